"""The loop IR: the contract between the lowering (``tullax.compiler.lower``) and every printer.

The IR is small and explicit, so the Numba and the Julia printers compute the same thing by construction:

* A ``Kernel`` has array, scalar and size parameters and a body of statements. Every name in it is generated
  here (``a0`` arrays, ``s0`` scalars, ``n0`` sizes, ``i0`` indices, ``t0`` temporaries, ``acc`` ...): user
  text never reaches an identifier. ``SizeArg.size`` is the symbolic size the HOST evaluates from the input
  shapes at call time (``size.eval(shapes)``) and passes as an integer. The parameters and the kernel's
  name are its calling interface (``tullax.compiler.interface``: what a cached module stores).
* Statements: ``Loop``, ``If``, ``Let`` (bind a new local), ``Accum`` (update an accumulator), ``Store``,
  ``Scratch`` (a new local array).
* Expressions are typed (``dtype``: a numpy name, ``bool`` or ``int64`` for index arithmetic): ``Const``,
  ``Var``, ``Load``, ``BinOp``, ``UnOp``, ``Call``, ``Select``, ``Cast``.
* Everything is 0-based and row-major; loop bounds are half-open ``[start, stop)``. Printers translate (the
  Julia printer reverses dimensions and adds 1).

Semantics printers must respect:

* ``BinOp`` ops: ``+ - * /`` (``/`` only on floats), ``^`` (float power; when ``rhs`` is an integer
  ``Const`` it is an exact integer power, safe for negative bases), ``//`` and ``mod`` (FLOOR division and
  FLOOR modulo, the sign of the divisor, as Python and Julia's ``fld``/``mod``; C's ``/`` and ``%`` are NOT),
  ``max min``, comparisons ``< <= > >= == !=`` (dtype bool), ``and or`` on bools.
* ``Select(cond, then, orelse)`` evaluates ONLY the chosen branch: branches may hold loads that are in range
  only when the condition holds (print a ternary, never an eager ``ifelse``/``where``). The lowering makes such
  a load only as a checked read: the ``then`` of a pad or index check, itself a load (perhaps cast) or a nested
  check; every other load is in range in every iteration of its loops (the inferred ranges), which is what lets
  ``tullax.compiler.rewrite`` compute a shared expression before a Select whose branches repeat it.
* ``Call`` functions: the registry's ``CALLS`` (``tullax.spec.functions``: exp log log1p expm1 sqrt abs sin
  cos tan tanh sinh cosh; its "expand" functions, sigmoid softplus relu, are rewritten into these by the
  lowering). ``abs`` of an ``int64`` is integer. Complex values (``complex64``/``complex128``) come with
  ``conj``, ``real``, ``imag`` calls; ``real``/``imag``/``abs`` of a complex value are real of its precision;
  they are never compared, and max/min never see them.
* ``Loop.parallel``: iterations write disjoint output elements; a printer may run them on different threads.
  Parallel loops always form a perfect nest at the top of the kernel body (``parallel_nest``), so a GPU
  printer can map them to its ndrange and the rest of the body is the per-element work. In a ``split`` kernel
  some parallel loops cut a sum, so several iterations add into one element: only with ``atomic_add``.
* ``LoopKernel.split``: a split sum (``tullax.compiler.split``, GPU printers only): every store is ``atomic_add``
  and the host starts the output at zero (``:=``) or at the given array (``+=``).
* ``Loop.reduce_parallel``: set only on the outermost loop of a kernel with NO parallel loops (a scalar
  result); its iterations only combine into accumulators declared outside it with ``Accum`` (+ * max min), so
  a printer may split it across threads with per-thread partials and a final combine (Numba's prange
  reduction) or run it serially.
* ``Scratch(var, length, dtype)``: a new 1-D array of ``length`` (a constant) elements of ``dtype``, all zero,
  private to the iteration that declares it (each parallel iteration, each work-item has its own). ``Load`` and
  ``Store`` address it by ``var`` with one position in ``[0, length)``. It may be declared inside an ``If`` and
  used in later statements under the same condition. Only tiled kernels (``lower(..., tile=True)``, CPU
  printers) hold them: the float64 running totals of a tile's blocked float32 sum.
* ``Buffer(var, length, dtype)``: a row buffer of a fused program (``tullax.compiler.fuse``): a new 1-D array of
  ``length`` elements (an ``int64`` expression over the size parameters), NOT initialised (every element is
  stored before it is loaded), private to the point of the parallel nest that declares it. Buffers stand first
  in the per-element body (directly inside the parallel nest) and live until its end; ``Load``/``Store``
  address one by ``var`` with one position in ``[0, length)``. It holds a local that has one index more than
  the rows (attention's scores ``s[b,i,j]`` of row ``b,i``, over ``j``). ``shared=True`` (cooperative kernels
  only, ``tullax.compiler.cooperate``): ONE buffer per block, shared by its threads, whose lanes loops write it
  (each its elements) with a ``Barrier`` before anyone reads it: a GPU printer prints dynamic shared memory sized at
  launch (``shared_buffer_bytes``). A thread-per-row GPU kernel never holds a Buffer (the CUDA printer refuses it).
* ``Store.mode``: ``set``, ``add`` (read-modify-write; no other iteration of a parallel loop touches the
  element) or ``atomic_add`` (a scatter whose serial loops may hit the same element twice: serial printing is
  race-free, a printer that parallelises those loops too must make the addition atomic; in a ``split`` kernel
  parallel iterations add into one element, so it must always be atomic).
* ``LoopKernel.tile`` (``tullax.compiler.tiles``, GPU printers only): a block of exactly ``BlockTile.threads``
  threads per point of the parallel nest (a block tile of the output); ``Var(THREAD)`` is the thread's position
  in its block, ``0 <= thread < threads``, bound by the printer. ``Shared(var, length, dtype)`` is a 1-D array of
  the block, one per block however often it is reached (a printer declares it once at the kernel's top);
  ``Barrier()`` waits until every thread of the block has arrived, and makes the shared writes before it visible
  after it; every thread reaches every Barrier the same number of times. ``VectorLoad`` reads consecutive
  aligned elements of a shared array into locals (one vector read where the target has one). CPU printers never
  receive such a kernel (only the cuda backend's launch planner makes one); the Julia printer prints it for
  KernelAbstractions.
* ``LoopKernel.vector`` (``tullax.compiler.vectorize``, GPU printers only): each point of the innermost parallel
  loop is a run of ``vector`` consecutive outputs along the output's last axis; under ``If(Var(ALIGNED))`` its
  inputs are ``VectorLoad``s of kernel arrays and its output one ``VectorStore``, in the else the same lanes in
  scalar reads and stores. ``Var(ALIGNED)`` is bound by the printer.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterator, Sequence, Union

from tullax.compiler.interface import ArrayArg, KernelInterface, ScalarArg, SizeArg
from tullax.errors import TullaxError

INDEX = "int64"
BOOL = "bool"
FLOATS = ("float32", "float64")
COMPLEX = ("complex64", "complex128")  # the complex dtypes of FLOATS' precisions, in their order
REAL_OF = dict(zip(COMPLEX, FLOATS))
NAN = float("nan")  # one object: Const(NAN) compares and hashes equal to itself


# =============================================================================================
# Expressions
# =============================================================================================
@dataclass(frozen=True)
class Const:
    value: Union[int, float, bool, complex]
    dtype: str


@dataclass(frozen=True)
class Var:
    name: str
    dtype: str


@dataclass(frozen=True)
class Load:
    array: str
    index: tuple["Expr", ...]
    dtype: str


@dataclass(frozen=True)
class BinOp:
    op: str
    lhs: "Expr"
    rhs: "Expr"
    dtype: str


@dataclass(frozen=True)
class UnOp:
    op: str  # "neg" | "not"
    arg: "Expr"
    dtype: str


@dataclass(frozen=True)
class Call:
    fn: str
    args: tuple["Expr", ...]
    dtype: str


@dataclass(frozen=True)
class Select:
    cond: "Expr"
    then: "Expr"
    orelse: "Expr"
    dtype: str


@dataclass(frozen=True)
class Cast:
    arg: "Expr"
    dtype: str


Expr = Union[Const, Var, Load, BinOp, UnOp, Call, Select, Cast]
COMPARE = ("<", "<=", ">", ">=", "==", "!=")


# =============================================================================================
# Statements and kernels
# =============================================================================================
@dataclass(frozen=True)
class Let:
    var: str
    value: Expr


@dataclass(frozen=True)
class Accum:
    var: str
    op: str  # + * max min
    value: Expr


@dataclass(frozen=True)
class Store:
    array: str
    index: tuple[Expr, ...]
    value: Expr
    mode: str = "set"  # set | add | atomic_add


@dataclass(frozen=True)
class Scratch:
    var: str
    length: int
    dtype: str


@dataclass(frozen=True)
class Buffer:
    var: str
    length: "Expr"
    dtype: str
    shared: bool = False  # cooperative kernels: one per block, its threads share it (GPU shared memory)


@dataclass(frozen=True)
class If:
    cond: Expr
    then: tuple["Stmt", ...]
    orelse: tuple["Stmt", ...] = ()


@dataclass(frozen=True)
class Loop:
    var: str
    start: Expr
    stop: Expr
    parallel: bool
    body: tuple["Stmt", ...]
    reduce_parallel: bool = False
    lanes: bool = False  # cooperative kernels: the block's threads share the iterations (a Store in it: each its own)
    registers: int = 0  # a chunk loop of register strips (``tullax.compiler.strips``): its chunks' width


@dataclass(frozen=True)
class Combine:
    """Cooperative kernels: every thread's partial of accumulator ``var`` (``op``: + max min) merged over the
    block; afterwards every thread holds the total. ``op`` "logsumexp": ``var`` is a running max m and
    ``scaled`` a running sum s of exp(x - m') (m' = m, or 0 where m is infinite); pairs merge by rescaling
    each sum to the larger max (``tullax.compiler.cooperate``'s one-pass logsumexp)."""

    var: str
    op: str
    dtype: str
    scaled: str = ""


@dataclass(frozen=True)
class Shared:
    """Block-tiled kernels: a zero-based 1-D array of ``length`` elements shared by the threads of one block."""

    var: str
    length: int
    dtype: str


@dataclass(frozen=True)
class Barrier:
    """Block-tiled kernels: every thread of the block waits here for the others (``__syncthreads``)."""


@dataclass(frozen=True)
class VectorLoad:
    """Bind ``vars`` (new locals of ``dtype``) to ``len(vars)`` consecutive elements of ``array`` from the element
    at ``index`` (one position per axis: a ``Shared`` array of a block-tiled kernel has one; a kernel array of a
    vector-lane kernel, ``tullax.compiler.vectorize``, its rank, the run along its last axis): one vector read
    where the target has one (CUDA ``float4``, ``double2``), else the same values as scalar reads. The stage
    guarantees the first element's flat position is a multiple of ``len(vars)`` (a shared array starts 16-byte
    aligned; a kernel array's vector reads stand under ``If(Var(ALIGNED))``)."""

    vars: tuple[str, ...]
    array: str
    index: tuple[Expr, ...]
    dtype: str


@dataclass(frozen=True)
class VectorStore:
    """Vector-lane kernels (``tullax.compiler.vectorize``): set ``len(values)`` consecutive elements of kernel
    array ``array`` along its last axis from the element at ``index`` (an aligned run, as ``VectorLoad``'s): one
    vector write where the target has one, else scalar stores."""

    array: str
    index: tuple[Expr, ...]
    values: tuple[Expr, ...]
    dtype: str


THREAD = "thread"  # block-tiled kernels: the thread's position in its block, bound by the printer
# vector-lane kernels: true where every array the kernel reads or writes in vectors starts 16-byte aligned, bound by
# the printer (a bool); its If runs the vector reads, its else the same lanes in scalar reads
ALIGNED = "aligned"


@dataclass(frozen=True)
class BlockTile:
    """A block-tiled kernel's geometry (``tullax.compiler.tiles``): each block computes ``rows`` x ``cols``
    output elements of its two parallel loops, each of its ``threads`` threads a ``thread_rows`` x
    ``thread_cols`` register tile, staging ``chunk`` steps of the reduction in shared memory at a time."""

    rows: int
    cols: int
    thread_rows: int
    thread_cols: int
    chunk: int

    @property
    def threads(self) -> int:
        return (self.rows // self.thread_rows) * (self.cols // self.thread_cols)


Stmt = Union[Let, Accum, Store, If, Loop, Scratch, Buffer, Combine, Shared, Barrier, VectorLoad, VectorStore]


@dataclass(frozen=True)
class LoopKernel:
    name: str
    spec_text: str
    arrays: tuple[ArrayArg, ...]
    scalars: tuple[ScalarArg, ...]
    sizes: tuple[SizeArg, ...]
    body: tuple[Stmt, ...]
    compute_dtype: str
    is_scatter: bool = False
    split: bool = False
    cooperative: bool = False  # one block per point of the parallel nest (``Loop.lanes``, ``Combine``)
    warp: bool = False  # with ``cooperative``: one warp per point instead of a block
    tile: BlockTile | None = None  # a block of tile.threads threads per point of the parallel nest
    vector: int = 0  # vector-lane kernels (tullax.compiler.vectorize): the elements of a thread's run, else 0

    @property
    def interface(self) -> KernelInterface:
        """Its name and parameters: what a host needs to call it once compiled (``tullax.compiler.interface``)."""
        return KernelInterface(self.name, self.spec_text, self.arrays, self.scalars, self.sizes)

    @property
    def params(self) -> tuple[str, ...]:
        """Parameter names in call order: arrays (output first), scalars, sizes."""
        return self.interface.params

    @property
    def output(self) -> ArrayArg:
        return self.interface.output


def parallel_nest(kernel: LoopKernel) -> tuple[tuple[Loop, ...], tuple[Stmt, ...]]:
    """The perfect nest of parallel loops at the top of the body, and the per-element statements inside it."""
    loops: list[Loop] = []
    body = kernel.body
    while len(body) == 1 and isinstance(body[0], Loop) and body[0].parallel:
        loops.append(body[0])
        body = body[0].body
    return tuple(loops), body


# =============================================================================================
# Expression helpers (light constant folding keeps the printed code readable)
# =============================================================================================
def const(value, dtype: str = INDEX) -> Const:
    return Const(value, dtype)


def is_float(dtype: str) -> bool:
    return dtype.startswith("float")


def fold_int(op: str, a: int, b: int) -> int | None:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "//" and b:
        return a // b
    if op == "mod" and b:
        return a % b
    if op == "max":
        return max(a, b)
    if op == "min":
        return min(a, b)
    return None


def eval_int(expr: Expr, env: dict[str, int]) -> int:
    """The value of an integer index expression (constants, variables from ``env``, negation and the
    operations of ``fold_int``): what a host needs to know the extents of a kernel's loops before calling it."""
    if isinstance(expr, Const):
        return int(expr.value)
    if isinstance(expr, Var):
        return int(env[expr.name])
    if isinstance(expr, UnOp) and expr.op == "neg":
        return -eval_int(expr.arg, env)
    if isinstance(expr, BinOp):
        value = fold_int(expr.op, eval_int(expr.lhs, env), eval_int(expr.rhs, env))
        if value is not None:
            return value
    raise TullaxError(f"internal error: not an integer index expression with a value: {expr}")


def binop(op: str, lhs: Expr, rhs: Expr, dtype: str | None = None) -> Expr:
    """A typed binary operation, folding integer constants and neutral elements."""
    dtype = dtype or (BOOL if op in COMPARE or op in ("and", "or") else lhs.dtype)
    if isinstance(lhs, Const) and isinstance(rhs, Const) and dtype == INDEX:
        folded = fold_int(op, lhs.value, rhs.value)
        if folded is not None:
            return Const(folded, INDEX)
    if dtype == INDEX:
        if op in ("+", "-") and isinstance(rhs, Const) and rhs.value == 0:
            return lhs
        if op == "+" and isinstance(lhs, Const) and lhs.value == 0:
            return rhs
        if op == "-" and isinstance(lhs, Const) and lhs.value == 0:
            return UnOp("neg", rhs, INDEX)
        if op == "*" and isinstance(rhs, Const) and rhs.value == 1:
            return lhs
        if op == "*" and isinstance(lhs, Const) and lhs.value == 1:
            return rhs
        if op == "+" and isinstance(rhs, Const) and rhs.value < 0:
            return binop("-", lhs, Const(-rhs.value, INDEX))
        if op in ("+", "-") and isinstance(rhs, Const) and isinstance(lhs, BinOp) and lhs.op in ("+", "-") \
                and isinstance(lhs.rhs, Const):  # (x ± a) ± b  ->  x ± c
            total = (lhs.rhs.value if lhs.op == "+" else -lhs.rhs.value) + (
                rhs.value if op == "+" else -rhs.value)
            return binop("+", lhs.lhs, Const(total, INDEX))
        if op == "+" and isinstance(rhs, UnOp) and rhs.op == "neg":
            return binop("-", lhs, rhs.arg)
    if op == "*" and is_float(dtype) and lhs.dtype == rhs.dtype == dtype:
        if isinstance(rhs, Const) and rhs.value == 1:
            return lhs
        if isinstance(lhs, Const) and lhs.value == 1:
            return rhs
    if op == "and":
        if isinstance(lhs, Const) and lhs.value is True:
            return rhs
        if isinstance(rhs, Const) and rhs.value is True:
            return lhs
    return BinOp(op, lhs, rhs, dtype)


def negate(expr: Expr) -> Expr:
    if isinstance(expr, Const) and not isinstance(expr.value, bool):
        return Const(-expr.value, expr.dtype)
    if isinstance(expr, UnOp) and expr.op == "neg":
        return expr.arg
    return UnOp("neg", expr, expr.dtype)


def conjunction(conds: list[Expr]) -> Expr:
    out: Expr = Const(True, BOOL)
    for cond in conds:
        out = binop("and", out, cond)
    return out


def cast(expr: Expr, dtype: str) -> Expr:
    if expr.dtype == dtype:
        return expr
    if isinstance(expr, Const) and is_float(dtype) and not isinstance(expr.value, bool):
        return Const(float(expr.value), dtype)
    if isinstance(expr, Const) and dtype in COMPLEX and not isinstance(expr.value, bool):
        return Const(complex(expr.value), dtype)
    return Cast(expr, dtype)


def children(expr: Expr) -> tuple[Expr, ...]:
    if isinstance(expr, Load):
        return expr.index
    if isinstance(expr, BinOp):
        return (expr.lhs, expr.rhs)
    if isinstance(expr, (UnOp, Cast)):
        return (expr.arg,)
    if isinstance(expr, Call):
        return expr.args
    if isinstance(expr, Select):
        return (expr.cond, expr.then, expr.orelse)
    return ()


def with_children(expr: Expr, parts: tuple[Expr, ...]) -> Expr:
    """``expr`` with its children, in the order ``children`` gives them, replaced by ``parts``."""
    if isinstance(expr, Load):
        return replace(expr, index=parts)
    if isinstance(expr, BinOp):
        return replace(expr, lhs=parts[0], rhs=parts[1])
    if isinstance(expr, (UnOp, Cast)):
        return replace(expr, arg=parts[0])
    if isinstance(expr, Call):
        return replace(expr, args=parts)
    assert isinstance(expr, Select), expr
    return replace(expr, cond=parts[0], then=parts[1], orelse=parts[2])


def map_loads(expr: Expr, swap: Callable[[Load], Expr]) -> Expr:
    """``expr`` with each outermost Load replaced by ``swap(load)`` (a load's own index is not entered)."""
    if isinstance(expr, Load):
        return swap(expr)
    parts = children(expr)
    if not parts:
        return expr
    return with_children(expr, tuple(map_loads(part, swap) for part in parts))


def walk_expr(expr: Expr) -> Iterator[Expr]:
    yield expr
    for child in children(expr):
        yield from walk_expr(child)


def expr_vars(expr: Expr) -> set[str]:
    return {node.name for node in walk_expr(expr) if isinstance(node, Var)}


def walk_stmts(stmts: tuple[Stmt, ...]) -> Iterator[Stmt]:
    for stmt in stmts:
        yield stmt
        if isinstance(stmt, Loop):
            yield from walk_stmts(stmt.body)
        elif isinstance(stmt, If):
            yield from walk_stmts(stmt.then)
            yield from walk_stmts(stmt.orelse)


def statement_expressions(stmt: Stmt) -> tuple[Expr, ...]:
    """The expressions ``stmt`` itself holds (not those of nested statements)."""
    if isinstance(stmt, Loop):
        return (stmt.start, stmt.stop)
    if isinstance(stmt, If):
        return (stmt.cond,)
    if isinstance(stmt, (Let, Accum)):
        return (stmt.value,)
    if isinstance(stmt, Buffer):
        return (stmt.length,)
    if isinstance(stmt, VectorLoad):
        return stmt.index
    if isinstance(stmt, VectorStore):
        return stmt.index + stmt.values
    if isinstance(stmt, (Scratch, Combine, Shared, Barrier)):
        return ()
    assert isinstance(stmt, Store), stmt
    return stmt.index + (stmt.value,)


def expressions(stmts: Sequence[Stmt]) -> Iterator[Expr]:
    """Every top-level expression of ``stmts`` and of the statements nested in them."""
    for stmt in walk_stmts(tuple(stmts)):
        yield from statement_expressions(stmt)
