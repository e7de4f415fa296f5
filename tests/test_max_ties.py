"""A max/min gradient finds the winner its forward found, even where the body cancels.

A gradient kernel recomputes the body and compares it with the forward's result. Under fast-math the C compiler
reassociated ``x[i,j] - c[i] + c[0]`` differently in the two kernels (``c[0] - c[i]`` hoisted in one): with c
near 1000 and x near 1 the recomputed value missed the max by ~1e-4, far more than the tolerance relative to
the max (~1), and 61 of 64 rows lost their gradient silently (float32, c backend). The tolerance is now relative
to the magnitude of the body's terms (``tullax.grad.forward._magnitude``). The reference is jax's gradient of the
jnp reduction, run eagerly (jitted, XLA fuses and rounds the comparison itself)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from loop_backends import c_param

import tullax


def _cancelling(rng: np.random.Generator, dtype: str):
    x = rng.standard_normal((64, 100)).astype(dtype)
    c = (1000 + rng.standard_normal(64)).astype(dtype)
    return (x, c), lambda x, c: jnp.max(x - c[:, None] + c[0], axis=1)


def _tiny(rng: np.random.Generator, dtype: str):  # found by fuzzing: (max) over 2 values, a bias that cancels at i=0
    A = rng.standard_normal((2, 2, 2)).astype(dtype)
    B = rng.standard_normal(2).astype(dtype)
    return (A, B), lambda A, B: jnp.max(A[None, :, :, 0] - B[:, None, None] + B[0], axis=2)


CASES = [("(max) m[i] := x[i,j] - c[i] + c[0]", _cancelling),
         ("(max) O[i,j] := A[j,k,0] - B[i] + B[0]", _tiny)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("backend", ["numba", "xla", c_param()])
@pytest.mark.parametrize("spec, make", CASES, ids=["cancelling", "tiny"])
def test_max_gradient_finds_the_winner_of_a_cancelling_body(spec, make, backend, dtype):
    rng = np.random.default_rng(7)
    with jax.enable_x64(dtype == "float64"):
        args, reference = make(rng, dtype)
        kernel = tullax.einsum_kernel(spec, backend=backend)
        out, pullback = jax.vjp(lambda *a: kernel(*a), *args)
        assert out.dtype == dtype
        cotangent = jnp.asarray(rng.standard_normal(out.shape).astype(dtype))
        expected_out, expected_pullback = jax.vjp(reference, *args)
        # the sums round differently (terms near 1000 in float32: 1e-4), the winner is the same
        np.testing.assert_allclose(np.asarray(out), np.asarray(expected_out), rtol=0, atol=1e-3)
        for got, expected in zip(pullback(cotangent), expected_pullback(cotangent)):
            np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-5, atol=1e-5)
