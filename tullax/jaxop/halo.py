"""Halo exchange for a windowed read split across devices (``x[i+k]`` split along ``i``: a convolution).

The windowed axis of ``x`` takes the factor of ``i`` in the kernel's partitioning rule (``tullax.jaxop.partition``),
so Shardy splits ``x`` and the result alike, each as it stands: ``x`` (length ``N``) in blocks of ``C = ceil(N/P)``,
the result (length ``N - h``, ``h = max(k) + c`` the halo) in blocks of ``B = (N - h)/P``. Device ``d`` computes
the result's block ``[d*B, (d+1)*B)`` and reads ``x[d*B : d*B + B + h]``: its own block of ``x`` shifted left by
``d*(C - B)`` elements, and extended by the elements after it. It receives the last ``(P-1)*(C-B)`` elements of
its left neighbour's block and the first ``h - (C-B)`` of its right neighbour's (one ``ppermute`` each, as XLA's
own partitioning of a convolution does), and slices its window out of the three. ``x`` is never sliced before
the exchange: a slice to the result's length would be re-blocked by the partitioner (a collective of its own),
and the whole axis is never gathered.
"""
from __future__ import annotations

from typing import Any, Sequence

from tullax.jaxop.partition_rule import Factors


def halo_sizes(spec: Any, rule: Factors, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[str, int]]:
    """Per windowed axis's factor: the factor split with it and its halo ``h`` for these (global) shapes."""
    ranges = spec.range_of
    return {factor: (split, offset + (ranges[window].hi.eval(shapes) - 1 if window else 0))
            for factor, split, window, offset in rule.halo}


def reach(extent: int, halo: int, parts: int) -> tuple[int, int, int, int]:
    """``(B, C, left, right)``: the result's block, the input's block (the last one padded), and how many
    elements a device takes from the end of its left neighbour's block and from the start of its right one's."""
    block = (extent - halo) // parts
    held = -(-extent // parts)
    return block, held, (parts - 1) * (held - block), max(0, halo - (held - block))


def fits(extent: int, halo: int, parts: int) -> bool:
    """Whether each device's neighbours hold what its window needs: ``extent`` the axis's length, ``halo`` h,
    the index split in ``parts`` blocks."""
    if halo <= 0 or (extent - halo) % parts or extent <= halo:
        return False
    block, held, left, right = reach(extent, halo, parts)
    return left <= held and right <= held and extent - (parts - 1) * held >= 0


def window(held: Any, axis: int, mesh_axes: Sequence[str], parts: int, extent: int, halo: int) -> Any:
    """This device's window ``x[d*B : d*B + B + h]`` of the windowed axis (inside the per-shard function of
    ``tullax.jaxop.partition``), from ``held``, its block of ``x``, and its neighbours' (see the module
    docstring). Not split (no ``mesh_axes``): ``held`` is the whole axis."""
    from jax import lax

    if not mesh_axes:
        return held
    names = tuple(mesh_axes) if len(mesh_axes) > 1 else mesh_axes[0]
    block, size, left, right = reach(extent, halo, parts)
    pieces = []
    if left:  # the end of the left neighbour's block
        tail = lax.slice_in_dim(held, size - left, size, axis=axis)
        pieces.append(lax.ppermute(tail, names, [(d, d + 1) for d in range(parts - 1)]))
    pieces.append(held)
    if right:  # the start of the right neighbour's block
        head = lax.slice_in_dim(held, 0, right, axis=axis)
        pieces.append(lax.ppermute(head, names, [(d + 1, d) for d in range(parts - 1)]))
    joined = lax.concatenate(pieces, axis) if len(pieces) > 1 else held
    start = left - lax.axis_index(names) * (size - block)
    return lax.dynamic_slice_in_dim(joined, start, block + halo, axis=axis)


__all__ = ["fits", "halo_sizes", "reach", "window"]
