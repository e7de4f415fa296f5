"""Forward semantics: every corpus spec through the naive evaluator (ground truth) and the XLA backend
(plain lowering, under jit, and as a NumPy host kernel), plus the shape checks and dtype rules."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from corpus import CORPUS, Case

from tullax.backends.base import Signature
from tullax.backends.xla.backend import XlaBackend
from tullax.backends.xla.lower import (
    is_contraction,
    lower,
    result_dtype,
)
from tullax.errors import ShapeError
from tullax.spec.analyze import analyze
from tullax.spec.examples import random_inputs
from tullax.spec.parse import parse_spec
from tullax.spec.shapes import check_index_values, check_shapes, eval_shapes
from tullax.spec.text import format_spec
from tullax.testing.oracle import naive_eval

RTOL, ATOL = 1e-10, 1e-12


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def compile_case(case: Case, seed: int = 0):
    spec = analyze(parse_spec(case.spec), case.ranges)
    env = random_inputs(spec, case.shapes, seed=seed)
    return spec, env


def assert_matches(got, expected) -> None:
    got = np.asarray(got)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.id)
def test_corpus_lowering_matches_naive(case: Case):
    spec, env = compile_case(case, seed=0)
    assert_matches(lower(spec)(env), naive_eval(spec, env))


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.id)
def test_corpus_jit_and_host_kernel_match_naive(case: Case):
    spec, env = compile_case(case, seed=1)
    expected = naive_eval(spec, env)
    assert_matches(jax.jit(lower(spec))(env), expected)

    inputs = [env[name] for name in spec.input_names]
    out_dtype = result_dtype(spec, {n: np.asarray(v).dtype for n, v in env.items()})
    signature = Signature(tuple(np.asarray(v).dtype.name for v in inputs), out_dtype.name)
    kernel = XlaBackend().build(spec, signature)
    if spec.assign == ":=":
        out = np.full(expected.shape, np.nan, out_dtype)
    else:
        out = np.asarray(env[spec.out], out_dtype).copy()
    kernel(out, *inputs)
    assert_matches(out, expected)


def test_corpus_covers_both_lowering_paths():
    specs = [analyze(parse_spec(c.spec), c.ranges) for c in CORPUS]
    assert sum(map(is_contraction, specs)) >= 8
    assert sum(not is_contraction(s) for s in specs) >= 40
    assert len(CORPUS) >= 45


@pytest.mark.parametrize("text", ["C[i,j] := A[i,k]*B[k,j]", "s := x[i]*x[i]", "C[b,i,j] := A[b,i,k]*B[b,k,j]",
                                  "T[j,i] := A[i,j]"])
def test_einsum_and_broadcast_paths_agree(text):
    spec = analyze(parse_spec(text))
    env = random_inputs(spec, seed=3)
    assert is_contraction(spec)
    np.testing.assert_allclose(lower(spec)(env), lower(spec, einsum=False)(env), rtol=RTOL)


def test_einsum_path_respects_explicit_reduced_range():
    spec = analyze(parse_spec("C[i,j] := A[i,k]*B[k,j]"), {"k": (1, 3)})
    env = random_inputs(spec, {"A": (2, 4), "B": (4, 3)}, seed=0)
    expected = env["A"][:, 1:3] @ env["B"][1:3, :]
    np.testing.assert_allclose(lower(spec)(env), expected, rtol=RTOL)
    assert_matches(lower(spec)(env), naive_eval(spec, env))


def _logsumexp(x, axis):
    top = np.max(x, axis=axis, keepdims=True)
    return np.squeeze(top, axis) + np.log(np.sum(np.exp(x - top), axis=axis))


# Independent NumPy spellings of corpus cases: they check the naive evaluator itself.
NUMPY_REFERENCE = {
    "matmul": lambda e: e["A"] @ e["B"],
    "batched_matmul": lambda e: np.matmul(e["A"], e["B"]),
    "dist": lambda e: ((e["W"][:, :, None] - e["X"][:, None, :]) ** 2).sum(0),
    "conv1d": lambda e: np.correlate(e["x"], e["w"], mode="valid"),
    "strided": lambda e: e["x"][0:6:2] + e["x"][1:7:2],
    "embedding": lambda e: e["W"][e["ix"]],
    "row_max": lambda e: e["x"].max(1),
    "row_min": lambda e: e["x"].min(1),
    "row_logsumexp": lambda e: _logsumexp(e["x"], 1),
    "scalar_params": lambda e: e["a"] * e["x"] + e["b"],
    "row_norm": lambda e: np.linalg.norm(e["x"], axis=1),
    "diagonal": lambda e: np.diag(e["A"]),
    "trace": lambda e: np.trace(e["A"]),
    "products": lambda e: e["x"].prod(1),
    "conv_reversed": lambda e: np.convolve(e["x"], e["w"], mode="valid"),
    "full_conv": lambda e: np.convolve(e["x"], e["w"], mode="full"),
    "conv2d_nchw": lambda e: np.einsum("bkipjq,ckpq->bcij", np.lib.stride_tricks.sliding_window_view(
        e["x"], e["w"].shape[2:], axis=(2, 3)).transpose(0, 1, 2, 4, 3, 5), e["w"]),
    "reverse": lambda e: e["x"][::-1] * e["y"],
    "laplace": lambda e: e["x"][1:, :-1] + e["x"][:-1, 1:] - 2 * e["x"][:-1, :-1],
    "mod_shift": lambda e: np.roll(e["x"], -1) - e["x"],
    "circular_conv": lambda e: np.array([sum(e["x"][(i - k) % 5] * e["w"][k] for k in range(3)) for i in range(5)]),
    "upsample_pad_div": lambda e: np.repeat(e["z"], 2),
    "scatter_indirect": lambda e: e["h"] + np.bincount(e["ix"], e["v"], minlength=3),
    "accumulate_matmul": lambda e: e["C"] + e["A"] @ e["B"],
    "softplus_sum": lambda e: np.logaddexp(e["x"], 0).sum(1),
    "maxpool": lambda e: np.maximum(e["x"][0::2], e["x"][1::2]),
}


@pytest.mark.parametrize("case_id", sorted(NUMPY_REFERENCE))
def test_naive_evaluator_against_numpy(case_id):
    case = next(c for c in CORPUS if c.id == case_id)
    spec, env = compile_case(case, seed=5)
    np.testing.assert_allclose(naive_eval(spec, env), NUMPY_REFERENCE[case_id](env), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Semantics the corpus does not pin down by itself
# ---------------------------------------------------------------------------------------------
def test_conv1d_against_numpy():
    spec = analyze(parse_spec("y[i] := x[i+k]*w[k]"))
    x, w = np.arange(6.0), np.array([1.0, -2.0, 0.5])
    expected = np.correlate(x, w, mode="valid")
    np.testing.assert_allclose(lower(spec)({"x": x, "w": w}), expected, rtol=RTOL)
    np.testing.assert_allclose(naive_eval(spec, {"x": x, "w": w}), expected, rtol=RTOL)


def test_full_convolution_with_pad_against_numpy():
    spec = analyze(parse_spec("y[i] := x[pad(i-k)]*w[k]"), {"i": 7})
    x, w = np.arange(1.0, 6.0), np.array([1.0, -2.0, 0.5])
    np.testing.assert_allclose(lower(spec)({"x": x, "w": w}), np.convolve(x, w, mode="full"), rtol=RTOL)


def test_mod_wraps_like_python_and_clamp_clamps():
    x = np.arange(5.0)
    spec = analyze(parse_spec("y[i] := x[mod(i-2)] + 10*x[clamp(i+3)] + 0*x[i]"))
    expected = np.array([x[(i - 2) % 5] + 10 * x[min(i + 3, 4)] for i in range(5)])
    np.testing.assert_allclose(lower(spec)({"x": x}), expected)
    np.testing.assert_allclose(naive_eval(spec, {"x": x}), expected)


def test_reductions_over_empty_ranges_give_the_identity():
    x = np.ones((3, 4))
    for redop, identity in [("+", 0.0), ("*", 1.0), ("max", -np.inf), ("min", np.inf), ("logsumexp", -np.inf)]:
        spec = analyze(parse_spec(f"({redop}) m[i] := x[i,j]"), {"j": (2, 2)})
        np.testing.assert_array_equal(lower(spec)({"x": x}), np.full(3, identity))
        np.testing.assert_array_equal(naive_eval(spec, {"x": x}), np.full(3, identity))


def test_logsumexp_is_stable():
    spec = analyze(parse_spec("(logsumexp) l[i] := x[i,j]"))
    x = np.array([[1000.0, 1000.0], [-1000.0, -1000.0]])
    expected = np.array([1000 + np.log(2), -1000 + np.log(2)])
    np.testing.assert_allclose(lower(spec)({"x": x}), expected, rtol=1e-14)
    np.testing.assert_allclose(naive_eval(spec, {"x": x}), expected, rtol=1e-14)


def test_integer_power_of_negative_base_is_exact():
    spec = analyze(parse_spec("y[i] := x[i]^3 + x[i]^-1"))
    x = np.array([-2.0, -0.5, 3.0])
    np.testing.assert_array_equal(lower(spec)({"x": x}), x**3 + 1 / x)


def test_comparisons_give_zero_or_one():
    spec = analyze(parse_spec("y[i] := (x[i] > 0) + 10*(x[i] == 1)"))
    out = lower(spec)({"x": np.array([-1.0, 1.0, 2.0])})
    np.testing.assert_array_equal(out, [0.0, 11.0, 1.0])


def test_free_index_shifted_to_zero_in_output():
    # i runs from 1 as written: y[0] belongs to i = 1 (an inferred start other than 0 is refused, issue 44)
    spec = analyze(parse_spec("y[i] := x[i-1]*z[i]  (i in 1:size(z,0))"))
    x, z = np.arange(4.0), np.arange(10.0, 14.0)
    np.testing.assert_allclose(lower(spec)({"x": x, "z": z}), x[:3] * z[1:])


def test_index_value_keeps_the_unshifted_value():
    spec = analyze(parse_spec("y[i] := i*x[i-1]  (i in 1:size(x,0)+1)"))  # y[0] is i = 1: its VALUE is 1
    np.testing.assert_allclose(lower(spec)({"x": np.ones(4)}), [1.0, 2.0, 3.0, 4.0])
    np.testing.assert_allclose(naive_eval(spec, {"x": np.ones(4)}), [1.0, 2.0, 3.0, 4.0])


def test_assign_writes_only_the_range_and_keeps_the_rest():
    spec = analyze(parse_spec("y[i] = x[i+1]"))  # i narrowed to 0..len(x)-2: y's last element stays
    y, x = np.full(4, 7.0), np.arange(4.0)
    np.testing.assert_allclose(lower(spec)({"y": y, "x": x}), [1.0, 2.0, 3.0, 7.0])
    np.testing.assert_allclose(naive_eval(spec, {"y": y, "x": x}), [1.0, 2.0, 3.0, 7.0])


def test_scatter_accumulates_repeated_positions():
    spec = analyze(parse_spec("h[ix[b]] += v[b]"))
    env = {"h": np.zeros(3), "ix": np.array([0, 2, 0, 0], np.int32), "v": np.array([1.0, 2.0, 3.0, 4.0])}
    np.testing.assert_allclose(lower(spec)(env), [8.0, 0.0, 2.0])
    np.testing.assert_allclose(naive_eval(spec, env), [8.0, 0.0, 2.0])


def test_scatter_through_pad_drops_positions_outside():
    spec = analyze(parse_spec("y[pad(i+2)] += x[i]"))
    env = {"y": np.zeros(3), "x": np.array([1.0, 2.0, 3.0])}
    np.testing.assert_allclose(lower(spec)(env), [0.0, 0.0, 1.0])
    np.testing.assert_allclose(naive_eval(spec, env), [0.0, 0.0, 1.0])


def test_indirect_out_of_range_under_jit_reads_nan_and_scatter_drops():
    gather = analyze(parse_spec("out[b,d] := W[ix[b],d]"))
    env = {"W": np.ones((3, 2)), "ix": np.array([0, 5, -1], np.int32)}
    out = np.asarray(jax.jit(lower(gather))(env))
    np.testing.assert_array_equal(out[0], [1.0, 1.0])
    assert np.isnan(out[1:]).all()
    scatter = analyze(parse_spec("h[ix[b]] += v[b]"))
    env = {"h": np.zeros(3), "ix": np.array([1, 3, -1], np.int32), "v": np.array([1.0, 2.0, 4.0])}
    np.testing.assert_array_equal(jax.jit(lower(scatter))(env), [0.0, 1.0, 0.0])


def test_pad_of_an_index_array_reads_zero_outside_the_axis():
    """``pad(ix[e])`` (how a scatter's gradient reads the cotangent, issue 15): 0 where ix[e] is outside the axis,
    on the naive evaluator, the XLA lowering (eager and jit) and the Numba backend; the text round-trips and an
    eager call accepts any position."""
    import tullax

    spec = analyze(parse_spec("out[b,d] := W[pad(ix[b]),d]"))
    assert format_spec(spec) == "out[b,d] := W[pad(ix[b]),d]"
    assert format_spec(parse_spec(format_spec(spec))) == format_spec(spec)
    env = {"W": np.arange(6.0).reshape(3, 2), "ix": np.array([2, 3, -1, 0, -(2**40)], np.int64)}
    want = [[4.0, 5.0], [0.0, 0.0], [0.0, 0.0], [0.0, 1.0], [0.0, 0.0]]
    np.testing.assert_array_equal(naive_eval(spec, env), want)
    np.testing.assert_array_equal(lower(spec)(env), want)
    np.testing.assert_array_equal(jax.jit(lower(spec))(env), want)
    for backend in ("numba", "xla"):
        np.testing.assert_array_equal(tullax.Kernel("out[b,d] := W[pad(ix[b]),d]", backend=backend)(
            env["W"], env["ix"]), want)
    with pytest.raises(ShapeError, match="must hold integers"):
        check_index_values(spec, {"W": env["W"], "ix": np.zeros(2)})


def test_indirect_out_of_range_in_eager_calls_is_a_shape_error():
    spec = analyze(parse_spec("out[b,d] := W[ix[b],d]"))
    env = {"W": np.ones((3, 2)), "ix": np.array([0, 3], np.int32)}
    with pytest.raises(ShapeError, match=r"ix\[1\] = 3 is outside axis 0 of W"):
        naive_eval(spec, env)
    kernel = XlaBackend().build(spec, Signature(("float64", "int32"), "float64"))
    with pytest.raises(ShapeError, match=r"ix\[1\] = 3 is outside axis 0 of W"):
        kernel(np.zeros((2, 2)), env["W"], env["ix"])


def test_complex_inputs():
    spec = analyze(parse_spec("y[i] := conj(x[i,j])*x[i,j] + real(z[i]) - imag(z[i])"))
    env = random_inputs(spec, seed=0, dtype=np.complex128)
    expected = naive_eval(spec, env)
    assert expected.dtype == np.complex128
    assert_matches(lower(spec)(env), expected)


def test_integer_data_arrays_are_read_as_floats():
    spec = analyze(parse_spec("y[i] := n[i]/2 + x[i]"))
    env = {"n": np.array([1, 2, 3], np.int32), "x": np.zeros(3, np.float32)}
    out = lower(spec)(env)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, [0.5, 1.0, 1.5])


# ---------------------------------------------------------------------------------------------
# Differentiability of the oracle
# ---------------------------------------------------------------------------------------------
SMOOTH = [c for c in CORPUS if c.id in {
    "matmul", "dist", "conv1d", "strided", "embedding", "row_logsumexp", "scalar_params", "row_norm", "trace",
    "full_conv", "upsample_pad_div", "circular_conv", "scatter_embedding_grad", "assign_self", "exp_log",
    "powers", "conv2d_nchw", "laplace", "products", "sigmoid", "index_values"}]


@pytest.mark.parametrize("case", SMOOTH, ids=lambda c: c.id)
def test_lowering_gradients_match_finite_differences(case: Case):
    from jax.test_util import check_grads

    spec, env = compile_case(case, seed=4)
    wrt = [i.name for i in spec.inputs if i.kind in ("array", "scalar")]
    rest = {k: v for k, v in env.items() if k not in wrt}

    def scalar_loss(*values):
        out = lower(spec)({**rest, **dict(zip(wrt, values))})
        return jnp.sum(jnp.sin(out))

    # jitted: one compile per case instead of one per small op for each of check_grads' evaluations
    check_grads(jax.jit(scalar_loss), tuple(jnp.asarray(env[n]) for n in wrt), order=1, modes=["rev"],
                atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# dtypes and shapes
# ---------------------------------------------------------------------------------------------
def test_result_dtype_rules():
    spec = analyze(parse_spec("y[b] := a*W[ix[b]]*n[b]"))
    f32, f64, i64 = np.dtype("float32"), np.dtype("float64"), np.dtype("int64")
    assert result_dtype(spec, {"a": float, "W": f32, "ix": i64, "n": f32}) == f32  # weak scalar, index out
    assert result_dtype(spec, {"a": f32, "W": f64, "ix": i64, "n": f32}) == f64
    assert result_dtype(spec, {"a": float, "W": f32, "ix": i64, "n": i64}) == f32  # integer data joins
    assert spec.input_names == ("a", "W", "ix", "n")
    assert result_dtype(spec, [f32, f32, i64, np.dtype("complex64")]) == np.dtype("complex64")
    only_ints = analyze(parse_spec("y[i] := n[i]"))  # integer-valued: integers stay integers (issue 13)
    assert result_dtype(only_ints, {"n": np.dtype("int32")}) == np.dtype("int32")
    halved = analyze(parse_spec("y[i] := n[i]/2"))  # not integer-valued: the default float
    assert result_dtype(halved, {"n": np.dtype("int32")}) == np.dtype(jnp.zeros(()).dtype)


def test_lowering_keeps_float32():
    with jax.enable_x64(False):
        spec = analyze(parse_spec("D[i,j] := (W[k,i] - X[k,j])^2"))
        env = random_inputs(spec, seed=0, dtype=np.float32)
        out = lower(spec)({k: jnp.asarray(v) for k, v in env.items()})
        assert out.dtype == jnp.float32
        np.testing.assert_allclose(out, naive_eval(spec, env), rtol=1e-5)


def test_eval_shapes_evaluates_symbolic_ranges():
    spec = analyze(parse_spec("y[i] := x[i+k]*w[k]"))
    assert eval_shapes(spec, {"x": (10,), "w": (3,)}) == {"i": (0, 8), "k": (0, 3)}


@pytest.mark.parametrize("text, shapes, message", [
    ("C[i,j] := A[i,k]*B[k,j]", {"A": (2, 3), "B": (4, 5)},
     r"index k runs along axis 1 of A \(extent 3\) and axis 0 of B \(extent 4\)"),
    ("C[i,j] := A[i,k]*B[k,j]", {"A": (2, 3, 1), "B": (3, 5)}, r"A has rank 3 .* indexes it with 2 indices"),
    ("y[i] := x[i+k]*w[k]", {"x": (2,), "w": (5,)}, r"index i has an empty range"),
    ("y[i] := a*x[i]", {"a": (2,), "x": (3,)}, r"a is a scalar parameter"),
    ("y[i] := x[i]", {}, r"missing input x"),
])
def test_check_shapes_errors(text, shapes, message):
    spec = analyze(parse_spec(text))
    with pytest.raises(ShapeError, match=message):
        check_shapes(spec, shapes)
    if shapes:
        env = {name: np.ones(shape) for name, shape in shapes.items()}
        with pytest.raises(ShapeError, match=message):
            lower(spec)(env)


def test_explicit_range_pushing_an_access_out_of_bounds_is_a_shape_error():
    spec = analyze(parse_spec("y[i] := x[i+1]"), {"i": 5})
    with pytest.raises(ShapeError, match=r"axis 0 of x is indexed by i\+1, which reaches 5 .*extent 5"):
        check_shapes(spec, {"x": (5,)})
    check_shapes(spec, {"x": (6,)})


def test_zero_size_inputs_give_zero_size_results():
    spec = analyze(parse_spec("C[i,j] := A[i,k]*B[k,j]"))
    env = {"A": np.ones((0, 3)), "B": np.ones((3, 2))}
    assert np.asarray(lower(spec)(env)).shape == (0, 2)
    assert naive_eval(spec, env).shape == (0, 2)


def test_generate_source_is_the_jaxpr_of_the_lowering():
    spec = analyze(parse_spec("C[i,j] := A[i,k]*B[k,j]"))
    text = XlaBackend().generate_source(spec, Signature(("float32", "float32"), "float32"),
                                        shapes={"A": (2, 3), "B": (3, 4)})
    assert "A: (2, 3)" in text and "dot_general" in text and "f32[2,4]" in text
    assert XlaBackend().availability() == (True, "")
