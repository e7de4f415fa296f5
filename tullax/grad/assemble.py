"""The steps of one gradient: every occurrence of the input inverted, the contributions summed into as few
specs as their reduced indices allow, scatters last, prelude steps first."""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from tullax.grad.algebra import Maybe, add, call, mul, product, sub, total
from tullax.grad.derivative import IsVar, cotangent, derivative, wirtinger
from tullax.grad.forward import Forward
from tullax.grad.inversion import Scatter, Term, invert
from tullax.grad.names import fresh_index, fresh_indices
from tullax.spec.affine import AffineForm
from tullax.spec.ir import (
    Access,
    Affine,
    Expr,
    Idx,
    IndexVal,
    Indirect,
    Input,
    Num,
    Param,
    Range,
    Spec,
    Wrapped,
    idx_affine,
    map_expr,
    walk,
)
from tullax.spec.sizes import Sym
from tullax.spec.valuetype import is_complex

# Terms summed into one spec: the ranges they reduce over, and their bodies.
Group = tuple[dict[str, Range], tuple[Expr, ...]]


def gradient_steps(fw: Forward, inp: Input, result: str) -> tuple[Spec, ...]:
    """The steps computing the gradient w.r.t. ``inp`` into ``result``, the prelude steps they read first."""
    if inp.kind == "scalar":
        return _with_prelude(fw, _scalar_steps(fw, inp.name, result))
    contributions: list[Term | Scatter] = []
    if inp.name == fw.spec.out and fw.spec.assign != ":=":
        contributions += _given_output_terms(fw)
    for occ in _occurrences(fw.spec.body, inp.name):
        term = _term(fw, inp.name, lambda node, occ=occ: node == occ)
        if term is not None:
            contributions.append(invert(fw, occ, term))
    if fw.spec.finalizer is not None:  # arrays the finaliser reads at the free indices: nothing reduced
        for occ in _occurrences(fw.spec.finalizer, inp.name):
            term = fw.finalizer_term(lambda node, occ=occ: node == occ)
            if term is not None:
                contributions.append(invert(fw.free_only(), occ, term))
    return _with_prelude(fw, _assemble(fw, inp, result, contributions))


def _with_prelude(fw: Forward, steps: tuple[Spec, ...]) -> tuple[Spec, ...]:
    """The prelude steps (pre-finaliser value, tie counts) that ``steps`` read, directly or not, then them."""
    needed = {name for step in steps for name in step.input_names}
    kept = []
    for step in reversed(fw.prelude):
        if step.out in needed:
            kept.append(step)
            needed |= set(step.input_names)
    return tuple(reversed(kept)) + steps


def _occurrences(body: Expr, array: str) -> list[Access]:
    """The distinct accesses of ``array`` (equal index expressions read the same element: one variable)."""
    found: list[Access] = []
    for node in walk(body):
        if isinstance(node, Access) and node.array == array and node not in found:
            found.append(node)
    return found


def _scalar_steps(fw: Forward, name: str, result: str) -> tuple[Spec, ...]:
    """Δa := Σ over every forward index of the seed factor times ∂body/∂a."""
    def is_var(node: Expr) -> bool:
        return isinstance(node, Param) and node.name == name

    body = _term(fw, name, is_var)
    ranges = fw.ranges if body is not None else {}
    in_body = fw.make_spec(result, body, ranges, rank=0)
    in_finalizer = fw.finalizer_term(is_var) if fw.spec.finalizer is not None else None
    if in_finalizer is None:
        return (in_body,)
    over_free = {n: fw.ranges[n] for n in fw.spec.free}  # the finaliser runs once per result element
    if body is None:
        return (fw.make_spec(result, in_finalizer, over_free, rank=0),)
    return in_body, fw.make_spec(result, in_finalizer, over_free, assign="+=", rank=0)


def _term(fw: Forward, name: str, is_var: IsVar) -> Maybe:
    """The seed factor times ∂body/∂v for the variable ``is_var`` picks, an occurrence of input ``name``; with
    complex values, the cotangent of jax's convention (``derivative.cotangent``), real for a real input."""
    names = fw.complex_names
    if not names:
        return mul(fw.factor, derivative(fw.spec.body, is_var))
    term = cotangent(fw.factor, wirtinger(fw.spec.body, is_var, names), names)
    if term is not None and name not in names and is_complex(term, names):
        return call("real", term)  # a real input's cotangent is the real part (jax's convert_element_type)
    return term


def _given_output_terms(fw: Forward) -> list[Term]:
    """'+=' passes ΔOUT through to the given array; '=' passes it only where the spec did not write; '*=' scales
    it by the multiplier where the spec wrote."""
    spec = fw.spec
    rank = len(spec.lhs or ())
    plain = [idx.plain for idx in spec.lhs or ()] if not spec.is_scatter else []
    outs = tuple(plain) if plain else fresh_indices(fw.taken, rank)
    seed = Access(fw.seed, tuple(Affine.index(p) for p in outs)) if rank else Param(fw.seed)
    if spec.assign == "+=":
        return [Term(outs, seed, ())]
    inside = []
    for axis, name in enumerate(outs):
        rng, full = fw.ranges[name], Range(Sym(0), Sym.extent(spec.out, axis))
        inside += fw.sizes.range_conditions(AffineForm.index(name), rng, {name: full})
    if spec.assign == "*=":
        return [Term(outs, mul(seed, _multiplier(fw, inside)), ())]
    if not inside:
        return []  # the spec wrote every element: nothing of the given array survives
    return [Term(outs, mul(seed, sub(Num(1), product(inside))), ())]


def _multiplier(fw: Forward, inside: list[Expr]) -> Expr:
    """What '*=' multiplied the given element by: the multiplier step where the spec wrote, exactly 1 elsewhere
    (read through pad, which gives 0 there, plus 1 - the range conditions)."""
    mult = fw.multiplier
    if not inside or not isinstance(mult, Access):
        return mult
    padded = Access(mult.array, tuple(Wrapped("pad", idx_affine(i)) for i in mult.idx))
    return add(padded, sub(Num(1), product(inside)))


def _assemble(fw: Forward, inp: Input, result: str, contributions: list[Term | Scatter]) -> tuple[Spec, ...]:
    """One ':=' step for the terms that share their reduced indices, a '+=' step per other group, then the
    scatter steps ('+=' into the result; into zeros when they come first)."""
    terms = [c for c in contributions if isinstance(c, Term)]
    scatters = [c for c in contributions if isinstance(c, Scatter)]
    outs = terms[0].outs if terms else _default_outputs(fw, inp)
    groups: tuple[Group, ...] = ()
    for term in terms:
        body, remaining = _rename_outputs(fw, term, outs)
        groups = _add_to_groups(groups, body, remaining, fw)
    out_ranges = {p: Range(Sym(0), Sym.extent(inp.name, axis)) for axis, p in enumerate(outs)}
    steps: list[Spec] = []
    for number, (remaining, bodies) in enumerate(groups):
        assign = ":=" if number == 0 else "+="
        steps.append(fw.make_spec(result, total(bodies), {**out_ranges, **remaining}, free=outs, assign=assign,
                                  rank=inp.rank))
    for scatter in scatters:
        steps.append(fw.make_spec(result, scatter.body, fw.ranges, assign="+=", lhs=scatter.idx, rank=inp.rank))
    if not steps:  # the input does not influence the result
        steps.append(fw.make_spec(result, None, out_ranges, free=outs, rank=inp.rank))
    return tuple(steps)


def _default_outputs(fw: Forward, inp: Input) -> tuple[str, ...]:
    """Output index names for a gradient with no inverted term: the left-hand side's for the given output,
    else those of a plain occurrence (x[i,j]) when there is one."""
    spec = fw.spec
    if inp.name == spec.out and spec.lhs and not spec.is_scatter:
        return tuple(idx.plain for idx in spec.lhs)
    for occ in _occurrences(spec.body, inp.name):
        names = tuple(i.plain if isinstance(i, Affine) else None for i in occ.idx)
        if None not in names and len(set(names)) == len(names):
            return names
    return fresh_indices(fw.taken, inp.rank)


def _rename_outputs(fw: Forward, term: Term, outs: tuple[str, ...]) -> tuple[Expr, dict[str, Range]]:
    """The term over the gradient's output index names (its reduced indices renamed out of their way)."""
    mapping = dict(zip(term.outs, outs))
    taken = set(fw.taken) | set(outs) | set(term.outs) | {n for n, _ in term.remaining}
    remaining: dict[str, Range] = {}
    for name, rng in term.remaining:
        new = name
        if name in outs:
            new = fresh_index(taken)
            taken.add(new)
        mapping[name] = new
        remaining[new] = rng
    return _rename_indices(term.body, mapping), remaining


def _add_to_groups(groups: tuple[Group, ...], body: Expr, remaining: dict[str, Range],
                   fw: Forward) -> tuple[Group, ...]:
    """Sum the term into a group that reduces over the same ranges (renaming its reduced indices to the
    group's), or open a new group: one spec sums its whole body over ALL its reduced indices."""
    for number, (group_ranges, bodies) in enumerate(groups):
        match = _match_ranges(remaining, group_ranges, fw)
        if match is not None:
            joined = (group_ranges, bodies + (_rename_indices(body, match),))
            return groups[:number] + (joined,) + groups[number + 1:]
    return groups + ((dict(remaining), (body,)),)


def _match_ranges(mine: dict[str, Range], theirs: dict[str, Range], fw: Forward) -> dict[str, str] | None:
    """A renaming of ``mine`` onto ``theirs`` that pairs provably equal ranges, keeping equal names where it
    can; None when there is none."""
    if len(mine) != len(theirs):
        return None

    def same(a: Range, b: Range) -> bool:
        return fw.sizes.canon(a.lo) == fw.sizes.canon(b.lo) and fw.sizes.canon(a.hi) == fw.sizes.canon(b.hi)

    mapping: dict[str, str] = {}
    free = dict(theirs)
    for name in sorted(mine, key=lambda n: n not in theirs):  # keep equal names where possible
        choice = name if name in free and same(mine[name], free[name]) else \
            next((n for n, r in free.items() if same(mine[name], r)), None)
        if choice is None:
            return None
        mapping[name] = choice
        del free[choice]
    return mapping


def _rename_indices(body: Expr, mapping: Mapping[str, str]) -> Expr:
    """Rename indices simultaneously in every index expression and index value."""
    if all(k == v for k, v in mapping.items()):
        return body

    def aff(a: Affine) -> Affine:
        if not any(n in mapping for n, _ in a.terms):
            return a
        return AffineForm.canonical({mapping.get(n, n): c for n, c in a.terms}, a.const, a.div).to_affine()

    def idx(i: Idx) -> Idx:
        if isinstance(i, Indirect) and not i.plain:
            return replace(i, inner=aff(i.inner), offset=aff(i.offset))
        return aff(i) if isinstance(i, Affine) else replace(i, inner=aff(i.inner))

    def fix(node: Expr) -> Expr:
        if isinstance(node, IndexVal) and node.name in mapping:
            return replace(node, name=mapping[node.name])
        if isinstance(node, Access):
            return replace(node, idx=tuple(idx(i) for i in node.idx))
        return node
    return map_expr(body, fix)
