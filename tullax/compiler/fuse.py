"""Per-row fusion of a program (issue 50): statements that share their parallel (row) indices as ONE loop kernel.

A row-wise program (LayerNorm, RMSNorm, softmax, log-softmax, GroupNorm, logsumexp, attention) has locals indexed by
the same row indices ``R`` (LayerNorm's ``b``, softmax's ``b, i``), perhaps followed by one more index, and one
returned output indexed by ``R`` and perhaps more. Each statement is lowered as today (``tullax.compiler.lower``:
its reductions, finaliser, blocked float32 sums); the fused kernel is ONE parallel nest over ``R`` holding every
statement's per-row work in program order. A local's store becomes a ``Let`` (a per-row scalar, a register: never an
array in memory), and its loads in later statements the variable; the output's other indices run as serial loops
inside the row. A local with one index more than the rows (attention's scores ``s[b,i,j]`` of the row ``b,i``) is a
row ``Buffer`` over that index, written by its statement's serial loop and read by the later ones. A term that a
reduction sums and a later statement repeats (softmax's ``exp(s - m)``) is first made a local of its own
(``tullax.compiler.fuse_terms``), so the fused row computes it once, into a buffer. The result is ordinary loop IR,
so every printer prints it (C/OpenMP: a parallel loop over rows; CUDA: a thread per row; Numba; Julia).

Stitching lowered statement kernels, rather than lowering the program anew, keeps every statement's lowering
decisions (accumulator initial values, NaN rules, blocked sums) exactly those of the statement run on its own. A
program that does not have this shape raises ``NotFusable`` with the reason; it then runs unfused.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Mapping

from tullax.compiler.interface import ArrayArg, ScalarArg, SizeArg
from tullax.compiler.loops import (
    Accum,
    Buffer,
    Combine,
    Const,
    Expr,
    If,
    Let,
    Load,
    Loop,
    LoopKernel,
    Scratch,
    Stmt,
    Store,
    Var,
    cast,
    parallel_nest,
    walk_stmts,
)
from tullax.errors import TullaxError

if TYPE_CHECKING:
    from tullax.spec.program import Program

INDEX_DTYPE = "int64"
ROW_BUFFER_BYTES = 1 << 20  # a row buffer is on its thread's stack (a C VLA): longer rows run unfused
# a block's row buffers are in its shared memory: 48 KiB is what every CUDA GPU gives a block without opting in,
# less the cooperative combine's 64 doubles (``tullax.printers.cuda``'s tx_red)
SHARED_BYTES = 48 * 1024 - 64 * 8
# rows a CPU thread runs at once where a row's contraction reads a matrix that every row reads (attention's keys
# and values): the rows' copies share those loads (a 2 x 4 register tile of its scores)
ROW_TILE = 2
# vectors per row segment of a row's contraction held in registers across its sum (``tullax.compiler.strips``):
# attention's values, two rows of 64 float32 in 16 vector accumulators, each load of v shared by both rows; 0:
# neither these strips nor the tile's constant factors taken out of its dot products (the form before them)
ROW_STRIP_VECTORS = 8


class NotFusable(TullaxError):
    """The program is not a row-wise program this fusion takes (the message says why); it runs unfused."""


@dataclass(frozen=True)
class Fused:
    """A fused program: its kernel, the row indices its parallel nest runs over, and the returned outputs (the
    kernel's first array parameters, in this order)."""

    kernel: LoopKernel
    rows: tuple[str, ...]
    outputs: tuple[str, ...]
    agree: tuple[tuple[Expr, Expr], ...] = ()  # row bounds (over the size parameters) that must be equal
    program: Program | None = None  # the program fused (its sizes are read off its statements' shapes)

    @property
    def output(self) -> str:
        """The first returned output (the only one of most programs)."""
        return self.outputs[0]

    def shapes(self, inputs: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        """The shapes of the inputs and of every statement's result of the program fused (the kernel's sizes
        read some of them), from the inputs' shapes."""
        from tullax.spec.program import program_shapes

        assert self.program is not None
        return program_shapes(self.program, inputs)

    def check(self, sizes: dict[str, int]) -> str:
        """Why a call with these size parameters cannot run fused ("" where it can): the statements' rows
        read off different arrays, whose shapes disagree."""
        from tullax.compiler.loops import eval_int, walk_stmts

        for a, b in self.agree:
            if eval_int(a, sizes) != eval_int(b, sizes):
                return "the statements' rows have different extents"
        for stmt in walk_stmts(self.kernel.body):
            if isinstance(stmt, Buffer) and eval_int(stmt.length, sizes) * 8 > ROW_BUFFER_BYTES:
                return f"a row buffer of {eval_int(stmt.length, sizes)} elements exceeds a thread's stack share"
        return ""


def row_indices(program: Program, rows: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The row indices every local shares (the fused kernel's parallel nest), or ``NotFusable``. ``rows``: the
    rows to check the statements against (a scan program's: its scan statement's indices), else the shortest
    local's indices."""
    locals_ = [st for st in program.statements if st.local]
    if not locals_ and rows is None:
        raise NotFusable("no local to keep in registers")
    rows = rows if rows is not None else min((st.spec.free for st in locals_), key=len)
    for st in program.statements:
        if st.spec.scan is not None:
            raise NotFusable(f"statement {st.number} is a scan")
        free = st.spec.free
        if st.local and (free[:len(rows)] != rows or len(free) > len(rows) + 1):
            raise NotFusable(f"local {st.out} is indexed by {list(free)}, not the rows {list(rows)} (and perhaps "
                             f"one index more, a row buffer)")
    for st in program.statements:
        if not st.local and (not rows or not set(rows) <= set(st.spec.free)):
            raise NotFusable(f"the output {st.out} does not run over the locals' rows")
    return rows


def fuse_program(program: Program, dtype: str, name: str = "program", block_sums: bool = True,
                 ranges: Mapping | None = None, share: bool = True, row_tile: int | None = None,
                 rows: tuple[str, ...] | None = None) -> Fused:
    """The program as one loop kernel for data of ``dtype`` (a float dtype: inputs, locals and the result).
    ``block_sums=False``: float32 sums in one register (the GPU form, whose threads each sum a share).
    ``ranges``: the program's own (its terms shared, it is analysed again with them). ``share=False``: a
    repeated term computed where written (the GPU's block per row, whose threads hold no row buffer).
    ``row_tile``: rows per iteration of the parallel nest where a row contraction's loads are shared by them
    (1: a row each, as the GPU's forms need; None: ``ROW_TILE``). ``rows``: the rows to run in parallel over
    where the locals do not say (a scan adjoint's row program, whose outputs have an index more than the scan's
    rows: ``a[b,t,j]``, ``Δa[b,t,j]``); every statement fuses as in a scan's step (no register tiles)."""
    from tullax.compiler.fuse_terms import share_terms

    row_tile = ROW_TILE if row_tile is None else row_tile
    shared = share_terms(program, ranges) if share else None
    if shared is not None:
        try:
            return _fuse(shared, dtype, name, block_sums, row_tile, rows)
        except NotFusable:
            pass
    return _fuse(program, dtype, name, block_sums, row_tile, rows)


def _fuse(program: Program, dtype: str, name: str, block_sums: bool, row_tile: int = 1,
          rows: tuple[str, ...] | None = None) -> Fused:
    """``rows`` given (a scan program's step, ``tullax.compiler.scan_program``): every statement fuses, its
    register tiles dropped (a step computes one position of ``t``)."""
    from tullax.compiler.factor import factor_sums
    from tullax.compiler.fuse_axpy import row_axpy, row_tiles
    from tullax.compiler.jam import RegisterTile, register_tiles
    from tullax.compiler.lower import lower
    from tullax.spec.signature import Signature

    given = rows
    rows = row_indices(program, rows)
    locals_ = {st.out for st in program.statements if st.local}
    buffers: dict[str, Buffer] = {}  # a local with one index more than the rows -> its row buffer
    params = _Params(program.outputs)
    row_vars = tuple(f"r{k}" for k in range(len(rows)))
    outer: tuple[Loop, ...] = ()
    body: list[Stmt] = []
    compute = dtype
    agree: list[tuple[Expr, Expr]] = []
    shared_loads = False  # a row contraction whose reads other rows share (tile the rows)
    strips: list[Loop] = []  # the output's other index of a row's contraction turned inside out (``row_axpy``)
    for st in program.statements:
        spec = st.spec
        signature = Signature(tuple(INDEX_DTYPE if i.kind == "index" else dtype for i in spec.inputs), dtype)
        kernel = lower(spec, signature, name, block_sums=block_sums)
        if kernel.is_scatter or kernel.split or kernel.cooperative:
            raise NotFusable(f"statement {st.number} does not lower to a plain loop nest")
        loops, inner = parallel_nest(kernel)
        try:
            by_index = _loop_of_index(kernel, spec.free, inner, st.number)
        except NotFusable:  # register tiles (several rows per iteration): each row on its own instead
            if len(program.statements[-1].spec.free) == len(rows) and given is None:
                # one output element per row: fusing gains an epilogue and loses the contraction's tiles
                raise NotFusable(f"statement {st.number} is a contraction into the rows; fused it would lose its "
                                 f"register tiles") from None
            kernel = lower(spec, signature, name, share=False, block_sums=block_sums)
            loops, inner = parallel_nest(kernel)
            by_index = _loop_of_index(kernel, spec.free, inner, st.number)
        swapped = None
        if len(spec.free) == len(rows) + 1 and spec.redop == "+" and spec.finalizer is None and len(spec.reduced) == 1:
            plain = lower(spec, signature, name, share=False, block_sums=False)
            # its output row held in registers across j (``_row_strips``): a term per pass, else four
            swapped = row_axpy(plain, len(rows), jam=not (given is None and row_tile > 1 and ROW_STRIP_VECTORS))
            if swapped is not None:  # the row's contraction with its sum outside (``tullax.compiler.fuse_axpy``)
                kernel, loops = plain, parallel_nest(plain)[0]
                by_index = _loop_of_index(kernel, spec.free, parallel_nest(plain)[1], st.number)
        if tuple(loop.var for loop in loops[:len(rows)]) != tuple(by_index[r] for r in rows):
            raise NotFusable(f"statement {st.number}'s loops do not run over the rows {list(rows)} first")
        rename = _Rename(kernel, st.number, dict(zip((by_index[r] for r in rows), row_vars)), locals_, params,
                         buffers)
        if st.local and len(spec.free) > len(rows):  # a row buffer over the local's last index
            (extra,) = [loop for loop in loops if loop.var == by_index[spec.free[-1]]]
            if extra.start != Const(0, INDEX_DTYPE):
                raise NotFusable(f"local {st.out}'s last index does not start at 0")
            buffers[st.out] = Buffer(f"b_{st.out}", rename.expr(extra.stop), kernel.arrays[0].dtype)
            rename.buffer_of[kernel.arrays[0].name] = buffers[st.out]
        if swapped is None and len(spec.free) == len(rows) + 1 and spec.reduced and given is None:
            tiled = row_tiles(kernel, len(rows))  # the row's dot products four at a time
            if tiled is not None:
                loops, inner = parallel_nest(tiled)
                shared_loads = True
        here = tuple(rename.stmt(replace(loop, body=())) for loop in loops[:len(rows)])
        if not outer:
            outer = here
        for a, b in zip(outer, here):  # bounds read off other arrays' shapes must agree at call time
            agree.extend((x, y) for x, y in ((a.start, b.start), (a.stop, b.stop)) if x != y)
        work = tuple(rename.stmt(s) for s in (inner if swapped is None else swapped))
        if swapped is not None:
            strips.append(rename.stmt(replace(loops[-1], body=())))
        for loop in reversed(loops[len(rows):] if swapped is None else ()):  # the output's other indices: serial
            work = (replace(rename.stmt(replace(loop, body=())), parallel=False, body=work),)  # loops inside the row
        body.extend(work)
        compute = kernel.compute_dtype
    nest: tuple[Stmt, ...] = (*buffers.values(), *body)
    for loop in reversed(outer):
        nest = (replace(loop, body=nest),)
    text = "; ".join(("local " if st.local else "") + st.canonical for st in program.statements)
    kernel = LoopKernel(name, text, params.array_args(), tuple(params.scalars.values()), tuple(params.sizes.values()),
                        nest, compute)
    if shared_loads and row_tile > 1:
        kernel = register_tiles(kernel, [(row_vars[-1], RegisterTile(rows[-1], row_tile))])
    if given is None and row_tile > 1 and ROW_STRIP_VECTORS:
        kernel = _row_strips(factor_sums(kernel, each=True), strips)
    return Fused(kernel, rows, program.outputs, tuple(agree), program)


def _row_strips(kernel: LoopKernel, strips: list[Loop]) -> LoopKernel:
    """``kernel`` with each row's contraction turned inside out (``row_axpy``: ``for j: for e: out[.., e] +=
    ...``) run in chunks of ``e`` whose output row segments stay in vector registers across the sum over ``j``
    (``tullax.compiler.strips``: each element adds the same terms in the same order)."""
    from tullax.compiler.strips import STRIP_VECTORS, register_strips, strip_width

    width = strip_width(kernel.compute_dtype) // STRIP_VECTORS * ROW_STRIP_VECTORS
    for loop in strips if width else ():
        found = register_strips(kernel, loop.var, loop.start, loop.stop, width)
        kernel = kernel if found is None else found
    return kernel


def _loop_of_index(kernel: LoopKernel, free: tuple[str, ...], inner: tuple[Stmt, ...], number: int) -> dict[str, str]:
    """Each output index's loop variable, read off the store of the output (a plain ``out[i0, i1, ..]``)."""
    out = kernel.arrays[0].name
    stores = [s for s in walk_stmts(inner) if isinstance(s, Store) and s.array == out]
    if len(stores) != 1 or stores[0].mode != "set" or not all(isinstance(i, Var) for i in stores[0].index) \
            or len(stores[0].index) != len(free):
        raise NotFusable(f"statement {number} does not store its output once, at its loop indices")
    return {index: var.name for index, var in zip(free, stores[0].index)}


class _Params:
    """The fused kernel's parameters: the returned outputs first (``a0``, ``a1``... in program order), one array
    per external input (by name), one scalar, one size per symbol. A later statement's read of a returned output
    reads its output array (written earlier in the same row)."""

    def __init__(self, outputs: tuple[str, ...]):
        self.names = outputs
        self.outputs: dict[str, ArrayArg] = {}
        self.arrays: dict[str, ArrayArg] = {}
        self.scalars: dict[str, ScalarArg] = {}
        self.sizes: dict[Any, SizeArg] = {}

    def array(self, arg: ArrayArg) -> str:
        if arg.role != "in":
            self.outputs[arg.source] = replace(arg, name=f"a{self.names.index(arg.source)}")
            return self.outputs[arg.source].name
        if arg.source in self.names:
            return self.outputs[arg.source].name
        if arg.source not in self.arrays:
            self.arrays[arg.source] = replace(arg, name=f"a{len(self.names) + len(self.arrays)}")
        return self.arrays[arg.source].name

    def scalar(self, arg: ScalarArg) -> str:
        if arg.source not in self.scalars:
            self.scalars[arg.source] = replace(arg, name=f"s{len(self.scalars)}")
        return self.scalars[arg.source].name

    def size(self, arg: SizeArg) -> str:
        if arg.size not in self.sizes:
            self.sizes[arg.size] = replace(arg, name=f"n{len(self.sizes)}")
        return self.sizes[arg.size].name

    def array_args(self) -> tuple[ArrayArg, ...]:
        return (*(self.outputs[name] for name in self.names), *self.arrays.values())


class _Rename:
    """One statement's kernel renamed into the fused one: its parameters to the fused kernel's, its row loop
    variables to the shared ones, every other name suffixed with the statement's number, and its local's
    array turned into a per-row variable."""

    def __init__(self, kernel: LoopKernel, number: int, rows: dict[str, str], locals_: set[str], params: _Params,
                 buffers: Mapping[str, Buffer]):
        self.number, self.rows = number, rows
        self.local_of: dict[str, str] = {}  # the array parameter of a local -> its per-row variable
        self.buffer_of: dict[str, Buffer] = {}  # ... or its row buffer
        self.names: dict[str, str] = {}
        self.returned: set[str] = set()  # a returned output this statement reads
        for arg in kernel.arrays:
            if arg.source in buffers:
                self.buffer_of[arg.name] = buffers[arg.source]
            elif arg.source in locals_:
                self.local_of[arg.name] = f"l_{arg.source}"
            else:
                self.names[arg.name] = params.array(arg)
                if arg.role == "in" and arg.source in params.names:
                    self.returned.add(arg.name)
        for sc in kernel.scalars:
            self.names[sc.name] = params.scalar(sc)
        for size in kernel.sizes:
            self.names[size.name] = params.size(size)
        self.row_index = tuple(Var(var, INDEX_DTYPE) for var in rows.values())

    def var(self, name: str) -> str:
        return self.rows.get(name) or self.names.get(name) or f"{name}_{self.number}"

    def stmt(self, stmt: Stmt) -> Stmt:
        if isinstance(stmt, Store) and stmt.array in self.buffer_of:
            buffer = self.buffer_of[stmt.array]
            return Store(buffer.var, (self.expr(stmt.index[-1]),), cast(self.expr(stmt.value), buffer.dtype),
                         stmt.mode)
        if isinstance(stmt, Store) and stmt.array in self.local_of:
            return Let(self.local_of[stmt.array], self.expr(stmt.value))
        if isinstance(stmt, Store):
            return Store(self.names[stmt.array], tuple(self.expr(e) for e in stmt.index), self.expr(stmt.value),
                         stmt.mode)
        if isinstance(stmt, Loop):
            return replace(stmt, var=self.var(stmt.var), start=self.expr(stmt.start), stop=self.expr(stmt.stop),
                           body=tuple(self.stmt(s) for s in stmt.body))
        if isinstance(stmt, If):
            return If(self.expr(stmt.cond), tuple(self.stmt(s) for s in stmt.then),
                      tuple(self.stmt(s) for s in stmt.orelse))
        if isinstance(stmt, Let):
            return Let(self.var(stmt.var), self.expr(stmt.value))
        if isinstance(stmt, Accum):
            return Accum(self.var(stmt.var), stmt.op, self.expr(stmt.value))
        if isinstance(stmt, Scratch):
            return replace(stmt, var=self.var(stmt.var))
        if isinstance(stmt, Combine):
            return replace(stmt, var=self.var(stmt.var), scaled=self.var(stmt.scaled) if stmt.scaled else "")
        raise NotFusable(f"statement {self.number}: no fusion for {type(stmt).__name__}")

    def expr(self, expr: Expr) -> Expr:
        if isinstance(expr, Var):
            return Var(self.var(expr.name), expr.dtype)
        if isinstance(expr, Load) and expr.array in self.buffer_of:
            index = tuple(self.expr(e) for e in expr.index)
            if index[:-1] != self.row_index:
                raise NotFusable(f"statement {self.number} reads a local elsewhere than in its own row")
            return Load(self.buffer_of[expr.array].var, index[-1:], expr.dtype)
        if isinstance(expr, Load) and expr.array in self.local_of:
            index = tuple(self.expr(e) for e in expr.index)
            if index != self.row_index:
                raise NotFusable(f"statement {self.number} reads a local elsewhere than at its own row")
            return Var(self.local_of[expr.array], expr.dtype)
        if isinstance(expr, Load) and expr.array in self.returned:
            index = tuple(self.expr(e) for e in expr.index)
            if index[:len(self.row_index)] != self.row_index:  # another row's: another thread may write it
                raise NotFusable(f"statement {self.number} reads a returned output elsewhere than in its own row")
            return Load(self.names[expr.array], index, expr.dtype)
        if isinstance(expr, Load):
            return Load(self.names.get(expr.array) or self.var(expr.array), tuple(self.expr(e) for e in expr.index),
                        expr.dtype)
        changes = {f.name: (self.expr(getattr(expr, f.name)) if f.name in ("lhs", "rhs", "arg", "cond", "then",
                                                                           "orelse") else
                            tuple(self.expr(a) for a in expr.args) if f.name == "args" else getattr(expr, f.name))
                   for f in fields(expr)}
        return type(expr)(**changes)


def block_per_row(program: Program, dtype: str, inputs: Mapping[str, tuple[int, ...]], warp: bool = False,
                  name: str = "program", shared_bytes: int = SHARED_BYTES) -> Fused | None:
    """The GPU form of a fused program: a block (``warp``: a warp) per row, its threads striding each of the
    row's reductions and combining them (``tullax.compiler.cooperate``), then each writing its share of the
    output row (or of a row buffer, in the block's shared memory); the locals per-row values every thread holds.
    None where the row's work does not have that shape. ``inputs``: the call's input shapes (by name).

    A program whose repeated term becomes a row buffer (softmax's exp, computed once) is tried first; where its
    buffers take more than ``shared_bytes`` of shared memory, the program with the term recomputed instead (no
    buffer); a program whose locals are buffers themselves (attention's scores) then has no block-per-row form
    (and the thread-per-row form holds no buffer on a GPU: it runs unfused)."""
    from tullax.compiler.cooperate import cooperate, shared_buffer_bytes

    for share in (True, False):
        try:
            fused = fuse_program(program, dtype, name, block_sums=False, share=share, row_tile=1)
        except NotFusable:
            continue
        shapes = fused.shapes(inputs)
        sizes = {s.name: int(s.size.eval(shapes)) for s in fused.kernel.sizes}
        kernel = cooperate(fused.kernel, sizes, 1, warp=warp)
        if kernel is not None and shared_buffer_bytes(kernel, sizes) <= shared_bytes:
            return replace(fused, kernel=kernel)
    return None
