"""The algebraic expansion of a polynomial body (``einsum_kernel(..., algebra="expand")``, an opt-in): a sum whose
body is a polynomial in its reads, multiplied out into monomials, so that each monomial factors apart and XLA runs
it as a contraction (``forms._factored``). Summed squared differences become one GEMM and two row norms:

    sum_k (W[k,i] - X[k,j])^2  =  sum_k W[k,i]^2  -  2 sum_k W[k,i]*X[k,j]  +  sum_k X[k,j]^2

as an expert writes Dist in jnp, where the loops evaluate a subtraction and a multiply-add per point. The gradients
of such a kernel (``ΔW[k,i] := ΔD[i,j]*(2*(W[k,i] - X[k,j]))``) expand the same way: a row sum and a GEMM.

The rewrite changes rounding, not the value in exact arithmetic: when the points are close, the difference of
large terms cancels (an absolute error of a few units in the last place of ``|w|^2 + |x|^2`` rather than of the
result). A body that is a square (an even power, or a sum or product of such) is clamped at 0, as scikit-learn's
``euclidean_distances`` clamps its expansion; with float64 enabled in jax (``jax_enable_x64``), float32 inputs are
expanded in float64 and the result rounded once (scikit-learn upcasts float32 blocks so). Pure: no jax here.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from tullax.spec.ir import Binary, Expr, Indirect, Num, Spec, Unary, accesses

MAX_TERMS = 16  # a body that multiplies out into more monomials than this is not expanded
MAX_POWER = 4  # x^n for integer 0 <= n <= MAX_POWER is multiplied out; a larger power stays one factor

Poly = dict[tuple[Expr, ...], float]  # sorted atoms (a monomial) -> coefficient


@dataclass(frozen=True)
class Expansion:
    """``spec`` multiplied out: ``body`` is the spec without its finaliser and with the expanded body (what
    ``forms._factored`` contracts term by term); ``terms``: how many monomials; ``nonnegative``: the original
    body is a square (an even power, or sums and products of such), so the sum is clamped at 0 before the
    finaliser; ``largest``: the most indices one factor of the expansion reads (the original: ``before``)."""

    body: Spec
    terms: int
    nonnegative: bool
    largest: int
    before: int
    monomials: tuple[tuple[float, tuple[Expr, ...]], ...] = ()  # (coefficient, atoms), as ``body`` sums them


def _key(atom: Expr) -> str:
    return repr(atom)  # spans take no part in repr: equal reads sort together


def _product(a: Poly, b: Poly) -> Poly | None:
    out: Poly = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            mono = tuple(sorted(ma + mb, key=_key))
            out[mono] = out.get(mono, 0.0) + ca * cb
    out = {m: c for m, c in out.items() if c != 0.0}
    return out if len(out) <= MAX_TERMS else None


def _sum(a: Poly, b: Poly, sign: float) -> Poly:
    out = dict(a)
    for m, c in b.items():
        out[m] = out.get(m, 0.0) + sign * c
    return {m: c for m, c in out.items() if c != 0.0}


def _real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def polynomial(expr: Expr) -> Poly | None:
    """``expr`` as a polynomial over its atoms (every node that is not a number, ``+``, ``-``, ``*``, a division by
    a number or a small integer power); None when it has more than ``MAX_TERMS`` monomials."""
    if isinstance(expr, Num) and _real(expr.value):
        return {(): float(expr.value)} if expr.value != 0 else {}
    if isinstance(expr, Unary) and expr.op == "-":
        inner = polynomial(expr.arg)
        return None if inner is None else {m: -c for m, c in inner.items()}
    if isinstance(expr, Binary):
        if expr.op in ("+", "-"):
            lhs, rhs = polynomial(expr.lhs), polynomial(expr.rhs)
            if lhs is None or rhs is None:
                return None
            found = _sum(lhs, rhs, 1.0 if expr.op == "+" else -1.0)
            return found if len(found) <= MAX_TERMS else None
        if expr.op == "*":
            lhs, rhs = polynomial(expr.lhs), polynomial(expr.rhs)
            return None if lhs is None or rhs is None else _product(lhs, rhs)
        if expr.op == "/" and isinstance(expr.rhs, Num) and _real(expr.rhs.value) and expr.rhs.value != 0:
            lhs = polynomial(expr.lhs)
            return None if lhs is None else {m: c / expr.rhs.value for m, c in lhs.items()}
        power = expr.rhs.value if expr.op == "^" and isinstance(expr.rhs, Num) else None
        if isinstance(power, int) and not isinstance(power, bool) and 0 <= power <= MAX_POWER:
            base = polynomial(expr.lhs)
            if base is None:
                return None
            found: Poly | None = {(): 1.0}
            for _ in range(power):
                found = _product(found, base)
                if found is None:
                    return None
            return found
    return {(expr,): 1.0}


def _ordered(poly: Poly) -> tuple[tuple[float, tuple[Expr, ...]], ...]:
    return tuple((coef, mono) for mono, coef in sorted(poly.items(), key=lambda item: [_key(a) for a in item[0]]))


def _as_expr(poly: Poly) -> Expr:
    """The polynomial written back as a sum of signed products (coefficient first, then its atoms)."""
    body: Expr | None = None
    for coef, mono in _ordered(poly):
        size = abs(coef)
        term: Expr | None = None if size == 1.0 and mono else Num(int(size) if float(size).is_integer() else size)
        for atom in mono:
            term = atom if term is None else Binary("*", term, atom)
        assert term is not None
        if body is None:
            body = term if coef > 0 else Unary("-", term)
        else:
            body = Binary("+" if coef > 0 else "-", body, term)
    return body if body is not None else Num(0)


def nonnegative(expr: Expr) -> bool:
    """Whether ``expr`` is >= 0 for every real value of its reads: an even power, a non-negative number, or sums
    and products of such."""
    if isinstance(expr, Num):
        return _real(expr.value) and expr.value >= 0
    if isinstance(expr, Binary):
        if expr.op == "^":
            power = expr.rhs.value if isinstance(expr.rhs, Num) else None
            return isinstance(power, int) and not isinstance(power, bool) and power >= 0 and power % 2 == 0
        if expr.op in ("+", "*"):
            return nonnegative(expr.lhs) and nonnegative(expr.rhs)
    return False


def _largest(spec: Spec) -> int:
    from tullax.backends.xla.recognise import factor_indices, product_terms

    terms = product_terms(spec) or ()
    return max((len(factor_indices(f)) for _, fs in terms for f in fs), default=0)


@functools.lru_cache(maxsize=1024)  # the planner's analysis, its rule, the lowering and explain all ask
def expansion(spec: Spec) -> Expansion | None:
    """The expansion of ``spec``, or None where it does not apply: the spec is not a new result summed over some
    index (``:=``, ``+``, no scatter, no index array, no recurrence), its body is not a polynomial of at most
    ``MAX_TERMS`` monomials, or multiplying out leaves some factor on as many indices as before (nothing to
    contract apart: a plain contraction already is one)."""
    from tullax.backends.xla.recognise import _factors_apart

    if (spec.redop != "+" or spec.assign != ":=" or spec.is_scatter or not spec.reduced or spec.scan is not None
            or any(isinstance(i, Indirect) for a in accesses(spec.body) for i in a.idx)):
        return None
    poly = polynomial(spec.body)
    if poly is None or not poly:
        return None
    body = replace(spec, body=_as_expr(poly), finalizer=None)
    largest, before = _largest(body), _largest(spec)
    if largest >= before or not _factors_apart(body):
        return None
    return Expansion(body, len(poly), nonnegative(spec.body), largest, before, _ordered(poly))


def applies(spec: Spec) -> bool:
    return expansion(spec) is not None


def summary(spec: Spec) -> str | None:
    """What the expansion does to ``spec``, in a few words (``explain``); None where it does not apply."""
    from tullax.spec.text import format_spec

    found = expansion(spec)
    if found is None:
        return None
    clamp = "; clamped at 0 (a square)" if found.nonnegative else ""
    return (f"{found.terms} monomials, each a contraction on XLA (BLAS): {format_spec(found.body)}; every factor "
            f"reads at most {found.largest} of the indices where the body read {found.before}{clamp}")


__all__ = ["Expansion", "expansion", "applies", "polynomial", "nonnegative", "summary", "MAX_TERMS", "MAX_POWER"]
