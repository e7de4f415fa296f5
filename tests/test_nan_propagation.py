"""NaN propagates through max and min on every backend, as in jnp, NumPy and Julia (issue 13).

The cases put NaNs where each printed form can lose them: in a vectorised lane and in the remainder loop of a
max/min reduction, in every row, in a scalar (prange) reduction, in a tiled reduction and in the max()/min()
functions. The reference is NumPy (np.max / np.maximum propagate NaN)."""
from __future__ import annotations

import numpy as np
import pytest
from loop_backends import c_param
from test_julia_printer import run_julia

import tullax
from tullax.spec.frontend import compile_spec

nan = np.nan


def _inputs() -> list[np.ndarray]:
    small = np.array([[nan, 1, 2], [1, nan, 2], [1, 2, nan], [nan, nan, nan], [1, 2, 3]])
    wide = np.random.default_rng(0).random((6, 37))  # 4 blocks of 8 lanes and a remainder of 5
    wide[1, 3] = nan    # in a lane
    wide[2, 35] = nan   # in the remainder
    wide[3, :] = nan
    wide[4, 0] = -np.inf
    # long rows (9000 elements): XLA's CPU reduction lost a NaN in arrays of 4096 elements or more (jaxlib 0.10.2:
    # the max of the rest, or -inf with the NaN last); the Numba lanes' sums turn NaN on +inf beside -inf too (the
    # exact loop then decides)
    long = np.random.default_rng(1).random((6, 1500))
    long[0, 700] = nan
    long[1, -1] = nan
    long[2, 0] = nan
    long[3, 10], long[3, 18] = np.inf, -np.inf  # in one lane of 8: its sum is NaN
    long[4, :] = -np.inf
    return [small, wide, long]


CASES = [
    ("(max) m[i] := x[i,j]", lambda x: x.max(1)),
    ("(min) m[i] := x[i,j]", lambda x: x.min(1)),
    ("(max) m := x[i,j]", lambda x: x.max()),
    ("(min) m := x[i,j]", lambda x: x.min()),
    ("(max) m[j] := x[i,j]", lambda x: x.max(0)),  # the reduction over the strided index: a tiled kernel
    ("y[i,j] := max(x[i,j], 0)", lambda x: np.maximum(x, 0)),
    ("y[i,j] := min(0.5, x[i,j])", lambda x: np.minimum(0.5, x)),
    ("(logsumexp) l[i] := x[i,j]", lambda x: np.log(np.exp(x).sum(1))),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("backend", ["numba", "xla", c_param()])
@pytest.mark.parametrize("spec, reference", CASES, ids=[c[0] for c in CASES])
def test_nan_propagates(spec, reference, backend, dtype):
    kernel = tullax.einsum_kernel(spec, backend=backend)
    for x in _inputs():
        x = x.astype(dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            want = reference(x.astype(np.float64)).astype(dtype)
        got = np.asarray(kernel(x))
        np.testing.assert_allclose(got, want, rtol=1e-5, equal_nan=True, err_msg=f"{spec} on {x.shape}")


@pytest.mark.parametrize("spec, reference", CASES, ids=[c[0] for c in CASES])
def test_nan_propagates_in_the_printed_julia(spec, reference):
    step = compile_spec(spec)[1]
    for x in _inputs():
        with np.errstate(invalid="ignore", over="ignore"):
            want = reference(x)
        np.testing.assert_allclose(run_julia(step, {"x": x}), want, rtol=1e-12, equal_nan=True, err_msg=spec)


# ---------------------------------------------------------------------------------------------
# A comparison is a 0/1 number: NaN * 0 is NaN (IEEE, as NumPy), on every backend, eagerly and under jit. jnp's
# own `x*(x > 2)` gives 0 there (it multiplies by a bool as a select; XLA rewrites a multiply by a converted
# comparison into a select, which is what the xla backend did before): the select is `ifelse`, 0 on every backend.
# ---------------------------------------------------------------------------------------------
MASKS = [
    ("y[i] := x[i]*(x[i] > 2)", lambda x: x * (x > 2)),
    ("s := x[i]*(x[i] > 2)", lambda x: np.sum(x * (x > 2))),
    ("y[i] := (x[i] <= 2)*x[i] + 1", lambda x: (x <= 2) * x + 1),
    ("m[i] := x[i,j]*(w[j] > 0)", lambda x, w: (x * (w > 0)).sum(1)),  # a contraction (einsum on xla)
    ("y[i] := ifelse(x[i] > 2, x[i], 0)", lambda x: np.where(x > 2, x, 0)),  # the select: 0 at NaN everywhere
]


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("backend", ["numba", "xla"])
@pytest.mark.parametrize("spec, reference", MASKS, ids=[c[0] for c in MASKS])
def test_nan_times_a_false_comparison_is_nan_as_in_numpy(spec, reference, backend, dtype, jit):
    import jax

    x = np.array([nan, 1.0, 3.0, np.inf, -np.inf, 2.0], dtype)
    args = [x] if "w[" not in spec else [np.stack([x, x[::-1]]).T, np.array([1.0, -1.0], dtype)]
    kernel = tullax.einsum_kernel(spec, backend=backend)
    with np.errstate(invalid="ignore"):
        want = np.asarray(reference(*[a.astype(np.float64) for a in args]))
    got = np.asarray((jax.jit(kernel) if jit else kernel)(*args))
    np.testing.assert_array_equal(got.astype(np.float64), want, err_msg=spec)
    if "ifelse" not in spec and "w[" not in spec:
        assert np.isnan(got.flat[0]), "NaN*0 is NaN"
