"""Gradients of a recurrence (``tullax.spec.scan``): the existing inversion rules plus one rule.

The spec's unrolled form reads the trajectory h̃ (the initial state next to the result) as an ordinary input, so
``derive.gradients`` gives every gradient of it: Δx, Δlam, ... and Δh̃, each reading the cotangent Δh. The one
rule: a position of h̃ inside the result IS the result, so the result's cotangent is not Δh but the adjoint
state ``g = Δh + Δh̃`` (at h's positions), a recurrence running the other way:

    h[b,t,n] := lam[n]*h[b,t-1,n] + x[b,t,n]  (t scan from h0)
    g[b,t,n] := Δh[b,t,n] + g[b,t+1,n]*lam[n]  (t scan reverse)
    Δlam[n] := g[b,t,n]*ifelse(t >= 1, h[b,pad(t-1),n], h0[b,n])
    Δh0[b,n] := lam[n]*g[b,pad(0),n]

Every gradient is then the derived one with Δh read as g (computed first, by the same recurrence lowering) and
h̃ read as the result (or the initial state before it). Nonlinear bodies take their derivatives at the stored
results, as every tullax gradient does (``1 - h^2`` for tanh). Forward mode transposes these (as for every
kernel), so ``jacfwd`` runs them too.
"""
from __future__ import annotations

from dataclasses import replace

from tullax.errors import SpecError
from tullax.grad.names import fresh, seed_name, spec_names
from tullax.spec.ir import (
    Access,
    Affine,
    Binary,
    Call,
    Expr,
    Hole,
    Idx,
    IndexVal,
    Input,
    Num,
    Range,
    Size,
    Spec,
    Wrapped,
    accesses,
    map_expr,
)
from tullax.spec.scan import TRAJECTORY, Scan, unrolled
from tullax.spec.sizes import Extent, Sym
from tullax.spec.valuetype import result_is_complex


def scan_gradients(spec: Spec, complex_inputs: frozenset[str], derive) -> tuple[tuple[str, tuple, str], ...]:
    """(wrt, steps, result) of one ``Gradient`` per differentiable input of the recurrence ``spec``; ``derive``
    is ``derive.gradients`` (which builds the Gradients: no import back into it)."""
    scan: Scan = spec.scan
    flat = unrolled(spec)
    if complex_inputs and result_is_complex(flat, complex_inputs):  # the trajectory holds complex states too
        complex_inputs = complex_inputs | {TRAJECTORY}
    base = {grad.wrt: grad for grad in derive(flat, complex_inputs)}
    seed = seed_name(spec)
    g_name = fresh("g" + spec.out, spec_names(spec) | {seed} | {s.out for gr in base.values() for s in gr.steps})
    rename = {seed_name(flat): g_name}
    preludes, final = _split(base[TRAJECTORY], seed_name(flat))
    shared = tuple(_reading_result(spec, step, rename) for step in preludes)
    adjoint = _adjoint(spec, final, seed, g_name, rename)
    found = []
    for inp in spec.inputs:
        if inp.kind not in ("array", "scalar"):
            continue
        if inp.name == scan.init:
            steps = shared + (adjoint, _init_step(spec, final, g_name, rename))
            found.append((inp.name, steps, steps[-1].out))
            continue
        grad = base[inp.name]
        own = tuple(_reading_result(spec, step, rename) for step in grad.steps)
        steps = shared + (adjoint,) + tuple(step for step in own if step not in shared)
        found.append((inp.name, steps, grad.result))
    return tuple(found)


def _split(grad, seed: str) -> tuple[tuple[Spec, ...], Spec]:
    """The preludes of Δh̃ (forward values it reads, not the cotangent) and its last step, a plain spec."""
    *preludes, final = grad.steps
    if final.is_scatter or final.finalizer is not None or any(
            a.array == seed for step in preludes for a in accesses(step.body)):
        raise SpecError("the gradient of this recurrence w.r.t. its own earlier results is not one plain spec: "
                        "not supported yet")
    return tuple(preludes), final


def _adjoint(spec: Spec, step: Spec, seed: str, g_name: str, rename: dict) -> Spec:
    """The adjoint state ``g = Δh + Δh̃`` at h's positions, a recurrence in the other direction."""
    scan: Scan = spec.scan
    p = step.lhs[scan.axis].plain
    q = p  # the same name: it now runs over h's positions
    shift = Sym(scan.depth) if not scan.reverse else Sym(0)
    body = _substitute(step.body, p, Affine(((q, 1),), shift))
    body = _rename(body, rename)
    depth = 0

    def unpad(node: Expr) -> Expr:
        nonlocal depth
        if isinstance(node, Access) and node.array == g_name:
            idx = list(node.idx)
            pos = idx[scan.axis]
            pos = pos.inner if isinstance(pos, Wrapped) and pos.kind == "pad" else pos
            if not (isinstance(pos, Affine) and pos.names() == (q,) and pos.coef(q) == 1 and pos.const.is_const
                    and pos.const.const != 0 and (pos.const.const > 0) != scan.reverse):
                raise SpecError("the adjoint of this recurrence does not read itself at constant offsets: "
                                "not supported yet")
            depth = max(depth, abs(pos.const.const))
            idx[scan.axis] = pos
            for axis, other in enumerate(idx):  # the lanes are in range: the pads of the derivation go
                if axis != scan.axis and isinstance(other, Wrapped) and other.kind == "pad" and other.inner.plain:
                    idx[axis] = other.inner
            return Access(node.array, tuple(idx), span=node.span)
        return node

    body = map_expr(body, unpad)
    body = _inline_trajectory(body, spec)
    seed_read = Access(seed, step.lhs[:scan.axis] + (Affine.index(q),) + step.lhs[scan.axis + 1:])
    ranges = dict(step.ranges)
    ranges[q] = Range(Sym(0), Sym.extent(seed, scan.axis))
    ranges = {n: Range(_swap(r.lo, TRAJECTORY, seed), _swap(r.hi, TRAJECTORY, seed)) for n, r in ranges.items()}
    # the cotangent once per element: after the sum when there is one (a finaliser), else in the body
    finalizer = Binary("+", Hole(), seed_read) if step.reduced else None
    body = body if step.reduced else Binary("+", seed_read, body)
    adjoint = replace(
        step, out=g_name, body=body, finalizer=finalizer,
        ranges=tuple(ranges.items()), out_shape=tuple(ranges[n].extent() for n in step.free),
        scan=Scan(q, scan.axis, depth, not scan.reverse, None), agreements=())
    return replace(adjoint, inputs=_inputs(adjoint, spec, (seed,)))


def _init_step(spec: Spec, step: Spec, g_name: str, rename: dict) -> Spec:
    """Δh0: Δh̃ at the initial state's positions, reading g for Δh."""
    scan: Scan = spec.scan
    p = step.lhs[scan.axis].plain
    end = Sym(0) if not scan.reverse else Sym.extent(spec.out, scan.axis)
    rest = step.lhs[:scan.axis] + step.lhs[scan.axis + 1:]
    ranges = {n: Range(_swap(r.lo, TRAJECTORY, spec.out), _swap(r.hi, TRAJECTORY, spec.out))
              for n, r in step.ranges}
    if scan.depth == 1:
        position, lhs, free = Affine((), end), rest, tuple(n for n in step.free if n != p)
        del ranges[p]
    else:
        position, lhs, free = Affine(((p, 1),), end), (Affine.index(p),) + rest, (p,) + tuple(
            n for n in step.free if n != p)
        ranges[p] = Range(Sym(0), Sym(scan.depth))
    body = _inline_trajectory(_rename(_substitute(step.body, p, position), rename), spec)
    out = "Δ" + scan.init
    init_step = replace(step, out=fresh(out, spec_names(spec) | {g_name}), lhs=lhs, free=free, body=body,
                        ranges=tuple((n, ranges[n]) for n in free + step.reduced),
                        out_shape=tuple(ranges[n].extent() for n in free), agreements=())
    return replace(init_step, inputs=_inputs(init_step, spec, (g_name,)))


def _reading_result(spec: Spec, step: Spec, rename: dict) -> Spec:
    """A derived gradient step of the unrolled spec, reading g for Δh and the result for h̃."""
    body = _inline_trajectory(_rename(step.body, rename), spec)
    new = replace(step, body=body, finalizer=None if step.finalizer is None else _inline_trajectory(
        _rename(step.finalizer, rename), spec), lhs=step.lhs)
    swaps = {TRAJECTORY: spec.out, **rename}

    def swap(sym: Sym) -> Sym:
        for old, name in swaps.items():
            sym = _swap(sym, old, name)
        return sym

    ranges = tuple((n, Range(swap(r.lo), swap(r.hi))) for n, r in step.ranges)
    agreements = tuple(replace(a, first=(swaps.get(a.first[0], a.first[0]), a.first[1]),
                               second=(swaps.get(a.second[0], a.second[0]), a.second[1]))
                       for a in step.agreements if TRAJECTORY not in (a.first[0], a.second[0]))
    new = replace(new, ranges=ranges, out_shape=tuple(swap(s) for s in step.out_shape), agreements=agreements)
    return replace(new, inputs=_inputs(new, spec, tuple(rename.values())))


# ---------------------------------------------------------------------------------------------
def _inline_trajectory(expr: Expr, spec: Spec) -> Expr:
    """Every read of h̃ as a read of the result, or of the initial state outside it (``ifelse``)."""
    scan: Scan = spec.scan

    def fix(node: Expr) -> Expr:
        if not (isinstance(node, Access) and node.array == TRAJECTORY):
            return node
        pos = node.idx[scan.axis]
        padded = isinstance(pos, Wrapped) and pos.kind == "pad"
        aff = pos.inner if padded else pos
        if not isinstance(aff, Affine):
            raise SpecError("a gradient of this recurrence reads its trajectory at a computed position: "
                            "not supported yet")
        rest = node.idx[:scan.axis] + node.idx[scan.axis + 1:]
        shift = scan.depth if not scan.reverse else 0
        mine = Access(spec.out, node.idx[:scan.axis] + (Wrapped("pad", replace(aff, const=aff.const - shift)),)
                      + node.idx[scan.axis + 1:])
        if scan.init is None:
            return mine
        value = _affine_value(aff)
        if not scan.reverse:
            inside = Binary(">=", value, Num(scan.depth))
            init_pos: Idx = Wrapped("pad", aff)
        else:
            inside = Binary("<", value, Size(spec.out, scan.axis))
            init_pos = Wrapped("pad", replace(aff, const=aff.const - Sym.extent(spec.out, scan.axis)))
        start = Access(scan.init, rest if scan.depth == 1 else (init_pos,) + rest)
        if scan.depth == 1 and padded:  # reads outside h̃ give 0, as the pad did
            start = Call("ifelse", (Binary("<", value, Num(0)) if not scan.reverse else Binary(
                ">=", value, Binary("+", Size(spec.out, scan.axis), Num(1))), Num(0), start))
        return Call("ifelse", (inside, mine, start))

    return map_expr(expr, fix)


def _affine_value(aff: Affine) -> Expr:
    if aff.div != 1 or any(not isinstance(a, Extent) for a, _ in aff.const.terms):
        raise SpecError("a gradient of this recurrence reads its trajectory at a computed position: not "
                        "supported yet")
    parts: list[Expr] = [IndexVal(name) if coef == 1 else Binary("*", Num(coef), IndexVal(name))
                         for name, coef in aff.terms]
    parts += [Binary("*", Num(coef), Size(atom.array, atom.axis)) for atom, coef in aff.const.terms]
    if aff.const.const or not parts:
        parts.append(Num(aff.const.const))
    value = parts[0]
    for part in parts[1:]:
        value = Binary("+", value, part)
    return value


def _substitute(expr: Expr, name: str, value: Affine) -> Expr:
    """Index ``name`` replaced by the affine ``value`` in every position (values of the index too)."""

    def sub_aff(aff: Affine) -> Affine:
        coef = aff.coef(name)
        if not coef:
            return aff
        terms = dict((n, c) for n, c in aff.terms if n != name)
        for n, c in value.terms:
            terms[n] = terms.get(n, 0) + coef * c
        return replace(aff, terms=tuple((n, c) for n, c in terms.items() if c), const=aff.const + value.const * coef)

    def sub_idx(idx: Idx) -> Idx:
        if isinstance(idx, Affine):
            return sub_aff(idx)
        new = replace(idx, inner=sub_aff(idx.inner))
        return replace(new, offset=sub_aff(new.offset)) if hasattr(new, "offset") else new

    def fix(node: Expr) -> Expr:
        if isinstance(node, Access):
            return replace(node, idx=tuple(sub_idx(i) for i in node.idx))
        if isinstance(node, IndexVal) and node.name == name:
            if not value.const.is_const:
                raise SpecError("not supported yet: the value of a shifted scan index")
            return _affine_value(replace(value, const=value.const + node.offset))
        return node

    return map_expr(expr, fix)


def _rename(expr: Expr, names: dict) -> Expr:
    return map_expr(expr, lambda n: replace(n, array=names[n.array]) if isinstance(n, Access)
                    and n.array in names else n)


def _swap(sym: Sym, old: str, new: str) -> Sym:
    if not any(isinstance(a, Extent) and a.array == old for a, _ in sym.terms):
        return sym
    total = Sym(sym.const)
    for atom, coef in sym.terms:
        if isinstance(atom, Extent) and atom.array == old:
            total = total + Sym.extent(new, atom.axis) * coef
        else:
            total = total + Sym(0, ((atom, coef),))
    return total


def _inputs(step: Spec, spec: Spec, extra: tuple[str, ...]) -> tuple[Input, ...]:
    """The inputs ``step`` reads: its own (the trajectory left out), the result and initial state where read."""
    read = {a.array for e in (step.body, step.finalizer) if e is not None for a in accesses(e)}
    read |= {n.array for e in (step.body, step.finalizer) if e is not None for n in _walk(e) if isinstance(n, Size)}
    accessed = {a.array for e in (step.body, step.finalizer) if e is not None for a in accesses(e)}
    kept = [replace(i, kind="array") if i.kind == "shape" and i.name in accessed else i for i in step.inputs
            if i.name != TRAJECTORY and (i.name in read or i.kind in ("scalar", "shape"))]
    names = {i.name for i in kept}
    for name in (spec.out, spec.scan.init, *extra):
        if name is not None and name in read and name not in names:
            rank = next(len(a.idx) for e in (step.body, step.finalizer) if e is not None
                        for a in accesses(e) if a.array == name) if any(
                a.array == name for e in (step.body, step.finalizer) if e is not None for a in accesses(e)) \
                else len(spec.lhs)
            kept.append(Input(name, "array", rank))
            names.add(name)
    for name in _range_arrays(step):
        if name not in names:
            kept.append(Input(name, "shape", len(spec.lhs)))
            names.add(name)
    return tuple(kept)


def _walk(expr: Expr):
    from tullax.spec.ir import walk

    return walk(expr)


def _range_arrays(step: Spec) -> set[str]:
    found = set()
    for _, rng in step.ranges:
        for sym in (rng.lo, rng.hi):
            found |= {a.array for a, _ in sym.terms if isinstance(a, Extent)}
    return found - {step.out}


__all__ = ["scan_gradients"]
