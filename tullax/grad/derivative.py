"""Symbolic derivatives of body expressions (jax's conventions at the kinks: |x|' = 1 at 0, relu'(0) = 0,
max/min split ties).

The rules of the "call" functions come from the function registry (``tullax.spec.functions``): each is a
formula in the spec language over ``x`` (the argument; ``x1``, ``x2``, ... for one rule per argument of a
function of several) and ``y`` (the value f(x)), parsed once and rebuilt through the simplifying constructors of
``grad.algebra`` for every use; the chain rule sums over the arguments. ``max``, ``min`` and
``ifelse`` have structural rules here.
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

IsVar = Callable[[Expr], bool]


def derivative(expr: Expr, is_var: IsVar) -> Maybe:
    """∂expr/∂v where ``is_var`` picks the nodes that are the variable v (None: zero)."""
    if is_var(expr):
        return Num(1)
    if isinstance(expr, Unary):
        return neg(derivative(expr.arg, is_var))
    if isinstance(expr, Binary):
        return _binary_derivative(expr, is_var)
    if isinstance(expr, Call):
        return _call_derivative(expr, is_var)
    return None  # numbers, other inputs, index values


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


def _binary_derivative(expr: Binary, is_var: IsVar) -> Maybe:
    a, b, op = expr.lhs, expr.rhs, expr.op
    da, db = derivative(a, is_var), derivative(b, is_var)
    if op in ("+", "-"):
        return add(da, db) if op == "+" else sub(da, db)
    if op == "*":
        return add(mul(da, b), mul(a, db))
    if op == "/":
        return sub(div(da, b), mul(db, Binary("/", a, power(b, 2))))
    if op == "^":
        return _power_derivative(expr, da, db)
    return None  # comparisons are piecewise constant


def _power_derivative(expr: Binary, da: Maybe, db: Maybe) -> Maybe:
    a, b = expr.lhs, expr.rhs
    exponent = literal(b)
    if exponent is not None:
        return mul(mul(Num(exponent), power(a, exponent - 1)), da)
    d_base = mul(mul(b, Binary("^", a, sub(b, Num(1)))), da)
    return add(d_base, mul(mul(call("log", a), expr), db))


def _call_derivative(expr: Call, is_var: IsVar) -> Maybe:
    if expr.fn == "ifelse":
        return _ifelse_derivative(expr, is_var)
    if expr.fn in ("max", "min"):
        return _extremum_derivative(expr, is_var)
    terms = []
    for position, arg in enumerate(expr.args):  # the chain rule over every argument
        inner = derivative(arg, is_var)
        if inner is not None:
            terms.append(mul(partial_derivative(expr.fn, position, expr.args, expr), inner))
    return total(terms)


def _ifelse_derivative(expr: Call, is_var: IsVar) -> Maybe:
    cond, then, other = expr.args
    d_then, d_other = derivative(then, is_var), derivative(other, is_var)
    if d_then is None and d_other is None:
        return None
    if isinstance(cond, Binary) and cond.op in COMPARISONS and d_other is None and is_num(d_then, 1):
        return cond  # a comparison is already 0/1
    return call("ifelse", cond, d_then or Num(0), d_other or Num(0))


def _extremum_derivative(expr: Call, is_var: IsVar) -> Maybe:
    """The winner takes the derivative; a tie splits it equally, as jax does."""
    a, b = expr.args
    wins = ">" if expr.fn == "max" else "<"
    tie = mul(Num(0.5), cmp("==", a, b))
    d_a = mul(add(cmp(wins, a, b), tie), derivative(a, is_var))
    d_b = mul(add(cmp(wins, b, a), tie), derivative(b, is_var))
    return add(d_a, d_b)
