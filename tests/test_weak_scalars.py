"""Inputs as JAX would take them (issue 15): Python numbers are weak (they take the arrays' precision) eagerly as
under jit, where ``y[i] := s*x[i]`` with a Python float s and float32 x used to be float64 eagerly and float32
under jit; and big-endian arrays compute like native ones."""
from __future__ import annotations

import numpy as np
import pytest
from loop_backends import every_backend, skip_unavailable

import tullax


@pytest.mark.parametrize("backend", ["numba", "xla"])
@pytest.mark.parametrize("scalar", [2.5, 3, -1.0])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_python_numbers_are_weak_eagerly_and_under_jit(backend, scalar, dtype):
    import jax

    x = np.linspace(-1, 1, 5).astype(dtype)
    kernel = tullax.einsum_kernel("y[i] := s*x[i] + 1", backend=backend)
    eager = kernel(scalar, x)
    jitted = jax.jit(kernel)(scalar, x)
    assert eager.dtype == np.dtype(dtype)
    if dtype == "float32":  # without x64, jit computes float64 inputs in float32: compare where both can agree
        assert jitted.dtype == eager.dtype
    np.testing.assert_allclose(eager, scalar * x + 1, rtol=1e-6)


def test_a_numpy_scalar_keeps_its_own_dtype():
    y = tullax.einsum_kernel("y[i] := s*x[i]", backend="numba")(np.float64(2.0), np.ones(3, np.float32))
    assert y.dtype == np.float64  # NumPy scalars are strongly typed, as in jnp


@pytest.mark.parametrize("backend", ["numba", "xla"])
@pytest.mark.parametrize("dtype", [">f4", ">f8", ">i4"])
def test_big_endian_inputs_are_byte_swapped_not_refused(backend, dtype):
    """Issue 15: big-endian arrays used to escape as jax's TypeError; they compute like native ones."""
    x = np.arange(6).astype(dtype)
    y = tullax.einsum_kernel("y[i] := x[i]*2 + w[i]", backend=backend)(x, np.ones(6, np.float32))
    np.testing.assert_allclose(y, np.arange(6) * 2.0 + 1.0)


@pytest.mark.parametrize("backend", every_backend())
def test_a_python_number_under_jit_with_x64_stays_weak(backend):
    # under x64 a jitted Python float arrives as a weakly typed float64 tracer: the result came back float64
    # where jnp's s*x with float32 x is float32 (and eagerly tullax's was float32 too)
    import jax

    skip_unavailable(backend)
    x = np.linspace(-1, 1, 5).astype(np.float32)
    kernel = tullax.einsum_kernel("y[i] := s*x[i] + 1", backend=backend)
    with jax.enable_x64(True):
        jitted = jax.jit(kernel)(2.5, x)
        strong = jax.jit(kernel)(np.float64(2.5), x)
        assert jitted.dtype == jax.jit(lambda s, x: s * x + 1)(2.5, x).dtype == np.float32
        assert strong.dtype == np.float64  # a NumPy scalar is strongly typed, as in jnp
        grad = jax.jit(jax.grad(lambda s: kernel(s, x).sum()))(2.5)
    np.testing.assert_allclose(jitted, 2.5 * x + 1, rtol=1e-6)
    np.testing.assert_allclose(grad, x.astype(np.float64).sum(), rtol=1e-5, atol=1e-6)
