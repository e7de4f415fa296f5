"""Expression constructors that simplify as they build, so derived gradient specs read like hand-written ones.

``None`` stands for an exact zero: a derivative that vanishes drops its whole product instead of printing
``0*...``. The rules are deliberately trivial (signs pulled out, constants first, ``x*1`` and ``x + 0``
dropped): they must never change a value, only its spelling.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterable

from tullax.spec.affine import AffineForm
from tullax.spec.ir import COMPARISONS, Binary, Call, Expr, IndexVal, Name, Num, Unary
from tullax.spec.sizes import Sym

Maybe = Expr | None


def is_num(expr: Maybe, value: float) -> bool:
    return isinstance(expr, Num) and expr.value == value


def literal(expr: Expr) -> int | float | None:
    """The number ``expr`` spells (``2``, ``-0.5``), else None."""
    if isinstance(expr, Num):
        return expr.value
    if isinstance(expr, Unary) and isinstance(expr.arg, Num):
        return -expr.arg.value
    return None


def neg(a: Maybe) -> Maybe:
    if a is None:
        return None
    if isinstance(a, Num):
        return Num(-a.value)
    if isinstance(a, Unary):
        return a.arg
    return Unary("-", a)


def _negative(a: Expr) -> bool:
    return isinstance(a, Unary) or (isinstance(a, Num) and not isinstance(a.value, complex) and a.value < 0)


def add(a: Maybe, b: Maybe) -> Maybe:
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(b, Unary):
        return Binary("-", a, b.arg)
    if isinstance(b, Num) and not isinstance(b.value, complex) and b.value < 0:
        return Binary("-", a, Num(-b.value))
    return Binary("+", a, b)


def sub(a: Maybe, b: Maybe) -> Maybe:
    return add(a, neg(b))


def mul(a: Maybe, b: Maybe) -> Maybe:
    if a is None or b is None:
        return None
    if isinstance(a, Num) and isinstance(b, Num):
        return Num(a.value * b.value)
    if is_num(a, 1):
        return b
    if is_num(b, 1):
        return a
    if is_num(a, -1):
        return neg(b)
    if is_num(b, -1):
        return neg(a)
    if _negative(a) or _negative(b):  # pull signs out: -(2*a*b), not a*(-2)*b
        inner = mul(neg(a) if _negative(a) else a, neg(b) if _negative(b) else b)
        return inner if _negative(a) and _negative(b) else neg(inner)
    if isinstance(b, Num):  # constants first: 2*x
        return Binary("*", b, a)
    if isinstance(b, Binary) and b.op == "/" and is_num(b.lhs, 1):
        return Binary("/", a, b.rhs)
    return Binary("*", a, b)


def div(a: Maybe, b: Expr) -> Maybe:
    if a is None:
        return None
    return a if is_num(b, 1) else Binary("/", a, b)


def power(a: Expr, n: int | float) -> Maybe:
    if n == 0:
        return Num(1)
    return a if n == 1 else Binary("^", a, Num(n))


def call(fn: str, *args: Expr) -> Expr:
    return Call(fn, tuple(args))


def cmp(op: str, a: Expr, b: Expr) -> Expr:
    return Binary(op, a, b)


def product(factors: Iterable[Maybe]) -> Maybe:
    out: Maybe = Num(1)
    for factor in factors:
        out = mul(out, factor)
    return out


def total(terms: Iterable[Maybe]) -> Maybe:
    out: Maybe = None
    for term in terms:
        out = add(out, term)
    return out


_BINARY: dict[str, Callable[[Expr, Expr], Maybe]] = {"+": add, "-": sub, "*": mul, "/": div}


def rebuild(expr: Expr, leaf: Callable[[str], Expr]) -> Maybe:
    """``expr`` (a formula in the spec language over named placeholders, such as a derivative rule over
    ``x`` and ``y``) rebuilt through the constructors above, each placeholder replaced by ``leaf(name)``:
    the same simplifications apply as if the formula had been written with the constructors."""
    if isinstance(expr, Name):
        return leaf(expr.name)
    if isinstance(expr, Num):
        return Num(expr.value)
    if isinstance(expr, Unary):
        return neg(rebuild(expr.arg, leaf))
    if isinstance(expr, Call):
        return call(expr.fn, *(rebuild(a, leaf) for a in expr.args))
    assert isinstance(expr, Binary), f"a formula holds no {type(expr).__name__}"
    lhs, rhs = rebuild(expr.lhs, leaf), rebuild(expr.rhs, leaf)
    if expr.op in COMPARISONS:
        return cmp(expr.op, lhs, rhs)
    exponent = literal(rhs) if expr.op == "^" else None
    if exponent is not None:
        return power(lhs, exponent)
    if expr.op == "^":
        return Binary("^", lhs, rhs)
    return _BINARY[expr.op](lhs, rhs)


# ---------------------------------------------------------------------------------------------
# Affine forms as body expressions
# ---------------------------------------------------------------------------------------------
def affine_expr(form: AffineForm, extra: Sym = Sym(0)) -> Expr:
    """``Σ coef*index + const + extra`` (``form.div`` ignored) as a body expression: a symbolic constant
    rides on an IndexVal, since a body has no other way to read a size."""
    const = form.const + extra
    terms: list[Expr] = []
    placed = const.is_const
    for name, coef in form.terms:
        if coef == 1 and not placed:
            terms.append(IndexVal(name, const))
            placed = True
        else:
            terms.append(mul(Num(coef), IndexVal(name)))
    if not placed:  # no unit term to carry a symbolic constant: add (n + const) - n
        name = form.terms[0][0]
        terms += [IndexVal(name, const), neg(IndexVal(name))]
    elif const.is_const and const.const:
        terms.append(Num(const.const))
    return total(terms) or Num(0)


def compare(op: str, form: AffineForm, bound: Sym) -> Expr:
    """``form <op> bound``; a constant bound stays on the right (i >= 1), a symbolic one moves left."""
    if (bound - form.const).is_const:
        return cmp(op, affine_expr(replace(form, const=Sym(0))), Num((bound - form.const).const))
    return cmp(op, affine_expr(form, -bound), Num(0))
