"""Host kernels inside a JAX computation: the portable ``jax.pure_callback`` path."""
from __future__ import annotations

from typing import Any, Sequence

from .ir import Spec


def host_call(spec: Spec, backend_name: str, args: Sequence[Any]) -> Any:
    """Call the backend's host kernel for ``spec`` from inside jit/grad through ``jax.pure_callback``."""
    import jax
    import numpy as np

    from . import backends
    from .backends.base import Signature
    from .kernel import result_dtype

    shapes = {name: tuple(a.shape) for name, a in zip(spec.input_names, args)}
    out_shape = tuple(s.eval(shapes) for s in spec.out_shape)
    dtype = np.dtype(result_dtype(spec, list(args)))
    signature = Signature(tuple(np.dtype(a.dtype).name for a in args), dtype.name)
    kernel = backends.resolve(backend_name).build(spec, signature)

    def run(*arrays):
        arrays = [np.asarray(a) for a in arrays]
        if spec.assign == ":=":
            out = np.empty(out_shape, dtype) if not spec.is_scatter else np.zeros(out_shape, dtype)
        else:
            out = np.array(arrays[0], dtype=dtype, copy=True)
        kernel(out, *[a if a.ndim else a[()] for a in arrays])
        return out

    result = jax.ShapeDtypeStruct(out_shape, dtype)
    return jax.pure_callback(run, result, *args, vmap_method="sequential")
