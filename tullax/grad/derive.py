"""Gradient specs by index inversion (DESIGN section 2): one gradient program per differentiable input.

For ``OUT[free] = f(reduce over the other indices of body)`` and an input ``A``,

    ΔA[p] = Σ over occurrences A[e] of the body, Σ over every index combination with e(indices) = p, of
            ΔOUT[free] * f'(pre) * ∂OUT/∂body * ∂body/∂A[e]

Each occurrence is *inverted*: the equations ``e_d(indices) = p_d`` are solved for an index of coefficient ±1
(the solved index is substituted everywhere), for a coefficient c under a divisibility-reading ``pad(../c)``, or
kept as an equality guard; the indices left over stay reduced. Accesses that may leave their axis after the
substitution read through ``pad``. Only ``mod``/``clamp``/indirect occurrences cannot be inverted: they become a
scatter step (``ΔA[e] += ...``, the one kind of step that needs atomics). The results are ordinary Specs, so they
are printed, lowered and differentiated again like any other.

The environment a gradient's steps read (see ``Gradient``; ``tullax.grad.run`` runs them):
- every forward input by its name; for ':=' specs the forward result under ``spec.out`` (the residual);
  for '=' and '+=' specs ``spec.out`` is the GIVEN array (input 0, which the body may read): their gradient
  steps never read the forward result;
- the cotangent of the result under ``seed_name(spec)``;
- the output of every earlier step under its ``out`` name.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import count
from typing import Iterable, Mapping

from tullax.errors import SpecError
from tullax.grad.algebra import Maybe, affine_expr, call, cmp, compare, div, literal, mul, product, sub, total
from tullax.grad.derivative import (
    derivative,
    derivative_from_output,
    has_output_form,
    has_zero_derivative,
    unary_derivative,
)
from tullax.spec import functions
from tullax.spec.affine import AffineForm
from tullax.spec.analyze import shift_indices
from tullax.spec.ir import (
    ARITHMETIC,
    Access,
    Affine,
    Agreement,
    Binary,
    Call,
    Expr,
    Idx,
    IndexVal,
    Indirect,
    Input,
    Num,
    Param,
    Range,
    Spec,
    Unary,
    Wrapped,
    idx_affine,
    map_expr,
    walk,
)
from tullax.spec.sizes import (
    Extent,
    Extremum,
    FloorDiv,
    Sym,
    extremum,
    floordiv,
)
from tullax.spec.text import format_spec

__all__ = ["Gradient", "gradients", "gradient_texts", "seed_name"]


@dataclass(frozen=True)
class Gradient:
    """The gradient w.r.t. input ``wrt``: run ``steps`` in order, each reading the environment described in
    the module docstring; the last step's output ``result`` has the shape of ``wrt`` (scalar for a scalar
    parameter). A '+=' step whose ``out`` is not yet in the environment accumulates into zeros of the shape
    (and dtype) of ``wrt``: that is how a scatter step starts."""

    wrt: str
    steps: tuple[Spec, ...]
    result: str


def seed_name(spec: Spec) -> str:
    """The environment name of the cotangent of ``spec``'s result: 'Δ' + out, unless that name is taken."""
    return _fresh("Δ" + spec.out, _spec_names(spec))


@lru_cache(maxsize=1024)
def gradients(spec: Spec) -> tuple[Gradient, ...]:
    """One Gradient per differentiable input ('array' and 'scalar' kinds), in ``spec.inputs`` order.
    Whether an array holds integers is a runtime matter: callers skip those."""
    if spec.redop == "*":
        raise SpecError("gradients of (*) reductions are not supported: a product's gradient divides by the "
                        "factors and fails at zeros; write the product as exp of a (+) sum of logs if the "
                        "factors are positive")
    fw = _Forward.of(spec)
    return tuple(_gradient(fw, inp) for inp in spec.inputs if inp.kind in ("array", "scalar"))


@lru_cache(maxsize=1024)
def gradient_texts(spec: Spec) -> tuple[str, ...]:
    """Each gradient as text, one string per differentiable input, its steps joined with '; '."""
    return tuple("; ".join(format_spec(step) for step in grad.steps) for grad in gradients(spec))


# =============================================================================================
# Names
# =============================================================================================
_INDEX_NAMES = ("m", "n", "p", "q", "r", "s", "t", "u", "v", "w", "a", "b", "c", "d", "e", "f", "g", "h")


def _spec_names(spec: Spec) -> set[str]:
    return set(spec.input_names) | {spec.out} | set(spec.indices)


def _fresh(base: str, taken: Iterable[str]) -> str:
    taken = set(taken)
    if base not in taken:
        return base
    return next(f"{base}{n}" for n in count(1) if f"{base}{n}" not in taken)


def _fresh_index(taken: Iterable[str]) -> str:
    taken = set(taken)
    for name in _INDEX_NAMES:
        if name not in taken:
            return name
    return _fresh("m", taken)


# =============================================================================================
# Symbolic size reasoning (what is provably in bounds)
# =============================================================================================
class _Sizes:
    """Extents known equal (agreements, the seed having the result's shape): canonical forms and bounds."""

    def __init__(self, equal: Mapping[tuple[str, int], Sym]):
        self.equal = dict(equal)

    def canon(self, sym: Sym) -> Sym:
        out = Sym(sym.const)
        for atom, coef in sym.terms:
            out = out + self._atom(atom) * coef
        return out

    def _atom(self, atom) -> Sym:
        if isinstance(atom, Extent):
            key = (atom.array, atom.axis)
            return self.canon(self.equal[key]) if key in self.equal else Sym.of(atom)
        if isinstance(atom, FloorDiv):
            return floordiv(self.canon(atom.num), atom.den)
        return extremum(atom.kind, [self.canon(a) for a in atom.args])

    def at_least(self, a: Sym, b: Sym) -> bool:
        """a >= b provably."""
        return _ge(self.canon(a), self.canon(b))

    def bounds(self, lin: AffineForm, ranges: Mapping[str, Range]) -> tuple[Sym, Sym]:
        """Smallest and largest value of an undivided affine expression over ``ranges``."""
        low = high = lin.const
        for name, coef in lin.terms:
            rng = ranges[name]
            first, last = rng.lo * coef, (rng.hi - 1) * coef
            low, high = (low + first, high + last) if coef > 0 else (low + last, high + first)
        return low, high

    def within(self, lin: AffineForm, lo: Sym, hi: Sym, ranges: Mapping[str, Range]) -> tuple[bool, bool]:
        """(lo <= lin provably, lin < hi provably)."""
        if lin.div != 1:
            return False, False
        low, high = self.bounds(lin, ranges)
        return self.at_least(low, lo), self.at_least(hi - 1, high)


def _ge(a: Sym, b: Sym, depth: int = 0) -> bool:
    diff = a - b
    if diff.is_const:
        return diff.const >= 0
    if depth > 6:
        return False
    for side, sym in (("a", a), ("b", b)):
        for atom, coef in sym.terms:
            if isinstance(atom, Extremum) and coef == 1:
                rest = sym - Sym.of(atom)
                parts = [arg + rest for arg in atom.args]
                if side == "a":  # min(..) >= b needs every argument; max(..) >= b needs one
                    checks = [_ge(p, b, depth + 1) for p in parts]
                    return all(checks) if atom.kind == "min" else any(checks)
                checks = [_ge(a, p, depth + 1) for p in parts]
                return all(checks) if atom.kind == "max" else any(checks)
    return False


# =============================================================================================
# The forward spec, seen from its gradients
# =============================================================================================
@dataclass
class _Forward:
    """What every gradient of one spec shares: names, ranks, ranges, the seed factor and the prelude steps
    (recomputed pre-finaliser value, tie counts) that the seed factor reads."""

    spec: Spec
    seed: str
    taken: set[str]
    ranks: dict[str, int]
    ranges: dict[str, Range]
    sizes: _Sizes
    facts: list[tuple[tuple[str, int], tuple[str, int], str]]
    prelude: list[Spec] = field(default_factory=list)
    factor: Maybe = None  # ΔOUT * f'(pre) * ∂OUT/∂body, in the forward's indices

    @staticmethod
    def of(spec: Spec) -> "_Forward":
        seed = seed_name(spec)
        rank = len(spec.lhs or ())
        ranks = {i.name: i.rank for i in spec.inputs if i.kind != "scalar"}
        ranks.update({spec.out: rank, seed: rank})
        fw = _Forward(spec, seed, _spec_names(spec) | {seed}, ranks, dict(spec.ranges), _Sizes({}), [])
        fw._learn_sizes()
        fw.factor = _seed_factor(fw)
        return fw

    @property
    def indices(self) -> tuple[str, ...]:
        return self.spec.free + self.spec.reduced

    def _learn_sizes(self) -> None:
        """Agreeing axes share one canonical extent; the seed (and a ':=' residual) has the result's shape."""
        spec, root = self.spec, {}

        def find(axis: tuple[str, int]) -> tuple[str, int]:
            while axis in root:
                axis = root[axis]
            return axis

        for agr in spec.agreements:
            first, second = find(agr.first), find(agr.second)
            if first != second:
                root[second] = first
            self.facts.append((agr.first, agr.second, agr.index))
        equal = {axis: Sym.extent(*find(axis)) for axis in root}
        for axis, extent in enumerate(spec.out_shape):
            equal[(self.seed, axis)] = extent
            self._fact_for(self.seed, axis, extent)
            if spec.assign == ":=":
                equal[(spec.out, axis)] = extent
                self._fact_for(spec.out, axis, extent)
        self.sizes = _Sizes(equal)

    def _fact_for(self, array: str, axis: int, extent: Sym) -> None:
        """Record ``size(array, axis) == extent`` as an agreement when ``extent`` is one array's axis."""
        if len(extent.terms) == 1 and extent.const == 0 and extent.terms[0][1] == 1 \
                and isinstance(extent.terms[0][0], Extent):
            atom = extent.terms[0][0]
            if (atom.array, atom.axis) != (array, axis):
                self.facts.append(((array, axis), (atom.array, atom.axis), "Δ"))

    def fresh(self, base: str) -> str:
        name = _fresh(base, self.taken)
        self.taken.add(name)
        return name

    def covered(self, index: str) -> bool:
        """True when the seed ΔOUT reads zero exactly where ``index`` leaves its forward range: it is a free
        index and its range is the whole output axis."""
        spec = self.spec
        if index not in spec.free:
            return False
        if spec.assign == ":=":
            return True
        axis = next(d for d, idx in enumerate(spec.lhs) if idx.plain == index)
        rng = self.ranges[index]
        return self.sizes.at_least(Sym(0), rng.lo) and self.sizes.at_least(rng.hi, Sym.extent(spec.out, axis)) \
            and self.sizes.at_least(Sym.extent(spec.out, axis), rng.hi)

    # -- building steps ---------------------------------------------------------------------------
    def make_spec(self, out: str, body: Maybe, ranges: Mapping[str, Range], *, free: tuple[str, ...] = (),
                  assign: str = ":=", redop: str = "+", lhs: tuple[Idx, ...] | None = None,
                  rank: int | None = None) -> Spec:
        """An analysed Spec from parts; its inputs are found in the body, the left-hand side and the ranges."""
        body = body if body is not None else Num(0)
        if lhs is None and free:
            lhs = tuple(Affine.index(p) for p in free)
        rank = len(free) if rank is None else rank
        self.ranks.setdefault(out, rank)
        inputs = self._inputs(out, body, lhs, ranges, assign)
        reduced = tuple(n for n in ranges if n not in free)
        if assign == ":=":
            out_shape = tuple(ranges[p].extent() for p in free)
        else:
            out_shape = tuple(Sym.extent(out, d) for d in range(rank))
        present = {i.name for i in inputs} | {out}
        agreements = tuple(Agreement(label, a, b) for a, b, label in self.facts
                           if a[0] in present and b[0] in present)
        return Spec(redop=redop, out=out, lhs=lhs, assign=assign, body=body, finalizer=None, inputs=inputs,
                    free=free, reduced=reduced, ranges=tuple((n, ranges[n]) for n in free + reduced),
                    agreements=tuple(dict.fromkeys(agreements)), out_shape=out_shape)

    def _inputs(self, out, body, lhs, ranges, assign) -> tuple[Input, ...]:
        kinds: dict[str, str] = {}

        def note(name: str, kind: str) -> None:
            if name not in kinds:
                kinds[name] = kind
            elif kind == "array" and kinds[name] in ("index", "shape"):
                kinds[name] = "array"

        if assign != ":=":
            note(out, "array")
        for node in walk(body):
            if isinstance(node, Access):
                note(node.array, "array")
                for idx in node.idx:
                    if isinstance(idx, Indirect):
                        note(idx.array, "index")
            elif isinstance(node, Param):
                note(node.name, "scalar")
        for idx in lhs or ():
            if isinstance(idx, Indirect):
                note(idx.array, "index")
        for name in sorted(_size_arrays(body, lhs, ranges.values())):
            note(name, "shape")
        return tuple(Input(n, k, 0 if k == "scalar" else self.ranks.get(n, 1 if k == "index" else 0))
                     for n, k in kinds.items())

    def free_step(self, base: str, body: Expr, redop: str) -> Expr:
        """A prelude step ``name[free] := (redop) body`` over the forward's own free indices (shifted to
        start at 0); returns how the forward body reads it."""
        spec = self.spec
        name = self.fresh(base)
        shifts = {i: self.ranges[i].lo for i in spec.free if self.ranges[i].lo != Sym(0)}
        ranges = {i: Range(Sym(0), self.ranges[i].extent()) for i in spec.free}
        ranges.update({r: self.ranges[r] for r in spec.reduced})
        step = self.make_spec(name, shift_indices(body, shifts) if shifts else body, ranges, free=spec.free,
                              redop=redop)
        self.prelude.append(step)
        for axis, extent in enumerate(step.out_shape):
            self.sizes.equal[(name, axis)] = extent
            self._fact_for(name, axis, extent)
        if not spec.free:
            return Param(name)
        return Access(name, tuple(Affine(((i, 1),), -shifts.get(i, Sym(0))) for i in spec.free))


# Relative distance under which a recomputed body value counts as reaching the max/min. Compilers contract
# a*b + c*d into fused multiply-adds differently in different kernels (XLA does, unconditionally), so a body
# recomputed by a gradient kernel may differ from the forward's in the last bits.
TIE_TOLERANCE = 1e-6


def _winner(body: Expr, extreme: Expr) -> Expr:
    """1 where ``body`` attains the reduction's ``extreme``: exact equality when every kernel computes the
    body bitwise alike, otherwise equality up to TIE_TOLERANCE (relative)."""
    if _reproducible(body):
        return cmp("==", body, extreme)
    gap = call("abs", sub(body, extreme))
    return cmp("<=", gap, mul(Num(TIE_TOLERANCE), call("abs", extreme)))


def _reproducible(expr: Expr) -> bool:
    """Rounds the same in every kernel, even under fast-math (contraction into multiply-adds, reassociation):
    an input, or one operation on inputs (x[i,j]*w[j], a + x[i], max(x[i], y[i]))."""
    leaves = (Access, Param, Num, IndexVal)
    expr = _strip_sign(expr)
    if isinstance(expr, leaves):
        return True
    if isinstance(expr, Binary) and expr.op in ARITHMETIC and expr.op != "^":
        return all(isinstance(_strip_sign(x), leaves) for x in (expr.lhs, expr.rhs))
    if isinstance(expr, Call) and expr.fn in ("abs", "relu", "max", "min", "conj", "real"):
        return all(isinstance(_strip_sign(x), leaves) for x in expr.args)
    return False


def _strip_sign(expr: Expr) -> Expr:
    return _strip_sign(expr.arg) if isinstance(expr, Unary) else expr


def _size_arrays(body: Expr, lhs: tuple[Idx, ...] | None, ranges: Iterable[Range]) -> set[str]:
    """Arrays whose extents a spec reads symbolically: in its ranges, index constants and index values."""
    syms = [s for rng in ranges for s in (rng.lo, rng.hi)]
    for node in walk(body):
        if isinstance(node, IndexVal):
            syms.append(node.offset)
        elif isinstance(node, Access):
            syms += [(i if isinstance(i, Affine) else i.inner).const for i in node.idx]
    syms += [(i if isinstance(i, Affine) else i.inner).const for i in lhs or ()]
    return set().union(*(s.arrays() for s in syms))


def _seed_factor(fw: _Forward) -> Maybe:
    """ΔOUT[free] * f'(pre) * ∂OUT/∂body, in the forward's indices: every term of every gradient has it."""
    spec = fw.spec
    seed = Access(fw.seed, spec.lhs) if spec.lhs else Param(fw.seed)
    residual = (Access(spec.out, spec.lhs) if spec.lhs else Param(spec.out)) if spec.assign == ":=" else None
    pre: list[Expr] = []  # the pre-finaliser value, computed once when needed

    def pre_value() -> Expr:
        if not pre:
            pre.append(residual if residual is not None and not spec.finalizer
                       else fw.free_step("pre", spec.body, spec.redop))
        return pre[0]

    grad: Maybe = seed
    finalizer = spec.finalizer
    if finalizer and has_zero_derivative(finalizer):
        grad = None
    elif finalizer and residual is not None and has_output_form(finalizer):
        grad = mul(seed, derivative_from_output(finalizer, residual))
    elif finalizer:
        grad = mul(seed, unary_derivative(finalizer, pre_value()))
    if grad is None or spec.redop == "+":
        return grad
    if spec.redop in ("max", "min"):  # ties share the gradient equally, as jax does
        hit = _winner(spec.body, pre_value())
        ties = fw.free_step("count", hit, "+")
        if not _reproducible(spec.body):  # a near-miss may find no winner at all: no 0/0
            ties = call("max", ties, Num(1))
        return div(mul(grad, hit), ties)
    return mul(grad, call("exp", sub(spec.body, pre_value())))  # logsumexp


# =============================================================================================
# One gradient
# =============================================================================================
@dataclass(frozen=True)
class _Term:
    """One inverted contribution: its output indices, body and the indices it still reduces over."""

    outs: tuple[str, ...]
    body: Expr
    remaining: tuple[tuple[str, Range], ...]


@dataclass(frozen=True)
class _Scatter:
    """A contribution through a non-invertible occurrence: ``ΔA[idx] += body`` over every forward index."""

    idx: tuple[Idx, ...]
    body: Expr


def _gradient(fw: _Forward, inp: Input) -> Gradient:
    if inp.kind == "scalar":
        return _scalar_gradient(fw, inp.name)
    result = fw.fresh("Δ" + inp.name)
    contributions: list[_Term | _Scatter] = []
    if inp.name == fw.spec.out and fw.spec.assign != ":=":
        contributions += _given_output_terms(fw)
    for occ in _occurrences(fw.spec.body, inp.name):
        d_body = derivative(fw.spec.body, lambda node, occ=occ: node == occ)
        term = mul(fw.factor, d_body)
        if term is not None:
            contributions.append(_invert(fw, occ, term))
    steps = _assemble(fw, inp, result, contributions)
    return Gradient(inp.name, _with_prelude(fw, steps), result)


def _with_prelude(fw: _Forward, steps: tuple[Spec, ...]) -> tuple[Spec, ...]:
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


def _scalar_gradient(fw: _Forward, name: str) -> Gradient:
    """Δa := Σ over every forward index of the seed factor times ∂body/∂a."""
    result = fw.fresh("Δ" + name)
    d_body = derivative(fw.spec.body, lambda node: isinstance(node, Param) and node.name == name)
    body = mul(fw.factor, d_body)
    ranges = fw.ranges if body is not None else {}
    step = fw.make_spec(result, body, ranges, rank=0)
    return Gradient(name, _with_prelude(fw, (step,)), result)


def _given_output_terms(fw: _Forward) -> list[_Term]:
    """'+=' passes ΔOUT through to the given array; '=' passes it only where the spec did not write."""
    spec = fw.spec
    rank = len(spec.lhs or ())
    plain = [idx.plain for idx in spec.lhs or ()] if not spec.is_scatter else []
    outs = tuple(plain) if plain else _fresh_names(fw, rank)
    seed = Access(fw.seed, tuple(Affine.index(p) for p in outs)) if rank else Param(fw.seed)
    if spec.assign == "+=":
        return [_Term(outs, seed, ())]
    inside = []
    for axis, name in enumerate(outs):
        rng, full = fw.ranges[name], Range(Sym(0), Sym.extent(spec.out, axis))
        lin = AffineForm.index(name)
        inside += _range_conditions(fw, lin, rng, {name: full})
    if not inside:
        return []  # the spec wrote every element: nothing of the given array survives
    return [_Term(outs, mul(seed, sub(Num(1), product(inside))), ())]


def _fresh_names(fw: _Forward, n: int) -> tuple[str, ...]:
    names: list[str] = []
    for _ in range(n):
        names.append(_fresh_index(fw.taken | set(names)))
    return tuple(names)


def _range_conditions(fw: _Forward, lin: AffineForm, rng: Range, ranges: Mapping[str, Range]) -> list[Expr]:
    """Comparisons saying lo <= lin < hi, leaving out the sides that hold for every value in ``ranges``."""
    low_ok, high_ok = fw.sizes.within(lin, rng.lo, rng.hi, ranges)
    conds = []
    if not low_ok:
        conds.append(compare(">=", lin, rng.lo))
    if not high_ok:
        conds.append(compare("<", lin, rng.hi))
    return conds


# =============================================================================================
# Index inversion of one occurrence
# =============================================================================================
def _invert(fw: _Forward, occ: Access, term: Expr) -> _Term | _Scatter:
    if any(isinstance(i, Indirect) or (isinstance(i, Wrapped) and i.kind != "pad") for i in occ.idx):
        return _Scatter(occ.idx, term)
    banned: frozenset[str] = frozenset()
    while True:
        outcome = _Inversion(fw, occ, term, banned).run()
        if isinstance(outcome, _Term):
            return outcome
        assert outcome - banned, "an inversion retry must keep one more index reduced"
        banned |= outcome


class _Inversion:
    """One attempt at inverting ``occ`` in ``term``. ``banned`` indices are never solved for (an earlier
    attempt found that solving them leads where a guard is needed instead). ``run`` returns the term, or
    the set of indices to ban before trying again."""

    def __init__(self, fw: _Forward, occ: Access, term: Expr, banned: frozenset[str]):
        self.fw, self.occ, self.term, self.banned = fw, occ, term, banned
        self.eqs = [AffineForm.of(idx_affine(i)).normalized() for i in occ.idx]
        self.solutions: dict[str, AffineForm] = {}
        self.outs: list[str] = [""] * len(occ.idx)
        self.guards: list[int] = []

    # -- solving ------------------------------------------------------------------------------------
    def run(self) -> _Term | frozenset[str]:
        self._solve_plain_axes()
        self._name_outputs()
        pending = [d for d, o in enumerate(self.outs) if o not in self.solutions]
        pending = self._solve_unit_axes(pending)
        self._solve_scaled_axes(pending)
        return self._build()

    def _solve_plain_axes(self) -> None:
        """A[i] with i not yet solved: the output index is i itself."""
        for axis, lin in enumerate(self.eqs):
            name = lin.plain
            if name and name not in self.solutions and name not in self.banned:
                self.outs[axis] = name
                self.solutions[name] = AffineForm.index(name)

    def _name_outputs(self) -> None:
        for axis, name in enumerate(self.outs):
            if not name:
                self.outs[axis] = _fresh_index(self.fw.taken | set(self.outs))
        self.out_ranges = {name: Range(Sym(0), Sym.extent(self.occ.array, axis))
                           for axis, name in enumerate(self.outs)}

    def _unknowns(self, lin: AffineForm) -> dict[str, int]:
        return {n: c for n, c in lin.terms if n in self.fw.ranges and n not in self.solutions
                and n not in self.banned and n not in self.out_ranges}

    def _solve_unit_axes(self, pending: list[int]) -> list[int]:
        """Solve e_d = div*p_d for an index of coefficient ±1, free indices first (the seed guards them)."""
        progress = True
        while progress:
            progress = False
            for axis in list(pending):
                lin = self.eqs[axis].substitute(self.solutions).normalized()
                units = [n for n, c in self._unknowns(lin).items() if abs(c) == 1]
                if not units:
                    continue
                name = min(units, key=self._preference)
                self._record(name, lin.solve_for(name, AffineForm.index(self.outs[axis])).normalized())
                pending.remove(axis)
                progress = True
        return pending

    def _preference(self, name: str) -> tuple:
        """Free indices first (the seed already reads zero outside their range), then the index that
        appears in the fewest other places (fewer accesses to pad)."""
        uses = sum(name in _idx_names(node) for node in walk(self.term))
        return (not self.fw.covered(name), uses, self.fw.indices.index(name))

    def _record(self, name: str, solution: AffineForm) -> None:
        self.solutions = {n: s.substitute({name: solution}).normalized() for n, s in self.solutions.items()}
        self.solutions[name] = solution

    def _solve_scaled_axes(self, pending: list[int]) -> None:
        """c*i = p_d with |c| > 1: i = p_d/c read through pad(../c) (zero unless divisible), allowed only
        when i is a free index the seed guards and i appears nowhere but in plain or padded accesses.
        Otherwise the axis stays an equality guard."""
        for axis in pending:
            lin = self.eqs[axis].substitute(self.solutions).normalized()
            others = [self.eqs[a] for a in pending if a != axis]
            name = next((n for n, c in self._unknowns(lin).items()
                         if abs(c) > 1 and self._divisible_ok(n, others)), None)
            if name is None:
                self.guards.append(axis)
                continue
            self._record(name, lin.solve_for(name, AffineForm.index(self.outs[axis])).normalized())

    def _divisible_ok(self, name: str, other_eqs: list[AffineForm]) -> bool:
        if not self.fw.covered(name) or any(name in e.names() for e in other_eqs):
            return False
        if any(name in s.names() for s in self.solutions.values()):
            return False
        for node in walk(self.term):
            if isinstance(node, IndexVal) and node.name == name:
                return False
            if isinstance(node, Access):
                for idx in node.idx:
                    if name in idx_affine(idx).names() and not (isinstance(idx, Affine)
                                                        or (isinstance(idx, Wrapped) and idx.kind == "pad")):
                        return False
        return True

    # -- building the term --------------------------------------------------------------------------
    def _build(self) -> _Term | frozenset[str]:
        remaining = {n: self.fw.ranges[n] for n in self.fw.indices if n not in self.solutions}
        self.all_ranges = {**self.out_ranges, **remaining}
        self.unsure = {n for n in self.solutions if not self._holds(n)}  # solutions that may leave their range
        self.tainted: set[int] = set()
        self.ban: set[str] = set()
        body = map_expr(self.term, self._substitute_node)
        if self.ban:
            return frozenset(self.ban)
        equalities = [self._equality(axis) for axis in self.guards]
        if _unsafe(body, self.tainted):
            divided = {n for n, s in self.solutions.items() if s.div != 1}
            if divided:
                return frozenset(divided)
            conds = [c for n in sorted(self.unsure) for c in self._conditions(n)] + equalities
            body = call("ifelse", product(conds), body, Num(0)) if conds else body
        else:
            uncovered = [c for n in sorted(self.unsure) if not self.fw.covered(n) for c in self._conditions(n)]
            body = product([body, *equalities, *uncovered])
        return _Term(tuple(self.outs), body, tuple(remaining.items()))

    def _holds(self, name: str) -> bool:
        """The solution of ``name`` stays inside its forward range for every output and remaining index."""
        solution = self.solutions[name]
        rng = self.fw.ranges[name]
        return all(self.fw.sizes.within(solution, rng.lo, rng.hi, self.all_ranges))

    def _conditions(self, name: str) -> list[Expr]:
        return _range_conditions(self.fw, self.solutions[name], self.fw.ranges[name], self.all_ranges)

    def _equality(self, axis: int) -> Expr:
        lin = self.eqs[axis].substitute(self.solutions).normalized()
        left = mul(Num(lin.div), IndexVal(self.outs[axis]))
        return cmp("==", left, affine_expr(replace(lin, div=1)))

    def _substitute_node(self, node: Expr) -> Expr:
        if isinstance(node, IndexVal) and node.name in self.solutions:
            solution = self.solutions[node.name]
            if solution.div != 1:
                self.ban.add(node.name)
                return node
            new = affine_expr(solution, node.offset)
            if node.name in self.unsure:
                self.tainted.add(id(new))
            return new
        if isinstance(node, Access):
            idx = tuple(self._substitute_idx(node.array, axis, i) for axis, i in enumerate(node.idx))
            new = replace(node, idx=tuple(i for i, _ in idx))
            if any(padded for _, padded in idx):
                self.tainted.add(id(new))
            return new
        return node

    def _substitute_idx(self, array: str, axis: int, idx: Idx) -> tuple[Idx, bool]:
        """The index expression after substitution, and whether it now reads through a pad that may
        give zero where the original did not."""
        inner = idx_affine(idx)
        names = set(inner.names())
        if not names & set(self.solutions):
            return idx, False
        lin = AffineForm.of(inner).substitute(self.solutions).normalized()
        risky = bool(names & self.unsure)
        if isinstance(idx, Affine):
            extent = Range(Sym(0), Sym.extent(array, axis))
            if not risky or all(self.fw.sizes.within(lin, extent.lo, extent.hi, self.all_ranges)):
                return lin.to_affine(), False
            return Wrapped("pad", lin.to_affine()), True
        if isinstance(idx, Wrapped):
            if lin.div != 1 and idx.kind != "pad":
                self.ban.update(names & set(self.solutions))
            return replace(idx, inner=lin.to_affine()), risky and idx.kind == "pad"
        extent = Range(Sym(0), Sym.extent(idx.array, 0))
        if lin.div != 1 or (risky and not all(self.fw.sizes.within(lin, extent.lo, extent.hi, self.all_ranges))):
            self.ban.update(names & (self.unsure | {n for n, s in self.solutions.items() if s.div != 1}))
        return replace(idx, inner=lin.to_affine()), False


def _idx_names(node: Expr) -> set[str]:
    if isinstance(node, IndexVal):
        return {node.name}
    if isinstance(node, Access):
        return set().union(*(idx_affine(i).names() for i in node.idx))
    return set()


def _unsafe(expr: Expr, tainted: set[int], safe: bool = True) -> bool:
    if id(expr) in tainted and not safe:
        return True
    if isinstance(expr, Unary):
        return _unsafe(expr.arg, tainted, safe)
    if isinstance(expr, Call):
        inner = safe and functions.get(expr.fn).safe_at_pad
        return any(_unsafe(a, tainted, inner) for a in expr.args)
    if isinstance(expr, Binary):
        lhs_safe, rhs_safe = safe, safe
        if expr.op == "/":
            rhs_safe = False
        elif expr.op == "^":
            exponent = literal(expr.rhs)
            lhs_safe = safe and isinstance(exponent, int) and exponent >= 0
            rhs_safe = False
        return _unsafe(expr.lhs, tainted, lhs_safe) or _unsafe(expr.rhs, tainted, rhs_safe)
    return False


# =============================================================================================
# Assembling the steps
# =============================================================================================
def _assemble(fw: _Forward, inp: Input, result: str, contributions: list) -> tuple[Spec, ...]:
    """One ':=' step for the terms that share their reduced indices, a '+=' step per other group, then the
    scatter steps ('+=' into the result; into zeros when they come first)."""
    terms = [c for c in contributions if isinstance(c, _Term)]
    scatters = [c for c in contributions if isinstance(c, _Scatter)]
    outs = terms[0].outs if terms else _default_outputs(fw, inp)
    groups: list[tuple[dict[str, Range], list[Expr]]] = []
    for term in terms:
        body, remaining = _rename_outputs(fw, term, outs)
        _add_to_groups(groups, body, remaining, fw.sizes)
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


def _default_outputs(fw: _Forward, inp: Input) -> tuple[str, ...]:
    """Output index names for a gradient with no inverted term: the left-hand side's for the given output,
    else those of a plain occurrence (x[i,j]) when there is one."""
    spec = fw.spec
    if inp.name == spec.out and spec.lhs and not spec.is_scatter:
        return tuple(idx.plain for idx in spec.lhs)
    for occ in _occurrences(spec.body, inp.name):
        names = tuple(i.plain if isinstance(i, Affine) else None for i in occ.idx)
        if None not in names and len(set(names)) == len(names):
            return names
    return _fresh_names(fw, inp.rank)


def _rename_outputs(fw: _Forward, term: _Term, outs: tuple[str, ...]) -> tuple[Expr, dict[str, Range]]:
    """The term over the gradient's output index names (its reduced indices renamed out of their way)."""
    mapping = dict(zip(term.outs, outs))
    taken = set(fw.taken) | set(outs) | set(term.outs) | {n for n, _ in term.remaining}
    remaining: dict[str, Range] = {}
    for name, rng in term.remaining:
        new = name
        if name in outs:
            new = _fresh_index(taken)
            taken.add(new)
        mapping[name] = new
        remaining[new] = rng
    return _rename_indices(term.body, mapping), remaining


def _add_to_groups(groups: list, body: Expr, remaining: dict[str, Range], sizes: _Sizes) -> None:
    """Sum the term into a group that reduces over the same ranges (renaming its reduced indices to the
    group's), or open a new group: one spec sums its whole body over ALL its reduced indices."""
    for group_ranges, bodies in groups:
        match = _match_ranges(remaining, group_ranges, sizes)
        if match is not None:
            bodies.append(_rename_indices(body, match))
            return
    groups.append((dict(remaining), [body]))


def _match_ranges(mine: dict[str, Range], theirs: dict[str, Range], sizes: _Sizes) -> dict[str, str] | None:
    if len(mine) != len(theirs):
        return None

    def same(a: Range, b: Range) -> bool:
        return sizes.canon(a.lo) == sizes.canon(b.lo) and sizes.canon(a.hi) == sizes.canon(b.hi)

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
        return AffineForm.canonical({mapping.get(n, n): c for n, c in a.terms}, a.const, a.div).to_affine() \
            if any(n in mapping for n, _ in a.terms) else a

    def idx(i: Idx) -> Idx:
        return aff(i) if isinstance(i, Affine) else replace(i, inner=aff(i.inner))

    def fix(node: Expr) -> Expr:
        if isinstance(node, IndexVal) and node.name in mapping:
            return replace(node, name=mapping[node.name])
        if isinstance(node, Access):
            return replace(node, idx=tuple(idx(i) for i in node.idx))
        return node
    return map_expr(body, fix)
