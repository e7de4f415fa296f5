"""Rewrites of loop-IR statements that share work: substitution with folding, common subexpressions, dead Lets.

* ``substitute`` replaces variables by expressions and folds what becomes constant: integer arithmetic and
  comparisons of literals, ``and``/``or`` of known truth values, ``Select`` and ``If`` on a known condition,
  and the indicator product ``x * float(c)`` of a known comparison ``c``: ``x`` when it holds, ``0`` when not.
  That last fold treats a comparison used as a number as a Kronecker delta (a strong zero): the gradient of a
  function of ``x[i,0], x[i,1], ...`` w.r.t. ``x[i,m]`` is a sum of terms each multiplied by ``(m == c)``, and
  at a known ``m`` the other terms are not part of the derivative (jax.grad never evaluates them either).
  A sum then loses its zero terms, and ``acc += 0`` disappears.
* ``share_subexpressions``: an expression that a straight-line block evaluates twice or more is bound once to a
  ``Let`` before its first use (``cs0``, ``cs1`` ...), when nothing it reads is reassigned from there on in that block,
  the largest first: any function call (``exp``, ``log`` ...), and any other expression of
  ``SHARED_MIN_NODES`` nodes or more that reads data (index arithmetic is the compilers' to share). One found
  only inside ``Select`` branches is computed before the statement whichever branch runs, so only from
  ``SPECULATED_MIN_NODES`` nodes on (a product gradient's body appears in every case of its zero-count rule),
  and only when nothing in it can trap: no integer division by a variable, no read from inside a pad or index
  check (the one kind of load that may be out of range, ``tullax.compiler.loops``). Never across blocks.
* ``drop_dead_lets``: a ``Let`` whose name nothing reads any more (after the folds) is removed.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping

from tullax.compiler.loops import (
    BOOL,
    COMPARE,
    INDEX,
    Accum,
    Barrier,
    BinOp,
    Buffer,
    Call,
    Cast,
    Const,
    Expr,
    If,
    Let,
    Load,
    Loop,
    Scratch,
    Select,
    Shared,
    Stmt,
    Store,
    UnOp,
    Var,
    binop,
    children,
    is_float,
    negate,
    statement_expressions,
    walk_expr,
    walk_stmts,
)

SHARED_PREFIX = "cs"  # names of shared calls: no other generated name starts with it

_COMPARE_FN: dict[str, Callable[[object, object], bool]] = {
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
}


def _is_zero(expr: Expr) -> bool:
    return isinstance(expr, Const) and is_float(expr.dtype) and expr.value == 0


def _known(expr: Expr) -> bool | None:
    return expr.value if isinstance(expr, Const) and expr.dtype == BOOL else None


def _indicator(expr: Expr) -> bool | None:
    """The truth value of ``float(cond)`` when ``cond`` folded to a constant, else None."""
    if isinstance(expr, Cast) and is_float(expr.dtype) and expr.arg.dtype == BOOL:
        return _known(expr.arg)
    return None


def fold(expr: Expr) -> Expr:
    """One node with already folded children (see the module doc)."""
    if isinstance(expr, BinOp):
        lhs, rhs, op = expr.lhs, expr.rhs, expr.op
        if op in COMPARE and isinstance(lhs, Const) and isinstance(rhs, Const) and lhs.dtype == rhs.dtype == INDEX:
            return Const(_COMPARE_FN[op](lhs.value, rhs.value), BOOL)
        if op in ("and", "or") and (_known(lhs) is not None or _known(rhs) is not None):
            known, other = (lhs, rhs) if _known(lhs) is not None else (rhs, lhs)
            if op == "and":
                return other if known.value else Const(False, BOOL)
            return Const(True, BOOL) if known.value else other
        if op == "*" and is_float(expr.dtype):
            for a, b in ((lhs, rhs), (rhs, lhs)):
                holds = _indicator(b)
                if holds is not None:
                    return a if holds else Const(0.0, expr.dtype)
            if _is_zero(lhs) and _is_zero(rhs):
                return Const(0.0, expr.dtype)
        if op == "+" and is_float(expr.dtype):
            if _is_zero(rhs):
                return lhs
            if _is_zero(lhs):
                return rhs
        if op == "-" and is_float(expr.dtype):
            if _is_zero(rhs):
                return lhs
            if _is_zero(lhs):
                return negate(rhs)
        if op in ("+", "-") and expr.dtype == INDEX and isinstance(rhs, BinOp) and rhs.op in ("+", "-") \
                and isinstance(rhs.rhs, Const):  # x ± (y ± c) -> (x ± y) ± c: a copy's offset stays last
            shift = rhs.rhs.value if rhs.op == "+" else -rhs.rhs.value
            return binop("+", binop(op, lhs, rhs.lhs), Const(shift if op == "+" else -shift, INDEX))
        return binop(op, lhs, rhs, expr.dtype)
    if isinstance(expr, UnOp):
        if expr.op == "neg" and _is_zero(expr.arg):
            return Const(0.0, expr.dtype)
        if expr.op == "not" and _known(expr.arg) is not None:
            return Const(not expr.arg.value, BOOL)
        return expr
    if isinstance(expr, Select) and _known(expr.cond) is not None:
        return expr.then if expr.cond.value else expr.orelse
    if isinstance(expr, Cast) and isinstance(expr.arg, Const) and expr.arg.dtype == INDEX:
        return Const(float(expr.arg.value), expr.dtype) if is_float(expr.dtype) else expr
    return expr


def substitute(expr: Expr, values: Mapping[str, Expr]) -> Expr:
    """``expr`` with the variables of ``values`` replaced (by name), folded bottom-up; a Scratch array mapped to
    an integer expression has its positions shifted by it."""
    if isinstance(expr, Var):
        return values.get(expr.name, expr)
    if isinstance(expr, Const):
        return expr
    if isinstance(expr, Load):
        return replace(expr, index=_position(expr.array, tuple(substitute(i, values) for i in expr.index), values))
    if isinstance(expr, BinOp):
        return fold(replace(expr, lhs=substitute(expr.lhs, values), rhs=substitute(expr.rhs, values)))
    if isinstance(expr, (UnOp, Cast)):
        return fold(replace(expr, arg=substitute(expr.arg, values)))
    if isinstance(expr, Call):
        return replace(expr, args=tuple(substitute(a, values) for a in expr.args))
    assert isinstance(expr, Select), expr
    return fold(replace(expr, cond=substitute(expr.cond, values), then=substitute(expr.then, values),
                        orelse=substitute(expr.orelse, values)))


def _position(array: str, index: tuple[Expr, ...], values: Mapping[str, Expr]) -> tuple[Expr, ...]:
    """A Scratch array that ``values`` maps to an integer expression shifts its one position by that much (the
    copies of a register tile share one Scratch array, each in its own segment)."""
    shift = values.get(array)
    if shift is not None and shift.dtype == INDEX:
        return (binop("+", index[0], shift),)
    return index


def _renamed(name: str, values: Mapping[str, Expr]) -> str:
    value = values.get(name)
    return value.name if isinstance(value, Var) else name


def substitute_stmts(stmts: tuple[Stmt, ...], values: Mapping[str, Expr]) -> tuple[Stmt, ...]:
    """Statements with ``values`` substituted (assigned names renamed when they map to a ``Var``); an ``If``
    on a known condition becomes its branch, ``acc += 0`` goes."""
    out: list[Stmt] = []
    for stmt in stmts:
        if isinstance(stmt, Let):
            out.append(Let(_renamed(stmt.var, values), substitute(stmt.value, values)))
        elif isinstance(stmt, Accum):
            value = substitute(stmt.value, values)
            if not (stmt.op == "+" and _is_zero(value)):
                out.append(Accum(_renamed(stmt.var, values), stmt.op, value))
        elif isinstance(stmt, (Scratch, Shared, Barrier, Buffer)):
            out.append(stmt)
        elif isinstance(stmt, Store):
            index = _position(stmt.array, tuple(substitute(i, values) for i in stmt.index), values)
            out.append(Store(stmt.array, index, substitute(stmt.value, values), stmt.mode))
        elif isinstance(stmt, Loop):
            out.append(replace(stmt, start=substitute(stmt.start, values), stop=substitute(stmt.stop, values),
                               body=substitute_stmts(stmt.body, values)))
        else:
            assert isinstance(stmt, If), stmt
            cond = substitute(stmt.cond, values)
            then, orelse = substitute_stmts(stmt.then, values), substitute_stmts(stmt.orelse, values)
            known = _known(cond)
            if known is None:
                out.append(If(cond, then, orelse))
            else:
                out.extend(then if known else orelse)
    return tuple(out)


# =============================================================================================
# Dead Lets
# =============================================================================================
def _reads(stmts: tuple[Stmt, ...]) -> set[str]:
    """Every name an expression of ``stmts`` reads (variables, and arrays loaded or added into)."""
    names: set[str] = set()
    for stmt in walk_stmts(stmts):
        for expr in statement_expressions(stmt):
            for node in walk_expr(expr):
                if isinstance(node, Var):
                    names.add(node.name)
                elif isinstance(node, Load):
                    names.add(node.array)
        if isinstance(stmt, Accum):
            names.add(stmt.var)
    return names


def drop_dead_lets(stmts: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    """``stmts`` without the Lets of names that nothing reads (repeated until none is left)."""
    while True:
        reads = _reads(stmts)
        pruned = _prune(stmts, reads)
        if pruned == stmts:
            return stmts
        stmts = pruned


def _prune(stmts: tuple[Stmt, ...], reads: set[str]) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for stmt in stmts:
        if isinstance(stmt, Let) and stmt.var not in reads:
            continue
        if isinstance(stmt, Loop):
            stmt = replace(stmt, body=_prune(stmt.body, reads))
        elif isinstance(stmt, If):
            stmt = replace(stmt, then=_prune(stmt.then, reads), orelse=_prune(stmt.orelse, reads))
        out.append(stmt)
    return tuple(out)


# =============================================================================================
# Shared subexpressions
# =============================================================================================
# A repeated expression of at least this many nodes is bound once (a call of any size: its evaluation is the cost).
# Smaller arithmetic is left to the compilers, which share it themselves; binding it would only rename it.
SHARED_MIN_NODES = 4
# A repeated expression found only inside Select branches is computed before the statement, whichever branch
# runs, from this many nodes on: a product gradient's body appears in every case of the zero-count rule (seven
# times per term), and printed once per case it made modules of hundreds of kilobytes that Numba compiled for
# minutes. Smaller ones stay in their branches, where they may never run.
SPECULATED_MIN_NODES = 12


@dataclass
class _Seen:
    """One candidate of a straight-line block: where it is first and last used, how often, whether once outside
    every Select branch, and its size in nodes."""

    first: int
    last: int
    count: int
    unconditional: bool
    size: int


def _guard_branch(expr: Expr) -> bool:
    """A Select branch that only reads (a load, a cast load, a nested check): the loads of a pad or indirect read
    may be in range only under the Select's condition, so nothing inside it is ever moved out of it."""
    while isinstance(expr, Cast):
        expr = expr.arg
    return isinstance(expr, (Load, Select))


def _unsafe(expr: Expr) -> bool:
    """An integer division or modulo by something other than a nonzero constant: it may trap where the branch
    that held it would not have run."""
    return isinstance(expr, BinOp) and expr.op in ("//", "mod") and not (
        isinstance(expr.rhs, Const) and expr.rhs.value != 0)


@dataclass(frozen=True)
class _Node:
    """What ``_collect`` learns of a subexpression: its size in nodes, whether it may be evaluated anywhere in
    its statement's block (nothing in it can trap) and whether it reads data (a load or a call; index arithmetic
    and its comparisons are the compilers' to share)."""

    size: int
    movable: bool
    data: bool


def _collect(expr: Expr, pos: int, unconditional: bool, seen: dict[Expr, _Seen]) -> _Node:
    """Record every candidate in ``expr`` (the statement at ``pos``) in ``seen``."""
    if isinstance(expr, (Const, Var)):
        return _Node(1, True, False)
    if isinstance(expr, Load):  # positions are index arithmetic: never shared
        return _Node(_size(expr), True, True)
    parts: list[_Node] = []
    if isinstance(expr, Select):
        parts.append(_collect(expr.cond, pos, unconditional, seen))
        for branch in (expr.then, expr.orelse):
            if _guard_branch(branch):
                parts.append(_Node(_size(branch), True, True))
            else:
                parts.append(_collect(branch, pos, False, seen))
    else:
        parts += [_collect(child, pos, unconditional, seen) for child in children(expr)]
    node = _Node(1 + sum(p.size for p in parts), not _unsafe(expr) and all(p.movable for p in parts),
                 isinstance(expr, Call) or any(p.data for p in parts))
    if node.movable and node.data and expr.dtype != INDEX and (isinstance(expr, Call) or node.size >= SHARED_MIN_NODES):
        entry = seen.get(expr)
        if entry is None:
            seen[expr] = _Seen(pos, pos, 1, unconditional, node.size)
        else:
            entry.last = pos
            entry.count += 1
            entry.unconditional = entry.unconditional or unconditional
    return node


def _replace_expr(expr: Expr, old: Expr, var: Var) -> Expr:
    if expr == old:
        return var
    if isinstance(expr, Select):
        return replace(expr, cond=_replace_expr(expr.cond, old, var), then=_replace_expr(expr.then, old, var),
                       orelse=_replace_expr(expr.orelse, old, var))
    if isinstance(expr, BinOp):
        return replace(expr, lhs=_replace_expr(expr.lhs, old, var), rhs=_replace_expr(expr.rhs, old, var))
    if isinstance(expr, (UnOp, Cast)):
        return replace(expr, arg=_replace_expr(expr.arg, old, var))
    if isinstance(expr, Call):
        return replace(expr, args=tuple(_replace_expr(a, old, var) for a in expr.args))
    return expr  # a Load's positions hold no candidates


def _own_exprs(stmt: Stmt) -> tuple[Expr, ...]:
    return (stmt.value,) if isinstance(stmt, (Let, Accum, Store)) else ()


def _assigned(stmts: tuple[Stmt, ...]) -> set[str]:
    names: set[str] = set()
    for stmt in walk_stmts(stmts):
        if isinstance(stmt, (Let, Accum, Scratch, Buffer)):
            names.add(stmt.var)
        elif isinstance(stmt, Loop):
            names.add(stmt.var)
        elif isinstance(stmt, Store):
            names.add(stmt.array)
    return names


def _size(expr: Expr) -> int:
    return sum(1 for _ in walk_expr(expr))


def _reads_of(expr: Expr) -> set[str]:
    return {n.name for n in walk_expr(expr) if isinstance(n, Var)} | {
        n.array for n in walk_expr(expr) if isinstance(n, Load)}


class _Sharer:
    def __init__(self, taken: set[str]):
        self._taken = taken
        self._count = 0

    def _fresh(self) -> str:
        while f"{SHARED_PREFIX}{self._count}" in self._taken:
            self._count += 1
        self._count += 1
        return f"{SHARED_PREFIX}{self._count - 1}"

    def block(self, stmts: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
        stmts = tuple(self._nested(s) for s in stmts)
        while True:
            found = self._candidate(stmts)
            if found is None:
                return stmts
            expr, first = found
            at = _earliest(stmts, first, _reads_of(expr))
            var = Var(self._fresh(), expr.dtype)
            later = tuple(_replace_exprs(s, expr, var) for s in stmts[at:])
            stmts = stmts[:at] + (Let(var.name, expr),) + later

    def _nested(self, stmt: Stmt) -> Stmt:
        if isinstance(stmt, Loop):
            return replace(stmt, body=self.block(stmt.body))
        if isinstance(stmt, If):
            return replace(stmt, then=self.block(stmt.then), orelse=self.block(stmt.orelse))
        return stmt

    @staticmethod
    def _candidate(stmts: tuple[Stmt, ...]) -> tuple[Expr, int] | None:
        """The largest candidate evaluated twice or more by the straight-line statements of ``stmts`` from its
        first use on (once outside every Select branch, or large: ``SPECULATED_MIN_NODES``), with nothing it
        reads reassigned from there (nested statements included), and the position of its first use."""
        seen: dict[Expr, _Seen] = {}
        for pos, stmt in enumerate(stmts):
            for expr in _own_exprs(stmt):
                _collect(expr, pos, True, seen)
        own = [_assigned(stmts[pos:pos + 1]) for pos in range(len(stmts))]  # each statement walked once
        after: list[set[str]] = [set()] * (len(stmts) + 1)  # after[p]: what statements p.. assign
        for pos in range(len(stmts) - 1, -1, -1):
            after[pos] = own[pos] | after[pos + 1]
        best: tuple[Expr, int] | None = None
        best_size = 0
        for expr, entry in seen.items():
            if entry.count < 2 or entry.size <= best_size:
                continue
            if not entry.unconditional and entry.size < SPECULATED_MIN_NODES:
                continue
            first = entry.first
            # what the first statement writes (its Let or accumulator, the array it stores to) matters only to
            # uses after it: the statement evaluates its value before it writes
            written = after[first + 1] | (own[first] if entry.last > first else set())
            if _reads_of(expr) & written:
                continue
            best, best_size = (expr, first), entry.size
        return best


def _earliest(stmts: tuple[Stmt, ...], first: int, reads: set[str]) -> int:
    """Where a shared expression that ``first`` uses goes: right after the last statement before it that assigns
    something it reads. Placed as early as that, the block keeps its Lets ahead of its accumulations (the shape
    the printers' lane reductions recognise) instead of one Let between each pair of a register tile's copies."""
    for pos in range(first - 1, -1, -1):
        if _assigned(stmts[pos:pos + 1]) & reads:
            return pos + 1
    return 0


def _replace_exprs(stmt: Stmt, old: Expr, var: Var) -> Stmt:
    if isinstance(stmt, (Let, Accum, Store)):
        return replace(stmt, value=_replace_expr(stmt.value, old, var))
    return stmt


def share_subexpressions(stmts: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    """Every straight-line block of ``stmts`` with its repeated calls and larger subexpressions computed once
    (see the module doc)."""
    taken = {s.var for s in walk_stmts(stmts) if isinstance(s, (Let, Accum, Scratch, Buffer, Loop))}
    return _Sharer(taken).block(stmts)


__all__ = ["SHARED_PREFIX", "drop_dead_lets", "fold", "share_subexpressions", "substitute",
           "substitute_stmts"]
