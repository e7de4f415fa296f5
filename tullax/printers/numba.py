"""The Numba printer: the loop IR as ``@njit`` Python source.

One module per (spec, signature) with one ``@njit(parallel=..., fastmath=_FASTMATH, cache=True)`` function per
variant of the kernel. ``prange`` goes on the outermost parallel loop; where the body is one parallel loop nest
(``chunked``), the nested and flat variants are instead serial chunk functions over ``range(p_lo, p_hi)`` of that
loop, which the host runs on its own threads (no Numba parfor to compile). With two or more parallel loops a second,
``_flat`` variant runs ONE ``prange`` over the product of their extents (divmod back to the indices); the host
picks it at call time. A ``_serial`` variant (every loop a ``range``, ``parallel=False``) serves calls too small to
pay for a parallel launch. A scalar result (no parallel loop) gets ``prange`` on its reduction loop: Numba splits it
into per-thread partials and combines them (supported for + * max min). max/min reduction loops are printed as 8
independent lanes (``_lanes``), which LLVM vectorises; a float32 ``exp`` is printed as ``_exp_f32``
(``tullax.backends.numba.math``). A ``Scratch`` is ``np.zeros``. Array positions are printed as ``_ix(e)`` =
``np.uint64(e)``: never negative by construction, and unsigned positions skip Numba's negative-index wraparound.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Mapping, Sequence

from tullax._version import __version__
from tullax.compiler.loops import (
    Accum,
    BinOp,
    Const,
    Expr,
    Let,
    Loop,
    LoopKernel,
    Stmt,
    UnOp,
    binop,
    const,
    is_float,
    parallel_nest,
    walk_stmts,
)
from tullax.printers.base import (
    Infix,
    LoopPrinter,
    Place,
    Precedence,
    Prefix,
    Ternary,
    arithmetic_operators,
    left_associative,
    non_chaining,
)
from tullax.spec import functions
from tullax.spec.functions import Function

# fastmath without nnan/ninf: those would let LLVM assume no -inf/+inf/NaN, which breaks the -inf/+inf initial
# values of max/min, logsumexp's infinity test and NaN reads of out-of-range indirect indices. Nor nsz: with
# reassoc, LLVM folds 0*x + x*0 to 0 (NaN and inf included); nor arcp: x/d as x*(1/d) is inf for a subnormal d.
# reassoc alone lets sums vectorise.
FASTMATH = "{'contract', 'afn', 'reassoc'}"

# Calls printed as tullax.backends.numba.math's vectorisable versions instead of the registry's NumPy spelling,
# by (function, dtype): Numba's np.exp on float32 is a scalar expf call per element.
REPLACEMENTS = {("exp", "float32"): "_exp_f32"}
LANES = 8  # independent accumulators of a max/min reduction loop: one 256-bit vector of float32


@dataclass(frozen=True)
class NumbaPlace(Place):
    """``prange``: a parallel loop here is the outermost one (it gets ``prange``). ``lanes``: max/min reduction
    loops here print as lanes (not inside a prange reduction: Numba's parfor pass only recognises a reduction
    variable updated by one plain statement)."""

    prange: bool
    lanes: bool
    reduction: bool = False  # inside a prange reduction loop: max/min there also count NaNs (``accumulate``)


class NumbaPrinter(LoopPrinter):
    """Python under ``@njit`` for one kernel (which of its arrays are 0-d), with its nested and flat variants."""

    infix: ClassVar[Mapping[str, Infix]] = {
        **arithmetic_operators(non_chaining),  # Python chains comparisons
        "//": left_associative("//", Precedence.PRODUCT), "mod": left_associative("%", Precedence.PRODUCT),
        "and": left_associative("and", Precedence.AND), "or": left_associative("or", Precedence.OR),
        # right-associative, and `-x ** 2` is `-(x ** 2)`: the base is atomic
        "^": Infix("**", Precedence.POWER, Precedence.ATOM, Precedence.UNARY),
    }
    prefix: ClassVar[Mapping[str, Prefix]] = {"neg": Prefix("-", Precedence.UNARY, Precedence.UNARY),
                                              "not": Prefix("not ", Precedence.NOT, Precedence.NOT)}
    called: ClassVar[Mapping[str, str]] = {"max": "max", "min": "min"}
    ternary = Ternary("{then} if {cond} else {orelse}", Precedence.OR, Precedence.OR, Precedence.TERNARY)
    if_head = "if {cond}:"
    else_line = "else:"
    empty_block = "pass"
    # atomic_add: the lowering leaves the colliding loops serial in this nest, so a plain += is race-free
    store_forms: ClassVar[Mapping[str, str]] = {"set": "{target} = {value}", "add": "{target} += {value}",
                                                "atomic_add": "{target} += {value}"}
    scratch_form = "{var} = np.zeros({length}, {type})"
    buffer_form = "{var} = np.empty({length}, {type})"

    def __init__(self, kernel: LoopKernel, disk_cache: bool = True):
        self.kernel = kernel
        self.serial = False  # printing the serial variant: every loop a plain range, no parallel launch
        self.chunk = False  # printing a chunk variant: serial, but the parallel loop runs range(p_lo, p_hi)
        self.rank0 = frozenset(a.name for a in kernel.arrays if a.rank == 0)
        self.disk_cache = disk_cache  # Numba's cache=: off for a module that only exists in memory

    # -- tables' hooks ---------------------------------------------------------------------------
    def constant(self, node: Const) -> str:
        value = node.value
        if isinstance(value, bool):
            return "True" if value else "False"
        if node.dtype.startswith("int"):
            return str(int(value))
        if node.dtype.startswith("complex"):  # complex(nan, 0) etc. print as Python complex literals
            return f"np.{node.dtype}({_complex_literal(complex(value))})"
        if math.isnan(value):
            text = "np.nan"
        elif math.isinf(value):
            text = "np.inf" if value > 0 else "-np.inf"
        else:
            text = repr(float(value))
        return f"np.{node.dtype}({text})" if node.dtype != "float64" or "np." in text else text

    def type_name(self, dtype: str) -> str:
        return f"np.{dtype}"

    def call_name(self, fn: Function, dtype: str) -> str:
        if fn.name == "abs" and dtype.startswith("int"):  # an index value: integer arithmetic, not a ufunc
            return "abs"
        return REPLACEMENTS.get((fn.name, dtype), fn.numba)

    def index(self, array: str, index: Sequence[Expr]) -> str:
        return "0" if array in self.rank0 else super().index(array, index)


    def position(self, expr: Expr) -> str:
        """Positions as unsigned integers: they are never negative (the lowering proves every access in
        range), and an unsigned index skips Numba's negative-index wraparound, a select per access that
        stops LLVM from vectorising loops whose positions it cannot prove non-negative (x[i-k])."""
        return self.expr(expr) if isinstance(expr, Const) else f"_ix({self.expr(expr)})"

    def loop_header(self, loop: Loop, place: Place) -> str:
        assert isinstance(place, NumbaPlace)
        if self.chunk and loop.parallel and place.prange:
            return f"for {loop.var} in range({CHUNK_PARAMS[0]}, {CHUNK_PARAMS[1]}):"
        use_prange = not self.serial and ((loop.parallel and place.prange) or loop.reduce_parallel)
        return f"for {loop.var} in {'prange' if use_prange else 'range'}({self.expr(loop.start)}, " \
               f"{self.expr(loop.stop)}):"

    def inside_loop(self, loop: Loop, place: Place) -> Place:
        assert isinstance(place, NumbaPlace)
        in_reduction = loop.reduce_parallel and not self.serial
        return NumbaPlace(place.depth + 1, prange=False, lanes=place.lanes and not in_reduction,
                          reduction=place.reduction or in_reduction)

    def inside_branch(self, place: Place) -> Place:
        assert isinstance(place, NumbaPlace)
        return NumbaPlace(place.depth + 1, prange=False, lanes=place.lanes, reduction=place.reduction)

    # -- max/min reductions as lanes -------------------------------------------------------------
    def loop(self, loop: Loop, place: Place) -> list[str]:
        assert isinstance(place, NumbaPlace)
        if place.lanes and _lane_reduction(loop):
            return self._lanes(loop, place.depth)
        counted = _nan_counted(loop) if loop.reduce_parallel and not self.serial else ()
        if not counted:
            return super().loop(loop, place)
        pad = self.indent * place.depth
        nan = {v: self.constant(Const(math.nan, dtype)) for v, dtype in counted}
        return ([f"{pad}{var}_nan = 0" for var, _ in counted] + super().loop(loop, place)
                + [f"{pad}if {var}_nan:\n{pad}{self.indent}{var} = {nan[var]}" for var, _ in counted])

    def statement(self, stmt: Stmt, place: Place) -> list[str]:
        assert isinstance(place, NumbaPlace)
        if isinstance(stmt, Accum) and place.reduction and _propagates_nan(stmt):
            # Numba's parfor pass recognises only `acc = max(acc, v)`, which may drop a NaN: count NaNs in a sum
            # reduction beside it, and the loop's epilogue (``loop``) makes the result NaN when there were any
            pad, var = self.indent * place.depth, stmt.var
            return [f"{pad}{var}_v = {self.expr(stmt.value)}", f"{pad}{var} = {stmt.op}({var}, {var}_v)",
                    f"{pad}{var}_nan += {var}_v != {var}_v"]
        return super().statement(stmt, place)

    def accumulate(self, stmt: Accum) -> str:
        if _propagates_nan(stmt):
            return f"{stmt.var} = {NAN_PROPAGATING[stmt.op]}({stmt.var}, {self.expr(stmt.value)})"
        return super().accumulate(stmt)

    def binary(self, expr: BinOp) -> tuple[str, int]:
        """max/min NaN-propagating; ``x ** -n`` as ``1 / x ** n``: Numba's float power by a negative integer raises
        ZeroDivisionError at 0 whatever the error model, the division gives inf as IEEE and every other backend."""
        if expr.op in NAN_PROPAGATING and is_float(expr.dtype):
            return self.call(NAN_PROPAGATING[expr.op], (expr.lhs, expr.rhs)), Precedence.ATOM
        exponent = _negative_integer(expr.rhs) if expr.op == "^" and is_float(expr.dtype) else None
        if exponent is not None:
            one = self.constant(Const(1.0, expr.dtype))
            power = BinOp("^", expr.lhs, Const(exponent, expr.rhs.dtype), expr.dtype)
            return f"{one} / {self.expr(power, Precedence.POWER)}", Precedence.PRODUCT
        return super().binary(expr)

    def _lanes(self, loop: Loop, depth: int) -> list[str]:
        """A max/min reduction loop as LANES independent accumulators over blocks of LANES iterations, then
        the remainder. LLVM vectorises neither a max/min reduction (without the nnan flag, which -inf initial
        values forbid) nor Numba's builtin max; it does pack LANES independent compare-selects over consecutive
        elements into one vector max (measured: row max over 4096x4096, 4.8 ms -> 1.6 ms on 2 cores). Each lane
        starts from the accumulator's current value, so an enclosing loop that accumulates too stays right.

        A float lane keeps that fast compare-select (which skips a NaN) and sums its values beside it: a NaN
        value makes the sum NaN (so does +inf beside -inf). A NaN sum sends the blocks to the exact loop, which
        propagates NaN; else the lanes stand. Marking a NaN with a compare, in the lane itself (``lane != lane
        or ...``) or in a flag per lane (``flag | (v != v)``), kept LLVM from packing the lanes into vectors on
        this machine's CPU: the sum is the one check that packs (``benchmarks/nan_lanes.py``)."""
        pad, var = self.indent * depth, loop.var
        inner = NumbaPlace(depth + 1, prange=False, lanes=True)
        *lets, accum = loop.body
        cmp = ">" if accum.op == "max" else "<"
        lanes = [f"{accum.var}_l{k}" for k in range(LANES)]
        start, stop = self.expr(loop.start), self.expr(loop.stop)
        blocks = binop("*", binop("//", binop("-", loop.stop, loop.start), const(LANES)), const(LANES))
        sums = [f"{lane}_sum" for lane in lanes] if _propagates_nan(accum) else []
        zero = self.constant(Const(0.0, accum.value.dtype)) if sums else ""
        lines = [f"{pad}{lane} = {accum.var}" for lane in lanes] + [f"{pad}{total} = {zero}" for total in sums]
        if sums:
            lines.append(f"{pad}{accum.var}_in = {accum.var}")
        lines.append(f"{pad}{var}_top = {self.expr(binop('+', loop.start, blocks))}")
        lines.append(f"{pad}for {var}_blk in range({start}, {var}_top, {LANES}):")
        for k, lane in enumerate(lanes):
            lines.append(f"{pad}    {var} = {var}_blk + {k}")
            lines += self.block(lets, inner)
            lines.append(f"{pad}    {var}_v = {self.expr(accum.value)}")
            lines.append(f"{pad}    {lane} = {var}_v if {var}_v {cmp} {lane} else {lane}")
            if sums:  # the compare-select above skips a NaN value: the sum keeps it
                lines.append(f"{pad}    {sums[k]} = {sums[k]} + {var}_v")
        combine = NAN_PROPAGATING[accum.op] if sums else accum.op  # a lane may start from a NaN accumulator
        lines += [f"{pad}{accum.var} = {combine}({accum.var}, {lane})" for lane in lanes]
        if sums:  # a NaN (or +inf and -inf) among the blocks' values: the exact loop over them instead
            lines.append(f"{pad}if {' or '.join(f'{total} != {total}' for total in sums)}:")
            lines.append(f"{pad}    {accum.var} = {accum.var}_in")
            lines.append(f"{pad}    for {var} in range({start}, {var}_top):")
            lines += self.block(loop.body, NumbaPlace(depth + 2, prange=False, lanes=True))
        lines.append(f"{pad}for {var} in range({var}_top, {stop}):")
        lines += self.block(loop.body, inner)
        return lines

    # -- functions -------------------------------------------------------------------------------
    def function(self, name: str, flat: bool, serial: bool = False) -> str:
        kernel = self.kernel
        self.chunk = not serial and chunked(kernel)
        self.serial = serial or self.chunk
        if flat:
            body = self._flat(*parallel_nest(kernel))
        else:
            body = self.block(kernel.body, NumbaPlace(1, prange=not serial, lanes=True))
        params = kernel.params + (CHUNK_PARAMS if self.chunk else ())
        self.serial = self.chunk = False
        parallel = any("prange(" in line for line in body)
        head = (f"@njit(parallel={parallel}, fastmath=_FASTMATH, error_model='numpy', cache={self.disk_cache}, "
                "nogil=True)")
        return "\n".join([head, f"def {name}({', '.join(params)}):", *(body or ["    pass"])]) + "\n"

    def _flat(self, loops: tuple[Loop, ...], inner: tuple[Stmt, ...]) -> list[str]:
        """One prange over the product of the parallel extents; the indices come back by division (never
        reassign the prange variable or a copy of it: Numba's parfor pass rejects that)."""
        lines = []
        for k, loop in enumerate(loops):
            extent = self.expr(binop("-", loop.stop, loop.start))
            lines.append(f"    p_ext{k} = max({extent}, 0)")
        total = " * ".join(f"p_ext{k}" for k in range(len(loops)))
        whole = f"range({CHUNK_PARAMS[0]}, {CHUNK_PARAMS[1]})" if self.chunk else f"prange({total})"
        lines.append(f"    for p_flat in {whole}:")
        for k, loop in enumerate(loops):
            inner_extents = " * ".join(f"p_ext{m}" for m in range(k + 1, len(loops)))
            position = f"p_flat // ({inner_extents})" if inner_extents else "p_flat"
            if k:
                position = f"({position}) % p_ext{k}" if inner_extents else f"{position} % p_ext{k}"
            start = self.expr(loop.start, Precedence.SUM)
            lines.append(f"        {loop.var} = {position}" + ("" if start == "0" else f" + {start}"))
        lines += self.block(inner, NumbaPlace(2, prange=False, lanes=True))
        return lines


def _complex_literal(value: complex) -> str:
    """``complex(re, im)`` with each part spelled so Numba reads NaN and infinities back."""
    def part(x: float) -> str:
        return "np.nan" if math.isnan(x) else ("np.inf" if x > 0 else "-np.inf") if math.isinf(x) else repr(x)
    return f"complex({part(value.real)}, {part(value.imag)})"


def _propagates_nan(stmt: Accum) -> bool:
    """A float max/min accumulation: printed so a NaN operand makes the result NaN."""
    return stmt.op in NAN_PROPAGATING and is_float(stmt.value.dtype)


def _nan_counted(loop: Loop) -> tuple[tuple[str, str], ...]:
    """(accumulator, dtype) of every NaN-propagating max/min inside ``loop``."""
    found = {s.var: s.value.dtype for s in walk_stmts(loop.body) if isinstance(s, Accum) and _propagates_nan(s)}
    return tuple(found.items())


def _lane_reduction(loop: Loop) -> bool:
    """A serial loop whose body is Lets and then one max/min Accum: printed as lanes (``_lanes``)."""
    if loop.parallel or loop.reduce_parallel or not loop.body:
        return False
    *lets, last = loop.body
    return isinstance(last, Accum) and last.op in ("max", "min") and all(isinstance(s, Let) for s in lets)


def variants(kernel: LoopKernel) -> tuple[str, ...]:
    """The function names printed for ``kernel``: nested, flat with two or more parallel loops, and serial
    (``_serial``: no prange at all, for calls too small to pay for a parallel launch) when the nested one
    has a parallel loop."""
    loops, _ = parallel_nest(kernel)
    names = [kernel.name] + ([f"{kernel.name}_flat"] if len(loops) >= 2 else [])
    if _has_parallel_loop(kernel.body):
        names.append(f"{kernel.name}_serial")
    return tuple(names)


# The chunk bounds a chunked variant takes after the kernel's own parameters (``chunked``).
CHUNK_PARAMS = ("p_lo", "p_hi")


def chunked(kernel: LoopKernel) -> bool:
    """Whether the nested and flat variants of ``kernel`` are printed as chunk functions: serial code whose
    outermost parallel loop (the flat variant: its one loop over the product of the parallel extents) runs
    ``range(p_lo, p_hi)``, so the host runs the chunks of one call on its own threads
    (``tullax.backends.numba.threads``) instead of Numba's parallel pipeline: compiling a parfor costs 2-3x
    compiling the same nest serially (benchmarks/ttfk_breakdown.py: conv2d's weight gradient 3.8 s against
    1.45 s). Only where the body is ONE parallel loop nest: two top-level loops need a barrier between them
    (each of Numba's pranges is one), and a scalar result's prange reduction needs Numba's partial sums."""
    loops, _ = parallel_nest(kernel)
    return bool(loops)


def _has_parallel_loop(body: Sequence[Stmt]) -> bool:
    return any(isinstance(s, Loop) and (s.parallel or s.reduce_parallel) for s in walk_stmts(body))


def print_kernel(kernel: LoopKernel, disk_cache: bool = True) -> str:
    printer = NumbaPrinter(kernel, disk_cache)
    names = variants(kernel)
    parts = [f"# {kernel.name}: {kernel.spec_text}\n" + printer.function(names[0], flat=False)]
    for name in names[1:]:
        parts.append(printer.function(name, flat=name.endswith("_flat"), serial=name.endswith("_serial")))
    return "\n\n".join(parts)


def _negative_integer(expr: Expr) -> int | None:
    """n where ``expr`` is the constant -n for an integer n > 0 (a Const, or the negation of one); else None."""
    sign = 1
    if isinstance(expr, UnOp) and expr.op == "neg":
        expr, sign = expr.arg, -1
    if not isinstance(expr, Const) or isinstance(expr.value, (bool, complex)):
        return None
    value = sign * float(expr.value)
    return -int(value) if value.is_integer() and value < 0 else None


_HEADER = '''"""Generated by tullax {version} for the Numba backend. Do not edit: regenerated from the spec."""
import numpy as np
from numba import njit, prange

# fastmath without nnan/ninf: -inf/+inf initial values and NaN reads must survive
_FASTMATH = {fastmath}
# positions are non-negative by construction; unsigned ones skip the negative-index wraparound
_ix = np.uint64
'''


# NaN-propagating max/min (Python's max(a, b) may drop a NaN), from tullax.backends.numba.math
NAN_PROPAGATING = {"max": "_max_nan", "min": "_min_nan"}
_NAN_IMPORT = '''# NaN-propagating max and min, as jnp.maximum/minimum (tullax.backends.numba.math)
from tullax.backends.numba.math import max_nan as _max_nan, min_nan as _min_nan
'''


_EXP_IMPORT = '''# float32 exp as vectorisable arithmetic, Numba's np.exp is scalar expf (tullax.backends.numba.math)
from tullax.backends.numba.math import exp_f32 as _exp_f32
'''


def _modules_called(body: str) -> list[str]:
    """The modules (other than ``np``) of the registry's Numba spellings that ``body`` calls (``math.erf``)."""
    spellings = {f.numba for f in functions.FUNCTIONS.values() if f.numba and "." in f.numba}
    return sorted({name.split(".")[0] for name in spellings if f"{name}(" in body} - {"np"})


def print_module(kernels: Sequence[LoopKernel], disk_cache: bool = True) -> str:
    """The module of ``kernels``; ``disk_cache=False`` for one that is run from memory, without a file (Numba
    can only cache functions defined in a file)."""
    header = _HEADER.format(version=__version__, fastmath=FASTMATH)
    body = "\n\n".join(print_kernel(k, disk_cache) for k in kernels)
    if "_exp_f32(" in body:
        header += _EXP_IMPORT
    header += "".join(f"import {module}\n" for module in _modules_called(body))
    if any(f"{name}(" in body for name in NAN_PROPAGATING.values()):
        header += _NAN_IMPORT
    return header + "\n\n" + body


__all__ = ["CHUNK_PARAMS", "FASTMATH", "LANES", "REPLACEMENTS", "NumbaPrinter", "chunked", "print_kernel",
           "print_module", "variants"]
