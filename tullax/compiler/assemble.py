"""The loop nest of a kernel from its schedule, its loop bounds and the statements placed at each level.

Inside the loop of a level come the statements placed there (Lets in order; a guard wraps everything after
it, consecutive guards merge into one ``If``), then the next loop, and the innermost statements at the
bottom. The parallel loops wrap the per-element block of the innermost one as a perfect nest.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from tullax.compiler.emit import Guard, Placed, Placements
from tullax.compiler.loops import Expr, If, Loop, Stmt, conjunction
from tullax.compiler.schedule import Schedule


@dataclass(frozen=True)
class Nest:
    """Everything the loop nest is made of, once the emitter has placed every statement."""

    schedule: Schedule
    placements: Placements
    bounds: tuple[tuple[str, Expr, Expr], ...]  # loop index -> start, stop

    def _bounds(self, name: str) -> tuple[Expr, Expr]:
        return next((start, stop) for index, start, stop in self.bounds if index == name)

    def block(self, innermost: list[Stmt]) -> list[Stmt]:
        """The per-element block: the statements of the innermost parallel level and the serial loops inside
        it, ``innermost`` in the innermost loop."""
        return self._level(self.schedule.top, innermost)

    def _level(self, level: int, innermost: list[Stmt]) -> list[Stmt]:
        loops = self.schedule.loops
        if level + 1 < len(loops):
            name = loops[level + 1]
            start, stop = self._bounds(name)
            inner = [Loop(self.schedule.var(name), start, stop, False, tuple(self._level(level + 1, innermost)))]
        else:
            inner = list(innermost)
        return _wrap(self.placements.at(level), inner)

    def parallel(self, block: list[Stmt]) -> list[Stmt]:
        """``block`` inside the parallel loops."""
        for name in reversed(self.schedule.parallel):
            start, stop = self._bounds(name)
            block = [Loop(self.schedule.var(name), start, stop, True, tuple(block))]
        return block


def _wrap(items: list[Placed], inner: list[Stmt]) -> list[Stmt]:
    """Lets in order; a guard wraps everything after it (consecutive guards merge into one If)."""
    out: list[Stmt] = []
    for k, item in enumerate(items):
        if isinstance(item.stmt, Guard):
            guards = [item.stmt.cond]
            rest = items[k + 1:]
            while rest and isinstance(rest[0].stmt, Guard):
                guards.append(rest[0].stmt.cond)
                rest = rest[1:]
            out.append(If(conjunction(guards), tuple(_wrap(rest, inner))))
            return out
        out.append(item.stmt)
    return out + inner


def mark_reduce_parallel(stmt: Stmt) -> Stmt:
    """The outermost reduction loop of a kernel without parallel loops (possibly inside top-level guards)."""
    if isinstance(stmt, Loop):
        return replace(stmt, reduce_parallel=True)
    if isinstance(stmt, If):
        return replace(stmt, then=tuple(mark_reduce_parallel(s) for s in stmt.then))
    return stmt
