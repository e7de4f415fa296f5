"""Factors that do not change along an inner sum, taken out of it: sum over d of c*g(d) -> c * (sum over d of g(d)).

The Gaussian kernel sum's gradient w.r.t. x, ``Δx[i,m] := -ΔK[i,d]*(exp(..)*(2*(x[i,m]-y[j,m]))*b[j,d])``, runs
its three cases of m as three accumulators (``tullax.compiler.jam``) and sums over d innermost::

    for d in 0:n                                         s = 0
        acc_0 += -(ΔK[i,d] * (t0 * b[j,d]))               for d in 0:n
        acc_1 += -(ΔK[i,d] * (t1 * b[j,d]))      ->           s += ΔK[i,d] * b[j,d]
        acc_2 += -(ΔK[i,d] * (t2 * b[j,d]))               acc_0 += -(t0 * s); acc_1 += -(t1 * s); ...

with t_m (the exp times 2*(x[i,m]-y[j,m])) the same for every d: one multiply-add per d instead of three, and
the three sums of the same products become one. The sum is the same in real arithmetic; in floating point the
products are rounded differently (as a vectorised or blocked sum reorders its terms anyway).

Rewritten: a serial loop whose body is only ``+`` accumulations (no Let, store, guard or inner loop), each value
a product (negations included) whose factors split into the invariant ones (reading neither the loop variable
nor an accumulator the loop updates) and the rest, the rest the same product in every accumulation (the same
factors in the same order), and at least one invariant factor somewhere. Anything else stays as it was.
"""
from __future__ import annotations

from dataclasses import replace

from tullax.compiler.loops import (
    Accum,
    BinOp,
    Const,
    Expr,
    If,
    Let,
    Loop,
    LoopKernel,
    Stmt,
    UnOp,
    Var,
    expr_vars,
    is_float,
    walk_stmts,
)


def factor_sums(kernel: LoopKernel, each: bool = False) -> LoopKernel:
    """``kernel`` with the invariant factors of every loop of the pattern (module doc) taken out of its sum.
    ``each``: accumulations whose rests differ (a register tile's dot products, attention's scores
    ``q[i,d]*k[j,d]*0.125``) each sum their own rest and multiply by their invariant factors once after, where
    every accumulation has one: a multiply per term fewer."""
    taken = {s.var for s in walk_stmts(kernel.body) if hasattr(s, "var")}
    return replace(kernel, body=_rewrite(kernel.body, taken, each))


def _rewrite(stmts: tuple[Stmt, ...], taken: set[str], each: bool = False) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for stmt in stmts:
        if isinstance(stmt, Loop):
            loop = replace(stmt, body=_rewrite(stmt.body, taken, each))
            out += _factored(loop, taken, each) or [loop]
        elif isinstance(stmt, If):
            out.append(replace(stmt, then=_rewrite(stmt.then, taken, each),
                               orelse=_rewrite(stmt.orelse, taken, each)))
        else:
            out.append(stmt)
    return tuple(out)


def _product_factors(expr: Expr) -> tuple[int, list[Expr]]:
    """(sign, factors) of a float product: ``-(a * (b * c))`` -> (-1, [a, b, c])."""
    if isinstance(expr, UnOp) and expr.op == "neg" and is_float(expr.dtype):
        sign, factors = _product_factors(expr.arg)
        return -sign, factors
    if isinstance(expr, BinOp) and expr.op == "*" and is_float(expr.dtype) and \
            expr.lhs.dtype == expr.rhs.dtype == expr.dtype:
        left_sign, left = _product_factors(expr.lhs)
        right_sign, right = _product_factors(expr.rhs)
        return left_sign * right_sign, left + right
    return 1, [expr]


def _product(factors: list[Expr], sign: int, dtype: str) -> Expr:
    value: Expr | None = None
    for factor in factors:
        value = factor if value is None else BinOp("*", value, factor, dtype)
    value = Const(1.0, dtype) if value is None else value
    return UnOp("neg", value, dtype) if sign < 0 else value


def _factored(loop: Loop, taken: set[str], each: bool = False) -> list[Stmt] | None:
    if loop.parallel or loop.reduce_parallel or not loop.body:
        return None
    if not all(isinstance(s, Accum) and s.op == "+" and is_float(s.value.dtype) for s in loop.body):
        return None
    varying = {loop.var} | {s.var for s in loop.body if isinstance(s, Accum)}
    split = []
    for stmt in loop.body:
        assert isinstance(stmt, Accum)
        sign, factors = _product_factors(stmt.value)
        invariant = [f for f in factors if not expr_vars(f) & varying]
        rest = [f for f in factors if expr_vars(f) & varying]
        split.append((stmt, sign, invariant, rest))
    rests = {tuple(rest) for _, _, _, rest in split}
    if each and len(rests) == len(split) > 1 and all(rest and invariant for _, _, invariant, rest in split):
        return _factored_each(loop, split, taken)
    if len(rests) != 1 or not next(iter(rests)) or not any(invariant for _, _, invariant, _ in split):
        return None
    dtype = split[0][0].value.dtype
    if any(stmt.value.dtype != dtype for stmt, _, _, _ in split):
        return None
    total = _fresh(f"{loop.var}_s", taken)
    rest = list(next(iter(rests)))
    summed = replace(loop, body=(Accum(total, "+", _product(rest, 1, dtype)),))
    after = [Accum(stmt.var, "+", _product(invariant + [Var(total, dtype)], sign, dtype))
             for stmt, sign, invariant, _ in split]
    return [Let(total, Const(0.0, dtype)), summed, *after]


def _factored_each(loop: Loop, split: list, taken: set[str]) -> list[Stmt] | None:
    """Each accumulation summing its own rest (``factor_sums(each=True)``)."""
    if len({stmt.value.dtype for stmt, _, _, _ in split}) != 1:
        return None
    dtype = split[0][0].value.dtype
    totals = [_fresh(f"{loop.var}_s", taken) for _ in split]
    summed = replace(loop, body=tuple(Accum(total, "+", _product(rest, 1, dtype))
                                      for total, (_, _, _, rest) in zip(totals, split)))
    after = [Accum(stmt.var, "+", _product(invariant + [Var(total, dtype)], sign, dtype))
             for total, (stmt, sign, invariant, _) in zip(totals, split)]
    return [*(Let(total, Const(0.0, dtype)) for total in totals), summed, *after]


def _fresh(name: str, taken: set[str]) -> str:
    found, number = name, 1
    while found in taken:
        found, number = f"{name}{number}", number + 1
    taken.add(found)
    return found


__all__ = ["factor_sums"]
