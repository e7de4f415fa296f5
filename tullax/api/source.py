"""Whole-module source generation and ahead-of-time warming, for any backend."""
from __future__ import annotations

import time
from typing import Mapping

from tullax.errors import TullaxError, with_spec_context
from tullax.spec.frontend import compile_spec


def generate_source(spec: str, backend: str = "numba", dtype: str = "float32",
                    ranges: Mapping | None = None, shapes: Mapping | None = None) -> str:
    """The whole module when the backend prints one; otherwise the forward kernel's source and each gradient
    step's (gradients that cannot be derived are left out), each under a title. ``shapes`` (input name ->
    shape; the cuda backend, which picks its kernels by shapes): the kernels launched at those shapes, each
    with its launch. For cuda, ``ranges`` that fix every input's shape do the same."""
    from tullax import backends
    from tullax.backends.base import Signature
    from tullax.backends.host import kernel_steps
    from tullax.spec.program import analyze_program, is_program, statement_ranges

    if is_program(spec):  # a program: each statement's module, in program order, under its statement
        return "\n\n".join(f"# ==== statement {st.number}: {st.canonical}\n"
                            + generate_source(st.text, backend, dtype, statement_ranges(st.text, ranges))
                            for st in analyze_program(spec, ranges).statements)
    try:
        _, analysed = compile_spec(spec, ranges)
        impl = backends.get(backend)
        if shapes is not None:
            if not hasattr(impl, "shaped_source"):
                raise TullaxError(f"generate_source(shapes=...): the {backend} backend does not choose its kernels "
                                  "by shapes; leave shapes out (backend='cuda' does)")
            return impl.shaped_source(analysed, dtype, {k: tuple(v) for k, v in shapes.items()})
        if backends.capabilities(impl).module_source:
            return impl.module_source(analysed, dtype)
        parts = []
        for step in kernel_steps(analysed, dtype):
            source = impl.generate_source(step.spec, Signature.for_dtype(step.spec, dtype))
            parts.append(f"# ---- {step.label}\n{source}")
        return "\n\n".join(parts)
    except TullaxError as err:
        raise with_spec_context(err, spec) from None


def warm(spec: str, backend: str = "auto", dtype: str = "float32", ranges: Mapping | None = None) -> dict:
    """Compile and run once every kernel of ``spec`` on tiny inputs so the persistent cache holds them."""
    from tullax import backends
    from tullax.api.kernel import run_eager
    from tullax.backends.base import Signature
    from tullax.backends.host import kernel_steps
    from tullax.spec.arguments import result_dtype
    from tullax.spec.examples import random_inputs
    from tullax.spec.program import analyze_program, is_program, statement_ranges

    if is_program(spec):  # a program: every statement's kernels, keyed by statement number and kernel
        return {f"statement {st.number} {label}": ms for st in analyze_program(spec, ranges).statements
                for label, ms in warm(st.text, backend, dtype, statement_ranges(st.text, ranges)).items()}
    try:
        _, analysed = compile_spec(spec, ranges)
        impl = backends.resolve(backend)
        timings = {}
        for step in kernel_steps(analysed, dtype):
            env = random_inputs(step.spec, dtype=dtype)
            values = [env[name] for name in step.spec.input_names]
            start = time.perf_counter()
            run_eager(step.spec, impl, values)
            built = impl.build(step.spec, Signature.of_values(values, result_dtype(step.spec, values)))
            if hasattr(built, "prepare_every_variant"):  # the variants real shapes pick, not only the tiny ones'
                built.prepare_every_variant()
            timings[step.label] = (time.perf_counter() - start) * 1e3
        return timings
    except TullaxError as err:
        raise with_spec_context(err, spec) from None
