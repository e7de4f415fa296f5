"""Guards: linear conditions over spec indices that decide which terms a kernel computes at all.

In a ``+`` reduction a skipped term adds zero, so index comparisons and ``pad`` accesses that multiply the
whole body can become conditions instead of being computed (and a padded scatter position is one too). An
equality is SOLVED for a reduced index (``m == 2k``: no loop over k, ``k = m // 2`` under a divisibility
check); an inequality in the innermost index of a reduction loop narrows that loop's bounds
(``Δy[pad(m-k)]*w[k]``: k runs over ``max(0, m-n+1) : min(K, m+1)``); anything else is an ``If`` placed right
where its indices are known. This module finds the conditions and solves them (pure functions over the spec);
``compiler.bounds`` writes them as loop bounds and guard expressions.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from tullax.errors import TullaxError
from tullax.spec import ir
from tullax.spec.ir import Affine, Spec, Wrapped
from tullax.spec.sizes import Sym


# =============================================================================================
# Linear forms and conditions
# =============================================================================================
@dataclass(frozen=True)
class LinearForm:
    """``sum(coef * index) + const`` over index values. ``coefs`` keeps the order in which the indices first
    appeared, and a coefficient that cancelled to 0 keeps its place: that order is the order of the terms in
    the printed arithmetic. ``terms`` drops the zeros."""

    coefs: tuple[tuple[str, int], ...]
    const: Sym

    @property
    def terms(self) -> tuple[tuple[str, int], ...]:
        return tuple((n, c) for n, c in self.coefs if c != 0)

    def negated(self) -> LinearForm:
        return LinearForm(tuple((n, -c) for n, c in self.coefs), -self.const)

    def scaled(self, k: int) -> LinearForm:
        return LinearForm(tuple((n, c * k) for n, c in self.coefs), self.const * k)

    def plus(self, other: LinearForm, sign: int) -> LinearForm:
        """``self + other`` (sign 1) or ``self - other`` (sign -1)."""
        coefs = dict(self.coefs)
        for name, coef in other.coefs:
            coefs[name] = coefs.get(name, 0) + sign * coef
        return LinearForm(tuple(coefs.items()), self.const + other.const if sign > 0 else self.const - other.const)


class Rel(Enum):
    NONNEGATIVE = "ge"  # the form is >= 0
    ZERO = "eq"  # the form is == 0
    DIVISIBLE = "div"  # the form is divisible by ``Cond.div``


@dataclass(frozen=True)
class Cond:
    """``sum(coef * index) + const`` (no zero coefficients) related to zero by ``rel``."""

    terms: tuple[tuple[str, int], ...]
    const: Sym
    rel: Rel
    div: int = 1

    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.terms)

    def coef(self, name: str) -> int:
        return dict(self.terms).get(name, 0)


def _cond(form: LinearForm, rel: Rel, div: int = 1) -> Cond:
    return Cond(form.terms, form.const, rel, div)


def linear_form(expr: ir.Expr) -> LinearForm | None:
    """``expr`` as an integer linear form over index values, or None (data, division, non-integer numbers)."""
    if isinstance(expr, ir.IndexVal):
        return LinearForm(((expr.name, 1),), expr.offset)
    if isinstance(expr, ir.Size):  # an extent: a symbolic constant, so j < size(x,1)-1 narrows j's loop
        return LinearForm((), Sym.extent(expr.array, expr.axis))
    if isinstance(expr, ir.Num):
        is_int = isinstance(expr.value, int) and not isinstance(expr.value, bool)
        return LinearForm((), Sym(expr.value)) if is_int else None
    if isinstance(expr, ir.Unary):
        inner = linear_form(expr.arg)
        return None if inner is None else inner.negated()
    if isinstance(expr, ir.Binary) and expr.op in ("+", "-", "*"):
        left, right = linear_form(expr.lhs), linear_form(expr.rhs)
        if left is None or right is None:
            return None
        if expr.op == "*":
            if not left.coefs and left.const.is_const:
                left, right = right, left
            if right.coefs or not right.const.is_const:
                return None
            return left.scaled(right.const.const)
        return left.plus(right, 1 if expr.op == "+" else -1)
    return None


def comparison_conds(expr: ir.Binary) -> list[Cond] | None:
    """Linear conditions equivalent to an index comparison (None when it is not one, or is ``!=``)."""
    left, right = linear_form(expr.lhs), linear_form(expr.rhs)
    if left is None or right is None or expr.op == "!=":
        return None
    diff = left.plus(right, -1)
    if expr.op == "==":
        return [_cond(diff, Rel.ZERO)]
    if expr.op == ">=":
        return [_cond(diff, Rel.NONNEGATIVE)]
    if expr.op == ">":
        return [Cond(diff.terms, diff.const - 1, Rel.NONNEGATIVE)]
    if expr.op == "<=":
        return [_cond(diff.negated(), Rel.NONNEGATIVE)]
    return [Cond(diff.negated().terms, -diff.const - 1, Rel.NONNEGATIVE)]  # <


def pad_conds(aff: Affine, extent: Sym) -> list[Cond]:
    """``pad(e)`` on an axis of ``extent`` reads inside iff e is divisible by div and 0 <= e/div < extent,
    i.e. (e divisible) and e >= 0 and div*(extent-1) - e >= 0."""
    conds = []
    if aff.div > 1:
        conds.append(Cond(aff.terms, aff.const, Rel.DIVISIBLE, aff.div))
    conds.append(Cond(aff.terms, aff.const, Rel.NONNEGATIVE))
    top = extent * aff.div - aff.div
    conds.append(Cond(tuple((n, -c) for n, c in aff.terms if c != 0), top - aff.const, Rel.NONNEGATIVE))
    return conds


# =============================================================================================
# Finding and solving the conditions of a spec
# =============================================================================================
@dataclass(frozen=True)
class Solution:
    """``index`` computed from ``cond`` instead of looped: an equality with a non-zero coefficient on it, or a
    divisibility condition with coefficient ±1 on it where its range is no longer than the divisor."""

    index: str
    cond: Cond
    lo: int = 0  # a divisibility condition's residue: index = lo + mod(-coef*rest - lo, div)

    @property
    def coef(self) -> int:
        return self.cond.coef(self.index)


@dataclass(frozen=True)
class Guards:
    body: ir.Expr  # the spec body without the factors that became conditions
    conds: tuple[Cond, ...]  # linear conditions left once equalities were solved
    solutions: tuple[Solution, ...]  # in dependency order: each reads loop indices or earlier solutions only
    generic: tuple[ir.Expr, ...]  # index comparisons that are not linear conditions (``!=``)


def find_guards(spec: Spec, serial: tuple[str, ...]) -> Guards:
    """The guards of ``spec``, whose serial (non-parallel) indices are ``serial``, innermost last: only a
    ``+`` reduction drops the factors of its body, a scatter's ``pad`` positions are conditions too."""
    body, conds, generic = spec.body, (), ()
    if spec.redop == "+":  # a skipped term adds zero
        body, conds, generic = _strip_factors(spec.body)
    if spec.is_scatter:
        conds += tuple(c for axis, idx in enumerate(spec.lhs) if isinstance(idx, Wrapped) and idx.kind == "pad"
                       for c in pad_conds(idx.inner, Sym.extent(spec.out, axis)))
    rest, solutions = _solve_equalities(conds, serial, spec.range_of)
    return Guards(body, tuple(rest), _dependency_order(solutions), generic)


def _strip_factors(expr: ir.Expr) -> tuple[ir.Expr, tuple[Cond, ...], tuple[ir.Expr, ...]]:
    """``expr`` with each of its factors (through ``*``, the numerator of ``/`` and unary minus) that is a
    condition replaced, and the conditions, left to right: a linear index comparison becomes 1 and its
    linear conditions, an index ``!=`` becomes 1 and a generic condition, an access with ``pad`` positions
    reads without them (in range under the guard; div > 1: an exact division) and its pad conditions."""
    if isinstance(expr, ir.Binary) and expr.op == "*":
        lhs, lhs_conds, lhs_generic = _strip_factors(expr.lhs)
        rhs, rhs_conds, rhs_generic = _strip_factors(expr.rhs)
        return replace(expr, lhs=lhs, rhs=rhs), lhs_conds + rhs_conds, lhs_generic + rhs_generic
    if isinstance(expr, ir.Binary) and expr.op == "/":
        lhs, conds, generic = _strip_factors(expr.lhs)
        return replace(expr, lhs=lhs), conds, generic
    if isinstance(expr, ir.Unary):
        arg, conds, generic = _strip_factors(expr.arg)
        return replace(expr, arg=arg), conds, generic
    if isinstance(expr, ir.Binary) and expr.op in ir.COMPARISONS:
        found = comparison_conds(expr)
        if found is not None:
            return ir.Num(1), tuple(found), ()
        if expr.op == "!=" and linear_form(expr.lhs) is not None and linear_form(expr.rhs) is not None:
            return ir.Num(1), (), (expr,)
    if isinstance(expr, ir.Access) and any(isinstance(i, Wrapped) and i.kind == "pad" for i in expr.idx):
        conds: list[Cond] = []
        new_idx = []
        for axis, idx in enumerate(expr.idx):
            if isinstance(idx, Wrapped) and idx.kind == "pad":
                conds += pad_conds(idx.inner, Sym.extent(expr.array, axis))
                new_idx.append(idx.inner)
            else:
                new_idx.append(idx)
        return replace(expr, idx=tuple(new_idx)), tuple(conds), ()
    return expr, (), ()


def _solve_equalities(conds: tuple[Cond, ...], serial: tuple[str, ...], ranges: dict[str, ir.Range],
                      ) -> tuple[list[Cond], list[Solution]]:
    """Solve ``eq`` conditions for a serial index: its loop disappears, a Let and range guards remain."""
    rest: list[Cond] = []
    pending = list(conds)
    solutions: list[Solution] = []
    frozen: set[str] = set()  # indices left in a |coef| > 1 solution: never solved themselves, so no cycles
    while pending:
        cond = pending.pop(0)
        solved = {s.index for s in solutions}
        target = _solve_target(cond, serial, solved | frozen) if cond.rel == Rel.ZERO else None
        if target is None:
            rest.append(cond)
            continue
        coef = cond.coef(target)
        if abs(coef) != 1:
            frozen |= set(cond.names()) - {target}
        solutions.append(Solution(target, cond))
        lo_hi = ranges[target]
        in_range = [Cond(((target, 1),), -lo_hi.lo, Rel.NONNEGATIVE),
                    Cond(((target, -1),), lo_hi.hi - 1, Rel.NONNEGATIVE)]
        if abs(coef) == 1:  # substitute target = -(rest)/coef into every other condition: stays linear
            pending = [_substitute(c, target, cond) for c in pending + in_range]
            rest = [_substitute(c, target, cond) for c in rest]
        else:
            others = tuple((n, c) for n, c in cond.terms if n != target)
            rest.append(Cond(others, cond.const, Rel.DIVISIBLE, abs(coef)))
            pending += in_range
    return _solve_residues(rest, serial, ranges, solutions, frozen)


def _solve_residues(conds: list[Cond], serial: tuple[str, ...], ranges: dict[str, ir.Range],
                    solutions: list[Solution], frozen: set[str]) -> tuple[list[Cond], list[Solution]]:
    """A divisibility condition on a serial index ``t`` with coefficient ±1 whose range is no longer than the
    divisor (a strided window's gradient, ``pad((m-p)/2)`` with ``p in 0:2``) holds for at most one ``t``: the
    residue ``t = lo + mod(...)`` (``Solution.lo``), a Let instead of a loop testing every term; the range's
    stop stays a guard where it is shorter than the divisor."""
    rest = list(conds)
    for cond in conds:
        if cond.rel != Rel.DIVISIBLE or cond not in rest:
            continue
        taken = {s.index for s in solutions} | frozen
        names = [n for n in cond.names() if n in serial and n not in taken and abs(cond.coef(n)) == 1]
        names = [n for n in names if ranges[n].lo.is_const and ranges[n].hi.is_const
                 and ranges[n].hi.const - ranges[n].lo.const <= cond.div]
        if not names:
            continue
        target = max(names, key=serial.index)  # the innermost: its loop is the one run per term
        lo, hi = ranges[target].lo.const, ranges[target].hi.const
        solutions.append(Solution(target, cond, lo))
        frozen |= set(cond.names()) - {target}
        rest = [c for c in rest if c != cond]  # the same read's condition twice: both hold by construction
        if hi - lo < cond.div:
            rest.append(Cond(((target, -1),), Sym(hi - 1), Rel.NONNEGATIVE))
    return rest, solutions


def _solve_target(cond: Cond, serial: tuple[str, ...], taken: set[str]) -> str | None:
    """The index to solve ``cond`` for: a serial one not taken, preferably with coefficient ±1 (no
    divisibility check), then the innermost."""
    candidates = [n for n in cond.names() if n in serial and n not in taken]
    if not candidates:
        return None
    candidates.sort(key=lambda n: (abs(cond.coef(n)) == 1, serial.index(n)))
    return candidates[-1]


def _substitute(cond: Cond, target: str, eq: Cond) -> Cond:
    """Replace ``target`` in ``cond`` using ``eq`` (coef ±1 on target): target = -(eq - coef*target)/coef."""
    k = cond.coef(target)
    if k == 0:
        return cond
    c = eq.coef(target)  # ±1
    factor = -k * c  # cond + factor*eq removes target: k + factor*c = k - k*c*c = 0
    terms = dict(cond.terms)
    for name, coef in eq.terms:
        terms[name] = terms.get(name, 0) + factor * coef
    return Cond(tuple((n, c) for n, c in terms.items() if c != 0), cond.const + eq.const * factor, cond.rel,
                cond.div)


def _dependency_order(solutions: list[Solution]) -> tuple[Solution, ...]:
    """Solutions ordered so each one only uses loop indices or indices solved before it."""
    targets = {s.index for s in solutions}
    done: set[str] = set()
    ordered: list[Solution] = []
    pending = list(solutions)
    while pending:
        ready = [s for s in pending
                 if all(n in done or n not in targets for n in s.cond.names() if n != s.index)]
        if not ready:
            raise TullaxError("internal error: cyclic index solutions")
        for item in ready:
            ordered.append(item)
            done.add(item.index)
            pending.remove(item)
    return tuple(ordered)
