"""Symbolic derivatives of body expressions (jax's conventions at the kinks: |x|' = 1 at 0, relu'(0) = 0,
max/min split ties).

The rules of the "call" functions come from the function registry (``tullax.spec.functions``): each is a
formula in the spec language over ``x`` (the argument; ``x1``, ``x2``, ... for one rule per argument of a
function of several) and ``y`` (the value f(x)), parsed once and rebuilt through the simplifying constructors of
``grad.algebra`` for every use; the chain rule sums over the arguments. ``max``, ``min`` and
``ifelse`` have structural rules here, and so do ``conj``, ``real``, ``imag`` and ``abs`` of complex values
(``wirtinger``: jax's convention for complex gradients).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable

from tullax.grad.algebra import (
    Maybe,
    add,
    call,
    cmp,
    div,
    is_num,
    literal,
    mul,
    neg,
    power,
    rebuild,
    sub,
    total,
)
from tullax.spec import functions
from tullax.spec.ir import COMPARISONS, Binary, Call, Expr, Num, Unary
from tullax.spec.parse import parse_spec
from tullax.spec.valuetype import is_complex

IsVar = Callable[[Expr], bool]
Pair = tuple[Maybe, Maybe]


def derivative(expr: Expr, is_var: IsVar) -> Maybe:
    """∂expr/∂v where ``is_var`` picks the nodes that are the variable v (None: zero); every value real."""
    return wirtinger(expr, is_var, frozenset())[0]


def wirtinger(expr: Expr, is_var: IsVar, names: frozenset[str]) -> Pair:
    """(∂expr/∂v, ∂expr/∂conj(v)), the Wirtinger derivatives, where ``names`` are the complex arrays and scalars
    (``spec.valuetype``). On real values the second is None (zero) and the first is the ordinary derivative, so
    real specs derive exactly as before; a holomorphic function keeps its rule on complex values, and
    ``conj``/``real``/``imag``/``abs`` of a complex value have the rules of ``u + conj(u)`` and ``sqrt(u*conj(u))``.
    The cotangent of v under jax's convention is then ``ct*∂ + conj(ct*∂̄)`` (``cotangent``)."""
    if is_var(expr):
        return Num(1), None
    if isinstance(expr, Unary):
        d, b = wirtinger(expr.arg, is_var, names)
        return neg(d), neg(b)
    if isinstance(expr, Binary):
        return _binary_pair(expr, is_var, names)
    if isinstance(expr, Call):
        return _call_pair(expr, is_var, names)
    return None, None  # numbers, other inputs, index values


def cotangent(ct: Maybe, pair: Pair, names: frozenset[str]) -> Maybe:
    """The cotangent of v (jax's convention: what ``jax.grad`` of a real loss returns for a complex v) from the
    cotangent ``ct`` of the expression and its Wirtinger pair: ``ct*∂ + conj(ct*∂̄)``. For a real v the caller
    takes the real part."""
    d, b = pair
    return add(mul(ct, d), conj(mul(ct, b), names))


def conj(expr: Maybe, names: frozenset[str]) -> Maybe:
    """conj(expr), simplified: a real value is its own conjugate."""
    if expr is None:
        return None
    if isinstance(expr, Num):
        return Num(expr.value.conjugate()) if isinstance(expr.value, complex) else expr
    if not is_complex(expr, names):
        return expr
    if isinstance(expr, Call) and expr.fn == "conj":
        return expr.args[0]
    if isinstance(expr, Unary):
        return neg(conj(expr.arg, names))
    return call("conj", expr)


def unary_derivative(fn: str, u: Expr, node: Expr | None = None) -> Maybe:
    """f'(u) for a one-argument function; ``node`` is f(u) itself where the rule reuses it (``exp' = y``)."""
    return partial_derivative(fn, 0, (u,), node)


def partial_derivative(fn: str, position: int, args: tuple[Expr, ...], node: Expr | None = None) -> Maybe:
    """∂f/∂(argument ``position``) at ``args``, from the registry's rule over x (one argument) or x1, x2, ...
    and y; ``node`` is f(args) itself where the rule reuses it. None: that partial derivative is zero."""
    entry = functions.get(fn)
    rule = _formula(entry.partials()[position])
    if rule is None:  # imag of a real value, floor, sign: zero
        return None
    value = node if node is not None else call(fn, *args)
    names = {"x": args[0]} if entry.arity == 1 else {f"x{k + 1}": a for k, a in enumerate(args)}
    return rebuild(rule, {**names, "y": value}.__getitem__)


def derivative_from_output(fn: str, output: Expr) -> Maybe:
    """f'(pre) written with the finalised output ``output`` = f(pre) alone, so a finaliser's gradient reads the
    forward result instead of recomputing pre; None when the registry has no such formula."""
    rule = _formula(functions.get(fn).from_output)
    return None if rule is None else rebuild(rule, {"y": output}.__getitem__)


def has_zero_derivative(fn: str) -> bool:
    return functions.get(fn).derivative is None


def has_output_form(fn: str) -> bool:
    return functions.get(fn).from_output is not None


@lru_cache(maxsize=None)
def _formula(text: str | None) -> Expr | None:
    """A registry formula as a spec-language expression (parsed once)."""
    return None if text is None else parse_spec(f"formula := {text}").body


def _binary_pair(expr: Binary, is_var: IsVar, names: frozenset[str]) -> Pair:
    a, b, op = expr.lhs, expr.rhs, expr.op
    (da, ba), (db, bb) = wirtinger(a, is_var, names), wirtinger(b, is_var, names)
    if op in ("+", "-"):
        return (add(da, db), add(ba, bb)) if op == "+" else (sub(da, db), sub(ba, bb))
    if op == "*":
        return add(mul(da, b), mul(a, db)), add(mul(ba, b), mul(a, bb))
    if op == "/":
        ratio = Binary("/", a, power(b, 2))
        return sub(div(da, b), mul(db, ratio)), sub(div(ba, b), mul(bb, ratio))
    if op == "^":
        exponent = literal(b)
        if exponent is not None:
            factor = mul(Num(exponent), power(a, exponent - 1))
            return mul(factor, da), mul(factor, ba)
        d_base, d_exp = mul(b, Binary("^", a, sub(b, Num(1)))), mul(call("log", a), expr)
        return add(mul(d_base, da), mul(d_exp, db)), add(mul(d_base, ba), mul(d_exp, bb))
    return None, None  # comparisons are piecewise constant


def _call_pair(expr: Call, is_var: IsVar, names: frozenset[str]) -> Pair:
    if expr.fn == "ifelse":
        return _ifelse_pair(expr, is_var, names)
    if expr.fn in ("max", "min"):
        return _extremum_pair(expr, is_var, names)
    if len(expr.args) == 1 and functions.get(expr.fn).on_complex != "holomorphic" \
            and is_complex(expr.args[0], names):
        d, b = wirtinger(expr.args[0], is_var, names)
        return (None, None) if d is None and b is None else _wirtinger_rule(expr, d, b, names)
    ds, bs = [], []
    for position, arg in enumerate(expr.args):  # the chain rule over every argument
        d, b = wirtinger(arg, is_var, names)
        if d is None and b is None:
            continue
        rule = partial_derivative(expr.fn, position, expr.args, expr)
        ds.append(mul(rule, d))
        bs.append(mul(rule, b))
    return total(ds), total(bs)


def _wirtinger_rule(expr: Call, d: Maybe, b: Maybe, names: frozenset[str]) -> Pair:
    """conj, real, imag and abs of a complex u, whose Wirtinger pair is (d, b)."""
    (u,) = expr.args
    if expr.fn == "conj":
        return conj(b, names), conj(d, names)
    if expr.fn == "real":  # (u + conj(u))/2
        return mul(Num(0.5), add(d, conj(b, names))), mul(Num(0.5), add(b, conj(d, names)))
    if expr.fn == "imag":  # (u - conj(u))/2i
        return mul(Num(-0.5j), sub(d, conj(b, names))), mul(Num(-0.5j), sub(b, conj(d, names)))
    assert expr.fn == "abs", expr.fn  # sqrt(u*conj(u)): (conj(u)*du + u*d(conj(u)))/(2|u|)
    cu = conj(u, names)
    safe = add(expr, cmp("==", expr, Num(0)))  # |u|, or 1 at u = 0: a zero gradient there, as jax's abs rule
    return (mul(Num(0.5), div(add(mul(cu, d), mul(u, conj(b, names))), safe)),
            mul(Num(0.5), div(add(mul(cu, b), mul(u, conj(d, names))), safe)))


def _ifelse_pair(expr: Call, is_var: IsVar, names: frozenset[str]) -> Pair:
    cond, then, other = expr.args
    (d_then, b_then), (d_other, b_other) = wirtinger(then, is_var, names), wirtinger(other, is_var, names)
    return _ifelse_of(cond, d_then, d_other), _ifelse_of(cond, b_then, b_other)


def _ifelse_of(cond: Expr, d_then: Maybe, d_other: Maybe) -> Maybe:
    if d_then is None and d_other is None:
        return None
    if isinstance(cond, Binary) and cond.op in COMPARISONS and d_other is None and is_num(d_then, 1):
        return cond  # a comparison is already 0/1
    return call("ifelse", cond, d_then or Num(0), d_other or Num(0))


def _extremum_pair(expr: Call, is_var: IsVar, names: frozenset[str]) -> Pair:
    """The winner takes the derivative; a tie splits it equally, as jax does (the arguments are real)."""
    a, b = expr.args
    wins = ">" if expr.fn == "max" else "<"
    tie = mul(Num(0.5), cmp("==", a, b))
    w_a, w_b = add(cmp(wins, a, b), tie), add(cmp(wins, b, a), tie)
    (da, ba), (db, bb) = wirtinger(a, is_var, names), wirtinger(b, is_var, names)
    return add(mul(w_a, da), mul(w_b, db)), add(mul(w_a, ba), mul(w_b, bb))
