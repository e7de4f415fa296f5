"""A linear first-order recurrence as ``lax.associative_scan`` (issue 48): the XLA form 'associative'.

``h[t] = a[t]*h[t-1] + b[t]`` (lanes that do not mix, depth 1, no sum inside the step) composes associatively:
``(a1, b1) ∘ (a2, b2) = (a2*a1, a2*b1 + b2)``, so it runs in log T parallel rounds instead of T sequential steps.
``a`` is the body's derivative in its self-read (which must not read the state again: the body is affine in it)
and ``b`` the body with the self-read at 0, each the plain jnp lowering of an elementwise spec over the result's
indices; the initial state enters the first element (the last, reverse). Work is O(T log T) against the
loops' O(T): the planner races it (on a GPU its parallel rounds are what wins).
"""
from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any, Callable, Mapping

from tullax.spec.ir import Access, Affine, Num, Spec, accesses, map_expr, walk
from tullax.spec.scan import TRAJECTORY, unrolled

Env = Mapping[str, Any]


@functools.lru_cache(maxsize=1024)
def linear_parts(spec: Spec) -> tuple[Spec, Spec] | None:
    """(a, b): elementwise specs over the result's indices with ``spec``'s body ``a*h[t∓1] + b``; None where
    ``spec`` is not such a recurrence."""
    from tullax.grad.derivative import wirtinger

    scan = spec.scan
    if scan is None or scan.depth != 1 or spec.reduced or spec.finalizer is not None or spec.assign != ":=":
        return None
    reads = {acc for acc in accesses(spec.body) if acc.array == spec.out}
    if len(reads) != 1:
        return None
    (read,) = reads
    if any(not (isinstance(ix, Affine) and ix.plain == own.plain) for axis, (ix, own) in
           enumerate(zip(read.idx, spec.lhs)) if axis != scan.axis):
        return None  # the lanes mix
    every = frozenset(spec.input_names) | {spec.out}  # as if every value were complex: conj(h) is not linear
    slope, other = wirtinger(spec.body, lambda e: e == read, every)
    if slope is None or other is not None or any(
            isinstance(n, Access) and n.array == spec.out for n in walk(slope)):
        return None
    offset = map_expr(spec.body, lambda n: Num(0) if n == read else n)
    flat = unrolled(spec)
    inputs = tuple(i for i in flat.inputs if i.name != TRAJECTORY)
    return tuple(replace(flat, body=body, inputs=inputs) for body in (slope, offset))


@functools.lru_cache(maxsize=256)
def lower_associative(spec: Spec, lower: Callable[[Spec], Callable], dtype_of: Callable) -> Callable[[Env], Any]:
    """``fn(env) -> jax.Array``: the linear recurrence ``spec`` as one ``lax.associative_scan``. ``lower`` is
    the plain jnp lowering (``xla.lower.lower``) and ``dtype_of`` its dtype rule, passed in (that module imports
    this one)."""
    parts = linear_parts(spec)
    if parts is None:
        raise ValueError(f"{spec.out}: not a linear first-order recurrence")
    slope_fn, offset_fn = (lower(part) for part in parts)
    scan = spec.scan

    def run(env: Env):
        import jax
        import jax.numpy as jnp
        import numpy as np

        from tullax.spec.shapes import check_shapes, input_shapes, result_dtype

        shapes = input_shapes(spec, env)
        check_shapes(spec, shapes)
        dtype = np.dtype(jax.dtypes.canonicalize_dtype(
            result_dtype(spec, {n: dtype_of(env[n]) for n in spec.input_names})))
        shape = tuple(int(s.eval(shapes)) for s in spec.out_shape)
        a = jnp.broadcast_to(slope_fn(env), shape).astype(dtype)
        b = jnp.broadcast_to(offset_fn(env), shape).astype(dtype)
        if scan.init is not None:  # the initial state enters the first step (the last, reverse)
            edge = shape[scan.axis] - 1 if scan.reverse else 0
            at = (slice(None),) * scan.axis + (edge,)
            b = b.at[at].add(a[at] * jnp.asarray(env[scan.init]).astype(dtype))

        def combine(first, then):
            return then[0] * first[0], then[0] * first[1] + then[1]

        return jax.lax.associative_scan(combine, (a, b), reverse=scan.reverse, axis=scan.axis)[1]

    run.__name__ = "tullax_xla_associative_" + spec.out
    return run


def is_linear(spec: Spec) -> bool:
    return linear_parts(spec) is not None


__all__ = ["linear_parts", "lower_associative", "is_linear"]
