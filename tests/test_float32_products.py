"""float32 product reductions run in a float64 register (``tullax.compiler.blocking.product_total``): a running
float32 product whose partial products leave float32's range gave inf (or 0) where the product itself is an
ordinary float32. Found by fuzzing the c backend with random specs: ``(*) O[i,j] := B[l,i] + C[k] - tan(tanh(A[j,k]))``
over 600 terms gave inf where the product was 2.5e36 (on the c and numba backends alike).

Each case runs on every host loop backend, against the naive evaluator in float64 on the same float32 inputs;
the loop IR, which every printer prints, is checked for its float64 accumulators."""
from __future__ import annotations

import numpy as np
import pytest
from corpus import analysed
from loop_backends import c_param, run_host

from tullax import backends
from tullax.backends.base import Signature
from tullax.compiler.blocking import TOTAL
from tullax.compiler.loops import Let, walk_stmts
from tullax.compiler.lower import ACC, lower
from tullax.spec.examples import random_inputs
from tullax.testing.oracle import naive_eval

BACKENDS = ["numba", c_param()]
BIG = np.float32(1e4)
RUN = 20  # values of BIG in a row: a running product of 1e80, beyond float32, within float64


def _out_of_range(count: int, n: int, axis: int) -> np.ndarray:
    """``count`` runs of n values along ``axis`` whose running product leaves float32's range on the way while the
    product stays near 1: RUN values of 1e4, then RUN of 1e-4 (every odd run: the small ones first, so the running
    product underflows), then ones up to n."""
    assert n >= 2 * RUN
    x = np.ones((count, n), np.float32)
    for r in range(count):
        first, second = (BIG, 1 / BIG) if r % 2 == 0 else (1 / BIG, BIG)
        x[r, :RUN], x[r, RUN:2 * RUN] = first, second
    return x if axis == 1 else np.ascontiguousarray(x.T)


def _accumulator_dtypes(text: str, dtype: str) -> set[str]:
    """The dtypes of the reduction accumulators in the loop IR of ``text`` computed in ``dtype``."""
    spec = analysed(text)
    kernel = lower(spec, Signature.for_dtype(spec, dtype), "product", tile=True)
    return {s.value.dtype for s in walk_stmts(kernel.body) if isinstance(s, Let) and s.var.startswith(ACC)}


def _expected(spec, env: dict) -> np.ndarray:
    return np.asarray(naive_eval(spec, {k: np.asarray(v, np.float64) for k, v in env.items()}), np.float64)


CASES = [
    # reduced along rows: 4 rows at once (a register tile), then the ragged rows
    ("(*) p[i] := x[i,j]", lambda: {"x": _out_of_range(11, 64, axis=1)}),
    # reduced down columns, one running product per output element: float32 products were tiled, each output
    # element accumulating in float32 while the loop vectorised across the tile
    ("(*) p[j] := x[i,j]", lambda: {"x": _out_of_range(37, 48, axis=0)}),
    ("(*) q[i,k] := x[i,j]*y[j,k]", lambda: {"x": _out_of_range(6, 41, axis=1), "y": np.ones((41, 37), np.float32)}),
    # multiplying into the given output
    ("(*) r[j] *= x[i,j]", lambda: {"r": np.full(5, 2.0, np.float32), "x": _out_of_range(5, 40, axis=0)}),
    # the product itself beyond float32 (1e40), the given value times it within (1e37): multiplied before the
    # product is rounded, or inf (found by fuzzing auto, seed 11015: ``O[i,j] *= j*A[k,j,i]``)
    ("r[j] *= x[i,j]", lambda: {"r": np.full(3, 1e-3, np.float32), "x": np.full((10, 3), 1e4, np.float32)}),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("text, make", CASES, ids=[c[0] + f" {i}" for i, c in enumerate(CASES)])
def test_float32_products_whose_running_product_leaves_the_range(backend: str, text: str, make):
    spec = analysed(text)
    env = make()
    expected = _expected(spec, env)
    assert np.all(np.isfinite(expected)) and np.all(np.abs(expected) > 0.1)
    got = run_host(backends.get(backend), spec, env, "float32")
    np.testing.assert_allclose(got, expected, rtol=1e-5, err_msg=text)


@pytest.mark.parametrize("text, make", CASES, ids=[c[0] + f" {i}" for i, c in enumerate(CASES)])
def test_the_loop_ir_of_a_float32_product_keeps_its_running_product_in_float64(text: str, make):
    """Every printer prints the IR: its accumulators are float64 (``test_lower``'s interpreter computes in float64
    whatever the IR says, so it cannot show the range)."""
    assert _accumulator_dtypes(text, "float32") == {TOTAL}


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_fuzzed_product_that_overflowed(backend: str):
    text = "(*) O[i,j] := B[l,i] + C[k] - tan(tanh(A[j,k]))"
    spec = analysed(text)
    shapes = {"B": (15, 17), "C": (40,), "A": (23, 40)}
    env = {k: np.asarray(v, np.float32) for k, v in random_inputs(spec, shapes, seed=1074).items()}
    expected = _expected(spec, env)
    got = run_host(backends.get(backend), spec, env, "float32")
    assert np.all(np.isfinite(got)), "a running float32 product overflowed"
    # float32 terms (tan of tanh) against float64 ones, some near zero (4e-4 relative in one element here);
    # below float32's smallest normal the result is a subnormal or zero
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=np.finfo(np.float32).tiny)


def test_float64_and_integer_products_are_unchanged():
    """Only float32 products widen: float64 ones already have the range, integer ones wrap as their type does."""
    for dtype in ("float64", "int64"):
        assert _accumulator_dtypes("(*) p[i] := x[i,j]", dtype) == {dtype}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_float32_product_finaliser_sees_the_float64_total(backend: str):
    """The finaliser runs on the float64 total, rounded once after it: ``log`` of a product of 1e40 is 92.1, not
    the log of the product rounded to float32 (inf)."""
    text = "(*) p[j] := x[i,j] |> log"
    spec = analysed(text)
    env = {"x": np.full((10, 3), 1e4, np.float32)}
    expected = _expected(spec, env)
    got = run_host(backends.get(backend), spec, env, "float32")
    np.testing.assert_allclose(got, expected, rtol=1e-6, err_msg=text)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_gradient_of_a_float32_product_multiplied_into_a_small_given_value(backend: str):
    """d(r[j] * prod_i x[i,j])/dx[i,j] is r[j] times the product of the other factors: 1e-3 * 1e36 here. The
    gradient divides the product of every nonzero factor (a step of its own: 1e40 and 2e40 in two columns) by
    the factor, and that product was rounded to float32 before the given value multiplied it: inf (found by
    fuzzing the c backend, seed 11015: ``O[i,j] *= j*A[k,j,i]``). The step multiplies the given value in as its
    finaliser now, on the float64 total."""
    import jax
    import jax.numpy as jnp

    import tullax

    kernel = tullax.einsum_kernel("r[j] *= x[i,j]", backend=backend)
    r = np.full(3, 1e-3, np.float32)
    x = np.full((10, 3), 1e4, np.float32)
    x[0, 1], x[3, 2] = 2e4, 0.5
    grad_x, grad_r = jax.grad(lambda x, r: jnp.sum(kernel(r, x)), argnums=(0, 1))(jnp.asarray(x), jnp.asarray(r))
    x64, r64 = x.astype(np.float64), r.astype(np.float64)
    product = np.prod(x64, axis=0)
    expected = r64 * product / x64  # no factor is zero
    assert np.all(np.isfinite(np.asarray(grad_x))), "the product of the other factors overflowed float32"
    np.testing.assert_allclose(np.asarray(grad_x), expected, rtol=1e-5)
    # w.r.t. the given value: the product itself, beyond float32 in two columns (inf, as float32 holds it)
    np.testing.assert_allclose(np.asarray(grad_r), product.astype(np.float32), rtol=1e-5)
