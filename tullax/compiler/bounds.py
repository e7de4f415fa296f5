"""Conditions as loop bounds and guard expressions: the second half of guarding, which writes through the emitter.

``guards`` finds and solves the conditions (pure); here an inequality whose innermost index has a serial loop
narrows that loop's bounds, and every other condition becomes a guard at the level where its indices are known.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from tullax.compiler.emit import Emitter, Phase
from tullax.compiler.guards import Cond, Rel
from tullax.compiler.loops import Expr, binop, const, negate
from tullax.compiler.schedule import Schedule
from tullax.spec.sizes import Sym


class Side(Enum):
    START = "start"  # the loop starts at the maximum of its range's start and these bounds
    STOP = "stop"  # ... and stops at the minimum of its range's stop and these


@dataclass(frozen=True)
class Bound:
    index: str  # the spec index whose loop it narrows
    side: Side
    value: Expr


def narrow(conds: tuple[Cond, ...], schedule: Schedule, emit: Emitter) -> tuple[Bound, ...]:
    """An inequality whose innermost index has a serial loop narrows that loop's bounds (no test per
    iteration); every other condition becomes a guard at the level where its indices are known."""
    bounds = []
    for cond in conds:
        inner = max(cond.names(), key=schedule.level, default=None)
        if cond.rel == Rel.NONNEGATIVE and inner in schedule.loops and inner not in schedule.parallel:
            coef = cond.coef(inner)
            others = tuple((n, c) for n, c in cond.terms if n != inner)
            bounds.append(_bound(inner, coef, others, cond.const, emit))
        else:
            emit.guard(cond_expr(cond, emit), Phase.LINEAR_GUARD)
    return tuple(bounds)


def _bound(index: str, coef: int, others: tuple[tuple[str, int], ...], const_part: Sym, emit: Emitter) -> Bound:
    """``coef*v + rest >= 0`` as a bound on v: ``v >= ceil(-rest/coef)`` or ``v < floor(rest/-coef) + 1``."""
    if coef == 1:
        return Bound(index, Side.START, emit.linear(tuple((n, -c) for n, c in others), -const_part))
    if coef == -1:
        return Bound(index, Side.STOP, emit.linear(others, const_part + 1))
    rest = emit.linear(others, const_part)
    if coef > 0:
        return Bound(index, Side.START, negate(binop("//", rest, const(coef))))
    return Bound(index, Side.STOP, binop("+", binop("//", rest, const(-coef)), const(1)))


def cond_expr(cond: Cond, emit: Emitter) -> Expr:
    """The condition as a comparison, solved for a unit-coefficient index when there is one."""
    if cond.rel != Rel.DIVISIBLE:
        unit = [n for n, c in cond.terms if abs(c) == 1]
        if unit:
            name = unit[-1]
            coef = cond.coef(name)
            others = tuple((n, -c * coef) for n, c in cond.terms if n != name)
            rhs = emit.linear(others, -cond.const * coef)  # v == rhs, or v >= rhs / v <= rhs
            index = emit.index_var(name)
            if cond.rel == Rel.ZERO:
                return binop("==", index, rhs)
            if coef > 0:
                return binop(">=", index, rhs)
            return binop("<", index, binop("+", rhs, const(1)))
    value = emit.linear(cond.terms, cond.const)
    if cond.rel == Rel.NONNEGATIVE:
        return binop(">=", value, const(0))
    if cond.rel == Rel.ZERO:
        return binop("==", value, const(0))
    return binop("==", binop("mod", value, const(cond.div)), const(0))
