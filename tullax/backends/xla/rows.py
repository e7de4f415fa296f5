"""Row scatters and row gathers for the XLA lowering (``tullax.backends.xla.lower``).

An axis indexed plainly (``d``, ``d+c``) by an index that no other axis's position uses is covered by a whole slice
per coordinate tuple of the other axes: ``lax.scatter_add`` / ``lax.gather`` with window dimensions, what
``W.at[ix].add(rows)`` and ``jnp.take(W, ix, axis=0)`` emit, instead of a full coordinate tuple per element (which
ran the embedding gradient at 0.87x jnp's speed). Same results: the window's own positions are in bounds
(check_shapes proved them), so a tuple outside the output drops or masks exactly the elements it carries.

jax is imported inside functions only, as in ``tullax.backends.xla.lower``, which imports this module lazily.
"""
from __future__ import annotations

from typing import Any

from tullax.spec.ir import Access, Affine, Idx, idx_names

# ``ctx`` below is ``tullax.backends.xla.lower``'s evaluation context (spec, shapes, grid); the positions are its
# ``Position``s (``tullax.backends.xla.reads``). Not imported: those modules import this one, and the import graph
# stays acyclic.


def gather_windows(ctx: Any, acc: Access, shape: tuple[int, ...]) -> dict[int, str]:
    """The axes of ``acc`` that ``read_rows`` reads as whole slices (see ``_window_axes``): where another axis
    needs a coordinate per element, the last axis among them, and no axis is empty (a clipped position on an
    empty axis reads nothing)."""
    windows = _window_axes(ctx, acc.idx)
    # the last (contiguous) axis a window: slices over leading axes alone gather strided columns, which ran
    # conv1d's x[b,i+k] 1.33x slower than a coordinate per element (benchmarks/results/scatter_rows.md)
    if len(acc.idx) - 1 not in windows or len(windows) == len(acc.idx) or 0 in shape or ctx.grid.empty:
        return {}
    return windows


def read_rows(ctx: Any, acc: Access, array, positions: list[Any], windows: dict[int, str]):
    """The read as XLA's row gather (what ``jnp.take(W, ix, axis=0)`` emits): one coordinate tuple per
    combination of the other axes' positions, and a whole slice of ``windows``' axes per tuple, instead of a
    coordinate per element. Positions are clipped into the array (``reads.position``); the caller masks them."""
    import jax.numpy as jnp
    from jax import lax

    grid = ctx.grid
    window_names = [windows[a] for a in sorted(windows)]  # in the array's axis order
    columns, gather_axes = [], []
    for axis, (idx, pos) in enumerate(zip(acc.idx, positions)):
        if axis in windows:
            start = grid.lo[grid.axis(windows[axis])] + idx.const.eval(ctx.shapes)
            if start == 0:
                continue
            columns.append(jnp.asarray(start))
        else:
            columns.append(jnp.asarray(pos.pos))
        gather_axes.append(axis)
    ndim = len(grid.names)
    columns = [c.reshape((1,) * (ndim - c.ndim) + c.shape) for c in columns]
    indices = jnp.stack(jnp.broadcast_arrays(*columns), axis=-1)  # the grid's rank; window axes of size 1
    batch = [a for a, n in enumerate(grid.names) if n not in window_names]
    indices = jnp.squeeze(indices, axis=tuple(grid.axis(n) for n in window_names))
    sizes = tuple(grid.size[grid.axis(windows[a])] if a in windows else 1 for a in range(array.ndim))
    numbers = lax.GatherDimensionNumbers(
        offset_dims=tuple(range(len(batch), len(batch) + len(windows))),
        collapsed_slice_dims=tuple(a for a in range(array.ndim) if a not in windows),
        start_index_map=tuple(gather_axes))
    value = lax.gather(array, indices, numbers, sizes, mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS)
    names = [grid.names[a] for a in batch] + window_names
    return jnp.transpose(value, [names.index(n) for n in grid.names])


def _window_axes(ctx: Any, idxs: tuple[Idx, ...]) -> dict[int, str]:
    """The axes of an access that a whole slice can cover: ``d`` or ``d+c`` (coefficient 1, in bounds as
    check_shapes proved) with ``d`` on a grid axis and in no other axis's position. The rest (indirect,
    wrapped, strided, diagonal positions) keep one coordinate per element."""
    windows: dict[int, str] = {}
    for axis, idx in enumerate(idxs):
        if not isinstance(idx, Affine) or idx.div != 1 or len(idx.terms) != 1 or idx.terms[0][1] != 1:
            continue
        name = idx.terms[0][0]
        others = [n for k, other in enumerate(idxs) if k != axis for n in idx_names(other)]
        if name in ctx.grid.names and name not in others:
            windows[axis] = name
    return windows


def scatter_windows(ctx: Any) -> dict[int, str]:
    """The output axes ``scatter_rows`` covers with slices: only where some axis still needs coordinates
    (an all-plain left-hand side is a slice update, not a scatter)."""
    windows = _window_axes(ctx, ctx.spec.lhs)
    return windows if 0 < len(windows) < len(ctx.spec.lhs) else {}


def scatter_rows(ctx: Any, base, value, windows: dict[int, str], places: dict[int, Any]):
    """The scatter as XLA's row scatter (what ``W.at[ix].add(rows)`` emits): one coordinate tuple per element
    of the grid's other axes, and a whole slice of ``windows``' axes per tuple, instead of a coordinate per
    element. A tuple outside the output drops its whole slice, as each of its elements is dropped one by one
    in the general form, since the slice's own axes are in bounds."""
    import jax.numpy as jnp
    from jax import lax

    grid = ctx.grid
    window_names = [windows[a] for a in sorted(windows)]  # in the output's axis order
    batch = [n for n in grid.names if n not in window_names]
    order = [grid.axis(n) for n in batch + window_names]
    squeezed = [1 if n in window_names else sz for n, sz in zip(grid.names, grid.size)]
    columns, scatter_axes = [], []
    for axis, idx in enumerate(ctx.spec.lhs):
        if axis in windows:
            name = windows[axis]
            start = grid.lo[grid.axis(name)] + idx.const.eval(ctx.shapes)
            if start == 0:
                continue
            place = jnp.asarray(start)
        else:  # the position the caller computed, outside positions moved past the axis to be dropped
            place = places[axis]
        place = jnp.transpose(jnp.broadcast_to(place, squeezed), order)
        columns.append(place.reshape(place.shape[:len(batch)]))
        scatter_axes.append(axis)
    indices = jnp.stack(jnp.broadcast_arrays(*columns), axis=-1)
    numbers = lax.ScatterDimensionNumbers(
        update_window_dims=tuple(range(len(batch), len(batch) + len(windows))),
        inserted_window_dims=tuple(a for a in range(base.ndim) if a not in windows),
        scatter_dims_to_operand_dims=tuple(scatter_axes))
    updates = jnp.transpose(value, order)
    return lax.scatter_add(base, indices, updates, numbers, mode=lax.GatherScatterMode.FILL_OR_DROP)

