"""The c backend's strips of vector math (``tullax.printers.c_math_strips``): a serial loop that no vector form
takes but whose leading Lets call exp (a Gaussian kernel's sum over points, whose rows of 4 columns are the loop
inside) runs in strips, the exps of a strip first in an ``omp simd`` loop (glibc's vector expf), then the loop
reading them.
Checked in the printed C and against NumPy float64, NaN, infinities and -0.0 included."""
from __future__ import annotations

import functools

import numpy as np
import pytest
from corpus import analysed
from loop_backends import run_host

from tullax.backends.c.backend import CBackend, module_source
from tullax.grad import gradients
from tullax.grad.run import gradient_env, run_gradient
from tullax.printers.c_math_strips import STRIP

BACKEND = CBackend()
pytestmark = pytest.mark.skipif(not BACKEND.availability()[0], reason="no C compiler that builds OpenMP here")
GAUSSIAN = "K[i,d] := exp(-((x[i,0]-y[j,0])^2 + (x[i,1]-y[j,1])^2))*b[j,d]"
POINTS = 2 * STRIP + 22  # two whole strips and a part of one


@pytest.fixture(autouse=True)
def _optimising_build_only(monkeypatch):
    """The optimising build prints the strips (the fast tier's plain C has no vectors)."""
    monkeypatch.setenv("TULLAX_C_TIERS", "off")


def _exps(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return np.exp(-((x[:, None, 0] - y[None, :, 0]) ** 2 + (x[:, None, 1] - y[None, :, 1]) ** 2))


def _inputs(rng: np.random.Generator) -> dict:
    return {"x": rng.uniform(-2, 2, (7, 2)), "y": rng.uniform(-2, 2, (POINTS, 2)),
            "b": rng.standard_normal((POINTS, 3))}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_exp_of_a_loop_with_an_inner_loop_runs_in_vector_strips(dtype: str):
    spec = analysed(GAUSSIAN)
    source = module_source(spec, dtype)
    forward = source[source.index("void forward("):source.index("void forward_packed(")]
    call = "expf(" if dtype == "float32" else "exp("
    assert "#pragma omp simd" in forward
    simd = forward.index("#pragma omp simd")
    assert f"_sb += {STRIP})" in forward and f"_strip[{STRIP}];" in forward
    assert call in forward[simd:forward.index("}", simd)] and "_strip[i2" in forward  # the strip's vector loop, read
    env = _inputs(np.random.default_rng(5))
    env["x"][1, 0] = np.nan  # a NaN point: its row is NaN
    env["x"][2] = -0.0
    env["y"][3] = -0.0  # exp(-0.0) = 1
    env["y"][70, 0] = np.inf  # exp(-inf) = 0, times b: 0, but NaN where b is inf (IEEE's 0 * inf)
    env["b"][70, 0] = np.inf
    env["y"][STRIP + 5] = 1e3  # exp underflows to 0 exactly
    env = {k: v.astype(dtype) for k, v in env.items()}
    got = run_host(BACKEND, spec, env, dtype)
    x, y, b = (env[k].astype(np.float64) for k in "xyb")
    with np.errstate(invalid="ignore"):
        want = (_exps(x, y)[:, :, None] * b[None]).sum(1)
    assert np.isnan(got[1]).all() and np.isnan(got[:, 0]).all() and not np.isnan(got[[0, 2, 3, 4, 5, 6], 1:]).any()
    np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_gradients_of_a_gaussian_kernel_sum_through_the_strips(dtype: str):
    """Every gradient step of the Gaussian sum (the points' gradient is the benchmark's ``grad y``) against NumPy:
    NaN in b reaches its point's gradient, underflowed exps give exact zeros."""
    spec = analysed(GAUSSIAN)
    env = _inputs(np.random.default_rng(6))
    env["b"][9, 1] = np.nan
    env["y"][STRIP + 5] = 1e3
    env = {k: v.astype(dtype) for k, v in env.items()}
    run = functools.partial(run_host, BACKEND, dtype=dtype)
    forward = run(spec, env)
    cotangent = np.random.default_rng(7).standard_normal(forward.shape).astype(dtype)
    genv = gradient_env(spec, env, forward, cotangent)
    x, y, b = (env[k].astype(np.float64) for k in "xyb")
    exps, g = _exps(x, y), cotangent.astype(np.float64)
    weight = exps * (g @ b.T)  # [i, j]: the cotangent's weight of each pair
    diff = 2 * (x[:, None, :] - y[None, :, :])
    with np.errstate(invalid="ignore"):
        want = {"y": (weight[:, :, None] * diff).sum(0), "x": -(weight[:, :, None] * diff).sum(1),
                "b": exps.T @ g}
    tol = 2e-5 if dtype == "float32" else 1e-12
    for grad in gradients(spec):
        got = run_gradient(grad, spec, genv, run)
        scale = np.nanmax(np.abs(want[grad.wrt]), initial=1.0)
        np.testing.assert_allclose(got, want[grad.wrt], rtol=tol, atol=tol * scale, err_msg=grad.wrt)
    assert np.isnan(run_gradient(next(g for g in gradients(spec) if g.wrt == "y"), spec, genv, run)[9]).all()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_remainder_of_a_sum_of_exps_on_lanes_runs_its_exps_on_vectors(dtype: str):
    """A row sum of exps on vector lanes whose length is no multiple of the lanes: the remainder's exps in an
    ``omp simd`` loop into an array (``c_nest_strips.vector_rest``), added one by one in order; NaN, inf and -0.0
    in the remainder reach the sums as in NumPy."""
    spec = analysed("s[i] := exp(x[i,j])")
    source = module_source(spec, dtype)
    forward = source[source.index("void forward("):source.index("void forward_packed(")]
    rest = forward[forward.index("_r["):]
    assert "#pragma omp simd" in rest[:rest.index("}")] and ("expf(" if dtype == "float32" else "exp(") in rest
    x = np.random.default_rng(8).uniform(-3, 3, (5, 21))  # 16 on lanes, then a remainder of 5
    x[1, 19] = np.nan
    x[2, 18] = np.inf
    x[3, 20] = -np.inf
    x[4, 17:] = -0.0
    env = {"x": x.astype(dtype)}
    got = run_host(BACKEND, spec, env, dtype)
    want = np.exp(env["x"].astype(np.float64)).sum(1)
    assert np.isnan(got[1]) and np.isinf(got[2])
    np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == "float32" else 1e-13)
