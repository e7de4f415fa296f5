"""A padded window read over a long summed index, turned to run over the window's own short axis.

``Δx[m] := ΔΔw[pad(m-i+2)]*Δy[i]`` (the x gradient of ``Δw[k] := Δy[i]*x[pad(i+k-2)]``, 5 elements of ``ΔΔw``,
``i`` over the 32 of ``Δy``) sums, for each ``m``, 32 terms of which at most 5 are not zero, and its window over
``i`` is as long as ``Δy``: split along ``m``, a device would need all of ``Δy`` (an all-gather). With ``k =
m-i+2`` it is ``Δx[m] := ΔΔw[k]*Δy[pad(m-k+2)]``, the same sum (each term is zero where either read is), a
window of 5 over ``m``: split along ``m``, each device takes 2 elements of ``Δy`` from each neighbour
(``tullax.jaxop.halo``). Pure: a Spec and the inputs' global shapes in, a Spec out.
"""
from __future__ import annotations

from dataclasses import replace

from tullax.jaxop.partition_rule import _linear
from tullax.spec.ir import Access, Affine, IndexVal, Range, Spec, Wrapped, idx_names, map_expr, spec_accesses, walk
from tullax.spec.sizes import Sym


def swapped(spec: Spec, shapes: dict[str, tuple[int, ...]]) -> Spec:
    """``spec`` with its window ``A[pad(m-i+c)]`` (``m`` free, ``i`` summed from 0 over the extent of the axes
    it reads plainly, longer than ``A``'s axis, the body a product of both reads, a ``+`` sum, ``:=``) read as
    ``A[k]``, ``k`` summed over ``A``'s axis, and each ``B[i]`` as ``B[pad(m-k+c)]``; ``spec`` itself otherwise."""
    if spec.scan is not None or spec.finalizer is not None or spec.redop != "+" or spec.assign != ":=" or \
            spec.is_scatter:
        return spec
    reads = list(spec_accesses(spec))
    for access in reads:
        for axis, idx in enumerate(access.idx):
            found = _candidate(spec, shapes, reads, access, axis, idx)
            if found is not None:
                return found
    return spec


def _candidate(spec: Spec, shapes: dict, reads: list[Access], access: Access, axis: int, idx: object) -> Spec | None:
    if not isinstance(idx, Wrapped) or idx.kind != "pad" or access.array not in shapes:
        return None
    inner = idx.inner
    if inner.div != 1 or not inner.const.is_const or sorted(c for _, c in inner.terms) != [-1, 1]:
        return None
    (m,), (i,) = ([n for n, c in inner.terms if c == s] for s in (1, -1))
    ranges = spec.range_of
    if m not in spec.free or i not in spec.reduced or ranges[i].lo != Sym(0):
        return None
    if any(isinstance(node, IndexVal) and node.name == i for node in walk(spec.body)):
        return None
    others = [(a, p) for a in reads for p, x in enumerate(a.idx)
              if i in idx_names(x) and not (a is access and p == axis)]
    if not others or any(a is access or a.array not in shapes or not isinstance(a.idx[p], Affine) or
                         a.idx[p].plain != i for a, p in others):
        return None
    long = ranges[i].hi.eval(shapes)
    if shapes[access.array][axis] >= long or any(shapes[a.array][p] != long for a, p in others):
        return None
    if not _linear(spec.body, access) or not all(_linear(spec.body, a) for a, _ in others):
        return None
    k = next(n for n in ("k", "l", "n", "p", "q", *(f"k{j}" for j in range(99)))
             if n not in spec.indices and n not in spec.input_names and n != spec.out)
    window = Wrapped("pad", Affine(((m, 1), (k, -1)), const=inner.const))
    rewritten = {id(access): replace(access, idx=tuple(Affine.index(k) if p == axis else x
                                                       for p, x in enumerate(access.idx)))}
    for a, p in others:
        rewritten[id(a)] = replace(a, idx=tuple(window if q == p else x for q, x in enumerate(a.idx)))
    body = map_expr(spec.body, lambda node: rewritten.get(id(node), node))
    new_ranges = tuple((k, Range(Sym(0), Sym.extent(access.array, axis))) if n == i else (n, r)
                       for n, r in spec.ranges)
    agreements = tuple(a for a in spec.agreements if a.index != i)  # i's axes: equal, checked above
    return replace(spec, body=body, ranges=new_ranges, reduced=tuple(k if n == i else n for n in spec.reduced),
                   agreements=agreements)


__all__ = ["swapped"]
