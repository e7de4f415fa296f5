"""Batched tangents and cotangents of a recurrence through its lane factors (``tullax.grad.factor``).

``jacfwd`` batches the tangent over n basis vectors and ``jacrev`` the cotangent over n outputs: for an input
whose tangent factors (``lam[n]`` of a lane-wise recurrence), the batched tangent is one sensitivity scan ``s``
times the broadcast tangent, and the batched cotangent's gradient the contraction of the cotangent with ``s``,
both jnp products XLA fuses with their neighbours (a final-state slice, the cotangent's padding), where the
general path runs a batched scan writing n trajectories. Only where the primals are not batched: ``s`` is then
computed once.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from tullax.grad.factor import lane_factor


def factored_inputs(op: Any, live: tuple, operands: Sequence[Any], dims: Sequence[Any]) -> dict[int, tuple]:
    """{input position: its axes in the result} for the live inputs whose batched tangents factor; empty where
    the primals are batched. A complex recurrence factors alike: its tangent is complex-linear in the input's."""
    n = len(op.spec.inputs)
    if op.spec.scan is None or any(d is not None for d in dims[:n + 1]):
        return {}
    positions = [i for i, keep in enumerate(live) if keep]
    found = {}
    for pos, dim in zip(positions, dims[n + 1:]):
        axes = lane_factor(op.spec, op.spec.inputs[pos].name) if dim is not None else None
        if axes is not None and operands[pos].ndim == len(axes):
            found[pos] = axes
    return found


def batched_factors(op: Any, wanted: Sequence[int], args: Sequence[Any], out: Any, ct: Any) -> dict[int, tuple]:
    """{input position: its axes in the result} for the ``wanted`` gradients that factor, where the cotangent
    is batched (``jacrev``'s vmap of the pullback) and the primals are not; empty otherwise (a single cotangent
    runs the adjoint scan its other gradients share)."""
    import jax.numpy as jnp

    tracer = _batch_tracer()
    if op.spec.scan is None or tracer is None or not isinstance(ct, tracer):
        return {}
    if any(isinstance(v, tracer) for v in (*args, out)):
        return {}
    found = {}
    for pos in wanted:
        axes = lane_factor(op.spec, op.spec.inputs[pos].name)
        if axes is not None and jnp.ndim(args[pos]) == len(axes):
            found[pos] = axes
    return found


def _batch_tracer() -> Any:
    """jax's BatchTracer class (a transpose rule sees no batch dimensions, only its tracers), None where this jax
    does not have it where it used to be (then nothing factors: the general path, correct)."""
    try:
        from jax._src.interpreters.batching import BatchTracer
    except ImportError:
        return None
    return BatchTracer


def sensitivity(linear_value: Callable, op: Any, pos: int, args: Sequence[Any], out: Any) -> Any:
    """The result's tangent for a tangent of ones in input ``pos`` (the factor ``s``), by ``linear_value``
    (``primitives._linear_value``: the tangent recurrence)."""
    import jax.numpy as jnp

    live = tuple(i == pos for i in range(len(args)))
    return linear_value(op, live, *args, out, jnp.ones(jnp.shape(args[pos]), out.dtype))


def spread(value: Any, axes: tuple, ndim: int) -> Any:
    """``value`` (an input's tangent, its axes at result ``axes``) shaped to broadcast against the result."""
    import jax.numpy as jnp

    order = sorted(range(len(axes)), key=axes.__getitem__)
    value = jnp.transpose(value, order)
    shape = [1] * ndim
    for i, a in enumerate(sorted(axes)):
        shape[a] = value.shape[i]
    return value.reshape(shape)


def factored_value(linear_value: Callable, op: Any, live: tuple, factored: dict, *operands) -> Any:
    """The tangent of the result (``linear_value``) with the ``factored`` inputs' terms as ``s · tangent``."""
    n = len(op.spec.inputs)
    args, out, tangents = operands[:n], operands[n], operands[n + 1:]
    positions = [i for i, keep in enumerate(live) if keep]
    value = None
    rest = []
    for pos, tangent in zip(positions, tangents):
        if pos in factored:
            factor = sensitivity(linear_value, op, pos, args, out)
            term = factor * spread(tangent.astype(out.dtype), factored[pos], out.ndim)
            value = term if value is None else value + term
        else:
            rest.append(tangent)
    if rest:
        rest_live = tuple(keep and i not in factored for i, keep in enumerate(live))
        term = linear_value(op, rest_live, *args, out, *rest)
        value = term if value is None else value + term
    return value


def factored_gradient(linear_value: Callable, op: Any, pos: int, axes: tuple, args: Sequence[Any], out: Any,
                      ct: Any) -> Any:
    """The cotangent of input ``pos`` (its axes at result ``axes``): ``Σ ct · s`` over the other result axes."""
    import jax.numpy as jnp

    product = ct * sensitivity(linear_value, op, pos, args, out)
    summed = product.sum(axis=tuple(a for a in range(out.ndim) if a not in axes))
    order = sorted(axes)  # the kept axes in result order; the input's own order is ``axes``
    value = jnp.transpose(summed, [order.index(a) for a in axes])
    return value.astype(args[pos].dtype).reshape(jnp.shape(args[pos]))


__all__ = ["batched_factors", "factored_inputs", "factored_value", "factored_gradient", "sensitivity", "spread"]
