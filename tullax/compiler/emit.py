"""The one mutable builder of a lowering: generated names, size parameters, and the statements placed at
each loop level (solved indices, guards, index temporaries, hoisted values).

Every name in a kernel is numbered in the order the lowering first asks for it, so the same lowering steps
in the same order give the same kernel. Statements are not nested here: each is recorded with its level and
a ``Phase``, and ``assemble`` builds the loop nest from the recorded ``Placements``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from enum import IntEnum

from tullax.compiler.loops import (
    INDEX,
    BinOp,
    Call,
    Cast,
    Const,
    Expr,
    Let,
    Load,
    Select,
    SizeArg,
    UnOp,
    Var,
    binop,
    const,
    expr_vars,
    walk_expr,
)
from tullax.compiler.schedule import Schedule
from tullax.spec.ir import Indirect
from tullax.spec.sizes import Sym


class Phase(IntEnum):
    """Where a statement goes among those of its loop level: in this order, and in the order placed within a
    phase. A guard wraps everything after it at its level and deeper."""

    SOLVED_INDEX = 0  # ``k = m // 2``: the guards may read it
    LINEAR_GUARD = 1  # conditions on indices: they keep the index temporaries' positions in range
    INDEX_TEMP = 2  # ``t = ix[e]``, read once
    DATA_GUARD = 3  # conditions that may read index temporaries (an index array pointing outside, ``!=``)
    HOISTED = 4  # loads and calls: after every guard that protects them


@dataclass(frozen=True)
class Guard:
    cond: Expr


@dataclass(frozen=True)
class Placed:
    level: int
    phase: Phase
    seq: int  # placement order: the order within a phase
    stmt: Let | Guard


@dataclass(frozen=True)
class Placements:
    items: tuple[Placed, ...]

    def at(self, level: int) -> list[Placed]:
        """The statements of ``level`` in the order they are emitted."""
        return sorted((i for i in self.items if i.level == level), key=lambda i: (i.phase, i.seq))

    @property
    def has_guards(self) -> bool:
        return any(isinstance(i.stmt, Guard) for i in self.items)


class Emitter:
    """Numbers names in the order they are asked for and records placed statements. Its state is set up
    here whole: any method may be called at any time, and reads only what earlier calls recorded."""

    def __init__(self, schedule: Schedule):
        self._schedule = schedule
        self._var_of = dict(schedule.variables)
        # generated variable -> the level where its value is known (loop variables, solved indices, temps)
        self._levels = {self._var_of[name]: level for level, name in enumerate(schedule.loops)}
        self._levels.update({self._var_of[name]: level for name, level in schedule.solved})
        self._sizes: dict[Sym, SizeArg] = {}
        self._placed: list[Placed] = []
        self._hoisted: dict[Expr, str] = {}  # hoisted value -> its temporary (CSE)
        self._index_temps: dict[Indirect, str] = {}
        self._temps = 0

    # -- names ---------------------------------------------------------------------------------
    def _fresh(self) -> str:
        self._temps += 1
        return f"t{self._temps - 1}"

    def index_var(self, name: str) -> Var:
        """The loop variable of spec index ``name`` (or of the variable its solution binds)."""
        return Var(self._var_of[name], INDEX)

    def size(self, sym: Sym) -> Expr:
        """An integer expression for a symbolic size: a constant, or a size parameter plus a constant."""
        return self.linear((), sym)

    def extent(self, array: str, axis: int) -> Expr:
        return self.size(Sym.extent(array, axis))

    def _size_param(self, sym: Sym) -> tuple[Var, int]:
        """The parameter holding the symbolic part of ``sym`` (sign-normalised: -size(x,0) reuses size(x,0))."""
        base = Sym(0, sym.terms)
        sign = -1 if all(c < 0 for _, c in base.terms) else 1
        base = base * sign
        if base not in self._sizes:
            self._sizes[base] = SizeArg(f"n{len(self._sizes)}", base)
        return Var(self._sizes[base].name, INDEX), sign

    def linear(self, terms: tuple[tuple[str, int], ...], const_part: Sym) -> Expr:
        """``sum(coef * index) + const`` as an integer expression (positive terms first when there are any)."""
        parts: list[tuple[Expr, int]] = []
        for name, coef in terms:
            term: Expr = self.index_var(name)
            parts.append((term if abs(coef) == 1 else binop("*", const(abs(coef)), term), 1 if coef > 0 else -1))
        if not const_part.is_const:
            parts.append(self._size_param(const_part))
        parts.sort(key=lambda p: -p[1])  # stable: a leading positive term avoids a negation
        out: Expr | None = None
        for term, sign in parts:
            if out is None:
                out = term if sign > 0 else UnOp("neg", term, INDEX)
            else:
                out = binop("+" if sign > 0 else "-", out, term)
        if out is None:
            return const(const_part.const)
        return binop("+", out, const(const_part.const))

    def size_args(self) -> tuple[SizeArg, ...]:
        """The size parameters asked for so far, in the order they were numbered."""
        return tuple(self._sizes.values())

    # -- placing statements --------------------------------------------------------------------
    def expr_level(self, expr: Expr) -> int:
        """The level where every variable of ``expr`` is known (at least the per-element block)."""
        top = self._schedule.top
        return max([top] + [self._levels.get(v, top) for v in expr_vars(expr)])

    def _place(self, level: int, phase: Phase, stmt: Let | Guard) -> None:
        self._placed.append(Placed(level, phase, len(self._placed), stmt))

    def solved_index(self, name: str, value: Expr) -> None:
        """The Let of an index solved from an equality, at the level the schedule gave it."""
        self._place(dict(self._schedule.solved)[name], Phase.SOLVED_INDEX, Let(self._var_of[name], value))

    def guard(self, cond: Expr, phase: Phase) -> None:
        """A condition around everything after it, at the level where its variables are known."""
        self._place(self.expr_level(cond), phase, Guard(cond))

    def index_temp(self, idx: Indirect, value: Expr) -> Var:
        """``ix[e]`` (its ``value``) read once into a temporary at the level where e is known."""
        if idx not in self._index_temps:
            name = self._fresh()
            level = self.expr_level(value)
            self._index_temps[idx] = name
            self._levels[name] = level
            self._place(level, Phase.INDEX_TEMP, Let(name, value))
        return Var(self._index_temps[idx], INDEX)

    def placements(self) -> Placements:
        return Placements(tuple(self._placed))

    # -- hoisting ------------------------------------------------------------------------------
    def hoist(self, expr: Expr) -> Expr:
        """``expr`` (of the innermost loop) with its sub-expressions with loads or calls that are known further
        out bound to temporaries there."""
        return self._hoist(expr, self._schedule.innermost)

    def _hoist(self, expr: Expr, inner: int) -> Expr:
        """Bind sub-expressions with loads or calls that are known above level ``inner`` to temporaries
        there. Never out of a Select branch (it may be valid only when the condition holds)."""
        level = self.expr_level(expr)
        if level < inner and not isinstance(expr, (Const, Var)) and _costly(expr):
            expr = self._hoist_children(expr, level)  # parts known even further out go further out
            if expr in self._hoisted:
                return Var(self._hoisted[expr], expr.dtype)
            name = self._fresh()
            self._hoisted[expr] = name
            self._levels[name] = level
            self._place(level, Phase.HOISTED, Let(name, expr))
            return Var(name, expr.dtype)
        return self._hoist_children(expr, inner)

    def _reuse(self, expr: Expr) -> Expr:
        """Replace sub-expressions that a hoisted temporary already holds (its Let dominates every deeper
        statement: guards at its level come before it and wrap everything after)."""
        if expr in self._hoisted and not isinstance(expr, (Const, Var)):
            return Var(self._hoisted[expr], expr.dtype)
        if isinstance(expr, Select):
            return replace(expr, cond=self._reuse(expr.cond), then=self._reuse(expr.then),
                           orelse=self._reuse(expr.orelse))
        if isinstance(expr, BinOp):
            return replace(expr, lhs=self._reuse(expr.lhs), rhs=self._reuse(expr.rhs))
        if isinstance(expr, (UnOp, Cast)):
            return replace(expr, arg=self._reuse(expr.arg))
        if isinstance(expr, Call):
            return replace(expr, args=tuple(self._reuse(a) for a in expr.args))
        return expr

    def _hoist_children(self, expr: Expr, inner: int) -> Expr:
        if isinstance(expr, Select):  # branches: only reuse values already computed unconditionally
            return replace(expr, cond=self._hoist(expr.cond, inner), then=self._reuse(expr.then),
                           orelse=self._reuse(expr.orelse))
        if isinstance(expr, Load):
            return expr  # its index arithmetic is cheap
        if isinstance(expr, BinOp):
            return replace(expr, lhs=self._hoist(expr.lhs, inner), rhs=self._hoist(expr.rhs, inner))
        if isinstance(expr, (UnOp, Cast)):
            return replace(expr, arg=self._hoist(expr.arg, inner))
        if isinstance(expr, Call):
            return replace(expr, args=tuple(self._hoist(a, inner) for a in expr.args))
        return expr


def _costly(expr: Expr) -> bool:
    return any(isinstance(n, (Load, Call)) for n in walk_expr(expr))
