"""The host C printer: the loop IR as C99 functions with OpenMP, one module per set of kernels (the backend
prints two per spec: its forward kernel, and every gradient step; ``UNIT_MARK`` between the functions lets it
compile a module as several translation units at once), for the ``c`` backend (``tullax.backends.c.backend``).

The mapping:

* One function per kernel: ``void name(arrays..., scalars..., sizes..., extents..., int tx_threads)``. Arrays
  are ``restrict`` pointers of their storage type (``const`` when read only); scalars are passed by value; the
  IR's sizes; then, for every array of rank >= 2, the extents of its axes 1.. (``a1_e1``) for the row-major
  flat offset of an element (``tullax.printers.clike``); ``tx_threads`` last.
* Loops are nested ``for`` loops over ``tx_i64`` (64-bit index arithmetic, as Numba's). The IR's parallel nest
  gets ``#pragma omp parallel for``, with ``collapse(k)`` over its leading loops whose bounds do not depend on
  each other (Numba's flat variant, always); ``if(tx_threads > 1)`` makes the same function the serial variant
  that the host picks for tiny calls (``tullax.backends.workload``), and ``num_threads(tx_threads)`` runs the
  thread count the host chose. A kernel with no parallel loop but a ``reduce_parallel`` loop gets ``reduction``
  clauses for the accumulators updated in it: ``+``/``*`` as OpenMP's, ``max``/``min`` as the prelude's
  declared reductions over the NaN-propagating ``tx_max``/``tx_min``.
* Declarations are hoisted: every local a region binds (``Let``, ``Scratch``) is declared once at the top of
  the region (the body of the innermost parallel loop, of a reduction loop, or the function) and assigned where
  the IR binds it. That keeps C's block scopes out of the IR's way (the tiled float32 sums declare a ``Scratch``
  in one ``If`` and read it in a later one) and makes every local private to its OpenMP iteration.
* A fused program's row ``Buffer``: a variable-length array among the region's locals, on its thread's stack.
* ``atomic_add`` stores are a plain ``+=`` (the colliding loops of a scatter are serial in the nest). A module
  where a kernel adds into its output also exports the parallel clear of ``tullax.printers.c_clear``.
* Expressions are the shared C ones (``tullax.printers.clike``); helpers carry their type's suffix
  (``tx_max_f32``), casts are C casts, infinities and NaN are GCC builtins. Register strips: ``c_strips``."""
from __future__ import annotations

from typing import ClassVar, Iterator, Mapping, Sequence

from tullax._version import __version__
from tullax.compiler.loops import (
    FLOATS,
    INDEX,
    Accum,
    Buffer,
    Cast,
    If,
    Let,
    Load,
    Loop,
    LoopKernel,
    Scratch,
    Stmt,
    Var,
    binop,
    const,
    expr_vars,
    parallel_nest,
    walk_expr,
)
from tullax.errors import TullaxError
from tullax.printers.base import Place, Precedence
from tullax.printers.c_clear import CLEAR_FUNCTION, CLEAR_SOURCE
from tullax.printers.c_complex import (
    COMPLEX_PRELUDE,
    COMPLEX_TYPES,
    ComplexC,
    holds_complex,
    refuse_plain,
    wants_scalar_loop,
)
from tullax.printers.c_fold_store import FoldStore, fold_store_lines, fold_store_plan
from tullax.printers.c_lanes import (
    ELEMENT_BYTES,
    HELPER_TYPES,
    LANE_PRELUDE,
    VECTOR_BYTES,
    lane_count,
    vector_lanes,
)
from tullax.printers.c_math_strips import math_strip_loop, math_strip_plan
from tullax.printers.c_mvec import MVEC_DECLARATIONS
from tullax.printers.c_nest_strips import nest_strip_loop, nest_strip_plan, vector_math, vector_rest
from tullax.printers.c_packed import packed_source
from tullax.printers.c_plain import plain_prelude
from tullax.printers.c_strips import register_strips
from tullax.printers.c_team import THREADS, team, trip_count
from tullax.printers.c_vector import LaneLoop, half_helpers, half_row, lane_vectors, vector_body
from tullax.printers.clike import (
    TYPE_SUFFIX,
    TYPEDEFS,
    CLikePrinter,
    CPlace,
    Parameter,
    extent_name,
    helper_definitions,
    storage_type,
)

NAME = "c"
# A lane loop prefetches this far ahead of each row it streams: the hardware's prefetchers stop at every 4 KiB
# page, XLA's buffers are on 4 KiB pages, and a prefetch this far ahead starts each page's walk and first lines
# early; 16 KiB was the fastest distance of those tried (benchmarks/ffi_call.py measures it in jit,
# benchmarks/results/ffi_call.json)
PREFETCH_BYTES = 16384
_OMP_REDUCTIONS = {"+": "+", "*": "*"}  # OpenMP's own; max/min are the prelude's NaN-propagating ones
_LANE_SUMS = {"+": "add", "*": "mul"}  # the sum/product lanes' folds (the prelude's ``tx_vfoldadd_f32``)
_IDENTITY = {"+": "-0.0", "*": "1.0"}
FOLD_EIGHT = True  # a register tile's eight float32 sums fold together (False: one by one, as before; benchmarks)
# a register tile's folded sums scaled into their totals and stored on vectors (``c_fold_store``; False: as written)
FOLD_STORE = True


def parameters(kernel: LoopKernel) -> tuple[Parameter, ...]:
    """Every parameter of the printed function but ``tx_threads``, in order: arrays, scalars, sizes, extents."""
    params = []
    for arr in kernel.arrays:
        qualifier = "const " if arr.role == "in" else ""
        params.append(Parameter(arr.name, "array", arr.dtype, f"{qualifier}{_element_type(arr.dtype)}*",
                                arr.name, restrict="restrict"))
    params += [Parameter(s.name, "scalar", s.dtype, _element_type(s.dtype), s.name) for s in kernel.scalars]
    params += [Parameter(size.name, "size", INDEX, "tx_i64") for size in kernel.sizes]
    for arr in kernel.arrays:
        for axis in range(1, arr.rank):
            params.append(Parameter(extent_name(arr.name, axis), "extent", INDEX, "tx_i64", arr.name, axis))
    return tuple(params)


def _element_type(dtype: str) -> str:
    return COMPLEX_TYPES.get(dtype) or storage_type(dtype, NAME)


class CPrinter(ComplexC, CLikePrinter):
    """Loop-IR expressions and statements as C99 with 64-bit index arithmetic; complex values as C99's
    ``_Complex`` (``tullax.printers.c_complex``)."""

    backend = NAME
    # atomic_add: the colliding loops of a scatter stay serial in the printed nest, so += is race-free
    store_forms: ClassVar[Mapping[str, str]] = {"set": "{target} = {value}", "add": "{target} += {value}",
                                                "atomic_add": "{target} += {value}"}
    # declared at the top of its region (``declarations``); here it is only zeroed
    scratch_form = "memset({var}, 0, {length} * sizeof({type}))"
    buffer_form = ""  # a variable-length array declared at the region's top (``declarations``)

    def __init__(self, plain: bool = False) -> None:
        super().__init__("tx_i64")
        self.plain = plain  # no GCC vector lanes: C that any C99 compiler builds (the c backend's fast tier)

    def helper_name(self, name: str, dtype: str) -> str:
        return f"{name}_{TYPE_SUFFIX[dtype]}"

    def cast_text(self, dtype: str, text: str) -> str:
        return f"(({self.type_name(dtype)}){text})"

    def cast(self, expr: Cast) -> str:
        return self.cast_text(expr.dtype, self.expr(expr.arg, Precedence.UNARY))

    def after_statement(self, stmts: Sequence[Stmt], at: int, place: CPlace) -> tuple[int, list[str]]:
        """A register tile's sums after their lane loop ``stmts[at]``, on vectors (``c_fold_store``)."""
        plan = self._fold_store(stmts, at, place)
        if plan is None:
            return 0, []
        written = stmts[at + 1:at + 1 + plan.count]
        dtype = dict(place.declared)[plan.sums[0]]
        width = vector_lanes(dtype)
        return plan.count, fold_store_lines(self, plan, written, place, f"tx_v{width}_{TYPE_SUFFIX[dtype]}", width)

    def _fold_store(self, stmts: Sequence[Stmt], at: int, place: CPlace) -> FoldStore | None:
        loop = stmts[at]
        if not FOLD_STORE or self.plain or not isinstance(loop, Loop) or loop.registers or wants_scalar_loop(loop):
            return None
        declared = dict(place.declared)
        if not _sum_lanes(loop, declared):
            return None
        dtypes = {declared[s.var] for s in loop.body if isinstance(s, Accum)}
        if len(dtypes) != 1 or next(iter(dtypes)) not in HELPER_TYPES:
            return None
        return fold_store_plan(stmts, at, declared, vector_lanes(next(iter(dtypes))))

    def loop(self, loop: Loop, place: Place) -> list[str]:
        assert isinstance(place, CPlace)
        if loop.registers:  # a chunk of register strips (``tullax.compiler.strips``), on vectors or as written
            return register_strips(self, loop, place, VECTOR_BYTES) or super().loop(loop, place)
        if wants_scalar_loop(loop) and not (loop.reduce_parallel and all(
                s.op == "+" for s in loop.body if isinstance(s, Accum))):  # complex: no float lanes, no simd
            return super().loop(loop, place)
        if not self.plain and _lane_reduction(loop):
            return self.lanes(loop, place)
        if _sum_lanes(loop, dict(place.declared)):
            return self.sum_lanes(loop, place)
        if _simd_reduction(loop):
            return [self.simd_pragma(loop, place), *super().loop(loop, place)]
        if not self.plain and (strip := math_strip_plan(loop)) is not None:
            return math_strip_loop(self, loop, place, strip)
        if not self.plain and (nest := nest_strip_plan(loop)) is not None:
            return nest_strip_loop(self, loop, place, nest)
        if not loop.reduce_parallel:
            return super().loop(loop, place)
        dtypes = dict(place.declared)
        accumulators = {s.var: s.op for s in _region(loop.body) if isinstance(s, Accum) and s.var in dtypes}
        clauses = "".join(f" reduction({self._reduction(op, dtypes[var])}:{var})" for var, op in accumulators.items())
        pad = self.indent * place.depth
        inner = CPlace(place.depth + 1, place.declared)
        decls, inner = self.declarations(loop.body, inner)
        return [f"{pad}#pragma omp parallel for{clauses} schedule(static) {team()}",
                pad + self.loop_header(loop, place), *decls, *self.block(loop.body, inner), pad + "}"]

    def simd_pragma(self, loop: Loop, place: CPlace) -> str:
        """``omp simd`` over a sum/product reduction loop (``_simd_reduction``): the module is compiled without
        -fassociative-math (it needs -fno-signed-zeros, which lets GCC fold NaN*0 to 0), so this is the one place
        the compiler may reorder float sums, and vectorise them; the loop's locals are private to each lane."""
        accums = {s.var: s.op for s in loop.body if isinstance(s, Accum)}
        clauses = "".join(f" reduction({_OMP_REDUCTIONS[op]}:{var})" for var, op in accums.items())
        lets = sorted({s.var for s in loop.body if isinstance(s, Let)})
        private = f" private({', '.join(lets)})" if lets else ""
        return f"{self.indent * place.depth}#pragma omp simd{clauses}{private}"

    def lanes(self, loop: Loop, place: CPlace) -> list[str]:
        """A max/min reduction loop as independent accumulators in vectors of ``vector_lanes(dtype)`` over blocks
        of as many iterations, then the remainder, as the Numba printer's lanes (``NumbaPrinter._lanes``): a
        NaN-propagating max is a loop-carried compare-select no compiler vectorises, and GCC vectorises neither a
        float max reduction without -ffinite-math-only nor many scalar compare-selects; GCC/Clang vectors of lanes
        do it by construction (the prelude's ``tx_vmax_f32``: the fast compare-select, which skips a NaN, and a
        NaN mask beside it; measured: row max over 4096x4096 on one core 15 ms scalar, 3.8 ms). The result is
        NaN when any lane saw one. Each lane starts from the accumulator, so an enclosing accumulation stays
        right; the lanes' values are computed one by one as the IR says (any index expression).

        One accumulator gets ``lane_count(dtype)`` lanes (two compare-select chains). Several (the rows of a
        register tile, ``schedule.STREAM_ROWS``: one loop reads that many rows at once) get one vector each, so
        the chains of all of them fit the registers."""
        pad, inner_pad, var = self.indent * place.depth, self.indent * (place.depth + 1), loop.var
        if_pad, deep = self.indent * (place.depth + 2), self.indent * (place.depth + 3)
        lets = [s for s in loop.body if isinstance(s, Let)]
        accums = [s for s in loop.body if isinstance(s, Accum)]
        declared = dict(place.declared)
        dtypes = {declared[a.var] for a in accums}
        if len(dtypes) != 1:
            raise TullaxError(f"internal error: max/min lanes over accumulators of several types: {sorted(dtypes)}")
        dtype = dtypes.pop()
        suffix, width = TYPE_SUFFIX[dtype], vector_lanes(dtype)
        lanes = lane_count(dtype) if len(accums) == 1 else width
        chains = range(lanes // width)
        vector, mask = f"tx_v{width}_{suffix}", f"tx_m{width}_{suffix}"
        names = [a.var for a in accums]
        extent = binop("max", binop("-", loop.stop, loop.start), const(0))
        top = binop("+", loop.start, binop("*", binop("//", extent, const(lanes)), const(lanes)))
        tail = binop("+", loop.start, binop("*", binop("//", extent, const(width)), const(width)))
        start = self.expr(loop.start)
        # no whole vector (a short window, a short row): neither the lanes nor their fold, only the remainder; with
        # two chains, a last vector of the first after the blocks (a row of 12 is one vector and 4 values)
        lines = [pad + "{",
                 f"{inner_pad}const {self.index_type} {var}_top = {self.expr(top)};"]
        if len(chains) > 1:
            lines.append(f"{inner_pad}const {self.index_type} {var}_tail = {self.expr(tail)};")
        end = f"{var}_tail" if len(chains) > 1 else f"{var}_top"
        lines += [f"{inner_pad}if ({end} > {start}) {{",
                  f"{if_pad}{vector} {', '.join(f'{acc}_l{c}' for acc in names for c in chains)};",
                  f"{if_pad}{mask} {', '.join(f'{acc}_nan{c} = {{0}}' for acc in names for c in chains)};",
                  *(f"{if_pad}{acc}_l{c} = ({vector}){{{', '.join([acc] * width)}}};" for acc in names
                    for c in chains),
                  f"{if_pad}{self.type_name(dtype)} "
                  f"{', '.join(f'{acc}_v{k}' for acc in names for k in range(lanes))};",
                  f"{if_pad}{self.index_type} {var};",
                  f"{if_pad}for ({self.index_type} {var}_blk = {start}; {var}_blk < {var}_top; "
                  f"{var}_blk += {lanes}) {{"]
        body = CPlace(place.depth + 3, place.declared)
        lines += self._lane_block(var, lets, accums, chains, width, dtype, body)
        lines.append(if_pad + "}")
        if len(chains) > 1:
            lines += [f"{if_pad}if ({var}_top < {var}_tail) {{",
                      f"{deep}const {self.index_type} {var}_blk = {var}_top;"]
            lines += self._lane_block(var, lets, accums, chains[:1], width, dtype, body)
            lines.append(if_pad + "}")
        for accum in accums:  # the chains into the first, then its lanes into the accumulator
            acc = accum.var
            for c in chains[1:]:
                lines += [f"{if_pad}{acc}_l0 = tx_v{accum.op}_{suffix}({acc}_l{c}, {acc}_l0, &{acc}_nan0);",
                          f"{if_pad}{acc}_nan0 |= {acc}_nan{c};"]
            lines.append(f"{if_pad}{acc} = tx_vfold{accum.op}_{suffix}({acc}_l0, {acc}_nan0, {acc});")
        lines.append(inner_pad + "}")
        rest = Loop(var, Var(end, INDEX), loop.stop, False, loop.body)
        return lines + super().loop(rest, CPlace(place.depth + 1, place.declared)) + [pad + "}"]

    def sum_lanes(self, loop: Loop, place: CPlace) -> list[str]:
        """A float sum/product loop (``_sum_lanes``) as vectors of independent partial sums: a loop without a
        reduction computes a block's terms into an array (GCC vectorises it without reassociating anything, calls
        through their ``declare simd`` clones), and the block's vectors are added to the lanes, which stay in
        registers; ``omp simd reduction`` kept its lanes on the stack, with a scalar remainder. The lanes start from
        the op's identity (-0.0: a sum of -0.0s stays -0.0) and fold in a fixed order, halves with halves, into the
        accumulator; then the remainder, one by one (on vectors, the loop's last vector, where the terms are plain
        arithmetic: ``c_vector.vector_rest``): deterministic, and NaN and inf reach the result. One
        accumulator gets ``lane_count(dtype)`` lanes and a last block of ``vector_lanes(dtype)``; several (the rows
        of a register tile) one vector each."""
        pad, inner_pad, var = self.indent * place.depth, self.indent * (place.depth + 1), loop.var
        if_pad, deep = self.indent * (place.depth + 2), self.indent * (place.depth + 3)
        lets = [s for s in loop.body if isinstance(s, Let)]
        accums = [s for s in loop.body if isinstance(s, Accum)]
        dtype = dict(place.declared)[accums[0].var]
        suffix, width, ctype = TYPE_SUFFIX[dtype], vector_lanes(dtype), self.type_name(dtype)
        lanes = lane_count(dtype) if len(accums) == 1 else width
        vector = f"tx_v{width}_{suffix}"
        extent = binop("max", binop("-", loop.stop, loop.start), const(0))
        top = binop("+", loop.start, binop("*", binop("//", extent, const(lanes)), const(lanes)))
        tail = binop("+", loop.start, binop("*", binop("//", extent, const(width)), const(width)))
        start, idx = self.expr(loop.start), self.index_type
        private = f" private({', '.join(sorted({s.var for s in lets}))})" if lets else ""
        body = CPlace(place.depth + 4, place.declared)

        # plain arithmetic: on vectors (``c_vector``); not in a plain (tcc) module, which has no vectors
        direct = None if self.plain else vector_body(var, lets, accums, dtype)

        def block(first: str, count: int, at: str) -> list[str]:
            # the terms of a block into an array by a loop without a reduction, then added to the lanes' vectors
            lines = [f"{at}{ctype} {', '.join(f'{a.var}_t[{count}]' for a in accums)};",
                     f"{at}#pragma omp simd{private}",
                     f"{at}for ({idx} {var}_l = 0; {var}_l < {count}; ++{var}_l) {{",
                     f"{at}{self.indent}const {idx} {var} = {first} + {var}_l;",
                     *self.block(lets, body),
                     *(f"{at}{self.indent}{a.var}_t[{var}_l] = {self.expr(a.value)};" for a in accums),
                     at + "}"]
            for a in accums:
                for c in range(count // width):
                    if self.plain:  # lane by lane, as the vectors add
                        lines.append(f"{at}for (int k = 0; k < {width}; ++k) {a.var}_l{c}[k] {a.op}= "
                                     f"{a.var}_t[{c * width} + k];")
                    else:
                        lines += [f"{at}memcpy(&{a.var}_t{c}, &{a.var}_t[{c * width}], sizeof({vector}));",
                                  f"{at}{a.var}_l{c} {a.op}= {a.var}_t{c};"]
            return lines

        chains = range(lanes // width)
        lines = [pad + "{", f"{inner_pad}const {idx} {var}_top = {self.expr(top)};",
                 f"{inner_pad}const {idx} {var}_tail = {self.expr(tail)};",
                 f"{inner_pad}if ({var}_tail > {start}) {{"]
        for a in accums:  # plain: arrays of lanes, added lane by lane as the vectors are
            ident = ", ".join([_IDENTITY[a.op]] * width)
            if self.plain:
                lines.append(f"{if_pad}{ctype} {', '.join(f'{a.var}_l{c}[{width}] = {{{ident}}}' for c in chains)};")
                continue
            lines.append(f"{if_pad}{vector} {', '.join(f'{a.var}_l{c} = {{{ident}}}' for c in chains)};")
            if direct is None:
                lines.append(f"{if_pad}{vector} {', '.join(f'{a.var}_t{c}' for c in chains)};")
        if direct is not None:  # the remainder as one more vector too, the loop's last (``vector_rest``)
            lanes_loop = LaneLoop(var, start, self.expr(loop.stop), lanes, width, vector, _IDENTITY[accums[0].op],
                                  idx, self.indent)
            lines += lane_vectors(direct, lanes_loop, if_pad, self.expr)
        else:
            lines.append(f"{if_pad}for ({idx} {var}_blk = {start}; {var}_blk < {var}_top; {var}_blk += {lanes}) {{")
            lines += block(f"{var}_blk", lanes, deep)
            lines.append(if_pad + "}")
            if lanes > width:
                lines += [f"{if_pad}if ({var}_top < {var}_tail) {{", *block(f"{var}_top", width, deep), if_pad + "}"]
        eight = FOLD_EIGHT and not self.plain and width == 8 and len(accums) % 8 == 0 and all(
            a.op == "+" for a in accums)
        for a in accums if not eight else ():
            each = f"for (int k = 0; k < {width}; ++k) " if self.plain else ""
            lines += [f"{if_pad}{each}{a.var}_l0{'[k]' if each else ''} {a.op}= {a.var}_l{c}{'[k]' if each else ''};"
                      for c in chains[1:]]
            fold = "tx_pfold" if self.plain else "tx_vfold"
            lines.append(f"{if_pad}{a.var} = {fold}{_LANE_SUMS[a.op]}_{suffix}({a.var}_l0, {a.var});")
        for group in range(0, len(accums) if eight else 0, 8):  # a register tile's sums (attention's scores)
            folded, some = f"{var}_fold", accums[group:group + 8]  # eight at a time: fewer shuffles, the same sums
            lines += [f"{if_pad}{{", f"{if_pad}{self.indent}const {vector} {folded} = tx_vfold8add_{suffix}("
                      f"{', '.join(f'{a.var}_l0' for a in some)}, ({vector}){{{', '.join(a.var for a in some)}}});",
                      *(f"{if_pad}{self.indent}{a.var} = {folded}[{k}];" for k, a in enumerate(some)), if_pad + "}"]
        if direct is not None:  # the vectors took every iteration; a shorter loop: half vectors, or one by one
            short = Loop(var, loop.start, loop.stop, False, loop.body)
            return [*lines, *half_row(direct, lanes_loop, inner_pad, self.expr), inner_pad + "} else {",
                    *super().loop(short, CPlace(place.depth + 2, place.declared)), inner_pad + "}", pad + "}"]
        lines.append(inner_pad + "}")
        rest = Loop(var, Var(f"{var}_tail", INDEX), loop.stop, False, loop.body)
        if not self.plain and vector_math(lets, accums):  # the remainder's terms on vectors, added one by one
            return lines + vector_rest(self, rest, width, private, CPlace(place.depth + 1, place.declared)) + [
                pad + "}"]
        return lines + super().loop(rest, CPlace(place.depth + 1, place.declared)) + [pad + "}"]

    def _lane_block(self, var: str, lets: Sequence[Let], accums: Sequence[Accum], chains: range, width: int,
                    dtype: str, place: CPlace) -> list[str]:
        """One block of the lanes from ``{var}_blk``: the values of ``chains`` vectors, one by one as the IR says,
        then one compare-select step per chain and accumulator."""
        pad, suffix = self.indent * place.depth, TYPE_SUFFIX[dtype]
        vector = f"tx_v{width}_{suffix}"
        lines: list[str] = []
        for load in _streams(var, lets, accums):
            ahead = PREFETCH_BYTES // ELEMENT_BYTES.get(load.dtype, 8)
            lines += [f"{pad}{var} = {var}_blk + {ahead};", f"{pad}__builtin_prefetch(&{self.expr(load)}, 0, 3);"]
        for k in range(len(chains) * width):
            lines.append(f"{pad}{var} = {var}_blk + {k};")
            lines += self.block(lets, place)
            lines += [f"{pad}{accum.var}_v{k} = {self.expr(accum.value)};" for accum in accums]
        for accum in accums:
            acc = accum.var
            for c in chains:
                chain = ", ".join(f"{acc}_v{k}" for k in range(c * width, (c + 1) * width))
                lines.append(f"{pad}{acc}_l{c} = tx_v{accum.op}_{suffix}(({vector}){{{chain}}}, {acc}_l{c}, "
                             f"&{acc}_nan{c});")
        return lines

    def _reduction(self, op: str, dtype: str) -> str:
        if op in _OMP_REDUCTIONS:
            return _OMP_REDUCTIONS[op]
        if op not in ("max", "min") or dtype not in HELPER_TYPES:
            raise TullaxError(f"internal error: no OpenMP reduction for {op} over {dtype}")
        return f"tx_r{op}_{TYPE_SUFFIX[dtype]}"

    def declarations(self, stmts: Sequence[Stmt], place: CPlace) -> tuple[list[str], CPlace]:
        """The declarations of every local the region ``stmts`` binds (not inside a reduction loop, which is a
        region of its own), at ``place``'s depth, and the place where they count as declared."""
        pad = self.indent * place.depth
        lines, declared = [], set()
        for stmt in _region(stmts):
            if isinstance(stmt, Let) and (stmt.var, stmt.value.dtype) not in declared:
                if any(name == stmt.var for name, _ in declared):
                    raise TullaxError(f"internal error: the loop IR binds {stmt.var} again with another type")
                declared.add((stmt.var, stmt.value.dtype))
                lines.append(f"{pad}{self.type_name(stmt.value.dtype)} {stmt.var};")
            elif isinstance(stmt, Scratch):
                lines.append(f"{pad}{self.type_name(stmt.dtype)} {stmt.var}[{stmt.length}];")
            elif isinstance(stmt, Buffer):  # its length is over the size parameters: known at the region's top
                lines.append(f"{pad}{self.type_name(stmt.dtype)} {stmt.var}[{self.expr(stmt.length)}];")
        return lines, CPlace(place.depth, frozenset(place.declared) | declared)


def _region(stmts: Sequence[Stmt]) -> Iterator[Stmt]:
    """The statements of ``stmts`` and of the loops and branches in them, not inside a reduction loop."""
    for stmt in stmts:
        yield stmt
        if isinstance(stmt, Loop) and not stmt.reduce_parallel:
            yield from _region(stmt.body)
        elif isinstance(stmt, If):
            yield from _region(stmt.then)
            yield from _region(stmt.orelse)


def _streams(var: str, lets: Sequence[Let], accums: Sequence[Accum]) -> list[Load]:
    """The loads of a lane loop over ``var`` that read along an array's last axis (``var`` in its last index
    only, no indirection and no local of the block in any index): the ones a prefetch ahead of the block helps."""
    local = {let.var for let in lets}
    found: list[Load] = []
    for stmt in (*lets, *accums):
        for node in walk_expr(stmt.value):
            if not isinstance(node, Load) or node in found or not node.index:
                continue
            names = [expr_vars(index) for index in node.index]
            if (var in names[-1] and not any(var in n for n in names[:-1]) and not set().union(*names) & local
                    and not any(isinstance(sub, Load) for index in node.index for sub in walk_expr(index))):
                found.append(node)
    return found


def _lane_reduction(loop: Loop) -> bool:
    """A serial loop whose body is Lets and then max/min Accums (one per row of a register tile): printed as
    lanes (``CPrinter.lanes``)."""
    if loop.parallel or loop.reduce_parallel or not loop.body:
        return False
    count = next((n for n, s in enumerate(loop.body) if not isinstance(s, Let)), len(loop.body))
    accums = loop.body[count:]
    return bool(accums) and all(isinstance(s, Accum) and s.op in ("max", "min") for s in accums)


def _sum_lanes(loop: Loop, declared: dict[str, str]) -> bool:
    """A ``_simd_reduction`` loop of float sums/products of one type: lanes of partial sums (``sum_lanes``)."""
    if not _simd_reduction(loop):
        return False
    accums = [s for s in loop.body if isinstance(s, Accum)]
    dtypes = {declared.get(a.var) for a in accums}
    return len(dtypes) == 1 and dtypes <= set(FLOATS) and all(a.op in _LANE_SUMS for a in accums)


def _simd_reduction(loop: Loop) -> bool:
    """A serial loop whose body is Lets and then ``+``/``*`` Accums of scalars (one per row of a register tile),
    none of them a Let's name, that reads along arrays' last axes: its iterations are independent but for the
    reductions (``CPrinter.simd_pragma``), and vectors of consecutive iterations are contiguous loads. A loop that
    reads down a column (the ``k`` of ``W[k,i]*X[k,j]``) gets no pragma: GCC then packs the tile's accumulators,
    which read along a row, into one vector (5x faster than vectors along ``k``, which gather)."""
    if loop.parallel or loop.reduce_parallel or not loop.body:
        return False
    count = next((n for n, s in enumerate(loop.body) if not isinstance(s, Let)), len(loop.body))
    lets, accums = loop.body[:count], loop.body[count:]
    local = {s.var for s in lets}
    if not accums or not all(isinstance(s, Accum) and s.op in _OMP_REDUCTIONS and s.var not in local
                             for s in accums):
        return False
    streams = _streams(loop.var, lets, accums)  # type: ignore[arg-type]
    loads = {node for stmt in loop.body for node in walk_expr(stmt.value) if isinstance(node, Load)}
    moving = {node for node in loads if any((loop.var in expr_vars(index)) or (expr_vars(index) & local)
                                            or any(isinstance(sub, Load) for sub in walk_expr(index))
                                            for index in node.index)}
    return bool(streams) and moving <= set(streams)


def collapsible(loops: Sequence[Loop], body: Sequence[Stmt]) -> int:
    """How many leading loops of the parallel nest OpenMP collapses: those whose bounds use no variable of an
    enclosing loop of the nest (a rectangular nest), but never the innermost one when the per-element body has
    no loop of its own: that loop is the one the compiler vectorises, and GCC vectorises no collapsed loop
    (measured: an elementwise 4096x4096 gradient 32 ms collapsed, 10 ms not)."""
    if not any(isinstance(s, Loop) for s in _region(body)):
        loops = loops[:-1]
    count, outer = 0, set()
    for loop in loops:
        if (expr_vars(loop.start) | expr_vars(loop.stop)) & outer:
            break
        count += 1
        outer.add(loop.var)
    return count


def kernel_function(kernel: LoopKernel, plain: bool = False) -> str:
    """The C function of ``kernel`` and its packed entry (``c_packed``); ``plain``: no GCC vectors (``CPrinter``)."""
    return _kernel_body(kernel, plain) + "\n" + packed_source(kernel.name, parameters(kernel), THREADS)


def _kernel_body(kernel: LoopKernel, plain: bool = False) -> str:
    if plain:
        refuse_plain(kernel)
    printer = CPrinter(plain)
    declarations = ",\n    ".join([p.declaration for p in parameters(kernel)] + [f"const int {THREADS}"])
    lines = [f"// {kernel.name}: {kernel.spec_text}", f"void {kernel.name}(\n    {declarations})", "{"]
    loops, body = parallel_nest(kernel)
    if not loops:  # serial, or a scalar result whose reduction loop is split (CPrinter.loop)
        decls, place = printer.declarations(kernel.body, CPlace(1))
        lines += decls + printer.block(kernel.body, place) + ["}"]
        return "\n".join(lines) + "\n"
    collapse = collapsible(loops, body)
    clause = f" collapse({collapse})" if collapse > 1 else ""
    lines.append(f"    #pragma omp parallel for{clause} schedule(static) "
                 f"{team(trip_count(printer, loops[:max(collapse, 1)]))}")
    for depth, loop in enumerate(loops, start=1):
        lines.append(printer.indent * depth + printer.loop_header(loop, CPlace(depth)))
    decls, place = printer.declarations(body, CPlace(len(loops) + 1))
    lines += decls + printer.block(body, place)
    lines += [printer.indent * depth + "}" for depth in range(len(loops), 0, -1)] + ["}"]
    return "\n".join(lines) + "\n"


_REDUCTIONS = "".join(
    f"#pragma omp declare reduction(tx_r{op}_{TYPE_SUFFIX[dt]} : {storage_type(dt)} : "
    f"omp_out = tx_{op}_{TYPE_SUFFIX[dt]}(omp_out, omp_in)) initializer(omp_priv = omp_orig)\n"
    for dt in HELPER_TYPES for op in ("max", "min"))

# a row shorter than a vector: two half vectors (``c_vector.half_row``)
_HALF_HELPERS = "".join(half_helpers(dtype, vector_lanes(dtype)) for dtype in HELPER_TYPES)


_PRELUDE = """\
#include <math.h>
#include <stdbool.h>
#include <string.h>
""" + TYPEDEFS + """
#ifdef TX_MVEC
// glibc's vector math (libmvec, linked by the c backend where it exists): loops calling these vectorise
""" + MVEC_DECLARATIONS + """#endif

// IEEE infinity and quiet NaN (the module is compiled without -ffinite-math-only: they survive)
static inline float tx_inf_f32(void) { return __builtin_inff(); }
static inline float tx_nan_f32(void) { return __builtin_nanf(""); }
static inline double tx_inf_f64(void) { return __builtin_inf(); }
static inline double tx_nan_f64(void) { return __builtin_nan(""); }

""" + helper_definitions("static inline", HELPER_TYPES) + """
// max/min reductions of a split reduction loop: max/min are idempotent, so each thread may start from the
// accumulator's value before the loop
""" + _REDUCTIONS
# a plain module's prelude: tcc's infinity and NaN, and the sum lanes' folds on arrays (``tullax.printers.c_plain``)
_PLAIN_PRELUDE = plain_prelude(_PRELUDE, {dtype: vector_lanes(dtype) for dtype in FLOATS})
# max/min and sum lanes' helpers (GCC/Clang vectors): not in a plain module

_HEADER = "// Generated by tullax {version} for the c backend. Do not edit: regenerated from the spec.\n"


# Between the prelude and each kernel function: where the backend may cut the module into translation units that
# it compiles at once (``tullax.backends.c.compile.split_units``).
UNIT_MARK = "\n// ---- tullax: kernel ----\n"


def print_module(kernels: Sequence[LoopKernel], plain: bool = False) -> str:
    """One C translation unit for ``kernels``: header, prelude, one function per kernel, and the parallel clear
    (``CLEAR_FUNCTION``) where a kernel adds into its output. ``plain``: without GCC's vector extensions, for a
    compiler that has none (``CPrinter.plain``)."""
    names = [k.name for k in kernels]
    if len(set(names)) != len(names):
        raise TullaxError(f"internal error: kernel names repeat in one C module: {names}")
    if CLEAR_FUNCTION in names:
        raise TullaxError(f"internal error: a kernel is named {CLEAR_FUNCTION!r}, the C module's own clear")
    clear = [CLEAR_SOURCE] if any(k.output.role == "inout" for k in kernels) else []
    prelude = _PLAIN_PRELUDE if plain else _PRELUDE + LANE_PRELUDE + _HALF_HELPERS
    if any(holds_complex(k) for k in kernels):
        prelude += COMPLEX_PRELUDE
    return UNIT_MARK.join([_HEADER.format(version=__version__) + prelude]
                          + [kernel_function(k, plain) for k in kernels] + clear)


__all__ = ["CPrinter", "THREADS", "UNIT_MARK", "collapsible", "kernel_function", "parameters", "print_module"]
