"""Element types beyond float32/float64: which dtypes a spec takes, when its result stays integer, and what the
backends compute in.

* Half precision (float16, bfloat16): loaded, computed and accumulated in float32, the result rounded back to
  the half dtype ``jnp.result_type`` gives. Neither Numba nor Julia's host path reads bfloat16, and Numba has no
  float16 arithmetic of its own, so half inputs are converted to float32 at the boundary (``kernel_dtype``).
* Integers: the result keeps ``jnp.result_type`` of the integer inputs when the body is integer-valued
  (``integer_valued``): sums, products, differences, max/min, abs, comparisons and ``ifelse`` of integers, integer
  literals and index values. Anything else (``/``, ``exp``, a float literal, logsumexp) gives a float, as in jnp.
  The loop kernels compute integer results in int64 and the host narrows them afterwards: for ``+ - *`` that
  is exactly the wrap-around of the narrower type (arithmetic modulo 2^bits).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tullax.spec.ir import Access, Binary, Call, Expr, Hole, IndexVal, Num, Param, Size, Spec, Unary

HALF = ("float16", "bfloat16")
# the wide dtype a loop kernel computes a result of each narrow dtype in (see the module docstring)
LOOP_COMPUTE = {"float16": "float32", "bfloat16": "float32"}
# functions whose value on integers is an integer (jnp keeps the integer dtype)
INTEGER_FUNCTIONS = ("abs", "relu", "max", "min", "ifelse", "conj", "real", "imag")


def as_dtype(dtype: Any) -> np.dtype:
    """``np.dtype(dtype)``, the name ``"bfloat16"`` included (NumPy knows it once ml_dtypes, which jax
    depends on, is imported)."""
    if isinstance(dtype, str) and dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def dtype_name(dtype: Any) -> str:
    """The NumPy name of ``dtype`` (``bfloat16`` for ml_dtypes' bfloat16)."""
    return as_dtype(dtype).name


def is_numeric(dtype: Any) -> bool:
    """A dtype tullax computes with: bool, integers, floats (half precision included) and complex."""
    found = as_dtype(dtype)
    return found.kind in "biufc" or found.name in HALF


def is_integer(dtype: Any) -> bool:
    """An integer (or bool) dtype, or Python's ``int``/``bool`` (a weak scalar), or a value of one."""
    if dtype is None:
        return False
    if isinstance(dtype, type) and dtype in (int, bool, float, complex):
        return dtype in (int, bool)
    if isinstance(dtype, (int, float, complex)) and not hasattr(dtype, "dtype"):  # a Python number
        return isinstance(dtype, int)
    return as_dtype(getattr(dtype, "dtype", dtype)).kind in "biu"


def kernel_dtype(dtype: Any) -> str:
    """The dtype the loop kernels handle for data of ``dtype``: float32 for half precision, integer results
    in int64 (narrowed by the host afterwards), anything else as it is."""
    name = dtype_name(dtype)
    if name in LOOP_COMPUTE:
        return LOOP_COMPUTE[name]
    return "int64" if as_dtype(dtype).kind in "iu" else name


def integer_valued(spec: Spec, integer_input: Callable[[str], bool]) -> bool:
    """Whether ``spec``'s result is an integer when the inputs for which ``integer_input(name)`` holds are
    integers: its body, reduction and finaliser keep integers integer (module docstring)."""
    if spec.redop not in ("+", "*", "max", "min"):
        return False
    if spec.finalizer is not None and not _integer(spec.finalizer, integer_input):
        return False  # ``_``, the reduced value, is an integer when the body is (checked below)
    return _integer(spec.body, integer_input)


def _integer(expr: Expr, integer_input: Callable[[str], bool]) -> bool:
    if isinstance(expr, Num):
        return isinstance(expr.value, int)
    if isinstance(expr, (IndexVal, Size, Hole)):  # an index value, size(A,d), the finaliser's ``_``
        return True
    if isinstance(expr, (Param, Access)):
        return integer_input(expr.name if isinstance(expr, Param) else expr.array)
    if isinstance(expr, Unary):
        return _integer(expr.arg, integer_input)
    if isinstance(expr, Binary):
        both = _integer(expr.lhs, integer_input) and _integer(expr.rhs, integer_input)
        if expr.op == "/":
            return False
        if expr.op == "^":  # an integer to a constant non-negative integer power; else a float, as pow is
            return both and isinstance(expr.rhs, Num) and expr.rhs.value >= 0
        return both
    if isinstance(expr, Call):
        return expr.fn in INTEGER_FUNCTIONS and all(_integer(a, integer_input) for a in expr.args)
    return False


__all__ = ["HALF", "as_dtype", "dtype_name", "is_numeric", "is_integer", "kernel_dtype", "integer_valued"]
