"""Complex numbers in the host C printer: ``complex64``/``complex128`` as C99's ``float _Complex``/``double
_Complex`` (complex.h), for the ``c`` backend (the CUDA printer refuses them).

* Types and literals: ``CMPLXF(re, im)``/``CMPLX(re, im)`` with each part a float literal (NaN and infinities
  as the prelude's ``tx_nan_f32()``; ``re + im*I`` would turn an infinite part into NaN).
* Functions: the registry's ``c_complex`` spelling (complex.h's ``cexpf``, ``cabs``, ``conjf``, ``crealf``...),
  and this prelude's ``tx_c<name>`` for log1p, expm1, exp2, log2, log10, which complex.h lacks.
* Arithmetic: ``+ - /`` are C's. Division is C99 Annex G's (GCC's ``__divsc3``: Smith's scaling, and an
  infinite or zero operand recovered from NaN+NaN i), as XLA divides complex values (``(1+2i)/0`` is inf+inf i,
  ``(inf+inf i)/1`` is inf+inf i). Multiplication is NOT C's ``*``: its Annex G recovery gives ``(inf+inf i)*1``
  as inf+inf i where jnp (and NumPy, Numba) compute the textbook ``(ac - bd) + (ad + bc)i`` and give NaN+NaN i,
  and it calls ``__mulsc3`` on every NaN result, which keeps the loop from vectorising. So ``*`` (and ``*=``,
  an integer power's squarings) is ``tx_cmul``, the textbook product, as jnp computes it. No flag changes this
  (``-fcx-limited-range`` would drop division's scaling too); GCC ignores ``#pragma STDC CX_LIMITED_RANGE``.
* Comparisons and max/min never see complex values (``spec.valuetype`` refuses them). Complex loops are never
  printed as vector lanes (``c_vector``, the max/min lanes, ``omp simd`` reductions): those are float vectors;
  a complex reduction is a plain scalar loop (``wants_scalar_loop``).
* The fast tier (tcc) has no ``_Complex``: a complex module waits for the optimising compiler (``plain``).
"""
from __future__ import annotations

from typing import Sequence

from tullax.compiler.loops import (
    COMPLEX,
    INDEX,
    Accum,
    BinOp,
    Call,
    Const,
    Expr,
    Loop,
    LoopKernel,
    expressions,
    walk_expr,
)
from tullax.errors import TullaxError
from tullax.printers.base import Precedence
from tullax.printers.clike import format_float
from tullax.spec import functions

COMPLEX_TYPES = {"complex64": "float _Complex", "complex128": "double _Complex"}
COMPLEX_SUFFIX = {"complex64": "c64", "complex128": "c128"}
_PART = {"complex64": "float32", "complex128": "float64"}  # the dtype of each part
_MAKE = {"complex64": "CMPLXF", "complex128": "CMPLX"}


class ComplexC:
    """The host C printer's complex values (mixed in before ``CLikePrinter``): their type, literals, function
    calls, products and integer powers; everything else is the real printer's."""

    def type_name(self, dtype: str) -> str:
        return COMPLEX_TYPES[dtype] if is_complex(dtype) else super().type_name(dtype)  # type: ignore[misc]

    def constant(self, node: Const) -> str:
        if is_complex(node.dtype) and not isinstance(node.value, bool):
            return literal(complex(node.value), node.dtype)
        return super().constant(node)  # type: ignore[misc]

    def node(self, expr: Expr) -> tuple[str, int]:
        # real/imag/abs of a complex value are real: the argument's dtype picks the spelling
        if isinstance(expr, Call) and expr.args and is_complex(expr.args[0].dtype):
            name = call_spelling(functions.get(expr.fn).c_complex, expr.fn, expr.args[0].dtype)
            return self.call(name, expr.args), Precedence.ATOM  # type: ignore[attr-defined]
        return super().node(expr)  # type: ignore[misc]

    def binary(self, expr: BinOp) -> tuple[str, int]:
        if not is_complex(expr.dtype) or expr.op not in ("*", "^"):
            return super().binary(expr)  # type: ignore[misc]
        if expr.op == "*":
            return self.call(multiply(expr.dtype), (expr.lhs, expr.rhs)), Precedence.ATOM  # type: ignore[attr-defined]
        if isinstance(expr.rhs, Const) and expr.rhs.dtype == INDEX:
            return f"{power(expr.dtype)}({self.expr(expr.lhs)}, {int(expr.rhs.value)})", Precedence.ATOM  # type: ignore[attr-defined]
        return self.call(general_power(expr.dtype), (expr.lhs, expr.rhs)), Precedence.ATOM  # type: ignore[attr-defined]

    def accumulate(self, stmt: Accum) -> str:
        if stmt.op == "*" and is_complex(stmt.value.dtype):
            return f"{stmt.var} = {multiply(stmt.value.dtype)}({stmt.var}, {self.expr(stmt.value)})"  # type: ignore[attr-defined]
        return super().accumulate(stmt)  # type: ignore[misc]


def is_complex(dtype: str) -> bool:
    return dtype in COMPLEX


def literal(value: complex, dtype: str) -> str:
    """A complex constant of ``dtype``: ``CMPLXF(1.5f, -2.0f)``, infinite and NaN parts kept."""
    part = _PART[dtype]
    return f"{_MAKE[dtype]}({format_float(value.real, part)}, {format_float(value.imag, part)})"


def call_spelling(c_complex: tuple[str, str] | None, name: str, dtype: str) -> str:
    """The C function of registry entry ``name`` (its ``c_complex`` field) on a ``dtype`` argument."""
    if c_complex is None:
        raise TullaxError(f"internal error: the function registry has no complex C spelling of {name}")
    return c_complex[COMPLEX.index(dtype)]


def multiply(dtype: str) -> str:
    """The textbook complex product helper for ``dtype`` operands (``tx_cmul_c64``)."""
    return f"tx_cmul_{COMPLEX_SUFFIX[dtype]}"


def power(dtype: str) -> str:
    """The exact integer power helper (``tx_cpowi_c64``): repeated squaring with ``tx_cmul``, as
    ``lax.integer_pow`` multiplies."""
    return f"tx_cpowi_{COMPLEX_SUFFIX[dtype]}"


def general_power(dtype: str) -> str:
    """``z^w`` with a non-constant exponent: complex.h's ``cpow``."""
    return "cpowf" if dtype == "complex64" else "cpow"


def wants_scalar_loop(loop: Loop) -> bool:
    """A loop that accumulates a complex value: printed as a plain scalar loop, never as float vector lanes or
    an ``omp simd`` reduction (its terms are complex products, ``tx_cmul``)."""
    return any(isinstance(s, Accum) and is_complex(s.value.dtype) for s in loop.body)


def kernel_is_complex(dtypes: Sequence[str]) -> bool:
    return any(is_complex(str(d)) for d in dtypes)


def refuse_plain(kernel: LoopKernel) -> None:
    """The fast tier's plain module is compiled by tcc, which has no ``_Complex``: its caller then waits for
    the optimising compiler."""
    if holds_complex(kernel):
        raise TullaxError("the c backend's fast tier (tcc) has no complex numbers: the optimising compiler "
                          "builds complex modules")


def holds_complex(kernel: LoopKernel) -> bool:
    """Whether ``kernel`` computes with a complex value anywhere: a parameter, or an intermediate of its body."""
    if kernel_is_complex([kernel.compute_dtype, *(a.dtype for a in kernel.arrays),
                          *(s.dtype for s in kernel.scalars)]):
        return True
    return any(is_complex(node.dtype) for top in expressions(kernel.body) for node in walk_expr(top))


def _helpers(dtype: str) -> str:
    """The complex prelude's helpers for ``dtype``."""
    t, s, part = COMPLEX_TYPES[dtype], COMPLEX_SUFFIX[dtype], _PART[dtype]
    r = "float" if dtype == "complex64" else "double"
    f = "f" if dtype == "complex64" else ""  # the float function's suffix (``expm1f``)
    make, one, half, two = _MAKE[dtype], format_float(1.0, part), format_float(0.5, part), format_float(2.0, part)
    ln2, ln10 = format_float(0.6931471805599453, part), format_float(2.302585092994046, part)
    return f"""\
static inline {t} tx_cmul_{s}({t} a, {t} b) {{
    {r} ar = creal{f}(a), ai = cimag{f}(a), br = creal{f}(b), bi = cimag{f}(b);
    return {make}(ar * br - ai * bi, ar * bi + ai * br);
}}
static inline {t} tx_cpowi_{s}({t} x, int n) {{
    if (n == 2) return tx_cmul_{s}(x, x);
    if (n == 3) return tx_cmul_{s}(x, tx_cmul_{s}(x, x));
    {t} result = {one};
    {t} base = x;
    for (unsigned m = n < 0 ? 0u - (unsigned)n : (unsigned)n; m != 0; m >>= 1) {{
        if (m & 1u) result = tx_cmul_{s}(result, base);
        base = tx_cmul_{s}(base, base);
    }}
    return n < 0 ? {one} / result : result;
}}
// log(1 + z): log|1+z| = log1p(x(2+x) + y^2)/2 keeps the digits of a small z that clog(1 + z) rounds away
static inline {t} tx_clog1p_{s}({t} z) {{
    {r} x = creal{f}(z), y = cimag{f}(z);
    if (fabs{f}(x) < {half} && fabs{f}(y) < {half})
        return {make}({half} * log1p{f}(x * ({two} + x) + y * y), atan2{f}(y, {one} + x));
    return clog{f}({one} + z);
}}
// exp(z) - 1: the real part exp(x)cos(y) - 1 as expm1(x)cos(y) - 2sin(y/2)^2, without cancellation
static inline {t} tx_cexpm1_{s}({t} z) {{
    {r} x = creal{f}(z), y = cimag{f}(z), h = sin{f}({half} * y);
    return {make}(expm1{f}(x) * cos{f}(y) - {two} * h * h, y == 0 ? y : exp{f}(x) * sin{f}(y));
}}
static inline {t} tx_cexp2_{s}({t} z) {{ return cexp{f}(z * {ln2}); }}
static inline {t} tx_clog2_{s}({t} z) {{ return clog{f}(z) / {ln2}; }}
static inline {t} tx_clog10_{s}({t} z) {{ return clog{f}(z) / {ln10}; }}
"""


COMPLEX_PRELUDE = """
// complex64/complex128 (tullax.printers.c_complex): C99 complex.h; multiplication is tx_cmul, the textbook
// product as jnp computes it (C's * recovers infinities from NaN, C99 Annex G); division is C's, as XLA's
#include <complex.h>
#ifndef CMPLXF
#define CMPLXF(x, y) __builtin_complex((float)(x), (float)(y))
#define CMPLX(x, y) __builtin_complex((double)(x), (double)(y))
#endif
""" + "".join(_helpers(dtype) for dtype in COMPLEX)


__all__ = ["COMPLEX_PRELUDE", "COMPLEX_SUFFIX", "COMPLEX_TYPES", "call_spelling", "general_power", "holds_complex",
           "is_complex", "kernel_is_complex", "literal", "multiply", "power", "refuse_plain", "wants_scalar_loop"]
