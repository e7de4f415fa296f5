"""Halo exchange for a windowed read split across devices (``x[i+k]`` split along ``i``: a convolution; or the
padded window of its input gradient, ``Δy[pad(m-k)]`` split along ``m``).

The windowed axis of ``x`` takes the factor of ``i`` in the kernel's partitioning rule (``tullax.jaxop.partition``),
so Shardy splits ``x`` and the result alike, each as it stands: ``x`` (length ``N``) in blocks of ``C = ceil(N/P)``,
the index ``i`` (extent ``M``) in blocks of ``B = M/P``. Device ``d`` computes the result's block along ``i`` and
reads ``x[d*B + lo : d*B + B + hi]`` (``lo = 0``, ``hi = max(k) + c`` for ``x[i+k+c]``; ``lo = c - max(k)``,
``hi = c`` for ``pad(m-k+c)``, zero outside ``[0, N)``): its own block of ``x`` shifted by ``d*(B - C) + lo``
elements, and extended. It receives the end of its left neighbour's block and the start of its right
neighbour's (one ``ppermute`` each, as XLA's own partitioning of a convolution does), and slices its window out
of the three. ``x`` is never sliced before the exchange: a slice to the result's length would be re-blocked by
the partitioner (a collective of its own), and the whole axis is never gathered.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from tullax.jaxop.partition_rule import Factors


class Halo(NamedTuple):
    """A windowed axis read by a device's block of index ``split`` (extent ``extent``): ``[d*B + lo, d*B + B + hi)``,
    zero outside the axis where ``pad``."""

    split: str
    lo: int
    hi: int
    pad: bool
    extent: int


def halo_sizes(spec: Any, rule: Factors, shapes: dict[str, tuple[int, ...]]) -> dict[str, Halo]:
    """Per windowed axis's factor: its ``Halo`` for these (global) shapes. Several windows on one axis
    (``x[pad(i-1)] - 2*x[i] + x[pad(i+1)]``) read the span of them all; the padded windows of one index share one
    span (``frame``), since the kernel's index runs over the same positions in every array it reads."""
    ranges, index_of = spec.range_of, rule.index_of
    found: dict[str, Halo] = {}
    for factor, split, window, offset, sign in rule.halo:
        reach = ranges[window].hi.eval(shapes) - 1 if window else 0
        lo, hi = (offset - reach, offset) if sign < 0 else (offset, offset + reach) if sign > 0 else (0, offset + reach)
        if factor in found:
            lo, hi = min(lo, found[factor].lo), max(hi, found[factor].hi)
        found[factor] = Halo(split, lo, hi, bool(sign), ranges[index_of[split]].hi.eval(shapes))
    spans = frame(found.values())
    return {f: h._replace(lo=spans[h.split][0], hi=spans[h.split][1]) if h.pad else h for f, h in found.items()}


def frame(halos: Any) -> dict[str, tuple[int, int]]:
    """Per index split with padded windows: ``(lo, hi)``, ``lo <= 0 <= hi``, the span every array it reads holds
    around the index's block on each device: ``[d*B + lo, d*B + B + hi)``."""
    spans: dict[str, tuple[int, int]] = {}
    for halo in halos:
        if halo.pad:
            lo, hi = spans.get(halo.split, (0, 0))
            spans[halo.split] = (min(lo, halo.lo), max(hi, halo.hi))
    return spans


def reach(extent: int, halo: Halo, parts: int) -> tuple[int, int, int, int, int, int]:
    """``(B, C, left, right, front, back)``: the index's block, the input's block (the last one padded), how many
    elements a device takes from the end of its left neighbour's block and from the start of its right one's
    (only what lies inside the axis), and the zeros around them that keep every device's window inside."""
    block, held = halo.extent // parts, -(-extent // parts)
    starts = [d * (block - held) + halo.lo for d in range(parts)]  # each window's start, from its own block's
    width = block + halo.hi - halo.lo
    left = max([0] + [d * held - max(0, d * block + halo.lo) for d in range(1, parts)])
    right = max([0] + [min(extent, (d + 1) * block + halo.hi) - (d + 1) * held for d in range(parts - 1)])
    front = max(0, max(-left - start for start in starts))
    back = max(0, max(start + width - held - right for start in starts))
    return block, held, left, right, front, back


def fits(extent: int, halo: Halo, parts: int) -> bool:
    """Whether each device's neighbours hold what its window needs: ``extent`` the axis's length, the index
    split in ``parts`` blocks."""
    if halo.extent <= 0 or halo.extent % parts or extent - (parts - 1) * -(-extent // parts) < 0:
        return False
    _, held, left, right, _, _ = reach(extent, halo, parts)
    return left <= held and right <= held


def window(held: Any, axis: int, mesh_axes: Sequence[str], parts: int, extent: int, halo: Halo) -> Any:
    """This device's window ``x[d*B + lo : d*B + B + hi]`` of the windowed axis (inside the per-shard function of
    ``tullax.jaxop.partition``), from ``held``, its block of ``x``, and its neighbours' (see the module
    docstring). Not split (no ``mesh_axes``): ``held`` is the whole axis."""
    import jax.numpy as jnp
    from jax import lax

    if not mesh_axes:
        return held
    names = tuple(mesh_axes) if len(mesh_axes) > 1 else mesh_axes[0]
    block, size, left, right, front, back = reach(extent, halo, parts)
    pieces = []
    if front:
        pieces.append(_zeros(held, axis, front))
    if left:  # the end of the left neighbour's block
        tail = lax.slice_in_dim(held, size - left, size, axis=axis)
        pieces.append(lax.ppermute(tail, names, [(d, d + 1) for d in range(parts - 1)]))
    pieces.append(held)
    if right:  # the start of the right neighbour's block
        head = lax.slice_in_dim(held, 0, right, axis=axis)
        pieces.append(lax.ppermute(head, names, [(d + 1, d) for d in range(parts - 1)]))
    if back:
        pieces.append(_zeros(held, axis, back))
    joined = lax.concatenate(pieces, axis) if len(pieces) > 1 else held
    device = lax.axis_index(names)
    length = block + halo.hi - halo.lo
    found = lax.dynamic_slice_in_dim(joined, front + left + device * (block - size) + halo.lo, length, axis=axis)
    if not halo.pad:
        return found
    shape = [1] * found.ndim
    shape[axis] = length
    at = (device * block + halo.lo + lax.iota("int32", length)).reshape(shape)  # global positions
    return jnp.where((at >= 0) & (at < extent), found, jnp.zeros_like(found))


def _zeros(like: Any, axis: int, count: int) -> Any:
    import jax.numpy as jnp

    shape = list(like.shape)
    shape[axis] = count
    return jnp.zeros(shape, like.dtype)


__all__ = ["Halo", "fits", "frame", "halo_sizes", "reach", "window"]
