"""Run a derived gradient (``tullax.grad.Gradient``) on any backend, step by step.

Conventions (shared with ``tullax.grad``):
- The environment holds every forward input by name, the cotangent under ``grad.seed_name(spec)`` and, for
  ':=' specs, the forward result under ``spec.out`` (the residual). For '=' and '+=' specs ``spec.out`` holds
  the GIVEN array (input 0, which the body may read), never the result: ``gradient_env`` builds it right.
- Each step reads only the names its ``inputs`` list, from that environment plus the earlier steps' outputs.
- A '+=' step whose ``out`` is not in the environment yet starts from zeros of the shape and dtype of
  ``grad.wrt``: that is a scatter step (``ΔW[ix[b],d] += Δout[b,d]``) coming first. A '+=' step whose ``out``
  is there (an earlier step wrote it) adds to it.
- The final result is cast to the float dtype of ``grad.wrt`` when its dtype differs (a gradient that is
  identically zero has no float input to take its dtype from).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable, Mapping

from tullax.grad import Gradient, seed_name
from tullax.spec.ir import Spec

Executor = Callable[[Spec, dict], Any]
Zeros = Callable[[tuple, Any], Any]

__all__ = ["run_gradient", "gradient_env", "starts_from_zeros", "zero_start_steps", "whole_copy"]


def gradient_env(spec: Spec, inputs: Mapping[str, Any], result: Any, cotangent: Any) -> dict[str, Any]:
    """The environment the gradients of ``spec`` read: inputs by name, the residual (':=' only) and the
    cotangent under ``seed_name(spec)``."""
    env = dict(inputs)
    if spec.assign == ":=":
        env[spec.out] = result
    env[seed_name(spec)] = cotangent
    return env


def run_gradient(grad: Gradient, spec: Spec, env: Mapping[str, Any], execute: Executor,
                 zeros: Zeros | None = None) -> Any:
    """Run ``grad``'s steps with ``execute(step_spec, step_env) -> array`` (a backend's spec executor, e.g.
    ``lambda s, e: xla.lower(s)(e)``) and return the gradient w.r.t. ``grad.wrt``. ``zeros(shape, dtype)``
    makes the starting array of a leading scatter step (default: NumPy or jax.numpy after ``env[grad.wrt]``).
    ``spec`` is the forward spec the gradient was derived from (checked against ``grad.wrt``)."""
    if grad.wrt not in spec.input_names:
        raise ValueError(f"gradient w.r.t. {grad.wrt!r} does not belong to a spec with inputs {spec.input_names}")
    local = dict(env)
    target = env[grad.wrt]
    for step, from_zeros in zip(grad.steps, starts_from_zeros(grad, spec)):
        if from_zeros:
            local[step.out] = (zeros or _zeros_like_type(target))(_shape(target), _dtype(target))
        step_env = {name: local[name] for name in step.input_names}
        local[step.out] = execute(step, step_env)
    return _cast(local[grad.result], target)


def starts_from_zeros(grad: Gradient, spec: Spec) -> tuple[bool, ...]:
    """For each step of ``grad`` (a gradient of ``spec``): whether it is a '+=' step that starts from zeros: its
    ``out`` is neither in the environment (``gradient_env``) nor written by an earlier step."""
    written = {*spec.input_names, spec.out, seed_name(spec)}
    found = []
    for step in grad.steps:
        found.append(step.assign == "+=" and step.out not in written)
        written.add(step.out)
    return tuple(found)


@lru_cache(maxsize=1024)
def zero_start_steps(spec: Spec, complex_inputs: frozenset[str] = frozenset()) -> frozenset[Spec]:
    """The gradient steps of ``spec`` that start from zeros (``starts_from_zeros``): a host kernel may clear its
    own output for them instead of taking a given array of zeros (``tullax.calls.host``)."""
    from tullax.grad import gradients

    return frozenset(step for grad in gradients(spec, complex_inputs)
                     for step, from_zeros in zip(grad.steps, starts_from_zeros(grad, spec)) if from_zeros)


def _shape(value: Any) -> tuple:
    return tuple(getattr(value, "shape", ()))


def _dtype(value: Any) -> Any:
    import numpy as np

    return value.dtype if hasattr(value, "dtype") else np.result_type(type(value))


def _is_numpy(value: Any) -> bool:
    import numpy as np

    return isinstance(value, (np.ndarray, np.generic, int, float, complex))


def _zeros_like_type(value: Any) -> Zeros:
    """NumPy zeros for NumPy values, jax.numpy zeros for anything else (jax arrays and tracers)."""
    if _is_numpy(value):
        import numpy as np

        return np.zeros
    import jax.numpy as jnp

    return jnp.zeros


def _cast(result: Any, like: Any) -> Any:
    import numpy as np

    dtype = np.dtype(_dtype(like))
    if not hasattr(result, "dtype") or result.dtype == dtype or not np.issubdtype(dtype, np.inexact):
        return result
    if np.dtype(result.dtype).kind == "c" and dtype.kind != "c":  # a real input's cotangent: the real part
        result = result.real
    return result.astype(dtype)


def whole_copy(step: Spec, env: Mapping[str, Any]) -> str | None:
    """The input ``step`` copies whole and unchanged (``Δx[b,t,n] := gh[b,t,n]``, a recurrence's input
    gradient that is its adjoint state), with ``env``'s shapes: the caller takes that array instead of running a
    kernel that writes a copy; None for any other step."""
    from tullax.spec.ir import Access, Affine
    from tullax.spec.sizes import Extent, Sym

    body = step.body
    if step.assign != ":=" or step.reduced or step.finalizer is not None or step.scan is not None:
        return None
    if not isinstance(body, Access) or len(body.idx) != len(step.lhs):
        return None
    names = [i.plain if isinstance(i, Affine) else None for i in step.lhs]
    if None in names or names != [i.plain if isinstance(i, Affine) else None for i in body.idx]:
        return None
    ranges = dict(step.ranges)
    read = _shape(env[body.array])
    for axis, name in enumerate(names):  # the result spans each axis of the read array exactly
        hi = ranges[name].hi
        if ranges[name].lo != Sym(0) or len(hi.terms) != 1 or hi.const != 0 or hi.terms[0][1] != 1:
            return None
        extent = hi.terms[0][0]
        if not isinstance(extent, Extent) or _shape(env[extent.array])[extent.axis] != read[axis]:
            return None
    return body.array
