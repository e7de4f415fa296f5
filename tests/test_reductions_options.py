"""``(&)``/``(|)`` reductions, ``init=`` and ``nograd=`` (tullax.api.options), on the numba and xla backends,
eager and under jit, against NumPy / jnp written by hand, gradients against jax.grad of the jnp reference."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tullax
from tullax.errors import SpecError

BACKENDS = ("numba", "xla")
RTOL = 1e-12


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape)


def modes(kernel):
    """The kernel called eagerly on NumPy and jitted on jax arrays: (label, function of NumPy inputs)."""
    return [("eager", lambda *a: kernel(*a)),
            ("jit", lambda *a: jax.jit(kernel)(*map(jnp.asarray, a)))]


# ---------------------------------------------------------------------------------------------
# (&) and (|)
# ---------------------------------------------------------------------------------------------
def with_nans() -> np.ndarray:
    x = data(5, 4)
    x[1, 2] = np.nan
    x[3] = [0.5, 0.7, 0.9, 1.1]
    return x


BOOLEAN_CASES = [
    ("(&) r[i] := x[i,j] > -1", lambda x: jnp.all(x > -1, axis=1)),
    ("(|) r[i] := x[i,j] > 1", lambda x: jnp.any(x > 1, axis=1)),
    ("(&) r[j] := x[i,j] != 0.7", lambda x: jnp.all(x != 0.7, axis=0)),
    ("(|) r := x[i,j] >= 1.1", lambda x: jnp.any(x >= 1.1)),
    ("(&) r := x[i,j] < 3", lambda x: jnp.all(x < 3)),
    # a body that is not a comparison: nonzero (NaN included) is true, as jnp.all/any say
    ("(&) r[i] := x[i,j] - 0.5", lambda x: jnp.all(x - 0.5, axis=1)),
    ("(|) r[i] := ifelse(x[i,j] > 2, x[i,j], 0)", lambda x: jnp.any(jnp.where(x > 2, x, 0), axis=1)),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("text, reference", BOOLEAN_CASES, ids=[c[0] for c in BOOLEAN_CASES])
def test_boolean_reductions_are_jnp_all_and_any(text, reference, backend):
    x = with_nans()
    want = reference(jnp.asarray(x))
    for label, run in modes(tullax.einsum_kernel(text, backend=backend)):
        got = run(x)
        assert got.dtype == want.dtype == np.bool_, (label, got.dtype)
        assert got.shape == want.shape, label
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=f"{label}: {text}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_boolean_reductions_over_nothing_are_true_for_all_and_false_for_any(backend):
    empty = np.zeros((3, 0))
    for redop, want in (("&", True), ("|", False)):
        kernel = tullax.einsum_kernel(f"({redop}) r[i] := x[i,j] > 0", backend=backend)
        for label, run in modes(kernel):
            np.testing.assert_array_equal(run(empty), np.full(3, want), err_msg=f"{label} ({redop})")
            assert run(empty).dtype == np.bool_


@pytest.mark.parametrize("backend", BACKENDS)
def test_boolean_init_joins_the_reduction(backend):
    x = data(4, 3)
    all_kernel = tullax.einsum_kernel("(&) r[i] := x[i,j] > -5", backend=backend, init=False)
    any_kernel = tullax.einsum_kernel("(|) r[i] := x[i,j] > 5", backend=backend, init=True)
    for (label, run_all), (_, run_any) in zip(modes(all_kernel), modes(any_kernel)):
        np.testing.assert_array_equal(run_all(x), np.zeros(4, bool), err_msg=label)
        np.testing.assert_array_equal(run_any(x), np.ones(4, bool), err_msg=label)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_flow_around_a_boolean_result(backend):
    """A bool result has no gradient; using it as a mask leaves the rest differentiable, as with jnp.all."""
    mask = tullax.einsum_kernel("(&) r[i] := x[i,j] > -1", backend=backend)
    assert mask.grad_specs == ()
    x = jnp.asarray(data(5, 4))

    def loss(all_above):
        return lambda v: jnp.sum(jnp.where(all_above(v)[:, None], v ** 2, v))

    want = jax.grad(loss(lambda v: jnp.all(v > -1, axis=1)))(x)
    np.testing.assert_allclose(jax.grad(loss(mask))(x), want, rtol=RTOL)
    np.testing.assert_allclose(jax.jit(jax.grad(loss(mask)))(x), want, rtol=RTOL)


def test_boolean_reductions_refuse_finalisers_and_updates():
    with pytest.raises(SpecError, match=r"\(&\) reduction gives true/false: it takes no finaliser"):
        tullax.einsum_kernel("(&) r[i] := x[i,j] > 0 |> exp")
    with pytest.raises(SpecError, match=r"\(\|\) reduction gives true/false.*no '\+='"):
        tullax.einsum_kernel("(|) r[i] += x[i,j] > 0")
    with pytest.raises(SpecError, match="unknown reduction '\\^': use one of .* & \\|"):
        tullax.einsum_kernel("(^) r[i] := x[i,j]")


def test_explain_says_what_a_boolean_reduction_runs_as():
    text = tullax.explain("(|) r[i] := x[i,j] > 0")
    assert "reduction: | (any), run as max of the body as 0/1; the result is bool" in text
    assert "(a bool result)" in text


# ---------------------------------------------------------------------------------------------
# init=
# ---------------------------------------------------------------------------------------------
def _logsumexp(v, axis):
    return jax.nn.logsumexp(v, axis=axis)


INIT_CASES = [
    ("r[i] := x[i,j]", 2.5, lambda x, v: 2.5 + jnp.sum(x, axis=1)),
    ("(*) r[i] := x[i,j]", -2.0, lambda x, v: -2.0 * jnp.prod(x, axis=1)),
    ("(max) r[i] := x[i,j]", 0.0, lambda x, v: jnp.maximum(jnp.max(x, axis=1), 0.0)),
    ("(min) r[j] := x[i,j]", 0.1, lambda x, v: jnp.minimum(jnp.min(x, axis=0), 0.1)),
    ("(logsumexp) r[i] := x[i,j]", 1.0, lambda x, v: jnp.logaddexp(_logsumexp(x, 1), 1.0)),
    ("(max) r := x[i,j]*w[j]", 10.0, lambda x, w: jnp.maximum(jnp.max(x * w), 10.0)),
    ("r := x[i,j]*w[j]", -1, lambda x, w: -1 + jnp.sum(x * w)),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("text, init, reference", INIT_CASES, ids=[c[0] for c in INIT_CASES])
def test_init_starts_the_reduction(text, init, reference, backend):
    x, w = data(5, 4), data(4, seed=1)
    kernel = tullax.einsum_kernel(text, backend=backend, init=init)
    args = (x, w)[:len(kernel.inputs)]
    want = reference(*map(jnp.asarray, (x, w)))
    for label, run in modes(kernel):
        got = run(*args)
        assert got.dtype == np.float64 and got.shape == want.shape, label
        np.testing.assert_allclose(got, want, rtol=RTOL, err_msg=f"{label}: {text} init={init}")

    if text.startswith("(*)"):  # (*) reductions have no gradient kernels yet (a SpecError says so)
        return
    cotangent = jnp.linspace(0.5, 1.5, want.size).reshape(want.shape)
    positions = tuple(range(len(args)))

    def loss(run):
        return lambda *values: jnp.sum(run(*values) * cotangent)

    got = jax.jit(jax.grad(loss(kernel), argnums=positions))(*map(jnp.asarray, args))
    expected = jax.jit(jax.grad(loss(lambda *v: reference(*v, *(w,)[len(v) - 1:])), argnums=positions))(
        *map(jnp.asarray, args))
    for name, g, e in zip(kernel.inputs, got, expected):
        np.testing.assert_allclose(g, e, rtol=RTOL, atol=1e-14, err_msg=f"gradient wrt {name}: {text} init={init}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_init_wins_an_empty_reduction_and_a_max_it_exceeds(backend):
    kernel = tullax.einsum_kernel("(max) m[i] := x[i,j]", backend=backend, init=0)
    for label, run in modes(kernel):
        np.testing.assert_array_equal(run(np.zeros((3, 0))), np.zeros(3), err_msg=label)
        np.testing.assert_array_equal(run(-np.ones((2, 4))), np.zeros(2), err_msg=label)
    # NaN still propagates through the start value, as jnp.maximum does
    assert np.isnan(kernel(np.array([[1.0, np.nan]]))[0])
    # the inputs of a max that init wins get no gradient
    grad = jax.grad(lambda v: jnp.sum(kernel(v)))(-jnp.ones((2, 4)))
    np.testing.assert_array_equal(grad, np.zeros((2, 4)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_init_reaches_only_the_diagonal_of_a_diagonal_write(backend):
    """Found by tests/test_property_options.py: ``D[i,i] := A[i,k]`` with init=1 put 1 off the diagonal, where
    the spec writes nothing (zeros). init is the start of each reduction the spec writes: on the diagonal only."""
    a = np.arange(6.0).reshape(3, 2)
    want = np.diag(1.0 + a.sum(1))
    kernel = tullax.einsum_kernel("D[i,i] := A[i,k]", backend=backend, init=1.0)
    for label, run in modes(kernel):
        np.testing.assert_array_equal(np.asarray(run(a)), want, err_msg=label)
    grad = jax.grad(lambda v: jnp.sum(kernel(v) * jnp.arange(9.0).reshape(3, 3)))(jnp.asarray(a))
    np.testing.assert_array_equal(grad, np.repeat([[0.0], [4.0], [8.0]], 2, axis=1))


def test_init_keeps_float32():
    kernel = tullax.einsum_kernel("(max) m[i] := x[i,j]", backend="numba", init=0.5)
    x = data(3, 4).astype(np.float32)
    assert kernel(x).dtype == np.float32 and jax.jit(kernel)(x).dtype == np.float32


@pytest.mark.parametrize("text, init, message", [
    ("r[i] += x[i,j]", 1.0, "with '\\+=' the existing array is the start"),
    ("r[i] := x[i]", 1.0, "init= needs a reduction"),
    ("r[i] := x[i,j] |> exp", 1.0, "init= with a finaliser"),
    ("r[i] := x[i,j]", "zero", "init= must be a number, got str"),
])
def test_init_misuse_is_a_spec_error(text, init, message):
    with pytest.raises(SpecError, match=message):
        tullax.einsum_kernel(text, init=init)


# ---------------------------------------------------------------------------------------------
# nograd=
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("nograd", ["w", ("w",), ["w", "b"]])
def test_nograd_inputs_get_zero_cotangents_and_no_gradient_kernel(backend, nograd):
    text = "y[i] := tanh(x[i,j]*w[j]) + b[i]"
    kernel = tullax.einsum_kernel(text, backend=backend, nograd=nograd)
    plain = tullax.einsum_kernel(text, backend=backend)
    frozen = {nograd} if isinstance(nograd, str) else set(nograd)
    assert [g.split(" := ")[0] for g in kernel.grad_specs] == \
        [g.split(" := ")[0] for g in plain.grad_specs if g[1:].split("[")[0] not in frozen]
    x, w, b = map(jnp.asarray, (data(3, 4), data(4, seed=1), data(3, seed=2)))
    np.testing.assert_allclose(kernel(np.asarray(x), np.asarray(w), np.asarray(b)),
                               plain(np.asarray(x), np.asarray(w), np.asarray(b)), rtol=RTOL)

    def reference(x, w, b):  # b[i] inside the sum over j: added once per j
        return (jnp.tanh(x * w) + b[:, None]).sum(1)

    def loss(run):
        return lambda *v: jnp.sum(run(*v) * jnp.arange(1.0, 4.0))

    want = jax.grad(loss(reference), argnums=(0, 1, 2))(x, w, b)
    for label, grad in (("eager", jax.grad(loss(kernel), argnums=(0, 1, 2))),
                        ("jit", jax.jit(jax.grad(loss(kernel), argnums=(0, 1, 2))))):
        for name, g, e in zip("xwb", grad(x, w, b), want):
            expected = np.zeros_like(e) if name in frozen else e
            np.testing.assert_allclose(g, expected, rtol=RTOL, err_msg=f"{label}: gradient wrt {name}")


def test_nograd_names_an_input_that_could_have_a_gradient():
    with pytest.raises(SpecError, match="nograd names 'z'.*those are: x, w"):
        tullax.einsum_kernel("y[i] := x[i,j]*w[j]", nograd=("z",))
    with pytest.raises(SpecError, match="nograd names 'ix'"):
        tullax.einsum_kernel("y[i] := x[ix[i]]", nograd="ix")


def test_the_options_show_in_the_kernels_repr():
    kernel = tullax.einsum_kernel("(max) m[i] := x[i,j]*w[j]", backend="xla", init=0, nograd="w")
    assert repr(kernel) == "tullax.Kernel('(max) m[i] := x[i,j]*w[j]', backend='xla', init=0, nograd=('w',))"
