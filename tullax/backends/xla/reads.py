"""Reading one access on the XLA lowering's index grid (``tullax.backends.xla.lower``): a slice where the access's
positions allow one, else a gather, masked where a pad reads 0 and where an index array points outside its axis.

``ctx`` below is ``tullax.backends.xla.lower``'s evaluation context (spec, shapes, grid). Not imported: that module
imports this one, and the import graph stays acyclic. jax is imported inside functions only."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tullax.spec.ir import Access, Affine, Idx, Indirect


def fill(dtype: Any) -> Any:
    """What an out-of-range gather reads, as ``jnp.take``'s fill: NaN, or an integer type's extreme."""
    kind = np.dtype(dtype).kind
    if kind in "iu":
        return np.iinfo(dtype).min if kind == "i" else np.iinfo(dtype).max
    return np.nan


@dataclass(frozen=True)
class Position:
    """Where one axis of an access reads: ``pos`` (in range), ``inside`` (False: a pad reads 0) and
    ``defined`` (False: an indirect index outside the axis, which reads NaN, as jnp.take's fill does)."""

    pos: Any
    inside: Any = None
    defined: Any = None


def read(ctx: Any, acc: Access):
    import jax.numpy as jnp

    from tullax.backends.xla import rows as xla_rows

    if sliceable(ctx, acc):
        return read_slices(ctx, acc)
    array = ctx.array(acc.array)
    positions = [position(ctx, idx, array.shape[axis]) for axis, idx in enumerate(acc.idx)]
    if 0 in array.shape:  # an index array into an empty axis: every read is outside it (NaN, or 0 under pad), but
        # XLA's gather refuses a slice of an empty axis, so it reads one padded element the masks below discard
        array = jnp.pad(array, [(0, int(extent == 0)) for extent in array.shape])
    windows = xla_rows.gather_windows(ctx, acc, array.shape)
    if windows:
        value = xla_rows.read_rows(ctx, acc, array, positions, windows).astype(ctx.leaf(acc.array))
    else:
        value = array[tuple(jnp.asarray(p.pos) for p in positions)].astype(ctx.leaf(acc.array))
    defined = all_masks([p.defined for p in positions])
    inside = all_masks([p.inside for p in positions])
    if defined is not None:
        value = jnp.where(defined, value, fill(ctx.dtype))
    if inside is not None:
        value = jnp.where(inside, value, 0)
    return value


def all_masks(masks: list):
    found = [m for m in masks if m is not None]
    if not found:
        return None
    out = found[0]
    for mask in found[1:]:
        out = out & mask
    return out


def affine(ctx: Any, aff: Affine):
    """``sum(coef * index) + const`` on the grid (a Python int when no index appears); ``div`` is not applied."""
    total = None
    for name, coef in aff.terms:
        term = ctx.grid.values(name) if coef == 1 else coef * ctx.grid.values(name)
        total = term if total is None else total + term
    const = aff.const.eval(ctx.shapes)
    if total is None:
        return const
    return total + const if const else total


def position(ctx: Any, idx: Idx, extent: int) -> Position:
    import jax.numpy as jnp

    if isinstance(idx, Affine):  # in bounds: check_shapes proved it
        return Position(affine(ctx, idx))
    if isinstance(idx, Indirect):
        where = ctx.array(idx.array)[jnp.asarray(affine(ctx, idx.inner))]
        if not idx.plain:  # scale*ix[e] + offset, with a value read too large to add without wrapping undefined
            limit = (int(jnp.iinfo(where.dtype).max) // 2) // abs(idx.scale)
            raw_ok = (where >= -limit) & (where <= limit)
            where = idx.scale * jnp.clip(where, -limit, limit) + affine(ctx, idx.offset)
            defined = raw_ok & (where >= 0) & (where < extent)
        else:
            defined = (where >= 0) & (where < extent)
        if idx.pad:  # pad(ix[e]) reads 0 outside the axis
            return Position(jnp.clip(where, 0, max(extent - 1, 0)), inside=defined)
        return Position(jnp.clip(where, 0, max(extent - 1, 0)), defined=defined)
    raw = affine(ctx, idx.inner)
    if idx.kind == "mod":
        return Position(jnp.mod(raw, extent))
    if idx.kind == "clamp":
        return Position(jnp.clip(raw, 0, extent - 1))
    inside = jnp.asarray(True)
    if idx.inner.div > 1:
        inside = jnp.mod(raw, idx.inner.div) == 0
        raw = jnp.floor_divide(raw, idx.inner.div)
    inside = inside & (raw >= 0) & (raw < extent)
    return Position(jnp.clip(raw, 0, max(extent - 1, 0)), inside=inside)


def live_terms(ctx: Any, aff: Affine) -> tuple[list[tuple[str, int]], int]:
    """The terms of ``aff`` over grid axes with more than one value, and the constant the others add (an
    index with one value on this grid, as the slices form of ``xla_forms`` makes, is a constant here)."""
    live, const = [], aff.const.eval(ctx.shapes)
    for name, coef in aff.terms:
        axis = ctx.grid.axis(name)
        if ctx.grid.size[axis] == 1:
            const += coef * ctx.grid.lo[axis]
        else:
            live.append((name, coef))
    return live, const


def sliceable(ctx: Any, acc: Access) -> bool:
    """Every axis a constant or one index (coefficient != 0), each index on one axis only: a strided slice."""
    names: list[str] = []
    for idx in acc.idx:
        if not isinstance(idx, Affine) or idx.div != 1:
            return False
        live, _ = live_terms(ctx, idx)
        if len(live) > 1:
            return False
        names += [n for n, _ in live]
    return len(names) == len(set(names))


def read_slices(ctx: Any, acc: Access):
    import jax.numpy as jnp

    window, names, flips = [], [], []
    for idx in acc.idx:
        live, const = live_terms(ctx, idx)
        if not live:
            window.append(const)
            continue
        (name, coef), = live
        axis = ctx.grid.axis(name)
        lo, n = ctx.grid.lo[axis], ctx.grid.size[axis]
        first, last = coef * lo + const, coef * (lo + n - 1) + const
        window.append(slice(min(first, last), max(first, last) + 1, abs(coef)))
        if coef < 0:
            flips.append(len(names))
        names.append(name)
    value = ctx.array(acc.array)[tuple(window)]
    if flips:
        value = jnp.flip(value, axis=flips)
    order = sorted(range(len(names)), key=lambda k: ctx.grid.axis(names[k]))
    value = jnp.transpose(value, order)
    shape = [ctx.grid.size[a] if n in names else 1 for a, n in enumerate(ctx.grid.names)]
    return value.reshape(shape).astype(ctx.leaf(acc.array))
