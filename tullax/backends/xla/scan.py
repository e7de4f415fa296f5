"""The XLA lowering of a recurrence (``tullax.spec.scan``): ``lax.scan`` over ``t``.

Each step evaluates the spec's unrolled form (``scan.unrolled``) with ``t`` ranged 0:1, on the inputs sliced at
``t`` (kept as an axis of 1) and on a window of the trajectory as the trajectory: forward the last d results
(most recent last), reverse a spare slot then the next d (nearest first). So the step is the plain jnp lowering
of an ordinary spec, and the carry is the window.
"""
from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any, Callable, Mapping

import numpy as np

from tullax.errors import SpecError
from tullax.spec.ir import (
    Access,
    Affine,
    Binary,
    Expr,
    IndexVal,
    Input,
    Num,
    Param,
    Range,
    Spec,
    Wrapped,
    idx_names,
    map_expr,
)
from tullax.spec.scan import TRAJECTORY, scan_shapes, unrolled
from tullax.spec.sizes import Sym

Env = Mapping[str, Any]


STEP = "ʹstep"  # the scalar input holding t inside a step (no user name can spell it)


@functools.lru_cache(maxsize=256)
def lower_scan(spec: Spec, lower: Callable[[Spec], Callable], dtype_of: Callable) -> Callable[[Env], Any]:
    """``fn(env) -> jax.Array``: ``spec`` (``spec.scan`` set) as one ``lax.scan``; differentiable and jit-able.
    ``lower`` is the plain jnp lowering (``xla.lower.lower``) and ``dtype_of`` its dtype rule, passed in (that
    module imports this one)."""
    scan = spec.scan
    step_spec, along = scan_step_spec(unrolled(spec), scan.index, scan.axis)
    step_fn = lower(step_spec)

    def run(env: Env):
        import jax
        import jax.numpy as jnp

        from tullax.spec.shapes import check_shapes, input_shapes, result_dtype

        shapes = input_shapes(spec, env)
        check_shapes(spec, shapes)
        dtype = np.dtype(jax.dtypes.canonicalize_dtype(
            result_dtype(spec, {n: dtype_of(env[n]) for n in spec.input_names})))
        trajectory, _ = scan_shapes(spec, shapes)
        length = trajectory[scan.axis] - scan.depth
        start = initial_window(scan, env, trajectory, dtype)
        fixed = {n: env[n] for n in step_spec.input_names if n in env and n not in along}
        xs = {name: slice_along(jnp.asarray(env[array]), axis, shift, length)
              for name, (array, axis, shift) in along.items()}
        xs[STEP] = jnp.arange(length)

        def step(carry, sliced):
            local = dict(fixed)
            local.update({n: jnp.expand_dims(v, along[n][1]) for n, v in sliced.items() if n != STEP})
            local[STEP] = sliced[STEP]
            local[TRAJECTORY] = carry
            value = step_fn(local).astype(dtype)
            kept = jax.lax.slice_in_dim(carry, 1, scan.depth, axis=scan.axis)
            parts = [value, value, kept] if scan.reverse else [kept, value]
            return jnp.concatenate(parts, axis=scan.axis), jnp.squeeze(value, scan.axis)

        _, ys = jax.lax.scan(step, start, xs, length=length, reverse=scan.reverse)
        return jnp.moveaxis(ys, 0, scan.axis)

    run.__name__ = "tullax_xla_scan_" + spec.out
    return run


def initial_window(scan, env: Env, trajectory: tuple[int, ...], dtype):
    """The scan's first carry: the window of the trajectory before the first step (zeros, or the initial state
    ``env[scan.init]`` laid along the scan axis; a reverse scan's spare slot first)."""
    import jax
    import jax.numpy as jnp

    window = list(trajectory)
    window[scan.axis] = scan.depth + (1 if scan.reverse else 0)
    if scan.init is None:
        return jnp.zeros(window, dtype)
    init = jnp.asarray(env[scan.init]).astype(dtype)
    init = jnp.expand_dims(init, scan.axis) if scan.depth == 1 else jnp.moveaxis(init, 0, scan.axis)
    if not scan.reverse:
        return init
    return jnp.concatenate([jnp.zeros_like(jax.lax.slice_in_dim(init, 0, 1, axis=scan.axis)), init], axis=scan.axis)


def slice_along(value, axis: int, shift: int, length: int):
    """``value`` at positions ``shift, shift+1, ...`` along ``axis`` (``length`` of them, 0 outside), axis first."""
    import jax.numpy as jnp

    value = jnp.moveaxis(value, axis, 0)
    if shift == 0 and value.shape[0] == length:
        return value
    pos = jnp.arange(length) + shift
    inside = (pos >= 0) & (pos < value.shape[0])
    taken = jnp.take(value, jnp.clip(pos, 0, max(value.shape[0] - 1, 0)), axis=0)
    return jnp.where(inside.reshape((-1,) + (1,) * (value.ndim - 1)), taken, jnp.zeros_like(taken))


def scan_step_spec(flat: Spec, t: str, out_axis: int) -> tuple[Spec, dict[str, tuple[str, int, int]]]:
    """The spec of one step: ``t`` ranged 0:1, every input read at ``t + c`` read instead from its slice at the
    step (a new input per shift, 0 outside its axis: the reads of a derived spec are pads there), the value of
    ``t`` a scalar input. Returns it and, per sliced input, (array, axis, c)."""
    along: dict[str, tuple[str, int, int]] = {}

    def fix(node: Expr) -> Expr:
        if isinstance(node, IndexVal) and node.name == t:
            value: Expr = Param(STEP)
            return value if node.offset == Sym(0) else Binary("+", value, _sym_value(node.offset))
        if not isinstance(node, Access) or node.array == TRAJECTORY:
            return node
        idx = list(node.idx)
        name = node.array
        for axis, item in enumerate(idx):
            aff = item.inner if isinstance(item, Wrapped) and item.kind == "pad" else item
            if not isinstance(aff, Affine) or t not in aff.names():
                if t in idx_names(item):
                    raise SpecError(f"{node.array} is read at a computed position of the scan index {t}: the "
                                    f"lax.scan lowering cannot slice it")
                continue
            if aff.terms != ((t, 1),) or not aff.const.is_const or aff.div != 1:
                raise SpecError(f"{node.array} is read at {t} times a factor: the lax.scan lowering slices at "
                                f"{t} plus a constant")
            shift = aff.const.const
            name = node.array if shift == 0 and item == aff else f"{node.array}ʹ{axis}ʹ{shift}"
            if along.get(name, (node.array, axis, shift)) != (node.array, axis, shift):
                raise SpecError(f"{node.array} is read at {t} on two axes: the lax.scan lowering slices one")
            along[name] = (node.array, axis, shift)
            idx[axis] = Affine.index(t)
        return replace(node, array=name, idx=tuple(idx))

    body = map_expr(flat.body, fix)
    finalizer = None if flat.finalizer is None else map_expr(flat.finalizer, fix)
    ranks = {i.name: i.rank for i in flat.inputs}
    inputs = flat.inputs + tuple(Input(n, "array", ranks[a]) for n, (a, _, _) in along.items() if n != a) + (
        Input(STEP, "scalar", 0),)
    ranges = tuple((n, Range(Sym(0), Sym(1)) if n == t else r) for n, r in flat.ranges)
    shape = tuple(Sym(1) if d == out_axis else s for d, s in enumerate(flat.out_shape))
    step = replace(flat, body=body, finalizer=finalizer, inputs=inputs, ranges=ranges, out_shape=shape,
                   agreements=())
    return step, along


def _sym_value(sym: Sym) -> Expr:
    if not sym.is_const:
        raise SpecError("the lax.scan lowering takes the value of the scan index only with a constant offset")
    return Num(sym.const)


__all__ = ["lower_scan"]
