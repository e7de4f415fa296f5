"""A program run fused (``tullax.compiler.fuse``): its one loop kernel on the host backend, inside JAX.

The forward is a ``pure_callback`` into the fused kernel (``tullax.backends.program_host``), wrapped in a
``custom_jvp`` whose rule is the JVP of the unfused program (its statements' kernels, which JAX linearises and
transposes): a forward call runs the one fused kernel; ``jax.grad``, ``jacfwd`` and higher orders run the
statements' derived gradient kernels by reverse accumulation, exactly as unfused (the gradient program is not
fused yet).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tullax.compiler.fuse import Fused, NotFusable, fuse_program
from tullax.spec.program import Program, program_shapes

FUSED_BACKENDS = ("c", "numba")


class FusedProgram:
    """The fused forms of one program on ``backend``, one per data dtype (or the reason it does not fuse)."""

    def __init__(self, program: Program, backend: str):
        self.program, self.backend = program, backend
        self._fused: dict[str, Fused | str] = {}

    def fused(self, dtype: str) -> Fused | None:
        found = self._fused.get(dtype)
        if found is None:
            try:
                found = fuse_program(self.program, dtype, "program")
            except NotFusable as why:
                found = str(why)
            self._fused[dtype] = found
        return found if isinstance(found, Fused) else None

    def reason(self, dtype: str) -> str:
        """Why the program does not fuse for ``dtype`` ("" where it does)."""
        self.fused(dtype)
        found = self._fused[dtype]
        return found if isinstance(found, str) else ""

    def call(self, env: dict[str, Any], unfused: Callable[..., Any]) -> Any | None:
        """The program's output on the values of ``env`` (input name -> value), or None where it does not fuse
        (mixed or non-float dtypes, or a program of another shape): the caller runs it unfused."""
        import jax
        import jax.numpy as jnp

        from tullax.backends.program_host import host_program

        names = self.program.inputs
        kinds = {i.name: i.kind for st in self.program.statements for i in st.spec.inputs}
        arrays = [n for n in names if kinds.get(n) != "scalar"]
        dtypes = {np.dtype(getattr(env[n], "dtype", np.float64)).name for n in arrays}
        if len(dtypes) != 1 or not dtypes <= {"float32", "float64"}:
            return None
        dtype = dtypes.pop()
        fused = self.fused(dtype)
        if fused is None:
            return None
        kernel = fused.kernel
        host = host_program(self.backend, kernel)
        values = [jnp.asarray(env[n], dtype) for n in names]
        shapes = program_shapes(self.program, {n: tuple(np.shape(v)) for n, v in zip(names, values)})
        result = jax.ShapeDtypeStruct(shapes[fused.output], dtype)

        def run(*given: Any) -> np.ndarray:
            out = np.empty(result.shape, dtype)
            host(out, dict(zip(names, given)), shapes)
            return out

        @jax.custom_batching.custom_vmap
        def one_call(*given: Any) -> Any:
            if self.backend == "c":  # XLA's custom call into the kernel, as a c kernel's own
                found = host.ffi_call(names, given, shapes, result)
                if found is not None:
                    return found
            return jax.pure_callback(run, result, *given, vmap_method="sequential")

        @one_call.def_vmap
        def _batched(size: int, batched: list[bool], *given: Any) -> tuple[Any, bool]:
            # a batch of programs runs as the unfused statements, which batch as kernels do
            axes = [0 if b else None for b in batched]
            return jax.vmap(unfused, in_axes=axes, axis_size=size)(*given), True

        @jax.custom_jvp
        def program(*given: Any) -> Any:
            return one_call(*given)

        @program.defjvp
        def _jvp(primals: tuple, tangents: tuple) -> tuple[Any, Any]:
            return jax.jvp(unfused, primals, tangents)

        return program(*values)
