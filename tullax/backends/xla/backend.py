"""The ``xla`` backend: the jnp lowering of ``tullax.backends.xla.lower`` as a registered backend, jitted, and its host
kernel for NumPy inputs (the reference and comparator backend)."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from tullax.backends.base import Capabilities, Signature
from tullax.backends.xla.lower import lower
from tullax.errors import ShapeError
from tullax.spec.ir import Spec
from tullax.spec.shapes import check_index_values, check_shapes, input_shapes


class XlaHostKernel:
    """``kernel(out, *inputs)``: the jitted lowering run on NumPy inputs (in ``spec.inputs`` order; for '='/'+='
    the existing values are read from ``out``), written into ``out``. It checks the input count, the shapes and
    the index values itself."""

    def __init__(self, spec: Spec, signature: Signature):
        import jax

        self.spec = spec
        self._compiled = jax.jit(lower(spec))
        # float64, complex128 or a 64-bit integer anywhere: run with x64 on, whatever the process-wide setting.
        data = [d for inp, d in zip(spec.inputs, signature.in_dtypes) if inp.kind in ("array", "scalar")]
        self._wide = any(np.dtype(d).itemsize >= 8 and np.dtype(d).kind in "fciu"
                         for d in (*data, signature.out_dtype))

    def __call__(self, out: np.ndarray, *inputs: Any) -> None:
        import jax

        spec = self.spec
        if len(inputs) != len(spec.inputs):
            raise ShapeError(f"the kernel takes {len(spec.inputs)} inputs ({', '.join(spec.input_names)}), "
                             f"got {len(inputs)}")
        env = dict(zip(spec.input_names, inputs))
        if spec.assign != ":=":
            env[spec.out] = out
        check_shapes(spec, input_shapes(spec, env))
        check_index_values(spec, env)
        with jax.enable_x64(self._wide or bool(jax.config.jax_enable_x64)):
            result = self._compiled(env)
            out[...] = np.asarray(result).astype(out.dtype, copy=False)


class XlaBackend:
    """Runs specs through the plain jnp lowering, jitted (the reference and comparator backend)."""

    name = "xla"
    capabilities = Capabilities()  # inside JAX it is the lowering itself, not a host callback

    def availability(self) -> tuple[bool, str]:
        import importlib.util
        import sys

        # found, not imported: `tullax doctor` and the planner's first look should not pay jax's import
        if "jax" not in sys.modules and importlib.util.find_spec("jax") is None:
            return False, "pip install jax"
        return True, ""

    def generate_source(self, spec: Spec, signature: Signature,
                        shapes: Mapping[str, tuple[int, ...]] | None = None) -> str:
        """The jaxpr of the lowering. XLA code depends on the shapes, so this traces with ``shapes`` (default:
        small example shapes from ``tullax.testing.shapes_for``) and says which ones in the first line."""
        import jax

        if shapes is None:
            from tullax.spec.examples import shapes_for
            shapes = shapes_for(spec, seed=0)
        args = {}
        for inp, dtype in zip(spec.inputs, signature.in_dtypes):
            args[inp.name] = jax.ShapeDtypeStruct(tuple(shapes[inp.name]), np.dtype(dtype))
        jaxpr = jax.make_jaxpr(lower(spec))(args)
        listed = ", ".join(f"{n}: {tuple(shapes[n])}" for n in spec.input_names)
        return f"# jaxpr of the jnp lowering for shapes {listed}\n{jaxpr}\n"

    def build(self, spec: Spec, signature: Signature) -> XlaHostKernel:
        return XlaHostKernel(spec, signature)


__all__ = ["XlaBackend", "XlaHostKernel"]
