"""Lane factors of a recurrence's tangent (issue 48): where an input's tangent is one number per lane.

In a lane-wise recurrence (every self-read at the result's own indices but the scan index), an input read only
at lane indices, ``lam[n]`` in ``h[b,t,n] := lam[n]*h[b,t-1,n] + x[b,t,n]``, forces the tangent recurrence with
``∂f/∂lam[b,t,n] · l̇am[n]``: a factor constant along the scan, while the recurrence acts lane by lane. Its
tangent is therefore ``ḣ[b,t,n] = s[b,t,n] · l̇am[n]`` with ``s`` the tangent for ``l̇am = 1``: ONE sensitivity
scan, however many tangents there are. Under ``jacfwd`` (n basis tangents) that replaces a batched scan writing
n trajectories by one scan and a broadcast product XLA fuses with what reads it (a final state: one slice), and
under ``jacrev`` the cotangent's contraction with ``s`` replaces n adjoint scans. The initial state factors the
same way (depth 1: its tangent is ``s`` for ``ḣ0 = 1`` times ``ḣ0``). Real values only: a non-holomorphic
body's tangent also reads ``conj(l̇am)``.
"""
from __future__ import annotations

from tullax.spec.ir import Access, Affine, Param, Spec, walk


def lane_factor(spec: Spec, name: str) -> tuple[int, ...] | None:
    """For the recurrence ``spec`` and its input ``name``: the result axes its axes stand at, in its own order,
    where its tangent factors out of the tangent recurrence (above); None where it does not."""
    scan = spec.scan
    if scan is None or spec.assign != ":=" or spec.lhs is None:
        return None
    lhs = [i.plain if isinstance(i, Affine) else None for i in spec.lhs]
    if None in lhs or len(set(lhs)) != len(lhs):
        return None
    lanes = [n for a, n in enumerate(lhs) if a != scan.axis]
    exprs = [e for e in (spec.body, spec.finalizer) if e is not None]
    nodes = [n for e in exprs for n in walk(e)]
    for node in nodes:  # lane-wise: the state is read at its own lanes (no mixing along any of them)
        if isinstance(node, Access) and node.array == spec.out:
            if any(not isinstance(i, Affine) or i.plain != lhs[a]
                   for a, i in enumerate(node.idx) if a != scan.axis):
                return None
    if name == scan.init:
        if scan.depth != 1 or any(isinstance(n, (Access, Param)) and _name(n) == name for n in nodes):
            return None
        return tuple(a for a in range(len(lhs)) if a != scan.axis)
    reads = {n for n in nodes if isinstance(n, (Access, Param)) and _name(n) == name}
    if not reads:
        return None
    if any(isinstance(n, Param) for n in reads):
        return () if len(reads) == 1 else None
    shapes = {tuple(i.plain if isinstance(i, Affine) else None for i in n.idx) for n in reads}
    if len(shapes) != 1:
        return None
    (idx,) = shapes
    if any(i is None or i not in lanes for i in idx) or len(set(idx)) != len(idx):
        return None
    return tuple(lhs.index(i) for i in idx)


def _name(node: Access | Param) -> str:
    return node.array if isinstance(node, Access) else node.name


__all__ = ["lane_factor"]
