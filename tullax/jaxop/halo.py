"""Halo exchange for a windowed read split across devices (``x[i+k]`` split along ``i``: a convolution).

Device ``d`` of ``P`` computes the result's block ``[d*B, (d+1)*B)`` of ``i`` and reads ``x[d*B : d*B + B + h]``
(``h = max(k) + c``: its halo). ``x`` is handed to the kernel's partitioning in two operands
(``tullax.jaxop.partition``): its head ``x[:P*B]``, split as ``i`` is (so Shardy shards it, and the result, along
the same mesh axes), and ``x`` whole, split as given, whose last device's block ends with the last ``h``
elements. Each device sends the first ``h`` elements of its block of the head to its left neighbour (one
``ppermute`` of ``h`` rows); the last device takes the end of its block of ``x``. The whole axis is never
gathered.
"""
from __future__ import annotations

from typing import Any, Sequence

from tullax.jaxop.partition_rule import Factors


def halo_sizes(spec: Any, rule: Factors, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[str, int]]:
    """Per windowed axis's factor: the factor split with it and its halo ``h`` for these (global) shapes."""
    ranges = spec.range_of
    return {factor: (split, offset + (ranges[window].hi.eval(shapes) - 1 if window else 0))
            for factor, split, window, offset in rule.halo}


def fits(extent: int, halo: int, parts: int) -> bool:
    """Whether a device's right neighbour holds its whole halo: ``extent`` the axis's length, ``halo`` h, the
    index split in ``parts`` blocks."""
    last = extent - (parts - 1) * -(-extent // parts)  # the real elements of the last device's block
    return (extent - halo) % parts == 0 and 0 < halo <= min((extent - halo) // parts, last)


def window(head: Any, tail: Any, axis: int, mesh_axes: Sequence[str], parts: int) -> Any:
    """This device's window of the windowed axis (inside the per-shard function of ``tullax.jaxop.partition``):
    its block of the head, then the first ``h`` elements of its right neighbour's block (the last device: the
    tail, the axis's last ``h`` elements). Not split (no ``mesh_axes``): head and tail joined."""
    import jax.numpy as jnp
    from jax import lax

    if not mesh_axes:
        return lax.concatenate([head, tail], axis)
    names = tuple(mesh_axes) if len(mesh_axes) > 1 else mesh_axes[0]
    first = lax.slice_in_dim(head, 0, tail.shape[axis], axis=axis)
    after = lax.ppermute(first, names, [(d + 1, d) for d in range(parts - 1)])
    after = jnp.where(lax.axis_index(names) == parts - 1, tail, after)
    return lax.concatenate([head, after], axis)


__all__ = ["fits", "halo_sizes", "window"]
