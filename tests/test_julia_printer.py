"""The Julia printer, verified without a Julia (issue 5, layers 1-3).

1. Every generated module for the corpus (forward and every gradient step, float32 and float64, CPU and CUDA
   flavours) parses with tree-sitter-julia without ERROR/MISSING nodes and is accepted by the subset evaluator
   (``tests/julia_subset.py``), which rejects any construct outside the verified subset.
2. Every generated kernel is EXECUTED by that evaluator (Julia semantics: 1-based, column-major views, bounds and
   type checks, work-items in shuffled order with race detection) through its printed launcher, with the host
   arguments the real backend computes (``launch_arguments``), and compared with ``tullax.testing.naive_eval``
   on every corpus case (float64, both flavours; float32 for a handful) and with the Numba backend on a
   representative subset. Gradient steps run in the environment ``run_gradient`` builds.
3. Golden files ``tests/golden/julia/<id>.jl`` for canonical specs (``TULLAX_UPDATE_GOLDEN=1`` regenerates).
"""
from __future__ import annotations

import math
import os
import re
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from corpus import CASES_BY_ID, CORPUS, Case
from julia_subset import CPU_BACKEND, JuliaRuntimeError, load_module, parse_errors

import tullax
from tullax.backends.base import Signature
from tullax.backends.julia import (
    CPU,
    CUDA,
    Target,
    kernel_module,
    launch_arguments,
    module_source,
)
from tullax.errors import TullaxError
from tullax.grad import gradients
from tullax.grad.run import gradient_env, run_gradient
from tullax.printers.julia import format_float, launch_nest, launcher_name
from tullax.spec.arguments import as_numpy_inputs, check_call, result_dtype
from tullax.spec.examples import random_inputs, shapes_for
from tullax.spec.frontend import compile_spec
from tullax.testing.oracle import naive_eval

GOLDEN = Path(__file__).parent / "golden" / "julia"
UPDATE = os.environ.get("TULLAX_UPDATE_GOLDEN") == "1"
TARGETS = {"cpu": CPU, "cuda": CUDA}
TOL = {np.float64: 1e-10, np.float32: 2e-4}


# ---------------------------------------------------------------------------------------------
# Running printed kernels in the evaluator
# ---------------------------------------------------------------------------------------------
def analysed(case: Case):
    return compile_spec(case.spec, case.ranges)[1]


def setup(case: Case, dtype, seed: int = 1):
    """The analysed spec and consistent random inputs (shapes from the case, completed by shapes_for)."""
    spec = analysed(case)
    shapes = dict(case.shapes or {})
    if any(i.name not in shapes for i in spec.inputs if i.kind != "scalar"):
        shapes = {**shapes_for(spec, seed=0), **shapes}
    return spec, random_inputs(spec, shapes, seed=seed, dtype=dtype)


@lru_cache(maxsize=None)
def evaluator_module(source: str):
    return load_module(source)


def prepared(step, env):
    """(NumPy inputs in spec order, signature, a fresh output: NaN for ':=' so an unwritten element shows, zeros
    for a scatter, a copy of the given array for '=' and '+=')."""
    arrays = as_numpy_inputs(step, [env[name] for name in step.input_names])
    check_call(step, arrays)
    dtype = np.dtype(result_dtype(step, arrays))
    signature = Signature(tuple(np.dtype(a.dtype).name for a in arrays), dtype.name)
    out_shape = tuple(s.eval({n: np.shape(a) for n, a in zip(step.input_names, arrays)}) for s in step.out_shape)
    if step.assign != ":=":
        out = np.array(arrays[0], dtype=dtype, copy=True)
    else:
        out = np.zeros(out_shape, dtype) if step.is_scatter else np.full(out_shape, np.nan, dtype)
    return arrays, signature, out


def run_julia(step, env, target: Target = CPU) -> np.ndarray:
    """The step's result computed by its printed Julia module, launched through its printed launcher."""
    arrays, signature, out = prepared(step, env)
    kernel, source = kernel_module(step, signature, target)
    args, copy_back = launch_arguments(kernel, step, out, arrays)
    evaluator_module(source).call(launcher_name(kernel), CPU_BACKEND, *args)
    if copy_back is not None:
        out[...] = copy_back
    return out


def run_numba(step, env) -> np.ndarray:
    from tullax.backends.numba import NumbaBackend

    arrays, signature, out = prepared(step, env)
    NumbaBackend().build(step, signature)(out, *arrays)
    return out


def naive_result(step, step_env) -> np.ndarray:
    arrays = as_numpy_inputs(step, [step_env[n] for n in step.input_names])
    return naive_eval(step, step_env).astype(result_dtype(step, arrays))


def kernel_runs(case: Case, dtype) -> list[tuple[str, object, dict]]:
    """(label, step spec, its environment) for the forward kernel and every gradient step of ``case``; the
    environments flow as in ``run_gradient`` (reference results from naive_eval, in ``dtype``)."""
    spec, env = setup(case, dtype)
    runs: list[tuple[str, object, dict]] = [("forward", spec, env)]
    try:
        grads = gradients(spec)
    except TullaxError:  # (*) reductions have none
        return runs

    def reference(step, step_env):
        runs.append((f"gradient step {step.out}", step, step_env))
        return naive_result(step, step_env)

    result = naive_result(spec, env)
    cotangent = np.asarray(np.random.default_rng(7).standard_normal(result.shape)).astype(result.dtype)
    genv = gradient_env(spec, env, result, cotangent)
    for grad in grads:
        if np.issubdtype(np.asarray(env[grad.wrt]).dtype, np.inexact):
            run_gradient(grad, spec, genv, reference)
    return runs


def assert_close(got, expected, dtype) -> None:
    tol = TOL[dtype]
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(expected, np.float64), rtol=tol, atol=tol)


# ---------------------------------------------------------------------------------------------
# Layer 1: every generated module parses and stays inside the subset
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flavour", sorted(TARGETS))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.id)
def test_whole_module_parses_and_is_in_the_subset(case: Case, dtype: str, flavour: str):
    source = module_source(analysed(case), dtype, target=TARGETS[flavour])
    assert parse_errors(source) == []
    module = load_module(source)
    assert "forward!" in module.kernel_names and "run_forward!" in module.function_names
    launchers = {f"run_{name}" for name in module.kernel_names}
    helpers = set(module.function_names) - launchers
    assert launchers <= set(module.function_names) and all("_nan_f" in name for name in helpers)


def test_generate_source_returns_the_whole_module_without_importing_juliacall():
    source = tullax.generate_source("y[i] := x[i+k]*w[k]", backend="julia", dtype="float64")
    module = load_module(source)
    assert module.name.startswith("TullaxKernels_")
    assert module.kernel_names == ["forward!", "grad0_step0!", "grad1_step0!"]
    assert "acc = 0.0\n" in source and not re.search(r"\.\d+f-?\d", source)  # Float64 literals only
    assert "juliacall" not in sys.modules
    cuda = tullax.generate_source("y[i] := x[i+k]*w[k]", backend="julia-cuda", dtype="float32")
    assert "tile" not in cuda and "tile" in tullax.generate_source("D[i,j] := (W[k,i] - X[k,j])^2",
                                                                   backend="julia")


# ---------------------------------------------------------------------------------------------
# Layer 2: execute every kernel, compare with the naive evaluator and with Numba
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flavour", sorted(TARGETS))
@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.id)
def test_every_kernel_matches_naive_float64(case: Case, flavour: str):
    for label, step, env in kernel_runs(case, np.float64):
        assert_close(run_julia(step, env, TARGETS[flavour]), naive_eval(step, env), np.float64)


FLOAT32_CASES = ["matmul", "dist", "conv1d", "embedding", "row_logsumexp", "scalar_params", "powers", "sigmoid",
                 "pad_stencil", "scatter_indirect", "upsample_pad_div", "exp_log"]


@pytest.mark.parametrize("case_id", FLOAT32_CASES)
def test_float32_kernels_match_naive(case_id: str):
    for label, step, env in kernel_runs(CASES_BY_ID[case_id], np.float32):
        got = run_julia(step, env)
        assert got.dtype == np.float32, label
        assert_close(got, naive_eval(step, env), np.float32)


# One case per construct class: tiling, reductions, logsumexp, pad guards and solved strides, indirect
# gather and scatter, mod/clamp, scalar results and parameters, finalisers, '=' and '+='.
NUMBA_CASES = ["dist", "conv1d", "strided", "embedding", "row_max", "row_logsumexp", "scalar_params",
               "circular_conv", "clamp_smooth", "upsample_pad_div", "assign_reduce_finaliser",
               "accumulate_matmul", "scatter_indirect", "powers"]


@pytest.mark.parametrize("case_id", NUMBA_CASES)
def test_kernels_match_the_numba_backend(case_id: str):
    for label, step, env in kernel_runs(CASES_BY_ID[case_id], np.float64):
        expected = run_numba(step, env)
        assert_close(run_julia(step, env), expected, np.float64)
        assert_close(run_julia(step, env, CUDA), expected, np.float64)


@pytest.mark.parametrize("case_id", ["matmul", "embedding"])
def test_float32_kernels_match_the_numba_backend(case_id: str):
    for label, step, env in kernel_runs(CASES_BY_ID[case_id], np.float32):
        assert_close(run_julia(step, env), run_numba(step, env), np.float32)


# ---------------------------------------------------------------------------------------------
# What the corpus does not pin down by itself
# ---------------------------------------------------------------------------------------------
def _spec_source(text: str, dtype: str = "float64", ranges=None, target: Target = CPU, **dtypes):
    spec = compile_spec(text, ranges)[1]
    signature = Signature(tuple(dtypes.get(i.name, dtype) for i in spec.inputs), dtype)
    return spec, *kernel_module(spec, signature, target)


def test_scatter_promotes_colliding_loops_to_atomic_work_items():
    spec, kernel, source = _spec_source("dW[ix[b],d] += g[b,d]", ix="int64")
    loops, _ = launch_nest(kernel)
    assert len(loops) == 2 and "Atomix.@atomic" in source
    env = {"dW": np.zeros((3, 4)), "ix": np.array([0, 2, 0, 0, 1]), "g": np.arange(20.0).reshape(5, 4)}
    expected = naive_eval(spec, env)
    np.testing.assert_array_equal(run_julia(spec, env), expected)
    # The same kernel without the atomic update is a data race between work-items b = 0, 2, 3.
    racy = load_module(source.replace("Atomix.@atomic ", ""))
    arrays, _, out = prepared(spec, env)
    args, _ = launch_arguments(kernel, spec, out, arrays)
    with pytest.raises(JuliaRuntimeError, match="data race"):
        racy.call(launcher_name(kernel), CPU_BACKEND, *args)


def test_scatter_without_a_parallel_index_runs_one_work_item_per_element():
    spec, kernel, source = _spec_source("h[ix[b]] += v[b]", ix="int32")
    loops, _ = launch_nest(kernel)
    assert [loop.var for loop in loops] == ["i0"]
    module = load_module(source)
    env = {"h": np.zeros(3), "ix": np.array([2, 2, 0, 5, -1, 2], np.int32), "v": np.arange(1.0, 7.0)}
    arrays, _, out = prepared(spec, env)
    args, _ = launch_arguments(kernel, spec, out, arrays)
    module.call("run_kernel!", CPU_BACKEND, *args)
    np.testing.assert_array_equal(out, [3.0, 0.0, 1.0 + 2.0 + 6.0])  # out-of-range positions are skipped
    assert module.launches == [("kernel!", (6,))]


def test_scalar_results_run_as_one_work_item():
    spec, kernel, source = _spec_source("s := x[i]*y[i]")
    module = load_module(source)
    env = {"x": np.arange(4.0), "y": np.ones(4)}
    arrays, _, out = prepared(spec, env)
    args, _ = launch_arguments(kernel, spec, out, arrays)
    module.call("run_kernel!", CPU_BACKEND, *args)
    assert out.shape == () and out == 6.0
    assert module.launches == [("kernel!", (1,))]


def test_an_empty_ndrange_is_not_launched():
    spec, kernel, source = _spec_source("y[i] := x[i]")
    module = load_module(source)
    out = np.zeros(0)
    args, _ = launch_arguments(kernel, spec, out, [np.zeros(0)])
    module.call("run_kernel!", CPU_BACKEND, *args)
    assert args[-1] == 0 and module.launches == []


@pytest.mark.parametrize("text, values", [
    ("y[i] := log(x[i])", [-1.0, 0.5, 0.0]),
    ("y[i] := sqrt(x[i])", [-4.0, 4.0, 0.0]),
    ("y[i] := log1p(x[i])", [-2.0, 1.0, -1.0]),
    ("y[i] := sin(x[i]) + cos(x[i]) + tan(x[i])", [math.inf, 1.0, -math.inf]),
    ("y[i] := x[i]^0.5", [-4.0, 4.0, 0.0]),
    ("y[i] := x[i]^z[i]", [-2.0, -2.0, -0.5]),
])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_real_functions_give_nan_outside_their_domain_instead_of_throwing(text, values, dtype):
    spec, kernel, source = _spec_source(text, dtype)
    env = {name: np.asarray(values, dtype) for name in spec.input_names}
    if "z" in env:
        env["z"] = np.asarray([0.5, 3.0, math.inf], dtype)
    with np.errstate(all="ignore"):
        expected = naive_eval(spec, env)
    np.testing.assert_allclose(run_julia(spec, env), expected, rtol=1e-6, equal_nan=True)


def test_integer_powers_are_exact_for_negative_bases():
    spec, kernel, source = _spec_source("y[i] := x[i]^3 + x[i]^-2", "float32")
    assert "^3" in source and "^(-2)" in source and "pow_nan" not in source
    env = {"x": np.array([-2.0, -0.5, 3.0], np.float32)}
    np.testing.assert_allclose(run_julia(spec, env), [-7.75, 3.875, 27.0 + 1 / 9], rtol=1e-6)


def test_parameters_scalars_and_layout():
    spec, kernel, source = _spec_source("y[i,j] := a*W[j,i] + b", "float32")
    assert "@kernel function kernel!(a0, @Const(a1), s0::Float64, s1::Float64, n0::Int, n1::Int)" in source
    assert "Float32(s0) * a1[i0 + 1, i1 + 1]" in source  # W[j,i] reversed: Julia W[i+1, j+1]
    env = {"a": np.float32(2.0), "W": np.arange(6, dtype=np.float32).reshape(3, 2), "b": np.float32(0.5)}
    np.testing.assert_allclose(run_julia(spec, env), 2.0 * env["W"].T + 0.5)


@pytest.mark.parametrize("value, dtype, text", [
    (1.5, "float32", "1.5f0"), (0.1, "float32", "0.1f0"), (1e-5, "float32", "1.0f-5"), (3e38, "float32", "3.0f38"),
    (-2.0, "float32", "-2.0f0"), (math.inf, "float32", "Inf32"), (-math.inf, "float64", "-Inf"),
    (math.nan, "float32", "NaN32"), (0.1, "float64", "0.1"), (1e20, "float64", "1.0e20"), (2.0, "float64", "2.0"),
])
def test_float_literals(value, dtype, text):
    assert format_float(value, dtype) == text
    module = load_module(f"module M\nfunction f()\n    return {text}\nend\nend\n")
    got = module.call("f")
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_equal(got, np.asarray(value, dtype))


def test_launch_arguments_copy_non_contiguous_output_back():
    spec, kernel, source = _spec_source("T[j,i] := A[i,j]")
    a = np.arange(6.0).reshape(2, 3)
    out = np.full((6, 2), np.nan)[::2]  # (3, 2), not contiguous
    args, copy_back = launch_arguments(kernel, spec, out, [a.T.copy().T])  # an F-ordered input gets copied
    assert copy_back is not None and args[0] is copy_back
    assert all(x.flags.c_contiguous for x in args[:2]) and args[2:] == [2, 3]
    load_module(source).call("run_kernel!", CPU_BACKEND, *args)
    out[...] = copy_back
    np.testing.assert_array_equal(out, a.T)


# ---------------------------------------------------------------------------------------------
# Layer 3: golden files
# ---------------------------------------------------------------------------------------------
GOLDEN_CASES = {  # file stem: (corpus id, flavour)
    "matmul": ("matmul", "cpu"), "matmul_cuda": ("matmul", "cuda"), "dist": ("dist", "cpu"),
    "conv1d": ("conv1d", "cpu"), "strided": ("strided", "cpu"), "embedding": ("embedding", "cpu"),
    "row_max": ("row_max", "cpu"), "row_logsumexp": ("row_logsumexp", "cpu"),
    "scalar_params": ("scalar_params", "cpu"), "scatter_indirect": ("scatter_indirect", "cpu"),
    "powers": ("powers", "cpu"),
}


@pytest.mark.parametrize("stem", sorted(GOLDEN_CASES))
def test_golden(stem: str):
    case_id, flavour = GOLDEN_CASES[stem]
    source = module_source(analysed(CASES_BY_ID[case_id]), "float32", target=TARGETS[flavour])
    path = GOLDEN / f"{stem}.jl"
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    assert path.exists(), f"missing golden file {path}: run with TULLAX_UPDATE_GOLDEN=1"
    assert source == path.read_text(), (
        f"the generated Julia for {stem} changed; review it against the KernelAbstractions 0.9 API and "
        "regenerate with TULLAX_UPDATE_GOLDEN=1")


def test_golden_files_parse_and_load():
    for path in sorted(GOLDEN.glob("*.jl")):
        assert path.stem in GOLDEN_CASES, f"stale golden file {path.name}"
        assert parse_errors(path.read_text()) == []
        load_module(path.read_text())
