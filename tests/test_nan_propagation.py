"""NaN propagates through max and min on every backend, as in jnp, NumPy and Julia (issue 13).

The cases put NaNs where each printed form can lose them: in a vectorised lane and in the remainder loop of a
max/min reduction, in every row, in a scalar (prange) reduction, in a tiled reduction and in the max()/min()
functions. The reference is NumPy (np.max / np.maximum propagate NaN)."""
from __future__ import annotations

import os

import numpy as np
import pytest
from loop_backends import every_backend, skip_unavailable
from special_rows import ROW_REDUCTIONS, assert_zero_contract, every_position, signed_zero_rows
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
    # relu is max(x, 0), NaN-propagating, as jax.nn.relu (issue 44: it was a select that gave 0 at NaN)
    ("y[i,j] := relu(x[i,j])", lambda x: np.maximum(x, 0)),
    ("m[i] := x[i,j] |> relu", lambda x: np.maximum(x.sum(1), 0)),
    ("(max) m[i] := x[i,j] |> relu(_)", lambda x: np.maximum(x.max(1), 0)),
]


def _tiers() -> str:
    """The c tiers these tests run: the optimised build alone ("off"), unless the run names its own
    (test_c_tiers runs this file on the fast tier alone, "only")."""
    return os.environ.get("TULLAX_C_TIERS") or "off"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("backend", every_backend())
@pytest.mark.parametrize("spec, reference", CASES, ids=[c[0] for c in CASES])
def test_nan_propagates(spec, reference, backend, dtype, monkeypatch):
    skip_unavailable(backend)
    monkeypatch.setenv("TULLAX_C_TIERS", _tiers())  # c: the optimised build (its vector lanes), not the fast tier's
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


# lanes: blocks of 16 float32 (8 float64), then a vector of 8 (4), then the rest: every count of each around them
LENGTHS = (*range(1, 10), 12, 15, 16, 17, 23, 24, 25, 31, 32, 33)


def _row_lengths(backend: str) -> tuple[int, ...]:
    return LENGTHS if backend != "xla" else (1, 9, 33)  # xla: no lanes of ours, and a trace per shape


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("backend", every_backend())
@pytest.mark.parametrize("spec, reference, filler", ROW_REDUCTIONS, ids=[c[0] for c in ROW_REDUCTIONS])
def test_a_row_max_or_min_keeps_nan_and_infinities_at_every_position_of_every_length(spec, reference, filler,
                                                                                     backend, dtype, monkeypatch):
    skip_unavailable(backend)
    monkeypatch.setenv("TULLAX_C_TIERS", _tiers())  # the optimised build's vector lanes, not the fast tier's loop
    kernel = tullax.einsum_kernel(spec, backend=backend)
    for length in _row_lengths(backend):
        x = every_position(length)
        np.testing.assert_array_equal(np.asarray(kernel(x.astype(dtype))), reference(x).astype(dtype),
                                      err_msg=f"{spec} on {backend}, rows of {length}")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("backend", every_backend())
@pytest.mark.parametrize("spec, reference, filler", ROW_REDUCTIONS, ids=[c[0] for c in ROW_REDUCTIONS])
def test_the_zero_a_row_max_or_min_returns_is_the_documented_one(spec, reference, filler, backend, dtype,
                                                                 monkeypatch):
    """docs/language.md: a max/min whose result is a zero is -0.0 where the row's zeros are all -0.0, +0.0 where
    they are all +0.0, and a zero of either sign where both occur (the lanes and the plain loop meet them in
    different orders)."""
    skip_unavailable(backend)
    monkeypatch.setenv("TULLAX_C_TIERS", _tiers())
    kernel = tullax.einsum_kernel(spec, backend=backend)
    for length in _row_lengths(backend):
        x = signed_zero_rows(length, filler)
        assert_zero_contract(kernel(x.astype(dtype)), x, f"{spec} on {backend} {dtype}, rows of {length}")


@pytest.mark.parametrize("spec, reference, filler", ROW_REDUCTIONS, ids=[c[0] for c in ROW_REDUCTIONS])
def test_a_row_max_or_min_keeps_nan_and_infinities_at_every_position_in_the_printed_julia(spec, reference, filler):
    step = compile_spec(spec)[1]
    for length in LENGTHS[:10]:
        x = every_position(length)
        np.testing.assert_array_equal(run_julia(step, {"x": x}), reference(x), err_msg=f"{spec}, rows of {length}")
        zeros = signed_zero_rows(length, filler)
        assert_zero_contract(run_julia(step, {"x": zeros}), zeros, f"{spec} in the printed Julia, rows of {length}")


# ---------------------------------------------------------------------------------------------
# A comparison is a 0/1 number: NaN * 0 is NaN (IEEE, as NumPy), on every backend, eagerly and under jit. jnp's
# own `x*(x > 2)` gives 0 there (it multiplies by a bool as a select; XLA rewrites a multiply by a converted
# comparison into a select, which is what the xla backend did before): the select is `ifelse`, 0 on every backend.
# ---------------------------------------------------------------------------------------------
MASKS = [
    ("y[i] := x[i]*(x[i] > 2)", lambda x: x * (x > 2)),
    ("y[i] := x[i]*0", lambda x: x * 0),  # the c backend's -fno-signed-zeros folded it to 0 (issue 44)
    ("y[i] := 0*x[i] + x[i]*0", lambda x: 0 * x + x * 0),
    ("s := x[i]*(x[i] > 2)", lambda x: np.sum(x * (x > 2))),
    ("y[i] := (x[i] <= 2)*x[i] + 1", lambda x: (x <= 2) * x + 1),
    ("m[i] := x[i,j]*(w[j] > 0)", lambda x, w: (x * (w > 0)).sum(1)),  # a contraction (einsum on xla)
    ("y[i] := ifelse(x[i] > 2, x[i], 0)", lambda x: np.where(x > 2, x, 0)),  # the select: 0 at NaN everywhere
]


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("backend", every_backend())
@pytest.mark.parametrize("spec, reference", MASKS, ids=[c[0] for c in MASKS])
def test_nan_times_a_false_comparison_is_nan_as_in_numpy(spec, reference, backend, dtype, jit):
    import jax

    skip_unavailable(backend)
    x = np.array([nan, 1.0, 3.0, np.inf, -np.inf, 2.0], dtype)
    args = [x] if "w[" not in spec else [np.stack([x, x[::-1]]).T, np.array([1.0, -1.0], dtype)]
    kernel = tullax.einsum_kernel(spec, backend=backend)
    with np.errstate(invalid="ignore"):
        want = np.asarray(reference(*[a.astype(np.float64) for a in args]))
    got = np.asarray((jax.jit(kernel) if jit else kernel)(*args))
    np.testing.assert_array_equal(got.astype(np.float64), want, err_msg=spec)
    if "ifelse" not in spec and "w[" not in spec:
        assert np.isnan(got.flat[0]), "NaN*0 is NaN"


@pytest.mark.parametrize("spec, axes", [("(max) m[i] := x[i,j]", 1), ("(min) m[j] := x[i,j]", 0),
                                        ("(max) m := x[i,j]", (0, 1))])
def test_the_xla_lowerings_max_and_min_differentiate_and_vmap_as_jnps(spec, axes):
    """The xla lowering reduces max/min with its NaN flags in one variadic reduction (``_nan_propagating``),
    whose derivative is its own rule: jax.grad, jax.jvp and jax.vmap of the lowering match `jnp.max`/`jnp.min`
    where there is no NaN (ties share the tangent, as jax's rule does) and give NaN where one was reduced."""
    import jax
    import jax.numpy as jnp

    from tullax.backends.xla.lower import lower

    _, forward = compile_spec(spec)
    lowered = lower(forward)
    mine = lambda x: lowered({"x": x})  # noqa: E731
    theirs = lambda x: (jnp.max if "(max)" in spec else jnp.min)(x, axis=axes)  # noqa: E731
    x = np.random.default_rng(3).standard_normal((5, 7)).astype(np.float32)
    x[2, 4] = x[2, 1] = x[2].max() + 1  # a tie in row 2 (and column 1 of the min's)
    x[3, 5] = x[0, 5] = x[:, 5].min() - 1
    cotangent = np.random.default_rng(4).standard_normal(np.shape(theirs(x))).astype(np.float32)
    for f in (jax.jit, lambda g: g):
        got = f(jax.grad(lambda v: jnp.sum(mine(v) * cotangent)))(x)
        want = jax.grad(lambda v: jnp.sum(theirs(v) * cotangent))(x)
        np.testing.assert_allclose(got, want, rtol=1e-6)
    tangent = np.random.default_rng(5).standard_normal(x.shape).astype(np.float32)
    np.testing.assert_allclose(jax.jvp(mine, (x,), (tangent,))[1], jax.jvp(theirs, (x,), (tangent,))[1],
                               rtol=1e-6)
    batch = np.stack([x, -x, 2 * x])
    np.testing.assert_array_equal(jax.vmap(mine)(batch), np.stack([theirs(b) for b in batch]))
    x[1, 1] = nan
    assert np.isnan(np.asarray(mine(x))).any()
    assert np.isnan(np.asarray(jax.jvp(mine, (x,), (tangent,))[1])).any()


# ---------------------------------------------------------------------------------------------
# relu, max(_, 0) and jax.nn.relu agree on every backend, and no float arithmetic raises (issue 44: relu(NaN)
# was 0 on c and numba; a float division by zero was Numba's ZeroDivisionError, or an INTERNAL error under jit)
# ---------------------------------------------------------------------------------------------
IEEE_INPUTS = np.array([nan, np.inf, -np.inf, 0.0, -0.0, 2.5, -1.5, 3.0])


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("backend", every_backend())
def test_relu_max_and_jax_nn_relu_agree(backend, jit):
    import jax

    skip_unavailable(backend)
    x = IEEE_INPUTS.astype(np.float32)
    want = np.asarray(jax.nn.relu(x))
    rows = np.stack([x, x[::-1]])
    for spec, args, reference in [("y[i] := relu(x[i])", x, want), ("y[i] := max(x[i], 0)", x, want),
                                  ("y[i] := x[i] |> relu", x, want),
                                  ("m[i] := x[i,j] |> relu", rows, np.asarray(jax.nn.relu(rows.sum(1))))]:
        kernel = tullax.einsum_kernel(spec, backend=backend)
        got = np.asarray((jax.jit(kernel) if jit else kernel)(args))
        np.testing.assert_array_equal(got, reference, err_msg=f"{spec} on {backend}")


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("backend", every_backend())
def test_a_float_division_by_zero_is_inf_or_nan_never_an_exception(backend, jit):
    import jax

    skip_unavailable(backend)
    x = IEEE_INPUTS.astype(np.float32)
    with np.errstate(all="ignore"):
        cases = [("y[i] := x[i]/x[i]", x / x), ("y[i] := 1/x[i]", 1 / x), ("y[i] := x[i]^(-1)", x ** -1.0),
                 ("y[i] := x[i]^(-2)", 1 / (x * x)), ("y[i] := x[i]/0", x / np.float32(0))]
    for spec, want in cases:
        kernel = tullax.einsum_kernel(spec, backend=backend)
        got = np.asarray((jax.jit(kernel) if jit else kernel)(x))
        np.testing.assert_array_equal(got, want, err_msg=f"{spec} on {backend}")


@pytest.mark.parametrize("backend", every_backend())
def test_integer_division_by_zero_is_a_float_inf_or_nan_as_jnps_true_divide(backend):
    """The spec language divides integers with ``/`` only, into floats (``//`` and ``%`` do not parse; ``mod``
    wraps an index and refuses an empty axis): an integer division by zero is inf or NaN as ``jnp.true_divide``
    gives, never a crash of the process (C's integer division by zero is SIGFPE) nor an exception."""
    import jax.numpy as jnp

    skip_unavailable(backend)
    x = np.array([7, -7, 0, 5, -2147483648], np.int32)
    d = np.array([0, 0, 0, 2, -1], np.int32)
    got = np.asarray(tullax.einsum_kernel("y[i] := x[i]/d[i]", backend=backend)(x, d))
    np.testing.assert_array_equal(got, np.asarray(jnp.true_divide(x, d)))
