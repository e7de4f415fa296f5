"""Inputs beyond tullax's limits are TullaxErrors that name the limit (issue 15): never a RecursionError, a
SyntaxError from compiling the generated code, or a ValueError/OverflowError from converting a literal."""
from __future__ import annotations

import numpy as np
import pytest

import tullax
from tullax.errors import SpecError
from tullax.spec.analyze import MAX_INDICES
from tullax.spec.parse import MAX_DEPTH

x4 = np.ones(4, np.float32)


@pytest.mark.parametrize("spec, match", [
    ("y[i] := " + "(" * 170 + "x[i]" + ")" * 170, "nests more than"),
    ("y[i] := " + "-" * 200 + "x[i]", "nests more than"),
    ("y[i] := " + "exp(" * 100 + "x[i]" + ")" * 100, "nests more than"),
    ("y[i] := " + "+".join(["x[i]"] * 1000), "operations deep"),
    ("y[i] := " + "*".join(["x[i]"] * 260), "operations deep"),
    ("y[i] := x[i] * " + "1" * 5000, "does not fit in int64"),
    ("y[i] := x[i] * 1" + "0" * 400, "does not fit in int64"),
    ("y[i] := i * 100000000000000000000 + x[i]", "does not fit in int64"),
    ("y[i] := x[i + 9223372036854775808]", "does not fit in int64"),
    # nesting inside an index or a range bound has the body's limit (issue 44): it was a RecursionError
    ("y[i] := x[" + "(" * 1000 + "i" + ")" * 1000 + "]", "nests more than"),
    ("y[i] := x[" + "(" * 100 + "i" + ")" * 100 + "-1]", "nests more than"),
    ("y[i] := x[pad(" + "(" * 100 + "i" + ")" * 100 + ")]", "nests more than"),
    ("y[i] := x[ix[" + "(" * 100 + "i" + ")" * 100 + "]]", "nests more than"),
    ("y[i] := x[i+k]*w[k]  (k in " + "(" * 1000 + "0" + ")" * 1000 + ":3)", "nests more than"),
    ("y[i] := x[i+k]*w[k]  (k in 0:" + "-" * 1000 + "3)", "nests more than"),
])
def test_limits_are_spec_errors(spec, match):
    with pytest.raises(SpecError, match=match):
        tullax.einsum_kernel(spec)


def test_an_index_nested_within_the_limit_is_accepted():
    deep = "(" * (MAX_DEPTH - 4) + "i" + ")" * (MAX_DEPTH - 4)
    kernel = tullax.einsum_kernel(f"y[i] := z[i]*x[{deep}+1]  (k in {'(' * (MAX_DEPTH - 4)}0{')' * (MAX_DEPTH - 4)}:2)",
                                  backend="xla")
    np.testing.assert_allclose(kernel(np.ones(5), np.arange(6.0)), 2 * np.arange(1.0, 6.0))


def test_the_deepest_accepted_expression_runs_forward_and_backward():
    import jax

    spec = "y[i] := " + "+".join(f"{k}*x[i]" for k in range(1, MAX_DEPTH))  # a chain MAX_DEPTH deep
    kernel = tullax.einsum_kernel(spec, backend="numba")
    np.testing.assert_allclose(kernel(x4), np.full(4, sum(range(1, MAX_DEPTH))), rtol=1e-6)
    grad = jax.grad(lambda v: kernel(v).sum())(x4)
    np.testing.assert_allclose(np.asarray(grad), np.full(4, sum(range(1, MAX_DEPTH))), rtol=1e-6)


def test_too_many_indices_is_a_spec_error():
    names = ",".join(f"i{d}" for d in range(MAX_INDICES + 5))
    with pytest.raises(SpecError, match=f"tullax allows {MAX_INDICES}"):
        tullax.einsum_kernel(f"y[{names}] := x[{names}]")


def test_the_most_indices_allowed_compile_with_guards_on_numba():
    """MAX_INDICES loops plus the blocks of pad guards stay within Python's 20 nested blocks."""
    names = [f"i{d}" for d in range(MAX_INDICES)]
    reads = ",".join(f"pad({n}-1)" if d < 3 else n for d, n in enumerate(names))
    spec = f"y[{','.join(names[:-1])}] := x[{reads}]"
    x = np.arange(2.0 ** MAX_INDICES).reshape((2,) * MAX_INDICES)
    y = tullax.einsum_kernel(spec, backend="numba", ranges={n: 2 for n in names[:3]})(x)
    want = np.zeros_like(x)
    want[1:, 1:, 1:] = x[:-1, :-1, :-1]
    np.testing.assert_allclose(y, want.sum(-1))
