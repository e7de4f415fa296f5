"""Accurate float32 sums (issue 13): long float32 ``+`` reductions, forward and gradients, stay within 10x of
XLA's own error, on every loop backend of the registry that runs on host buffers here (c, numba; julia where it
is installed: 10^6-10^7 terms) and in the printed Julia run by the subset evaluator (10^4-10^5 terms: it
interprets every element in Python, about 30 us each). XLA is the reference the bound is taken from.

Errors are relative, in the 2-norm over the whole result, against the same computation in float64 (XLA with
x64). The bound is 10x the largest of XLA's float32 error, the error of the float64 result rounded to float32
and half a float32 ulp (2^-24): a correctly rounded answer may lose that much, and XLA may by luck lose almost
nothing on a short result. Inputs are uniform in [0, 1): terms of one sign, the worst case for one running
float32 accumulator (which loses 15-5000x XLA's error on these sizes).
"""
from __future__ import annotations

import numpy as np
import pytest
from corpus import analysed

pytest.importorskip("numba")
jax = pytest.importorskip("jax")

from loop_backends import run_host, skip_unavailable  # noqa: E402

from tullax import backends  # noqa: E402
from tullax.backends.xla.lower import lower as xla_lower  # noqa: E402
from tullax.grad import gradients  # noqa: E402
from tullax.grad.run import gradient_env, run_gradient  # noqa: E402
from tullax.spec.ir import Spec  # noqa: E402

WITHIN = 10  # times XLA's error
HALF_ULP = 2.0**-24  # relative: the most a correctly rounded float32 result loses
LOOP_BACKENDS = [name for name in backends.names() if name != "xla"]  # xla: the reference


def host_runner(name: str):
    """``run(spec, env)`` on the registry's backend ``name`` in float32; skips where it cannot run here."""
    skip_unavailable(name)
    backend = backends.get(name)
    if not backend.capabilities.host_buffers:
        pytest.skip(f"{name} does not run on host buffers")
    return lambda spec, env: run_host(backend, spec, env, "float32")


def run_xla(spec: Spec, env: dict) -> np.ndarray:
    return np.asarray(jax.jit(xla_lower(spec))(env))


def run_float64(spec: Spec, env: dict) -> np.ndarray:
    with jax.enable_x64(True):
        return np.asarray(xla_lower(spec)({k: _float64(v) for k, v in env.items()}))


def _float64(value):
    return np.asarray(value, np.float64) if np.asarray(value).dtype == np.float32 else value


def relative_error(got, reference: np.ndarray) -> float:
    diff = np.asarray(got, np.float64) - reference
    return float(np.linalg.norm(diff.ravel()) / np.linalg.norm(reference.ravel()))


def uniform_inputs(spec: Spec, shapes: dict, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {name: rng.uniform(size=shapes[name]).astype(np.float32) for name in spec.input_names}


def assert_as_accurate_as_xla(run, text: str, shapes: dict, wrt: str | None, seed: int = 0) -> None:
    """``run(step, env)`` computes the forward result (``wrt`` None) or the gradient w.r.t. ``wrt`` (the
    residual and a uniform cotangent from the float64 forward) within WITHIN x XLA's error."""
    spec = analysed(text)
    env = uniform_inputs(spec, shapes, seed)
    if wrt is None:
        def compute(executor, float64: bool = False):
            return executor(spec, env)
    else:
        grad = next(g for g in gradients(spec) if g.wrt == wrt)
        forward = run_float64(spec, env)
        cotangent = np.random.default_rng(seed + 1).uniform(size=forward.shape)
        genv = gradient_env(spec, env, forward.astype(np.float32), cotangent.astype(np.float32))
        genv64 = {name: _float64(value) for name, value in genv.items()}  # the result takes wrt's dtype

        def compute(executor, float64: bool = False):
            return run_gradient(grad, spec, genv64 if float64 else genv, executor)
    reference = compute(run_float64, float64=True)
    ours, xla = relative_error(compute(run), reference), relative_error(compute(run_xla), reference)
    rounding = relative_error(reference.astype(np.float32), reference)
    assert ours <= WITHIN * max(xla, rounding, HALF_ULP), (
        f"{text} ({'forward' if wrt is None else 'gradient w.r.t. ' + wrt}): relative error {ours:.2e}, "
        f"XLA {xla:.2e}, float32 rounding {rounding:.2e}")


# =============================================================================================
# Every loop backend (c, numba, ...): 10^6-10^7 terms
# =============================================================================================
@pytest.mark.parametrize("text, shapes, wrt", [
    ("s := x[i,j]*y[i,j]", {"x": (4, 2_500_000), "y": (4, 2_500_000)}, None),  # a scalar: prange over i
    ("r[i] := x[i,j]", {"x": (4, 2_500_000)}, None),
    ("C[i,j] := A[i,k]*B[k,j]", {"A": (4, 1_000_000), "B": (1_000_000, 8)}, None),  # tiled: totals per tile
    ("S[i,j] := Q[i,d]*K[j,d]", {"Q": (16, 16), "K": (1_000_000, 16)}, "Q"),  # attention: ΔQ sums over long j
    ("h[b,o] := x[b,i]*W[i,o]", {"x": (1_000_000, 4), "W": (4, 8)}, "W"),  # a weight gradient over a batch
    # tiled, two summed indices, the strip-mined (inner) one shorter than a block: the partials once ran over
    # all 400k terms in float32 (the move into the totals counted the inner loop's length alone)
    ("C[i,j] := A[i,k,l]*B[k,l,j]", {"A": (4, 4000, 100), "B": (4000, 100, 8)}, None),
], ids=["dot", "row_sum", "matmul_long_k", "attention_grad_Q", "linear_grad_W", "two_sum_indices"])
@pytest.mark.parametrize("backend", LOOP_BACKENDS)
def test_loop_backends_long_sums_are_as_accurate_as_xla(backend: str, text: str, shapes: dict, wrt: str | None):
    assert_as_accurate_as_xla(host_runner(backend), text, shapes, wrt)


# =============================================================================================
# The printed Julia, executed by the subset evaluator: 10^4-10^5 terms
# =============================================================================================
@pytest.mark.parametrize("text, shapes, wrt", [
    ("s := x[i]*y[i]", {"x": (200_000,), "y": (200_000,)}, None),  # one work-item over every block
    ("r[i] := x[i,j]", {"x": (2, 50_000)}, None),
    ("S[i,j] := Q[i,d]*K[j,d]", {"Q": (2, 2), "K": (30_000, 2)}, "Q"),  # tiled, with the tile's totals
    ("C[i,j] := A[i,k,l]*B[k,l,j]", {"A": (2, 300, 50), "B": (300, 50, 2)}, None),  # the inner loop: 50
], ids=["dot", "row_sum", "attention_grad_Q", "two_sum_indices"])
def test_printed_julia_long_sums_are_as_accurate_as_xla(text: str, shapes: dict, wrt: str | None):
    pytest.importorskip("tree_sitter_julia")
    from test_julia_printer import run_julia

    assert_as_accurate_as_xla(run_julia, text, shapes, wrt)
