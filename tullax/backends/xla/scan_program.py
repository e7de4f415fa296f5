"""The XLA lowering of a scan program (``tullax.spec.scan_program``): one ``lax.scan`` over ``t`` whose step runs
every statement of the step in order, as ``tullax.backends.xla.scan`` runs one scan statement.

Each statement's spec over the trajectory (``step_specs``) becomes its one-step spec (``t`` ranged 0:1, inputs
sliced at ``t``); a local's value at the step (an axis of 1 at ``t``) is what later statements read; the carry is
the window of the last ``depth`` results. The oracle of the fused loop kernel, a candidate under ``auto``, and the
path of every derivative (JAX differentiates and batches ``lax.scan``).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from tullax.spec.program import Program, program_shapes
from tullax.spec.scan import TRAJECTORY
from tullax.spec.scan_program import step_specs, trajectory_shape

Env = Mapping[str, Any]


def lower_scan_program(program: Program) -> Callable[..., Any]:
    """``fn(*inputs) -> y``, the program's inputs in order; differentiable, batchable and jit-able."""
    from tullax.backends.xla.lower import _dtype_of, lower
    from tullax.backends.xla.scan import STEP, initial_window, scan_step_spec, slice_along

    step = program.step
    scan = step.scan
    specs = step_specs(program)
    steps = []
    for st, spec in zip(program.statements, specs):
        t_axis = next(d for d, name in enumerate(spec.free) if name == scan.index)
        step_spec, along = scan_step_spec(spec, scan.index, t_axis)
        steps.append((st.out, lower(step_spec), step_spec, along))
    step_outs = {st.out for st in program.statements}
    names = program.inputs

    def run(*values: Any) -> Any:
        import jax
        import jax.numpy as jnp

        from tullax.spec.shapes import result_dtype

        env = dict(zip(names, values))
        shapes = program_shapes(program, {n: tuple(np.shape(v)) for n, v in env.items()})
        dtypes: dict[str, Any] = {n: _dtype_of(v) for n, v in env.items()}
        for st in program.statements:
            dtypes[st.out] = result_dtype(st.spec, {n: dtypes[n] if n != TRAJECTORY else dtypes.get(step.out)
                                                    for n in st.spec.input_names if n in dtypes or n == TRAJECTORY})
            dtypes[st.out] = np.dtype(jax.dtypes.canonicalize_dtype(dtypes[st.out]))
        dtype = dtypes[step.out]
        trajectory = trajectory_shape(program, shapes)
        length = trajectory[scan.axis] - scan.depth
        start = initial_window(scan, env, trajectory, dtype)
        fixed: dict[str, Any] = {}
        xs: dict[str, Any] = {STEP: jnp.arange(length)}
        for _, _, step_spec, along in steps:
            fixed.update({n: env[n] for n in step_spec.input_names if n in env and n not in along})
            xs.update({name: slice_along(jnp.asarray(env[array]), axis, shift, length)
                       for name, (array, axis, shift) in along.items() if array not in step_outs})
        axes = {name: axis for _, _, _, along in steps for name, (array, axis, _) in along.items()
                if array not in step_outs}

        def one(carry, sliced):
            local = dict(fixed)
            local.update({n: jnp.expand_dims(v, axes[n]) for n, v in sliced.items() if n != STEP})
            local[STEP] = sliced[STEP]
            local[TRAJECTORY] = carry
            value = None
            for out, fn, _, _ in steps:
                value = fn(local).astype(dtypes[out])
                local[out] = value
            kept = jax.lax.slice_in_dim(carry, 1, scan.depth, axis=scan.axis)
            parts = [value, value, kept] if scan.reverse else [kept, value]
            return jnp.concatenate(parts, axis=scan.axis), jnp.squeeze(value, scan.axis)

        _, ys = jax.lax.scan(one, start, xs, length=length, reverse=scan.reverse)
        return jnp.moveaxis(ys, 0, scan.axis)

    run.__name__ = "tullax_xla_scan_program_" + step.out
    return run


__all__ = ["lower_scan_program"]
