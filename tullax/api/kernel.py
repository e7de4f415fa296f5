"""The public ``Kernel``: binds arguments, checks them at the call site, and runs eagerly on NumPy or as a
JAX operation on jax arrays and tracers."""
from __future__ import annotations

import sys
from functools import cached_property
from typing import Any, Iterable, Mapping

from tullax.api.options import finish, make_options, stop_gradients
from tullax.errors import TullaxError, with_spec_context
from tullax.spec.arguments import as_numpy_inputs, bind_inputs, check_call, result_dtype, weak_dtypes
from tullax.spec.frontend import compile_spec
from tullax.spec.ir import Spec


class Kernel:
    """A compiled index-notation kernel. Call it with the inputs positionally (in order of first appearance
    on the right-hand side; for '=' and '+=' the existing output first) or by name."""

    def __init__(self, spec: str, *, backend: str = "auto", ranges: Mapping | None = None, init: Any = None,
                 nograd: str | Iterable[str] = (), algebra: str | None = None):
        from tullax import backends

        if backend != "auto":
            backends.warm_up(backend)  # the C compiler's probe compiles while the spec is analysed
        self.source = spec
        self.canonical, self.ir = compile_spec(spec, ranges)
        try:
            self.options = make_options(self.canonical, self.ir, init, nograd, algebra, backend)
        except TullaxError as err:
            raise with_spec_context(err, spec) from None
        if backend != "auto":
            backends.get(backend)  # unknown names fail here, with the list of valid ones
        self.backend_name = backend

    # -- introspection ----------------------------------------------------------------------------
    @property
    def spec(self) -> str:
        """The canonical text of the spec."""
        return self.canonical

    @property
    def inputs(self) -> tuple[str, ...]:
        """Input names in call order."""
        return self.ir.input_names

    @cached_property
    def grad_specs(self) -> tuple[str, ...]:
        """One gradient spec (as text) per differentiable input; multi-step gradients joined by '; '."""
        from tullax.grad import gradient_texts

        try:
            if self.options.boolean is not None:  # a bool result has no gradient
                return ()
            texts = gradient_texts(self.ir)
            if not self.options.nograd:
                return texts
            from tullax.grad import gradients

            wrt = [g.wrt for g in gradients(self.ir)]  # gradient_texts follows this order
            return tuple(t for t, name in zip(texts, wrt) if name not in self.options.nograd)
        except TullaxError as err:
            raise with_spec_context(err, self.source) from None

    @cached_property
    def backend(self) -> Any:
        """The backend object this kernel runs on (``auto`` is resolved on first use)."""
        from tullax import backends

        return backends.resolve(self.backend_name)

    def _eager_backend(self, values: list[Any]) -> Any:
        """The backend of a call on NumPy values: ``auto`` skips a backend that refuses the call's dtypes."""
        if self.backend_name != "auto":
            return self.backend
        import numpy as np

        from tullax import backends

        dtypes = [np.result_type(v).name for v in values]
        return self.backend if backends.takes(self.backend, dtypes) else backends.resolve("auto", dtypes)

    def __repr__(self) -> str:
        extra = (f", init={self.options.init!r}" if self.options.init is not None else "") + \
            (f", nograd={tuple(sorted(self.options.nograd))!r}" if self.options.nograd else "") + \
            (f", algebra={self.options.algebra!r}" if self.options.algebra else "")
        return f"tullax.Kernel({self.canonical!r}, backend={self.backend_name!r}{extra})"

    def _jax_backend(self) -> str:
        """The backend of a call on jax values: ``auto`` stays ``auto``: the planner (``tullax.planner.decide``)
        chooses the loop backend or an XLA form for the forward kernel and for each gradient step, from the
        call's shapes; on a GPU the loop backend is the GPU's own (cuda or julia-cuda)."""
        return "auto" if self.backend_name == "auto" else self.backend.name

    # -- calling ----------------------------------------------------------------------------------
    def __call__(self, *args: Any, **named: Any) -> Any:
        try:
            values = bind_inputs(self.ir, args, named)
            if _any_jax(values):
                import jax.numpy as jnp

                from tullax.jaxop.primitives import apply

                values = stop_gradients(self.options, self.ir, values)
                return finish(self.options, self.ir.redop,
                              apply(self.ir, self._jax_backend(), values, algebra=self.options.algebra), jnp)
            import numpy as np

            return finish(self.options, self.ir.redop, run_eager(self.ir, self._eager_backend(values), values), np)
        except TullaxError as err:
            raise with_spec_context(err, self.source) from None


def _any_jax(values: list[Any]) -> bool:
    jax = sys.modules.get("jax")
    return jax is not None and any(isinstance(v, jax.Array) for v in values)


def run_eager(spec: Spec, backend: Any, values: list[Any]) -> Any:
    """Run on NumPy inputs, return a NumPy array (a new one: '=' and '+=' do not mutate their input)."""
    import numpy as np

    from tullax.backends.base import Signature
    from tullax.runtime import hugepages
    from tullax.spec.shapes import check_index_values

    arrays = as_numpy_inputs(spec, values)
    shapes = check_call(spec, arrays)
    env = dict(zip(spec.input_names, arrays))
    check_index_values(spec, env)
    dtype = np.dtype(result_dtype(spec, values))
    # a Python number arrives in the result's precision, as under jit (JAX's weak types)
    arrays = [a if weak is None else weak.type(a) for a, weak in zip(arrays, weak_dtypes(spec, values, dtype))]
    signature = Signature(tuple(np.dtype(a.dtype).name for a in arrays), dtype.name)
    out_shape = tuple(s.eval(shapes) for s in spec.out_shape)
    if spec.assign == ":=" and not spec.is_scatter:
        out = np.empty(out_shape, dtype)
        hugepages.advise(out)  # before its first write (runtime.hugepages)
    elif spec.assign == ":=":
        out = np.zeros(out_shape, dtype)
    else:
        out = np.array(arrays[0], dtype=dtype, copy=True)
    backend.build(spec, signature)(out, *arrays)
    return out
