"""The range of every integer a loop-IR kernel computes, for given size values: interval arithmetic over its
index expressions. A GPU host uses it to print a kernel with 32-bit index arithmetic when every value fits.

Loop variables run over their bounds, ``Let``s take the interval of their value, integer loads the whole range
of the array's dtype (an index array may hold anything), a ``Select`` the hull of its branches. Every integer
sub-expression is checked, not only the final positions: ``2*i + 1`` must fit at ``2*i`` too. Positions are
exact or over-approximated, never under: a value reached only under a guard still counts.

A loaded index (``Let t = ix[b]``, the load possibly cast) may lie outside the bound: the GPU printer declares it
in its array's own type, so it is exact, and comparing it is safe; any other use must sit under a guard (a
``Select`` or ``If`` whose condition is a conjunction of comparisons such as ``t >= 0 && t < n``) that bounds it,
and there it takes the guard's interval (the embedding's gather and scatter then index in 32 bits).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from tullax.compiler.loops import (
    BOOL,
    THREAD,
    Accum,
    Barrier,
    BinOp,
    Buffer,
    Call,
    Cast,
    Combine,
    Const,
    Expr,
    If,
    Let,
    Load,
    Loop,
    LoopKernel,
    Select,
    Shared,
    Stmt,
    Store,
    UnOp,
    Var,
    VectorLoad,
    VectorStore,
    children,
    is_float,
    statement_expressions,
)
from tullax.errors import TullaxError


@dataclass(frozen=True)
class Interval:
    lo: int
    hi: int

    def hull(self, other: "Interval") -> "Interval":
        return Interval(min(self.lo, other.lo), max(self.hi, other.hi))

    def within(self, bound: "Interval") -> bool:
        return bound.lo <= self.lo and self.hi <= bound.hi


BOOLEAN = Interval(0, 1)


@dataclass(frozen=True)
class Loose(Interval):
    """A loaded index declared in its array's own type: exact, only comparable until a guard bounds it."""


def dtype_interval(dtype: str) -> Interval:
    info = np.iinfo(np.dtype(dtype))
    return Interval(int(info.min), int(info.max))


class _Widest(Exception):
    """An integer value outside the bound: nothing more to learn."""


def fits(kernel: LoopKernel, sizes: Mapping[str, int], bound: Interval) -> bool:
    """Whether every integer ``kernel`` computes lies in ``bound`` when its size parameters have ``sizes``."""
    env = {name: Interval(int(v), int(v)) for name, v in sizes.items()}
    if kernel.tile is not None:
        env[THREAD] = Interval(0, kernel.tile.threads - 1)
    try:
        _block(kernel.body, env, bound)
    except _Widest:
        return False
    return True


def _block(stmts: tuple[Stmt, ...], env: dict[str, Interval], bound: Interval) -> None:
    env = dict(env)  # a block's Lets are visible after them in the block, not outside it
    for stmt in stmts:
        if isinstance(stmt, Loop):
            start, stop = _value(stmt.start, env, bound), _value(stmt.stop, env, bound)
            inner = {**env, stmt.var: Interval(start.lo, max(start.lo, stop.hi - 1))}
            _block(stmt.body, inner, bound)
        elif isinstance(stmt, If):
            _value(stmt.cond, env, bound)
            _block(stmt.then, _guarded(stmt.cond, env, bound), bound)
            _block(stmt.orelse, env, bound)
        elif isinstance(stmt, Let):
            loaded = loaded_index(stmt.value)
            if loaded is not None:
                for child in children(loaded):  # the load's own position must fit
                    _value(child, env, bound)
                found = dtype_interval(loaded.dtype)
                env[stmt.var] = found if found.within(bound) else Loose(found.lo, found.hi)
                continue
            value = _value(stmt.value, env, bound)
            if value is not None:
                env[stmt.var] = value
        elif isinstance(stmt, Accum):
            _value(stmt.value, env, bound)
        elif isinstance(stmt, Store):
            for expr in (*stmt.index, stmt.value):
                _value(expr, env, bound)
        elif isinstance(stmt, Buffer):
            _value(stmt.length, env, bound)
        elif isinstance(stmt, (VectorLoad, VectorStore)):
            for expr in statement_expressions(stmt):  # binds floats only
                _value(expr, env, bound)
        elif isinstance(stmt, (Combine, Shared, Barrier)):
            continue  # floats only, or no values
        else:
            raise TullaxError(f"internal error: no interval rule for the loop IR statement {stmt!r}")


def loaded_index(expr: Expr) -> Load | None:
    """The integer load ``expr`` binds (directly or cast to another integer type), or None."""
    inner = expr.arg if isinstance(expr, Cast) else expr
    if isinstance(inner, Load) and not is_float(inner.dtype) and inner.dtype != BOOL and \
            not inner.dtype.startswith("complex") and not is_float(expr.dtype):
        return inner
    return None


_BOUNDS = {">=": (0, None), ">": (1, None), "<": (None, -1), "<=": (None, 0)}  # t op e: t's new lo or hi is e + k
_MIRROR = {">=": "<=", ">": "<", "<": ">", "<=": ">="}


def _guarded(cond: Expr, env: Mapping[str, Interval], bound: Interval) -> dict[str, Interval]:
    """``env`` where ``cond`` holds: each loose loaded index that a conjunct of ``cond`` compares with a bounded
    value narrowed by it; once bounded on both sides it is an ordinary interval."""
    env = dict(env)
    stack = [cond]
    while stack:
        term = stack.pop()
        if not isinstance(term, BinOp):
            continue
        if term.op == "and":
            stack += [term.lhs, term.rhs]
            continue
        op, var, other = term.op, term.lhs, term.rhs
        if not isinstance(var, Var) or not isinstance(env.get(var.name), Loose):
            op, var, other = _MIRROR.get(op, op), term.rhs, term.lhs
        if op not in _BOUNDS or not isinstance(var, Var) or not isinstance(env.get(var.name), Loose):
            continue
        limit = _value(other, env, bound)
        if limit is None or isinstance(limit, Loose):
            continue
        current, (low, high) = env[var.name], _BOUNDS[op]
        lo = max(current.lo, limit.lo + low) if low is not None else current.lo
        hi = min(current.hi, limit.hi + high) if high is not None else current.hi
        narrowed = Interval(lo, max(lo, hi))
        env[var.name] = narrowed if narrowed.within(bound) else Loose(lo, max(lo, hi))
    return env


def _value(expr: Expr, env: Mapping[str, Interval], bound: Interval) -> Interval | None:
    """The interval of an integer or bool ``expr`` (None for a float), checking its integer parts."""
    if isinstance(expr, Select):  # its chosen branch is evaluated only where the condition holds
        _value(expr.cond, env, bound)
        parts = [BOOLEAN, _value(expr.then, _guarded(expr.cond, env, bound), bound), _value(expr.orelse, env, bound)]
    else:
        parts = [_value(child, env, bound) for child in children(expr)]
    if is_float(expr.dtype) or expr.dtype.startswith("complex"):
        return None
    if expr.dtype == BOOL:
        if isinstance(expr, BinOp) and expr.op not in ("and", "or") and \
                any(isinstance(p, Loose) for p in parts) and any(is_float(c.dtype) for c in children(expr)):
            raise _Widest  # a loose index compared with a float is converted, not compared in its own type
        return BOOLEAN
    if isinstance(expr, Var) and isinstance(env.get(expr.name), Loose):
        return env[expr.name]  # exact in its own declaration; arithmetic on it is checked below
    if any(isinstance(p, Loose) for p in parts):
        raise _Widest  # arithmetic on an unguarded loaded index
    found = _integer(expr, parts, env)
    if not found.within(bound):
        raise _Widest
    return found


def _integer(expr: Expr, parts: list[Interval | None], env: Mapping[str, Interval]) -> Interval:
    if isinstance(expr, Const):
        return Interval(int(expr.value), int(expr.value))
    if isinstance(expr, Var):
        return env.get(expr.name, dtype_interval(expr.dtype))
    if isinstance(expr, Load):
        return dtype_interval(expr.dtype)
    if isinstance(expr, Cast):
        return parts[0] if parts[0] is not None else dtype_interval(expr.dtype)
    if isinstance(expr, Select):
        return parts[1].hull(parts[2])
    if isinstance(expr, UnOp):  # neg
        return Interval(-parts[0].hi, -parts[0].lo)
    if isinstance(expr, Call):  # abs
        (a,) = parts
        return Interval(0 if a.lo <= 0 <= a.hi else min(abs(a.lo), abs(a.hi)), max(abs(a.lo), abs(a.hi)))
    if isinstance(expr, BinOp):
        return _binary(expr.op, parts[0], parts[1])
    raise TullaxError(f"internal error: no interval rule for the loop IR node {expr!r}")


def _binary(op: str, a: Interval, b: Interval) -> Interval:
    if op == "+":
        return Interval(a.lo + b.lo, a.hi + b.hi)
    if op == "-":
        return Interval(a.lo - b.hi, a.hi - b.lo)
    if op in ("*", "//"):
        if op == "//" and b.lo <= 0 <= b.hi:
            raise _Widest  # a divisor that may be zero: no bound
        combine = (lambda x, y: x * y) if op == "*" else (lambda x, y: x // y)
        corners = [combine(x, y) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
        # floor division may also truncate: the quotient of the extremes is the widest (a // b is monotone)
        return Interval(min(corners), max(corners))
    if op == "mod":  # floor modulo: the sign of the divisor, smaller than it
        top = max(abs(b.lo), abs(b.hi))
        return Interval(-top if b.lo < 0 else 0, top if b.hi > 0 else 0)
    if op == "max":
        return Interval(max(a.lo, b.lo), max(a.hi, b.hi))
    if op == "min":
        return Interval(min(a.lo, b.lo), min(a.hi, b.hi))
    raise TullaxError(f"internal error: no interval rule for the integer operator {op!r}")


__all__ = ["Interval", "Loose", "fits", "dtype_interval", "loaded_index"]
