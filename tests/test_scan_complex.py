"""Complex recurrences (issue 48): S5/LRU with a complex diagonal, ``h[b,t,n] := lam[n]*h[b,t-1,n] + x[b,t,n]
(t scan from h0)``, on c, numba and xla against the independent ``lax.scan`` oracle of tests/scan_cases.py:
forward eager and under jit; the gradient of a real loss (jax's convention: what ``jax.grad`` of the oracle
returns, the conjugate of the steepest-ascent direction); holomorphic ``jacfwd``/``jacrev`` w.r.t. ``lam``;
``vmap`` of the gradient; complex64 and complex128. Before the C printer had complex types, ``backend="c"``
refused every complex spec (a TullaxError naming xla and numba) and ``auto`` never offered it.

Cost: one kernel module per backend and dtype (the forward and its gradient steps), shared by the tests through
``_kernel``; small shapes (B=2, T=6, N=3). The state that mixes its lanes (its gradient was a SpecError): one
kernel per backend and dtype, B=2, T=5, N=3, about 25 s for its six cases on 2 loaded cores."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from loop_backends import c_param
from scan_cases import CASES

import tullax

LRU = next(case for case in CASES if case.name == "lru")
BACKENDS = (c_param(), "numba", "xla")
JAX_BACKENDS = (c_param(), "xla")  # numba runs eagerly only in these tests: its jit path is test_scan's
TOL = {"complex64": 3e-4, "complex128": 1e-10}


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


@functools.cache
def _kernel(backend: str):
    return tullax.einsum_kernel(LRU.spec, backend=backend)


def _inputs(dtype: str, seed: int = 0) -> list[np.ndarray]:
    """A complex lam inside the unit disc (a decaying rotation), complex x and h0."""
    rng = np.random.default_rng(seed)
    lam, x, h0 = LRU.inputs(rng, "float64").values()
    lam = lam * np.exp(0.7j * np.arange(1, lam.size + 1))
    x = x + 1j * rng.normal(size=x.shape)
    h0 = h0 - 0.5j * rng.normal(size=h0.shape)
    return [np.asarray(a, dtype) for a in (lam, x, h0)]


def _close(got, want, dtype: str) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    scale = max(1.0, float(np.abs(want).max(initial=0)))
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype] * scale)


def _loss(f, w):
    """A real loss of the complex trajectory: its gradient w.r.t. complex inputs is jax's convention."""
    return lambda lam, x, h0: jnp.sum(jnp.real(f(lam, x, h0) * jnp.conj(w)) + jnp.abs(f(lam, x, h0)) ** 2)


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_and_grad_of_every_input(backend, dtype):
    args = _inputs(dtype)
    kernel = _kernel(backend)
    want = LRU.oracle(*args)
    _close(kernel(*args), want, dtype)
    w = np.asarray(np.random.default_rng(1).normal(size=want.shape) * (1 - 2j), dtype)
    expected = jax.grad(_loss(LRU.oracle, w), (0, 1, 2))(*args)
    runs = [jax.grad(_loss(kernel, w), (0, 1, 2))]
    if backend != "numba":
        runs += [jax.jit(kernel), jax.jit(jax.grad(_loss(kernel, w), (0, 1, 2)))]
        _close(runs[1](*args), want, dtype)
        runs = [runs[0], runs[2]]
    for run in runs:
        for got, exp in zip(run(*args), expected):
            _close(got, exp, dtype)


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
@pytest.mark.parametrize("backend", JAX_BACKENDS)
def test_jacobians_wrt_lam_and_vmap_of_grad(backend, dtype):
    """Holomorphic jacfwd and jacrev w.r.t. lam (the recurrence is holomorphic in every input), under jit, and
    vmap over a batch of lams of the gradient of a real loss."""
    lam, x, h0 = _inputs(dtype)
    kernel = _kernel(backend)
    for jac in (jax.jacfwd, jax.jacrev):
        got = jax.jit(jac(lambda lam: kernel(lam, x, h0), holomorphic=True))(lam)
        _close(got, jac(lambda lam: LRU.oracle(lam, x, h0), holomorphic=True)(lam), dtype)
    lams = np.stack([lam, 0.9 * lam, np.conj(lam)])
    w = np.asarray(np.ones(x.shape) * (0.5 + 1j), dtype)

    def grad_of(f):
        return jax.vmap(jax.grad(lambda lam: _loss(f, w)(lam, x, h0)))

    _close(jax.jit(grad_of(kernel))(lams), grad_of(LRU.oracle)(lams), dtype)


def test_complex_specs_run_on_c_and_auto_may_pick_it():
    """The c backend is complex-capable in the registry (``auto`` plans it among the others), and its printed
    LRU is C99 complex: ``float _Complex`` arrays, the textbook product helper, no float vector lanes."""
    from tullax import backends

    assert backends.takes(backends.get("c"), ["complex64", "float32"])
    source = tullax.generate_source(LRU.spec, backend="c", dtype="complex64")
    forward = source[source.index("void forward("):]
    assert "float _Complex* restrict" in forward and "tx_cmul_c64(" in forward
    assert "tx_v8_f32" not in forward and "omp simd" not in forward


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_printed_julia_of_the_complex_scan_in_the_subset_evaluator(dtype):
    """No Julia here: the printed Julia (ComplexF32/ComplexF64) of the forward scan and of every gradient step,
    each on the inputs the XLA lowering of the steps before it gives, run by the Julia-subset evaluator, against
    that lowering of the same step."""
    pytest.importorskip("tree_sitter_julia")
    from test_julia_printer import run_julia

    from tullax.backends.xla.lower import lower as xla_lower
    from tullax.grad import gradients
    from tullax.grad.run import gradient_env, run_gradient
    from tullax.spec.frontend import compile_spec

    def checked(step, env):
        want = np.asarray(xla_lower(step)(env))
        _close(run_julia(step, env), want, dtype)
        return want

    spec = compile_spec(LRU.spec)[1]
    env = dict(zip(spec.input_names, _inputs(dtype)))
    result = checked(spec, env)
    genv = gradient_env(spec, env, result, np.asarray(np.ones(result.shape) * (0.5 - 1j), dtype))
    for grad in gradients(spec, frozenset(env)):
        run_gradient(grad, spec, genv, checked)


MIXING = "h[b,t,n] := W[n,m]*h[b,t-1,m] + x[b,t,n] (t scan)"


def _mixing_oracle(W, x):
    """The hand-written lax.scan: x sits inside the sum over m, so it is added once per m."""
    def step(h, xt):
        h = jnp.einsum("nm,bm->bn", W, h) + W.shape[1] * xt
        return h, h
    return jnp.swapaxes(jax.lax.scan(step, jnp.zeros_like(x[:, 0]), jnp.swapaxes(x, 0, 1))[1], 0, 1)


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_of_a_complex_state_that_mixes_its_lanes(backend, dtype):
    """Its adjoint adds the cotangent after the sum over the lanes, a finaliser ``_ + Δh[b,t,m]`` on complex
    values, which check_complex refused (a SpecError on every backend)."""
    rng = np.random.default_rng(2)
    W = np.asarray((rng.normal(size=(3, 3)) + 1j * rng.normal(size=(3, 3))) * 0.3, dtype)
    x, w = (np.asarray(rng.normal(size=(2, 5, 3)) + 1j * rng.normal(size=(2, 5, 3)), dtype) for _ in range(2))
    kernel = tullax.einsum_kernel(MIXING, backend=backend)
    _close(kernel(W=W, x=x), _mixing_oracle(W, x), dtype)

    def loss(f):
        return lambda W, x: jnp.sum(jnp.real(f(W, x) * jnp.conj(w)) + jnp.abs(f(W, x)) ** 2)
    expected = jax.grad(loss(_mixing_oracle), (0, 1))(W, x)
    for got, exp in zip(jax.grad(loss(lambda W, x: kernel(W=W, x=x)), (0, 1))(W, x), expected):
        _close(got, exp, dtype)
