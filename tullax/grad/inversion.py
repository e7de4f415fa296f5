"""Index inversion of one occurrence ``A[e]`` of a body term: the term rewritten over A's positions ``p``.

The equations ``e_d(indices) = p_d`` are solved, axis by axis: a plain ``A[i]`` names its output index ``i``;
an index of coefficient ±1 is solved for (and substituted everywhere); an index of coefficient c is solved
as ``p_d/c`` read through ``pad(../c)`` (zero unless divisible) where that is safe; any other axis stays an
equality guard. The indices left over stay reduced. Accesses that may leave their axis after substitution
read through ``pad``; where a zero read so could make the term infinite or NaN, the term is guarded by
``ifelse`` instead. Only ``mod``/``clamp``/indirect occurrences cannot be inverted: they become a scatter.

An attempt that finds a solved index it cannot use (divided, or leaving an axis it cannot pad) names the
indices to keep reduced instead, and the next attempt bans them.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Mapping

from tullax.grad.algebra import affine_expr, call, cmp, literal, mul, product, total
from tullax.grad.forward import Forward
from tullax.grad.names import fresh_index
from tullax.spec import functions
from tullax.spec.affine import AffineForm
from tullax.spec.ir import (
    Access,
    Affine,
    Binary,
    Call,
    Expr,
    Idx,
    IndexVal,
    Indirect,
    Num,
    Range,
    Unary,
    Wrapped,
    idx_affine,
    idx_names,
    walk,
)
from tullax.spec.sizes import Sym

Solutions = Mapping[str, AffineForm]


@dataclass(frozen=True)
class Term:
    """One inverted contribution: its output indices, body and the indices it still reduces over."""

    outs: tuple[str, ...]
    body: Expr
    remaining: tuple[tuple[str, Range], ...]


@dataclass(frozen=True)
class Scatter:
    """A contribution through a non-invertible occurrence: ``ΔA[idx] += body`` over every forward index."""

    idx: tuple[Idx, ...]
    body: Expr


def invert(fw: Forward, occ: Access, term: Expr) -> Term | Scatter:
    """``term`` (the seed factor times ∂body/∂occ) as a contribution to the gradient of ``occ.array``."""
    if any(isinstance(i, Indirect) or (isinstance(i, Wrapped) and i.kind != "pad") for i in occ.idx):
        return Scatter(occ.idx, term)
    banned: frozenset[str] = frozenset()
    while True:
        outcome = _attempt(fw, occ, term, banned)
        if isinstance(outcome, Term):
            return outcome
        assert outcome - banned, "an inversion retry must keep one more index reduced"
        banned |= outcome


# =============================================================================================
# Solving the axis equations
# =============================================================================================
@dataclass(frozen=True)
class _Axes:
    """The equations ``eqs[d] = div*outs[d]`` of one attempt, and the indices it never solves for."""

    fw: Forward
    term: Expr
    banned: frozenset[str]
    eqs: tuple[AffineForm, ...]
    outs: tuple[str, ...]
    out_ranges: Mapping[str, Range]

    def unknowns(self, form: AffineForm, solutions: Solutions) -> dict[str, int]:
        """The indices of ``form`` that this attempt may still solve for, with their coefficients."""
        return {n: c for n, c in form.terms if n in self.fw.ranges and n not in solutions
                and n not in self.banned and n not in self.out_ranges}

    def preference(self, name: str) -> tuple:
        """Free indices first (the seed already reads zero outside their range), then the index that
        appears in the fewest other places (fewer accesses to pad)."""
        uses = sum(name in _idx_names(node) for node in walk(self.term))
        return (not self.fw.covered(name), uses, self.fw.indices.index(name))


def _attempt(fw: Forward, occ: Access, term: Expr, banned: frozenset[str]) -> Term | frozenset[str]:
    """One attempt at inverting ``occ`` in ``term``: the term, or the set of indices to ban before the next."""
    eqs = tuple(AffineForm.of(idx_affine(i)).normalized() for i in occ.idx)
    named, solutions = _plain_axes(eqs, banned)
    outs = _name_outputs(fw, named)
    out_ranges = {name: Range(Sym(0), Sym.extent(occ.array, axis)) for axis, name in enumerate(outs)}
    axes = _Axes(fw, term, banned, eqs, outs, MappingProxyType(out_ranges))
    pending = [d for d, o in enumerate(outs) if o not in solutions]
    solutions, pending = _solve_unit_axes(axes, solutions, pending)
    solutions, guards = _solve_scaled_axes(axes, solutions, pending)
    return _build(axes, solutions, guards)


def _plain_axes(eqs: tuple[AffineForm, ...], banned: frozenset[str]) -> tuple[list[str], dict[str, AffineForm]]:
    """A[i] with i not yet solved: the output index of the axis is i itself ('' where not plain)."""
    outs = [""] * len(eqs)
    solutions: dict[str, AffineForm] = {}
    for axis, form in enumerate(eqs):
        name = form.plain
        if name and name not in solutions and name not in banned:
            outs[axis] = name
            solutions[name] = AffineForm.index(name)
    return outs, solutions


def _name_outputs(fw: Forward, named: list[str]) -> tuple[str, ...]:
    """A new index name for every axis that is not plain."""
    outs = list(named)
    for axis, name in enumerate(outs):
        if not name:
            outs[axis] = fresh_index(fw.taken | set(outs))
    return tuple(outs)


def _record(solutions: Solutions, name: str, solution: AffineForm) -> dict[str, AffineForm]:
    """The solutions with ``name`` solved: earlier solutions that mention it are rewritten with it."""
    updated = {n: s.substitute({name: solution}).normalized() for n, s in solutions.items()}
    updated[name] = solution
    return updated


def _solve_unit_axes(axes: _Axes, solutions: Solutions, pending: list[int]) -> tuple[Solutions, list[int]]:
    """Solve e_d = div*p_d for an index of coefficient ±1, free indices first (the seed guards them), until
    no axis is left that has one."""
    pending = list(pending)
    progress = True
    while progress:
        progress = False
        for axis in list(pending):
            form = axes.eqs[axis].substitute(solutions).normalized()
            unknowns = axes.unknowns(form, solutions)
            units = [n for n, c in unknowns.items() if abs(c) == 1]
            if not units or _divides_instead(axes, solutions, axis, pending, unknowns):
                continue
            name = min(units, key=axes.preference)
            solutions = _record(solutions, name, form.solve_for(name, AffineForm.index(axes.outs[axis])).normalized())
            pending.remove(axis)
            progress = True
    return solutions, pending


def _divides_instead(axes: _Axes, solutions: Solutions, axis: int, pending: list[int],
                     unknowns: Mapping[str, int]) -> bool:
    """Whether the axis ``s*h + u`` (``h`` free, ``|s| > 1``, ``u`` a reduced index of coefficient ±1) is left to
    ``_solve_scaled_axes``: ``h = (p - u)/s`` through ``pad(../s)`` keeps the window ``u`` summed (K terms),
    where solving for ``u`` kept ``h`` summed over its whole range behind guards (a strided convolution's input
    gradient: H terms per position, all but K/s of them zero, and no form XLA's convolution takes)."""
    if any(abs(c) == 1 and axes.fw.covered(n) for n, c in unknowns.items()):
        return False  # a free u (a patchify's x[4h+i]): solving u leaves h behind a pad the loops narrow to one
    others = [axes.eqs[a] for a in pending if a != axis]
    return any(abs(c) > 1 and axes.fw.covered(n) and _divisible_ok(axes, solutions, n, others)
               for n, c in unknowns.items())


def _solve_scaled_axes(axes: _Axes, solutions: Solutions, pending: list[int]) -> tuple[Solutions, tuple[int, ...]]:
    """c*i = p_d with |c| > 1: i = p_d/c read through pad(../c) (zero unless divisible), allowed only
    when i is a free index the seed guards and i appears nowhere but in plain or padded accesses.
    Otherwise the axis stays an equality guard."""
    guards: list[int] = []
    for axis in pending:
        form = axes.eqs[axis].substitute(solutions).normalized()
        others = [axes.eqs[a] for a in pending if a != axis]
        name = next((n for n, c in axes.unknowns(form, solutions).items()
                     if abs(c) > 1 and _divisible_ok(axes, solutions, n, others)), None)
        if name is None:
            guards.append(axis)
            continue
        solutions = _record(solutions, name, form.solve_for(name, AffineForm.index(axes.outs[axis])).normalized())
    return solutions, tuple(guards)


def _divisible_ok(axes: _Axes, solutions: Solutions, name: str, other_eqs: list[AffineForm]) -> bool:
    if not axes.fw.covered(name) or any(name in e.names() for e in other_eqs):
        return False
    if any(name in s.names() for s in solutions.values()):
        return False
    for node in walk(axes.term):
        if isinstance(node, IndexVal) and node.name == name:
            return False
        if isinstance(node, Access):
            for idx in node.idx:
                if name in idx_names(idx) and not (isinstance(idx, Affine)
                                                            or (isinstance(idx, Wrapped) and idx.kind == "pad")):
                    return False
    return True


def _idx_names(node: Expr) -> set[str]:
    if isinstance(node, IndexVal):
        return {node.name}
    if isinstance(node, Access):
        return set().union(*(idx_names(i) for i in node.idx))
    return set()


# =============================================================================================
# Building the term
# =============================================================================================
def _build(axes: _Axes, solutions: Solutions, guards: tuple[int, ...]) -> Term | frozenset[str]:
    fw = axes.fw
    remaining = {n: fw.ranges[n] for n in fw.indices if n not in solutions}
    ranges = {**axes.out_ranges, **remaining}
    # solutions that may leave their forward range for some output and remaining index
    unsure = frozenset(n for n, s in solutions.items()
                       if not all(fw.sizes.within(s, fw.ranges[n].lo, fw.ranges[n].hi, ranges)))
    substitution = _Substitution(fw, MappingProxyType(dict(solutions)), unsure, MappingProxyType(ranges))
    rewritten = substitution.rewrite(axes.term, safe=True)
    if rewritten.banned:
        return rewritten.banned
    body = rewritten.expr
    equalities = [_equality(axes, solutions, axis) for axis in guards]

    def conditions(name: str) -> list[Expr]:
        return fw.sizes.range_conditions(solutions[name], fw.ranges[name], ranges)

    if rewritten.unsafe:
        divided = frozenset(n for n, s in solutions.items() if s.div != 1)
        if divided:
            return divided
        conds = [c for n in sorted(unsure) for c in conditions(n)] + equalities
        body = call("ifelse", product(conds), body, Num(0)) if conds else body
    else:
        uncovered = [c for n in sorted(unsure) if not fw.covered(n) for c in conditions(n)]
        body = product([body, *equalities, *uncovered])
    return Term(axes.outs, body, tuple(remaining.items()))


def _equality(axes: _Axes, solutions: Solutions, axis: int) -> Expr:
    """The guard ``div*p_d == e_d`` of an axis no index was solved from."""
    form = axes.eqs[axis].substitute(solutions).normalized()
    out = axes.outs[axis]
    if not form.terms and not form.const.is_const:  # a symbolic constant position (x[i,end]): only an index
        # value can carry a size, so it moves to the left: div*p - const == 0
        scaled = [mul(Num(form.div - 1), IndexVal(out))] if form.div > 1 else []
        left = total([*scaled, IndexVal(out, -form.const)])
        return cmp("==", left, Num(0))
    left = mul(Num(form.div), IndexVal(out))
    return cmp("==", left, affine_expr(replace(form, div=1)))


@dataclass(frozen=True)
class _Rewritten:
    """A subexpression after substitution. ``banned``: solved indices it cannot use (the attempt fails);
    ``unsafe``: a node of it may now read zero (a new pad, an index value outside its old range) where a zero
    is not harmless (under a division, a log, a root or a negative or fractional power)."""

    expr: Expr
    banned: frozenset[str] = frozenset()
    unsafe: bool = False


@dataclass(frozen=True)
class _Substitution:
    """Every solved index replaced by its solution, in one term. ``unsure``: the solutions that may leave the
    forward range of their index; ``ranges``: those of the output and remaining indices."""

    fw: Forward
    solutions: Solutions
    unsure: frozenset[str]
    ranges: Mapping[str, Range]

    def rewrite(self, expr: Expr, safe: bool) -> _Rewritten:
        """``expr`` substituted; ``safe``: a zero at this position cannot make the term infinite or NaN."""
        if isinstance(expr, IndexVal):
            return self._index_value(expr, safe)
        if isinstance(expr, Access):
            return self._access(expr, safe)
        if isinstance(expr, Unary):
            arg = self.rewrite(expr.arg, safe)
            return _joined(replace(expr, arg=arg.expr), (arg,))
        if isinstance(expr, Call):
            inner = safe and functions.get(expr.fn).safe_at_pad
            parts = tuple(self.rewrite(a, inner) for a in expr.args)
            return _joined(replace(expr, args=tuple(p.expr for p in parts)), parts)
        if isinstance(expr, Binary):
            lhs_safe, rhs_safe = safe, safe
            if expr.op == "/":
                rhs_safe = False
            elif expr.op == "^":
                exponent = literal(expr.rhs)
                lhs_safe = safe and isinstance(exponent, int) and exponent >= 0
                rhs_safe = False
            parts = (self.rewrite(expr.lhs, lhs_safe), self.rewrite(expr.rhs, rhs_safe))
            return _joined(replace(expr, lhs=parts[0].expr, rhs=parts[1].expr), parts)
        return _Rewritten(expr)  # numbers, scalar parameters

    def _index_value(self, node: IndexVal, safe: bool) -> _Rewritten:
        solution = self.solutions.get(node.name)
        if solution is None:
            return _Rewritten(node)
        if solution.div != 1:  # a body cannot compute m/2: keep the index reduced instead
            return _Rewritten(node, banned=frozenset({node.name}))
        return _Rewritten(affine_expr(solution, node.offset), unsafe=node.name in self.unsure and not safe)

    def _access(self, node: Access, safe: bool) -> _Rewritten:
        parts = [self._position(node.array, axis, idx) for axis, idx in enumerate(node.idx)]
        new = replace(node, idx=tuple(idx for idx, _, _ in parts))
        padded = any(pad for _, pad, _ in parts)
        return _Rewritten(new, frozenset().union(*(ban for _, _, ban in parts)), padded and not safe)

    def _position(self, array: str, axis: int, idx: Idx) -> tuple[Idx, bool, frozenset[str]]:
        """The index expression after substitution, whether it now reads through a pad that may give zero
        where the original did not, and the solved indices it cannot use."""
        inner = idx_affine(idx)
        names = set(inner.names())
        if isinstance(idx, Indirect) and set(idx.offset.names()) & set(self.solutions):
            # ix[e]+j: a solved j could move the position anywhere the index array allows: keep j reduced
            return idx, False, frozenset(set(idx.offset.names()) & set(self.solutions))
        if not names & set(self.solutions):
            return idx, False, frozenset()
        form = AffineForm.of(inner).substitute(self.solutions).normalized()
        risky = bool(names & self.unsure)
        if isinstance(idx, Affine):
            extent = Range(Sym(0), Sym.extent(array, axis))
            if not risky or all(self.fw.sizes.within(form, extent.lo, extent.hi, self.ranges)):
                return form.to_affine(), False, frozenset()
            return Wrapped("pad", form.to_affine()), True, frozenset()
        if isinstance(idx, Wrapped):
            banned = names & set(self.solutions) if form.div != 1 and idx.kind != "pad" else set()
            return replace(idx, inner=form.to_affine()), risky and idx.kind == "pad", frozenset(banned)
        extent = Range(Sym(0), Sym.extent(idx.array, 0))
        banned: set[str] = set()
        if form.div != 1 or (risky and not all(self.fw.sizes.within(form, extent.lo, extent.hi, self.ranges))):
            banned = names & (self.unsure | {n for n, s in self.solutions.items() if s.div != 1})
        return replace(idx, inner=form.to_affine()), False, frozenset(banned)


def _joined(expr: Expr, parts: tuple[_Rewritten, ...]) -> _Rewritten:
    return _Rewritten(expr, frozenset().union(*(p.banned for p in parts)), any(p.unsafe for p in parts))
