"""The tangent of a recurrence (issue 48): forward mode as a forward scan of the same shape.

For ``h[t] = f(h[t-1], ..., h[t-d], x, lam, ...)`` the tangent ``ḣ = J·(ẋ, l̇am, ...)`` obeys the linear
recurrence ``ḣ[t] = Σ_k ∂f/∂h[t-k] · ḣ[t-k] + Σ_x ∂f/∂x · ẋ``, run in the same direction from the initial
state's tangent (or zeros), with the derivatives taken at the stored trajectory:

    h[b,t,n] := lam[n]*h[b,t-1,n] + x[b,t,n]  (t scan from h0)
    dh[b,t,n] := lam[n]*dh[b,t-1,n] + dlam[n]*ifelse(t >= 1, h[b,pad(t-1),n], h0[b,n]) + dx[b,t,n]
                 (t scan from dh0)

One kernel whatever the number of inputs, where transposing the gradient kernels (``jaxop.primitives``'s
general forward mode) runs the adjoint recurrence and one gradient kernel per input, twice (a VJP of a VJP);
under ``jacfwd`` the tangents carry a batch index, so it is one batched scan. A sum inside the step
differentiates term by term; a finaliser contributes its derivative at the stored result (``1 - h^2`` for
tanh). Complex values: ``∂f·ż + ∂̄f·conj(ż)`` (``derivative.wirtinger``). Recurrences this does not cover (a
max/min/product reduction inside the step, a finaliser whose derivative still needs the reduced value) give
None: the general forward mode serves them.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from tullax.errors import SpecError
from tullax.grad.algebra import Maybe, add, mul, total
from tullax.grad.derivative import conj, wirtinger
from tullax.grad.names import fresh, spec_names
from tullax.grad.scan import _inline_trajectory
from tullax.spec.ir import Access, Expr, Hole, Input, Param, Spec, Wrapped, map_expr, walk
from tullax.spec.scan import TRAJECTORY, Scan, trajectory_position
from tullax.spec.valuetype import HOLE, body_is_complex, result_is_complex


@dataclass(frozen=True)
class Tangent:
    """The tangent recurrence of a spec: ``spec`` reads the forward inputs, the result (``spec.out`` of the
    forward), and the tangents ``tangents[name]`` of the differentiated inputs."""

    spec: Spec
    tangents: tuple[tuple[str, str], ...]  # (forward input, its tangent's input name)


@lru_cache(maxsize=256)
def tangent_spec(spec: Spec, live: tuple[str, ...], complex_names: frozenset[str] = frozenset()) -> Tangent | None:
    """The tangent recurrence of the recurrence ``spec`` w.r.t. the inputs ``live`` (None where it does not
    apply); ``complex_names``: the complex inputs."""
    scan: Scan = spec.scan
    if scan is None or spec.assign != ":=" or (spec.reduced and spec.redop != "+"):
        return None
    names = set(spec_names(spec))
    dotted = {}
    for name in live:
        dotted[name] = fresh("d" + name, names)
        names.add(dotted[name])
    out = fresh("d" + spec.out, names)
    names.add(out)
    if result_is_complex(spec, complex_names):
        complex_names = complex_names | {spec.out, out}
    complex_names = complex_names | {dotted[n] for n in live if n in complex_names}
    init_live = scan.init is not None and scan.init in dotted
    variables = set(live) - {scan.init} | {spec.out}
    try:
        whole = spec.body if spec.finalizer is None and not spec.reduced else None  # the result itself
        body = _tangent_of(spec, spec.body, variables, dotted, out, complex_names, None, whole)
        finalizer = None
        if spec.finalizer is not None:
            hole_names = complex_names | ({HOLE} if body_is_complex(spec, complex_names) else set())
            finalizer = _tangent_of(spec, spec.finalizer, variables, dotted, out, hole_names, Hole(),
                                    spec.finalizer)
    except SpecError:
        return None
    if body is None and finalizer is None:
        return None
    if not any(isinstance(n, Access) and n.array == out for e in (body, finalizer) if e is not None
               for n in walk(e)):
        return None  # no self-read left: not a recurrence (the general forward mode serves it)
    ranks = {i.name: i for i in spec.inputs}
    read = {n.array if isinstance(n, Access) else n.name for e in (body, finalizer) if e is not None
            for n in walk(e) if isinstance(n, (Access, Param))}
    # every forward input stays, those no longer read for their extents only (the ranges may name them)
    inputs = [i if i.name in read or i.kind in ("scalar", "index") else replace(i, kind="shape")
              for i in spec.inputs]
    if spec.out in read:
        inputs.append(Input(spec.out, "array", len(spec.lhs)))
    inputs += [replace(ranks[name], name=dotted[name]) for name in live]
    new = replace(spec, out=out, body=body if body is not None else _zero(), finalizer=finalizer,
                  inputs=tuple(inputs), scan=replace(scan, init=dotted[scan.init] if init_live else None),
                  agreements=tuple(a for a in spec.agreements if scan.init not in (a.first[0], a.second[0])))
    return Tangent(new, tuple(dotted.items()))


def _zero() -> Expr:
    from tullax.spec.ir import Num

    return Num(0)


def _tangent_of(spec: Spec, expr: Expr, variables: set, dotted: dict, out: str, names: frozenset,
                hole: Hole | None, whole: Expr | None) -> Maybe:
    """Σ over the distinct reads v of ``expr`` of a variable: ∂expr/∂v · v̇ (+ ∂̄expr/∂v · conj(v̇)); and for a
    finaliser, its derivative in the reduced value times that value's tangent (the finaliser's ``_``)."""
    reads: list[Expr] = []
    for node in walk(expr):
        if (isinstance(node, Access) and node.array in variables) or (
                isinstance(node, Param) and node.name in variables):
            if node not in reads:
                reads.append(node)
    terms = []
    for read in reads:
        d, b = wirtinger(expr, lambda e, r=read: e == r, names)
        dot = _dot(read, dotted, out)
        terms.append(add(mul(_at_result(spec, d, whole), dot), mul(_at_result(spec, b, whole), conj(dot, names))))
    if hole is not None:
        d, b = wirtinger(expr, lambda e: isinstance(e, Hole), names)
        if b is not None:
            raise SpecError("a non-holomorphic finaliser of a complex sum")
        terms.append(mul(_at_result(spec, d, whole), hole))
    return total(terms)


def _dot(read: Expr, dotted: dict, out: str) -> Expr:
    if isinstance(read, Param):
        return Param(dotted[read.name])
    return Access(dotted.get(read.array, out), read.idx)


def _at_result(spec: Spec, factor: Maybe, whole: Expr | None) -> Maybe:
    """A derivative factor read at the stored trajectory: ``whole`` (the finaliser, or an unreduced body) is the
    result itself, a self-read of the forward is its trajectory (the initial state before it); no ``_`` may
    remain."""
    if factor is None:
        return None
    lhs = spec.lhs
    scan = spec.scan

    def fix(node: Expr) -> Expr:
        if isinstance(node, Access) and node.array == spec.out:
            idx = list(node.idx)
            pos = idx[scan.axis]
            if isinstance(pos, Wrapped):
                raise SpecError("a wrapped self-read")
            idx[scan.axis] = trajectory_position(scan, pos)
            return Access(TRAJECTORY, tuple(idx))
        return node

    if whole is not None:
        factor = _replace_whole(factor, whole, Access(spec.out, lhs))
    factor = map_expr(factor, fix)
    if any(isinstance(n, Hole) for n in walk(factor)):
        raise SpecError("the finaliser's derivative reads the reduced value")
    return _inline_trajectory(factor, spec)


def _replace_whole(expr: Expr, whole: Expr, by: Expr) -> Expr:
    """``expr`` with every subexpression equal to ``whole`` replaced by ``by`` (top-down: the largest first)."""
    if expr == whole:
        return by
    from tullax.spec.ir import Binary, Call, Unary

    if isinstance(expr, Unary):
        return replace(expr, arg=_replace_whole(expr.arg, whole, by))
    if isinstance(expr, Binary):
        return replace(expr, lhs=_replace_whole(expr.lhs, whole, by), rhs=_replace_whole(expr.rhs, whole, by))
    if isinstance(expr, Call):
        return replace(expr, args=tuple(_replace_whole(a, whole, by) for a in expr.args))
    return expr


__all__ = ["Tangent", "tangent_spec"]
