"""A kernel call's arguments against the analysed spec: binding them to inputs, and the checks every path runs
before a kernel does (eager NumPy calls, jax tracing, the benchmark parent) at the call site, so a mistake is
a ShapeError there and never inside a compiled kernel or a host callback. Values need only ``shape`` and
``dtype`` (NumPy arrays, jax arrays, tracers); jax is imported only for ``result_dtype``'s promotion rules."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from tullax.errors import ShapeError
from tullax.spec.dtypes import is_numeric
from tullax.spec.ir import Spec


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
        hint = ""
        if spec.assign in ("=", "+=") and spec.out in names and len(values) == len(names) - 1 \
                and spec.out not in named:  # one short: most likely '=' written for a new array
            hint = (f"; with '{spec.assign}' the existing {spec.out} is the first input, written into: to create "
                    f"a new {spec.out} write ':=' instead of '{spec.assign}'")
        raise ShapeError(f"missing input{'s' * (len(missing) > 1)} {', '.join(missing)}: the spec takes "
                         f"{len(names)} ({', '.join(names)}), in that order or by name{hint}")
    return [values[n] for n in names]


def as_numpy_inputs(spec: Spec, values: list[Any]) -> list[Any]:
    """NumPy views of the inputs (no copies for native-order NumPy arrays; big-endian ones are byte-swapped),
    scalars as NumPy scalars."""
    import numpy as np

    out = []
    for item, value in zip(spec.inputs, values):
        try:
            arr = np.asarray(value)
        except Exception as err:  # noqa: BLE001 - anything not array-like is the caller's mistake
            raise ShapeError(f"input {item.name} is not an array or a number: {err}") from None
        if not is_numeric(arr.dtype):
            raise ShapeError(f"input {item.name} has dtype {arr.dtype}; tullax takes numeric arrays")
        if not arr.dtype.isnative:  # big-endian data: kernels (and jax) compute in the machine's byte order
            arr = arr.astype(arr.dtype.newbyteorder("="))
        out.append(arr if item.kind != "scalar" else arr[()])
    return out


def check_call(spec: Spec, values: list[Any]) -> dict[str, tuple[int, ...]]:
    """Ranks, kinds and extents of the inputs against the spec; returns the shapes. Trace-time safe. A mismatch
    says the order and ranks the kernel expects, since arguments in the wrong order are its commonest cause."""
    try:
        return _check_call(spec, values)
    except ShapeError as err:
        raise ShapeError(f"{err}\n    {expected_arguments(spec, values)}") from None


def expected_arguments(spec: Spec, values: list[Any]) -> str:
    """``the kernel takes W (rank 2), g (rank 2), ix (rank 1, integers), in this order; got shapes ...``."""
    def describe(item: Any) -> str:
        if item.kind == "scalar":
            return f"{item.name} (a scalar)"
        if item.kind == "shape":
            return f"{item.name} (rank >= {item.rank}, only its shape is read)"
        return f"{item.name} (rank {item.rank}{', integers' if item.kind == 'index' else ''})"

    got = ", ".join(f"{item.name}={tuple(getattr(v, 'shape', ()))}" for item, v in zip(spec.inputs, values))
    return (f"the kernel takes {', '.join(describe(i) for i in spec.inputs)}, in this order (or by name); "
            f"got shapes {got}")


def _check_call(spec: Spec, values: list[Any]) -> dict[str, tuple[int, ...]]:
    from tullax.spec.shapes import check_shapes

    shapes: dict[str, tuple[int, ...]] = {}
    for item, value in zip(spec.inputs, values):
        shape = tuple(getattr(value, "shape", ()))
        if item.kind == "scalar":
            if shape != ():
                raise ShapeError(f"{item.name} is a scalar parameter in this spec but got an array of shape "
                                 f"{shape}; index it in the spec (e.g. {item.name}[i]) to pass an array")
        elif item.kind == "shape":  # only extents are read (size(A, d), a range): those axes must exist
            if len(shape) < item.rank:
                raise ShapeError(f"the spec reads axis {item.rank - 1} of {item.name} (size({item.name},"
                                 f"{item.rank - 1})) but it has rank {len(shape)} (shape {shape})")
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


def result_dtype(spec: Spec, values: Sequence[Any]) -> Any:
    """The dtype of the result of ``spec`` on ``values`` (``tullax.spec.shapes.result_dtype`` of their dtypes, a
    weakly typed value's as its Python type: ``weak_type``)."""
    from tullax.spec.shapes import result_dtype as _result_dtype

    return _result_dtype(spec, [weak_type(v) or _native(getattr(v, "dtype", None)) for v in values])


def _native(dtype: Any) -> Any:
    """``dtype`` in the machine's byte order (jax's promotion knows no big-endian dtypes)."""
    import numpy as np

    return None if dtype is None else np.dtype(dtype).newbyteorder("=")


def weak_type(value: Any) -> type | None:
    """``float``/``int``/``complex`` for a weakly typed value, else None. Weak, as in jnp's promotion: a plain Python
    number, or a jax value jax marks weak (a Python number's tracer under jit, float64 under x64;
    ``jnp.asarray(2.5)``). It takes the arrays' precision (``s*x`` with float32 x is float32), the same eagerly,
    with jax arrays, and under jit. A NumPy scalar is strongly typed."""
    if isinstance(value, (int, float, complex)) and not isinstance(value, bool) and not hasattr(value, "dtype"):
        return type(value)
    if getattr(getattr(value, "aval", None), "weak_type", False) or getattr(value, "weak_type", False) is True:
        import numpy as np

        return {"f": float, "i": int, "u": int, "c": complex}.get(np.dtype(value.dtype).kind)
    return None


def weak_dtypes(spec: Spec, values: Sequence[Any], result: Any) -> list[Any]:
    """Per input, the dtype a weakly typed data input is passed to the kernel in, None for every other input: as
    jnp converts a weak operand to the arrays' dtype before computing, a real number arrives in the real precision
    of ``result`` (the call's result dtype), a complex one in its complex precision (``abs(x[i] + c)`` is real,
    ``z[i]*2.0`` complex). Index and shape-only inputs keep their dtype: they take no part in the promotion."""
    import numpy as np

    result = np.dtype(result)
    real = np.dtype(np.finfo(result).dtype) if result.kind == "c" else result
    precision = {float: real, int: real, complex: np.result_type(result, np.complex64)}
    return [precision[kind] if item.kind in ("array", "scalar") and (kind := weak_type(v)) is not None else None
            for item, v in zip(spec.inputs, values)]


__all__ = ["bind_inputs", "as_numpy_inputs", "check_call", "result_dtype", "weak_dtypes", "weak_type"]
