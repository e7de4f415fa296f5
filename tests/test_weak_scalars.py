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


@pytest.mark.parametrize("backend", every_backend())
def test_a_weakly_typed_jax_value_is_converted_before_computing_as_jnp_converts_it(backend):
    # jnp converts a weak operand to the arrays' dtype first: 0.1*x with float32 x multiplies two float32s. The xla
    # backend took jnp.asarray(0.1) (weak float64 under x64), eagerly or under jit, as float64 and rounded the
    # float64 product (17 of these 64 results one ulp off); an eager NumPy call already converted a Python number.
    import jax
    import jax.numpy as jnp

    skip_unavailable(backend)
    x = (np.arange(1, 65) / 7).astype(np.float32)
    kernel = tullax.einsum_kernel("y[i] := s*x[i]", backend=backend)
    with jax.enable_x64(True):
        s = jnp.asarray(0.1)
        assert s.weak_type and s.dtype == np.float64
        want = np.asarray(s * jnp.asarray(x))
        results = {"eager, NumPy x": kernel(s, x), "eager, jax x": kernel(s, jnp.asarray(x)),
                   "jit": jax.jit(kernel)(s, x), "jit, Python number": jax.jit(kernel)(0.1, x),
                   "eager, Python number": kernel(0.1, x)}
    for how, got in results.items():
        assert got.dtype == np.float32, how
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=how)
