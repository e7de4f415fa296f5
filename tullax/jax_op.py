"""A tullax kernel as a JAX operation: a custom_vjp whose backward runs the derived gradient specs, each
itself such an operation (so gradients of gradients work)."""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Sequence

from .ir import Spec


def apply(spec: Spec, backend_name: str, values: Sequence[Any]) -> Any:
    """Run ``spec`` on jax values (arrays or tracers) through the backend ``backend_name``."""
    import jax.numpy as jnp

    from .kernel import check_call

    args = [jnp.asarray(v) for v in values]
    check_call(spec, args)  # trace time, never inside a callback
    return _op(spec, backend_name)(*args)


@lru_cache(maxsize=None)
def _op(spec: Spec, backend_name: str):
    import jax

    @jax.custom_vjp
    def op(*args):
        return _forward(spec, backend_name, args)

    def fwd(*args):
        out = _forward(spec, backend_name, args)
        return out, (args, out)

    def bwd(res, cotangent):
        args, out = res
        return _backward(spec, backend_name, args, out, cotangent)

    op.defvjp(fwd, bwd)
    return op


def _forward(spec: Spec, backend_name: str, args: Sequence[Any]) -> Any:
    if backend_name == "xla":
        from .backends.xla import lower

        return lower(spec)(dict(zip(spec.input_names, args)))
    from .callback import host_call

    return host_call(spec, backend_name, args)


def _backward(spec: Spec, backend_name: str, args: Sequence[Any], out: Any, cotangent: Any) -> tuple:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from .grad import gradients, seed_name
    from .gradrun import run_gradient

    env = dict(zip(spec.input_names, args))
    env[spec.out] = out  # the residual (for '=' and '+=' it replaces the given array: the result)
    env[seed_name(spec)] = cotangent
    by_input = {g.wrt: g for g in gradients(spec)} if _needs_any(spec, args) else {}

    def execute(step: Spec, step_env: dict) -> Any:
        return apply(step, backend_name, [step_env[name] for name in step.input_names])

    grads = []
    for item, arg in zip(spec.inputs, args):
        if item.name not in by_input or not jnp.issubdtype(arg.dtype, jnp.inexact):
            grads.append(np.zeros(arg.shape, dtype=jax.dtypes.float0))
            continue
        grad = run_gradient(by_input[item.name], spec, env, execute)
        grads.append(jnp.asarray(grad, dtype=arg.dtype).reshape(arg.shape))
    return tuple(grads)


def _needs_any(spec: Spec, args: Sequence[Any]) -> bool:
    import jax.numpy as jnp

    return any(i.kind in ("array", "scalar") and jnp.issubdtype(a.dtype, jnp.inexact)
               for i, a in zip(spec.inputs, args))
