"""The public ``Kernel``: binds arguments, checks them at the call site, and runs eagerly on NumPy or as a
JAX operation on jax arrays and tracers."""
from __future__ import annotations

import sys
from functools import cached_property
from typing import Any, Mapping

from tullax.errors import ShapeError, TullaxError, with_spec_context
from tullax.spec.frontend import compile_spec
from tullax.spec.ir import Spec


class Kernel:
    """A compiled index-notation kernel. Call it with the inputs positionally (in order of first appearance
    on the right-hand side; for '=' and '+=' the existing output first) or by name."""

    def __init__(self, spec: str, *, backend: str = "auto", ranges: Mapping | None = None):
        from tullax import backends

        self.source = spec
        self.canonical, self.ir = compile_spec(spec, ranges)
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
            return gradient_texts(self.ir)
        except TullaxError as err:
            raise with_spec_context(err, self.source) from None

    @cached_property
    def backend(self) -> Any:
        """The backend object this kernel runs on (``auto`` is resolved on first use)."""
        from tullax import backends

        return backends.resolve(self.backend_name)

    def __repr__(self) -> str:
        return f"tullax.Kernel({self.canonical!r}, backend={self.backend_name!r})"

    def _jax_backend(self) -> str:
        """The backend of a call on jax values: ``auto`` on a GPU platform picks a GPU backend."""
        if self.backend_name == "auto":
            from tullax.backends.gpu_select import auto_backend_for_jax

            found = auto_backend_for_jax()
            if found is not None:
                return found
        return self.backend.name

    # -- calling ----------------------------------------------------------------------------------
    def __call__(self, *args: Any, **named: Any) -> Any:
        try:
            values = bind_inputs(self.ir, args, named)
            if _any_jax(values):
                from tullax.jaxop.primitives import apply

                return apply(self.ir, self._jax_backend(), values)
            return run_eager(self.ir, self.backend, values)
        except TullaxError as err:
            raise with_spec_context(err, self.source) from None


def bind_inputs(spec: Spec, args: tuple, named: Mapping[str, Any]) -> list[Any]:
    """Positional and keyword arguments -> one value per spec input, in spec order."""
    names = spec.input_names
    if len(args) > len(names):
        raise ShapeError(f"too many inputs: the spec takes {len(names)} ({', '.join(names)}), "
                         f"got {len(args)} positional")
    values: dict[str, Any] = dict(zip(names, args))
    for key, value in named.items():
        if key not in names:
            raise ShapeError(f"unknown input {key!r}: the inputs are {', '.join(names) or 'none'}")
        if key in values:
            raise ShapeError(f"input {key!r} given twice (positionally and by name)")
        values[key] = value
    missing = [n for n in names if n not in values]
    if missing:
        raise ShapeError(f"missing input{'s' * (len(missing) > 1)} {', '.join(missing)}: the spec takes "
                         f"{len(names)} ({', '.join(names)}), in that order or by name")
    return [values[n] for n in names]


def _any_jax(values: list[Any]) -> bool:
    jax = sys.modules.get("jax")
    return jax is not None and any(isinstance(v, jax.Array) for v in values)


def as_numpy_inputs(spec: Spec, values: list[Any]) -> list[Any]:
    """NumPy views of the inputs (no copies for arrays already in NumPy), scalars as NumPy scalars."""
    import numpy as np

    out = []
    for item, value in zip(spec.inputs, values):
        try:
            arr = np.asarray(value)
        except Exception as err:  # noqa: BLE001 - anything not array-like is the caller's mistake
            raise ShapeError(f"input {item.name} is not an array or a number: {err}") from None
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
            raise ShapeError(f"input {item.name} has dtype {arr.dtype}; tullax takes numeric arrays")
        out.append(arr if item.kind != "scalar" else arr[()])
    return out


def check_call(spec: Spec, values: list[Any]) -> dict[str, tuple[int, ...]]:
    """Ranks, kinds and extents of the inputs against the spec; returns the shapes. Trace-time safe."""
    from tullax.spec.shapes import check_shapes

    shapes: dict[str, tuple[int, ...]] = {}
    for item, value in zip(spec.inputs, values):
        shape = tuple(getattr(value, "shape", ()))
        if item.kind == "scalar":
            if shape != ():
                raise ShapeError(f"{item.name} is a scalar parameter in this spec but got an array of shape "
                                 f"{shape}; index it in the spec (e.g. {item.name}[i]) to pass an array")
        elif len(shape) != item.rank:
            raise ShapeError(f"{item.name} is indexed with {item.rank} ind{'ices' if item.rank != 1 else 'ex'} "
                             f"in the spec but has rank {len(shape)} (shape {shape})")
        if item.kind == "index" and not _is_integer(value):
            raise ShapeError(f"{item.name} is used as an index array ({item.name}[..] inside brackets) and must "
                             f"hold integers, but has dtype {value.dtype}")
        shapes[item.name] = shape
    check_shapes(spec, shapes)
    return shapes


def _is_integer(value: Any) -> bool:
    import numpy as np

    return np.issubdtype(np.dtype(value.dtype), np.integer)


def result_dtype(spec: Spec, values: list[Any]):
    from tullax.spec.shapes import result_dtype as _result_dtype

    return _result_dtype(spec, [getattr(v, "dtype", None) for v in values])


def run_eager(spec: Spec, backend: Any, values: list[Any]) -> Any:
    """Run on NumPy inputs, return a NumPy array (a new one: '=' and '+=' do not mutate their input)."""
    import numpy as np

    from tullax.backends.base import Signature
    from tullax.spec.shapes import check_index_values

    arrays = as_numpy_inputs(spec, values)
    shapes = check_call(spec, arrays)
    env = dict(zip(spec.input_names, arrays))
    check_index_values(spec, env)
    dtype = np.dtype(result_dtype(spec, arrays))
    signature = Signature(tuple(np.dtype(a.dtype).name for a in arrays), dtype.name)
    out_shape = tuple(s.eval(shapes) for s in spec.out_shape)
    if spec.assign == ":=":
        out = np.empty(out_shape, dtype) if not spec.is_scatter else np.zeros(out_shape, dtype)
    else:
        out = np.array(arrays[0], dtype=dtype, copy=True)
    backend.build(spec, signature)(out, *arrays)
    return out
