"""Estimated work beyond a bound is a ShapeError that says the estimate and how to override it (issue 44): a
clause like ``(k in 0:4611686018427387904)`` was accepted and ran for hours. The bound (``MAX_WORK``, or
``TULLAX_MAX_WORK``) is checked with the shapes, at trace time, for the forward kernel and each gradient kernel,
on every backend; a result of 2^62 elements or more is refused whatever the setting (int64 positions)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from loop_backends import c_param

import tullax
from tullax.errors import ShapeError, TullaxError
from tullax.grad import gradients
from tullax.spec.frontend import compile_spec
from tullax.spec.shapes import check_shapes
from tullax.spec.work import MAX_WORK, MAX_WORK_ENV, max_work

BACKENDS = [c_param(), "numba", "xla", "auto"]
X = np.arange(1.0, 6.0)


@pytest.fixture
def default_bound(monkeypatch):
    monkeypatch.delenv(MAX_WORK_ENV, raising=False)


def test_the_clause_of_the_issue_is_refused_with_the_estimate_and_the_override(default_bound):
    spec = compile_spec("y[i] := x[i]  (k in 0:4611686018427387904)")[1]
    with pytest.raises(ShapeError) as info:
        check_shapes(spec, {"x": (5,)})  # every backend's check (without it: XLA aborts, c and numba run for hours)
    message = str(info.value)
    assert "would run about 2.31e+19 iterations (2^64.3: i over 5, k over 4611686018427387904)" in message
    assert f"bound of {MAX_WORK:.3g} per call (2^50.0)" in message and f"set {MAX_WORK_ENV}" in message
    assert max_work() == MAX_WORK == 2**50


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_refuses_beyond_the_bound_eagerly_under_jit_and_in_the_gradient(backend, monkeypatch):
    """With the bound lowered to 20, a kernel of 25 iterations (a work the test can afford to run if the check is
    missing: the clause of the issue would abort XLA, or loop for hours on c and numba, without it)."""
    monkeypatch.setenv(MAX_WORK_ENV, "20")
    kernel = tullax.einsum_kernel("y[i] := x[i]*w[k]", backend=backend)
    w = np.arange(5.0)
    with pytest.raises(ShapeError, match=r"would run about 25 iterations .* beyond tullax's bound of 20"):
        kernel(X, w)
    with pytest.raises(ShapeError, match="beyond tullax's bound"):
        jax.jit(kernel)(jnp.asarray(X), jnp.asarray(w))
    with pytest.raises(ShapeError, match="beyond tullax's bound"):
        jax.grad(lambda v: kernel(v, jnp.asarray(w)).sum())(jnp.asarray(X))


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_setting_lowers_and_raises_the_bound(backend, monkeypatch):
    """A conv of 5*3 = 15 iterations: refused under a bound of 14, run under 15; its gradient kernel for x,
    Δx[m] := Δy[pad(m-k)]*w[k], iterates 7*3 = 21 times and is checked with its own ranges when it is traced."""
    kernel = tullax.einsum_kernel("y[i] := x[i+k]*w[k]", backend=backend)
    x, w = np.arange(7.0), np.array([1.0, -2.0, 0.5])
    monkeypatch.setenv(MAX_WORK_ENV, "14")
    with pytest.raises(ShapeError, match=r"would run about 15 iterations \(2\^3\.9: i over 5, k over 3\)"):
        kernel(x, w)
    with pytest.raises(ShapeError, match="beyond tullax's bound of 14 per call"):
        jax.jit(kernel)(jnp.asarray(x), jnp.asarray(w))
    monkeypatch.setenv(MAX_WORK_ENV, "15")
    want = np.array([x[i:i + 3] @ w for i in range(5)])
    np.testing.assert_allclose(np.asarray(kernel(x, w)), want, rtol=1e-12)
    loss = jax.grad(lambda x: kernel(x, jnp.asarray(w)).sum())
    with pytest.raises(ShapeError, match=r"Δx\[m\] := .* would run about 21 iterations"):
        loss(jnp.asarray(x))
    monkeypatch.setenv(MAX_WORK_ENV, "21")
    np.testing.assert_allclose(np.asarray(loss(jnp.asarray(x))), np.convolve(np.ones(5), w, mode="full"),
                               rtol=1e-12)
    monkeypatch.setenv(MAX_WORK_ENV, "0")  # no bound
    np.testing.assert_allclose(np.asarray(kernel(x, w)), want, rtol=1e-12)


def test_each_gradient_kernel_is_checked_with_its_own_ranges(monkeypatch):
    """The gradient steps of a forward within the bound are kernels of their own: each is checked as it is."""
    spec = compile_spec("y[i] := x[i+k]*w[k]")[1]
    shapes = {"x": (7,), "w": (3,), "Δy": (5,)}
    monkeypatch.setenv(MAX_WORK_ENV, "14")
    for grad in gradients(spec):
        for step in grad.steps:
            step_shapes = {name: shapes[name] for name in step.input_names}
            with pytest.raises(ShapeError, match="beyond tullax's bound of 14"):
                check_shapes(step, step_shapes)


@pytest.mark.parametrize("value", ["many", "-3", "1e9"])
def test_a_setting_that_is_not_a_bound_says_so(value, monkeypatch):
    monkeypatch.setenv(MAX_WORK_ENV, value)
    with pytest.raises(TullaxError, match=f"{MAX_WORK_ENV}='{value}' is not a bound"):
        tullax.einsum_kernel("y[i] := 2*x[i]", backend="xla")(X)


def test_a_result_beyond_int64_positions_is_refused_whatever_the_setting(monkeypatch):
    monkeypatch.setenv(MAX_WORK_ENV, "0")
    spec = compile_spec("O[i,j] := x[i]*x[j]  (i in 0:4611686018427387904) (j in 0:4)")[1]
    with pytest.raises(ShapeError, match=r"the result would have 18446744073709551616 elements \(2\^64\.0\), beyond "
                                         r"the 2\^62"):
        check_shapes(spec, {"x": (5,)})
    with pytest.raises(ShapeError, match="beyond the 2\\^62"):
        tullax.einsum_kernel("O[i,j] := x[i]*x[j]  (i in 0:4611686018427387904) (j in 0:4)", backend="numba")(X)
