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
from typing import Any, Callable, Mapping

from tullax.grad.linear import linear_parts
from tullax.spec.ir import Spec

Env = Mapping[str, Any]


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
