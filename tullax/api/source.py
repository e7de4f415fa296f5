"""Whole-module source generation and ahead-of-time warming, for any backend."""
from __future__ import annotations

import time
from typing import Mapping

from tullax.errors import TullaxError, with_spec_context
from tullax.spec.frontend import compile_spec
from tullax.spec.ir import Spec


def signature_for(spec: Spec, dtype: str):
    """The signature used when only a float dtype is named: data and scalars in ``dtype``, indices int64."""
    import numpy as np

    from tullax.backends.base import Signature

    name = np.dtype(dtype).name
    return Signature(tuple("int64" if i.kind == "index" else name for i in spec.inputs), name)


def all_kernels(spec: Spec) -> list[tuple[str, Spec]]:
    """The forward spec and every gradient step, labelled (gradients that cannot be derived are left out)."""
    from tullax.grad import gradients

    kernels = [("forward", spec)]
    try:
        grads = gradients(spec)
    except TullaxError:
        grads = ()
    for grad in grads:
        for number, step in enumerate(grad.steps):
            label = f"gradient wrt {grad.wrt}" + (f", step {number + 1}" if len(grad.steps) > 1 else "")
            kernels.append((label, step))
    return kernels


def generate_source(spec: str, backend: str = "numba", dtype: str = "float32",
                    ranges: Mapping | None = None) -> str:
    from tullax import backends

    try:
        _, analysed = compile_spec(spec, ranges)
        impl = backends.get(backend)
        module_source = getattr(impl, "module_source", None)
        if module_source is not None:
            return module_source(analysed, dtype)
        parts = []
        for label, step in all_kernels(analysed):
            parts.append(f"# ---- {label}\n" + impl.generate_source(step, signature_for(step, dtype)))
        return "\n\n".join(parts)
    except TullaxError as err:
        raise with_spec_context(err, spec) from None


def warm(spec: str, backend: str = "auto", dtype: str = "float32", ranges: Mapping | None = None) -> dict:
    """Compile and run once every kernel of ``spec`` on tiny inputs so the persistent cache holds them."""
    from tullax import backends
    from tullax.api.kernel import run_eager
    from tullax.spec.examples import random_inputs

    try:
        _, analysed = compile_spec(spec, ranges)
        impl = backends.resolve(backend)
        timings = {}
        for label, step in all_kernels(analysed):
            env = random_inputs(step, dtype=dtype)
            start = time.perf_counter()
            run_eager(step, impl, [env[name] for name in step.input_names])
            timings[label] = (time.perf_counter() - start) * 1e3
        return timings
    except TullaxError as err:
        raise with_spec_context(err, spec) from None
