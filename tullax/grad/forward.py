"""The forward spec as its gradients see it: names taken, ranks, ranges, the extents known equal, the seed
factor every gradient term carries and the prelude steps that factor reads.

``forward_of`` builds it once per spec; everything after only reads it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Mapping

from tullax.grad.algebra import Maybe, call, cmp, div, mul, sub
from tullax.grad.bounds import Axis, KnownSizes
from tullax.grad.derivative import (
    cotangent,
    derivative,
    derivative_from_output,
    has_output_form,
    has_zero_derivative,
    unary_derivative,
    wirtinger,
)
from tullax.grad.names import fresh, seed_name, spec_names
from tullax.grad.steps import Fact, make_spec
from tullax.spec import functions
from tullax.spec.analyze import shift_indices
from tullax.spec.ir import (
    ARITHMETIC,
    Access,
    Affine,
    Binary,
    Call,
    Expr,
    Hole,
    Idx,
    IndexVal,
    Indirect,
    Num,
    Param,
    Range,
    Spec,
    Unary,
    map_expr,
    walk,
)
from tullax.spec.sizes import Extent, Sym
from tullax.spec.valuetype import is_complex, result_is_complex


@dataclass(frozen=True)
class Forward:
    """What every gradient of one spec shares. ``factor`` is ΔOUT * f'(pre) * ∂OUT/∂body in the forward's
    indices (None: zero); ``prelude`` holds the steps it reads (the recomputed pre-finaliser value, tie
    counts), in the order they run."""

    spec: Spec
    seed: str
    taken: frozenset[str]
    ranks: Mapping[str, int]
    ranges: Mapping[str, Range]
    sizes: KnownSizes
    facts: tuple[Fact, ...]
    prelude: tuple[Spec, ...] = ()
    factor: Maybe = None
    # the complex arrays and scalars: inputs, and the seed, residual and prelude values that are complex
    # (``spec.valuetype``); empty for a real spec, whose gradients derive as they always did
    complex_names: frozenset[str] = frozenset()
    hole: Expr | None = None  # what the finaliser's ``_`` reads in gradient terms (the pre-finaliser value)
    multiplier: Expr | None = None  # '*=': the factor fin(prod) read at the free indices (a prelude step)
    # a finaliser f(E) differentiated from the result (``_inner_slope``): ΔOUT * f'(E), which a finaliser
    # term multiplies by dE/dv; None: finaliser terms read the pre-finaliser value through ``hole``
    outer: Expr | None = None

    @property
    def indices(self) -> tuple[str, ...]:
        return self.spec.free + self.spec.reduced

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
        extent = Sym.extent(spec.out, axis)
        return self.sizes.at_least(Sym(0), rng.lo) and self.sizes.at_least(rng.hi, extent) \
            and self.sizes.at_least(extent, rng.hi)

    def free_only(self) -> "Forward":
        """The forward as the finaliser sees it: over the free indices alone (it runs after the reduction),
        so a finaliser term inverts with nothing left to reduce."""
        ranges = {name: self.ranges[name] for name in self.spec.free}
        spec = replace(self.spec, reduced=(), ranges=tuple(ranges.items()))
        return replace(self, spec=spec, ranges=MappingProxyType(ranges))

    def finalizer_term(self, is_var) -> Maybe:
        """ΔOUT times ∂(finaliser)/∂v, ``_`` read as the pre-finaliser value (None: zero)."""
        if self.outer is not None:
            assert isinstance(self.spec.finalizer, Call)
            return mul(self.outer, derivative(self.spec.finalizer.args[0], is_var))
        d_fin = derivative(self.spec.finalizer, is_var)
        if d_fin is None:
            return None
        seed = Access(self.seed, self.spec.lhs) if self.spec.lhs else Param(self.seed)
        return mul(seed, fill_hole(d_fin, self.hole))

    def make_spec(self, out: str, body: Maybe, ranges: Mapping[str, Range], *, free: tuple[str, ...] = (),
                  assign: str = ":=", redop: str = "+", lhs: tuple[Idx, ...] | None = None,
                  rank: int | None = None, finalizer: Expr | None = None) -> Spec:
        """A gradient step (see ``steps.make_spec``) that may read every array of the forward and prelude."""
        return make_spec(self.ranks, self.facts, out, body, ranges, free=free, assign=assign, redop=redop,
                         lhs=lhs, rank=rank, finalizer=finalizer)


def forward_of(spec: Spec, complex_inputs: frozenset[str] = frozenset(), hoist_factor: bool = True) -> Forward:
    """``complex_inputs``: the data inputs that hold complex numbers (their gradients follow jax's convention);
    ``hoist_factor``: a costly seed factor may be a prelude step of its own (``_worth_a_step``)."""
    seed = seed_name(spec)
    rank = len(spec.lhs or ())
    ranks = {i.name: i.rank for i in spec.inputs if i.kind != "scalar"}
    ranks.update({spec.out: rank, seed: rank})
    sizes, facts = _learn_sizes(spec, seed)
    names = frozenset(complex_inputs)
    if result_is_complex(spec, names):
        names |= {seed, spec.out} if spec.assign == ":=" else {seed}
    base = Forward(spec, seed, frozenset(spec_names(spec) | {seed}), MappingProxyType(ranks),
                   MappingProxyType(dict(spec.ranges)), sizes, facts, complex_names=names)
    return _with_seed_factor(base, hoist_factor)


def _learn_sizes(spec: Spec, seed: str) -> tuple[KnownSizes, tuple[Fact, ...]]:
    """Agreeing axes share one canonical extent; the seed (and a ':=' residual) has the result's shape."""
    root: dict[Axis, Axis] = {}

    def find(axis: Axis) -> Axis:
        while axis in root:
            axis = root[axis]
        return axis

    facts: list[Fact] = []
    for agr in spec.agreements:
        first, second = find(agr.first), find(agr.second)
        if first != second:
            root[second] = first
        facts.append((agr.first, agr.second, agr.index))
    equal = {axis: Sym.extent(*find(axis)) for axis in root}
    for axis, extent in enumerate(spec.out_shape):
        equal[(seed, axis)] = extent
        facts += _fact_for(seed, axis, extent)
        if spec.assign == ":=":
            equal[(spec.out, axis)] = extent
            facts += _fact_for(spec.out, axis, extent)
    return KnownSizes(MappingProxyType(equal)), tuple(facts)


def _fact_for(array: str, axis: int, extent: Sym) -> tuple[Fact, ...]:
    """``size(array, axis) == extent`` as an agreement when ``extent`` is one other array's axis."""
    if len(extent.terms) == 1 and extent.const == 0 and extent.terms[0][1] == 1 \
            and isinstance(extent.terms[0][0], Extent):
        atom = extent.terms[0][0]
        if (atom.array, atom.axis) != (array, axis):
            return (((array, axis), (atom.array, atom.axis), "Δ"),)
    return ()


def _free_step(fw: Forward, base: str, body: Expr, redop: str,
               finalizer: Expr | None = None) -> tuple[Forward, Expr]:
    """A prelude step ``name[free] := (redop) body |> finalizer`` over the forward's own free indices (shifted to
    start at 0): the forward with that step, and how the forward body reads the step's result."""
    spec = fw.spec
    name = fresh(base, fw.taken)
    shifts = {i: fw.ranges[i].lo for i in spec.free if fw.ranges[i].lo != Sym(0)}
    ranges = {i: Range(Sym(0), fw.ranges[i].extent()) for i in spec.free}
    ranges.update({r: fw.ranges[r] for r in spec.reduced})
    if shifts:
        body = shift_indices(body, shifts)
        finalizer = shift_indices(finalizer, shifts) if finalizer is not None else None
    step = fw.make_spec(name, body, ranges, free=spec.free, redop=redop, finalizer=finalizer)
    sizes, facts = fw.sizes, fw.facts
    for axis, extent in enumerate(step.out_shape):
        sizes = sizes.with_equal((name, axis), extent)
        facts += _fact_for(name, axis, extent)
    names = fw.complex_names | ({name} if is_complex(body, fw.complex_names) else set())
    grown = replace(fw, taken=fw.taken | {name}, ranks=MappingProxyType({**fw.ranks, name: len(spec.free)}),
                    sizes=sizes, facts=facts, prelude=fw.prelude + (step,), complex_names=names)
    if not spec.free:
        return grown, Param(name)
    return grown, Access(name, tuple(Affine(((i, 1),), -shifts.get(i, Sym(0))) for i in spec.free))


def _with_seed_factor(fw: Forward, hoist_factor: bool = True) -> Forward:
    """The forward with its seed factor ΔOUT[free] * f'(pre) * ∂OUT/∂body and the prelude steps it reads."""
    spec = fw.spec
    # a scatter dropped the elements whose ix[e] is outside the result: the cotangent there reads 0, not NaN
    seed_at = tuple(replace(i, pad=True) if isinstance(i, Indirect) else i for i in spec.lhs or ())
    seed = Access(fw.seed, seed_at) if spec.lhs else Param(fw.seed)
    out_value = Access(spec.out, spec.lhs) if spec.lhs else Param(spec.out)  # the result (or given) element
    given: Expr | None = None  # '*=' (not scattered): the given value, folded into the product of the others
    if spec.assign == "*=":  # OUT = given * prod body: the body's terms carry the given value
        fw, multiplier = _free_step(fw, "mult", spec.body, "*")  # the parser refuses a finaliser with *=
        fw = replace(fw, multiplier=multiplier)
        if spec.is_scatter:
            seed = mul(seed, out_value)
        else:
            given = out_value
    residual = out_value if spec.assign == ":=" else None

    def pre_value(fw: Forward) -> tuple[Forward, Expr]:
        """The pre-finaliser value: the residual itself when there is no finaliser, else recomputed."""
        if residual is not None and not spec.finalizer:
            return fw, residual
        return _free_step(fw, "pre", spec.body, spec.redop)

    grad: Maybe = seed
    pre: Expr | None = None
    finalizer = _unary_finalizer(spec.finalizer)
    if finalizer and functions.get(finalizer).on_complex != "holomorphic" \
            and is_complex(spec.body, fw.complex_names):  # conj, real, imag, abs of a complex value
        fw, pre = pre_value(fw)
        pair = wirtinger(Call(finalizer, (pre,)), lambda node: node == pre, fw.complex_names)
        return replace(fw, factor=cotangent(seed, pair, fw.complex_names))
    if finalizer and has_zero_derivative(finalizer):
        grad = None
    elif finalizer and residual is not None and has_output_form(finalizer):
        grad = mul(seed, derivative_from_output(finalizer, residual))
    elif finalizer:
        fw, pre = pre_value(fw)
        grad = mul(seed, unary_derivative(finalizer, pre))
    elif spec.redop == "+" and residual is not None and not fw.complex_names \
            and (slope := _inner_slope(spec.finalizer)) is not None:  # max/min and logsumexp need pre
        # f(E(_)) where f' has an output form and E is linear in _ (``tanh(_ + c[o])``): f'(E(pre)) * E' from
        # the result alone; recomputing pre would repeat the forward's whole reduction
        assert isinstance(spec.finalizer, Call)
        outer = mul(seed, derivative_from_output(spec.finalizer.fn, residual))
        if hoist_factor and outer is not None and _worth_a_step(fw, outer, operations=3):
            fw, outer = _hoisted(fw, outer)
        return replace(fw, factor=mul(outer, slope), outer=outer)
    elif spec.finalizer is not None:  # an expression of _: its derivative in _, at _ = pre
        fw, pre = pre_value(fw)
        fw = replace(fw, hole=pre)
        grad = mul(seed, fill_hole(derivative(spec.finalizer, lambda node: isinstance(node, Hole)), pre))
    if grad is None or spec.redop == "+":
        if grad is not None and hoist_factor and _worth_a_step(fw, grad):
            fw, grad = _hoisted(fw, grad)
        return replace(fw, factor=grad)
    if spec.redop == "*":
        return _product_factor(fw, grad, given)
    if pre is None:
        fw, pre = pre_value(fw)
    if spec.redop in ("max", "min"):  # ties share the gradient equally, as jax does
        hit = _winner(spec.body, pre)
        if not hoist_factor:  # a recurrence's adjoint: its prelude steps read the forward only, never the seed
            fw, ties = _free_step(fw, "count", hit, "+")
            if not _reproducible(spec.body):  # a near-miss may find no winner at all: no 0/0
                ties = call("max", ties, Num(1))
            return replace(fw, factor=div(mul(grad, hit), ties))
        # each winner's share, grad / (number of winners), as a step over the free indices alone: a division by
        # the count read in every gradient term kept a strided window's input gradient from dividing its output
        # index (pad((m-p)/2) reads 0 between windows: 0/0), summing every window behind guards instead. The count
        # stays a plain sum and the share an elementwise step (no finaliser over a sum): a split sum's partition
        # rule combines the count's partial sums, and both split along the free indices as the gradient does
        fw, ties = _free_step(fw, "count", hit, "+")
        if not _reproducible(spec.body):  # a near-miss may find no winner at all: no 0/0
            ties = call("max", ties, Num(1))
        fw, share = _hoisted(fw, div(grad, ties), "share")
        return replace(fw, factor=mul(share, hit))
    return replace(fw, factor=mul(grad, call("exp", sub(spec.body, pre))))  # logsumexp


def _worth_a_step(fw: Forward, factor: Expr, operations: int | None = None) -> bool:
    """Whether the seed factor of a sum is computed once, as a step over the free indices, rather than in every
    gradient's loop nest: there it is evaluated once per reduced index too (``h[b,o] := x[b,i]*W[i,o] |> tanh``:
    Δx's loop over (b,i,o) took a tanh per term, 64 times the (b,o) it depends on). Where it calls a function
    (a transcendental, or several operations), or takes at least ``operations`` (``Δh*(1 - h^2)``: three per
    term, as many as a product term itself), over a plain ':=' result of a real spec with reduced indices."""
    spec = fw.spec
    costly = operations is not None and sum(isinstance(node, Binary | Unary | Call) for node in walk(factor)) \
        >= operations
    return bool(spec.reduced) and spec.assign == ":=" and not spec.is_scatter and not fw.complex_names \
        and (costly or any(isinstance(node, Call) for node in walk(factor)))


def _inner_slope(finalizer: Expr | None) -> Maybe:
    """dE/d_ for a finaliser ``f(E)`` whose f' has an output form and whose E is a sum of ``_`` times a constant
    and terms without ``_`` (its derivative by ``_`` and by every array or scalar it reads has no ``_``), else None
    (a zero slope too: the general rule handles it)."""
    if not (isinstance(finalizer, Call) and len(finalizer.args) == 1 and has_output_form(finalizer.fn)):
        return None
    inner = finalizer.args[0]
    slope = derivative(inner, lambda node: isinstance(node, Hole))
    if slope is None:
        return None
    for read in {node for node in walk(inner) if isinstance(node, Access | Param)}:
        if any(isinstance(node, Hole) for node in walk(derivative(inner, lambda node, r=read: node == r) or Num(0))):
            return None
    return None if any(isinstance(node, Hole) for node in walk(slope)) else slope


def _hoisted(fw: Forward, factor: Expr, base: str = "g") -> tuple[Forward, Expr]:
    """``factor`` (over the free indices) as a prelude step of its own, and how the gradients read it."""
    grown, value = _free_step(fw.free_only(), base, factor, "+")  # no reduced index: nothing to sum
    return replace(grown, spec=fw.spec, ranges=fw.ranges), value


def _product_factor(fw: Forward, grad: Expr, given: Expr | None = None) -> Forward:
    """The factor of a (*) reduction: d(prod_r b_r)/d b_s is the product of the OTHER factors, exact at zeros
    and written so that differentiating it again (jax.hessian) is exact too. Prelude steps: ``zeros`` counts
    the zero factors, ``others`` multiplies the nonzero ones (a zero counts as 1, through a select whose
    derivative is 0) and ``zsum`` adds the zero ones (always 0: it is there for its derivative, 1 w.r.t. the
    zero factor). Then the product of the others is

        no zero:   others / b_s                      (b_s is not zero: no division by 0)
        one zero:  others at it, zsum*others/b_s elsewhere (0, with the right derivative w.r.t. the zero)
        two zeros: (zsum - b_s)*others at each of them (0: the other zero), 0 elsewhere
        more:      0

    Each case is the exact product as a function near the point for first and second derivatives (third and
    higher derivatives at a point where two or more factors are zero are not).

    ``given``: the value '*=' multiplies the product into. Every case is linear in ``others``, so ``others``
    multiplies it in as its finaliser (``|> _ * O[i]``), which a float32 kernel applies to the product's float64
    total before rounding it: the product of the others alone may be beyond float32 where given times it is
    not (1e40 times a given 1e-3 read inf)."""
    body = fw.spec.body
    is_zero = cmp("==", body, Num(0))
    nonzero = call("ifelse", is_zero, Num(1), body)
    fw, zeros = _free_step(fw, "zeros", is_zero, "+")
    fw, others = _free_step(fw, "others", nonzero, "*", None if given is None else mul(Hole(), given))
    fw, zsum = _free_step(fw, "zsum", call("ifelse", is_zero, body, Num(0)), "+")
    apart = div(others, nonzero)

    def count(n: int) -> Expr:
        return cmp("==", zeros, Num(n))

    two = call("ifelse", count(2), call("ifelse", is_zero, mul(sub(zsum, body), others), Num(0)), Num(0))
    one = call("ifelse", count(1), call("ifelse", is_zero, others, mul(zsum, apart)), two)
    return replace(fw, factor=mul(grad, call("ifelse", count(0), apart, one)))


# Relative distance under which a recomputed body value counts as reaching the max/min. Compilers contract
# a*b + c*d into fused multiply-adds differently in different kernels (XLA does, unconditionally), and under
# fast-math reassociate sums differently (the C compiler hoisted ``-c[i] + c[0]`` out of one kernel and not the
# other), so a body recomputed by a gradient kernel may differ from the forward's in the last bits. Those bits
# are relative to the magnitude of the terms of a sum, not to its value: a body that cancels (``x[i,j] - c[i] +
# c[0]`` with c near 1000 and x near 1) is measured against its terms (``_magnitude``).
TIE_TOLERANCE = 1e-6


def _unary_finalizer(finalizer: Expr | None) -> str | None:
    """The function name of a finaliser ``f(_)`` (``|> f``), else None."""
    if isinstance(finalizer, Call) and len(finalizer.args) == 1 and isinstance(finalizer.args[0], Hole):
        return finalizer.fn
    return None


def fill_hole(expr: Maybe, value: Expr | None) -> Maybe:
    """``expr`` with the finaliser's ``_`` replaced by ``value``."""
    if expr is None:
        return None
    return map_expr(expr, lambda node: value if isinstance(node, Hole) else node)


def _winner(body: Expr, extreme: Expr) -> Expr:
    """1 where ``body`` attains the reduction's ``extreme``: exact equality when every kernel computes the
    body bitwise alike, otherwise equality up to TIE_TOLERANCE (relative)."""
    if _reproducible(body):
        return cmp("==", body, extreme)
    gap = call("abs", sub(body, extreme))
    scale = call("abs", extreme)
    if _has_sum(body):  # rounding in any order of the sum is bounded relative to its terms' magnitudes
        scale = call("max", scale, _magnitude(body))
    return cmp("<=", gap, mul(Num(TIE_TOLERANCE), scale))


def _has_sum(expr: Expr) -> bool:
    """Whether ``expr`` adds or subtracts anywhere in its arithmetic (through signs, products and quotients)."""
    if isinstance(expr, Unary):
        return _has_sum(expr.arg)
    if isinstance(expr, Binary) and expr.op in ("+", "-"):
        return True
    if isinstance(expr, Binary) and expr.op in ("*", "/"):
        return _has_sum(expr.lhs) or _has_sum(expr.rhs)
    return False


def _magnitude(expr: Expr) -> Expr:
    """The magnitude the rounding error of ``expr`` scales with, whatever order its sums are evaluated in:
    sums of the terms' magnitudes, products and quotients of the factors' (the standard forward error bound of
    arithmetic); any other node its own absolute value."""
    if isinstance(expr, Unary):
        return _magnitude(expr.arg)
    if isinstance(expr, Num) and not isinstance(expr.value, complex):
        return Num(abs(expr.value))
    if isinstance(expr, Binary) and expr.op in ("+", "-"):
        return Binary("+", _magnitude(expr.lhs), _magnitude(expr.rhs))
    if isinstance(expr, Binary) and expr.op == "*":
        return Binary("*", _magnitude(expr.lhs), _magnitude(expr.rhs))
    if isinstance(expr, Binary) and expr.op == "/":
        return Binary("/", _magnitude(expr.lhs), call("abs", expr.rhs))
    return call("abs", expr)


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
