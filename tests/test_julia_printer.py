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
from julia_subset import (
    CPU_BACKEND,
    SUPPORTED_FUNCTIONS,
    JuliaRuntimeError,
    cpu_launch,
    load_module,
    parse_errors,
)

import tullax
from tullax.backends.base import Signature
from tullax.backends.julia.backend import (
    CPU,
    CUDA,
    Target,
    kernel_module,
    launch_arguments,
    module_source,
)
from tullax.errors import SpecError, TullaxError
from tullax.grad import gradients
from tullax.grad.run import gradient_env, run_gradient
from tullax.printers.julia import (
    CPU_GROUP_MAX_ITEMS,
    CPU_WORKGROUP_HELPER,
    format_float,
    helper_name,
    launcher_name,
)
from tullax.printers.launch import launch_nest
from tullax.spec import functions
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
    from tullax.backends.numba.backend import NumbaBackend

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
    assert launchers <= set(module.function_names)
    assert all("_nan_f" in name for name in helpers - {CPU_WORKGROUP_HELPER})
    # The CPU work-group helper is in a CPU module exactly when a launch uses it; never in a CUDA one.
    uses_helper = f"workgroupsize = {CPU_WORKGROUP_HELPER}(ndrange)" in source
    assert (CPU_WORKGROUP_HELPER in helpers) == uses_helper and (flavour == "cpu" or not uses_helper)
    # No @Const on the CPU: its alias scope miscompiles tiled read-modify-writes on Julia 1.11/1.12 (audit R1).
    assert flavour == "cuda" or "@Const" not in source


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


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", [name for name in functions.CALLS if functions.get(name).julia is not None])
def test_registry_julia_domains_are_where_julia_throws(name: str, dtype: str):
    """The registry's ``julia_domain`` (which calls the printer wraps in a NaN helper) against the evaluator's own
    model of Julia: the function throws DomainError exactly where the condition holds. A new registry function
    needs its Julia semantics in tests/julia_subset.py first: that model must not be read from the registry."""
    fn = functions.get(name)
    assert fn.julia in SUPPORTED_FUNCTIONS, f"add Julia's {fn.julia} to tests/julia_subset.py"
    zero, one = format_float(0.0, dtype), format_float(1.0, dtype)
    condition = "false" if fn.julia_domain is None else fn.julia_domain.format(zero=zero, one=one)
    args = ", ".join(["x"] * fn.arity)  # a function of two arguments (hypot) at x on the diagonal
    module = load_module(f"module M\nf(x) = {fn.julia}({args})\noutside(x) = {condition}\nend\n")
    for value in (-math.inf, -2.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0, math.inf, math.nan):
        x = np.dtype(dtype).type(value)
        try:
            module.call("f", x)
            throws = False
        except JuliaRuntimeError as err:
            assert "DomainError" in str(err)
            throws = True
        assert throws == module.call("outside", x), (name, dtype, value)


POW_EDGE_BASES = [-math.inf, -3.0, -2.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0, 3.0, math.inf, math.nan]
POW_EDGE_EXPONENTS = [-math.inf, -3.0, -2.5, -2.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0, 2.5, 3.0, math.inf, math.nan]


def same_bits(got: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Elementwise: both NaN, or equal with the same sign (+0 and -0 differ)."""
    return np.where(np.isnan(expected), np.isnan(got), (got == expected) & (np.signbit(got) == np.signbit(expected)))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_pow_helper_matches_xla_on_every_edge_value(dtype: str):
    """XLA, tullax's reference, follows IEEE pow: a negative base with a non-integer exponent is NaN when both are
    finite, |x|^y when one is infinite ((-Inf)^0.5 is Inf, (-Inf)^-0.5 is 0). Every pair, bit for bit (the sign
    of a zero included), through the printed helper as the evaluator runs it with Julia's ``^``."""
    import jax
    import jax.numpy as jnp

    name = helper_name("pow", dtype)
    spec, kernel, source = _spec_source("y[i] := x[i]^z[i]", dtype)
    assert f"{name}(a1[i0 + 1], a2[i0 + 1])" in source
    module = evaluator_module(source)
    pairs = [(x, y) for x in POW_EDGE_BASES for y in POW_EDGE_EXPONENTS]
    x, z = (np.array(column, dtype) for column in zip(*pairs))
    with jax.enable_x64(True):
        expected = np.asarray(jnp.power(jnp.asarray(x), jnp.asarray(z)))
    got = np.array([module.call(name, a, b) for a, b in zip(x, z)], dtype)
    same = same_bits(got, expected)
    assert same.all(), [(a, b, g, e) for a, b, g, e, ok in zip(x, z, got, expected, same) if not ok]
    np.testing.assert_array_equal(run_julia(spec, {"x": x, "z": z}), got)  # the kernel calls the helper


def test_integer_powers_are_exact_for_negative_bases():
    spec, kernel, source = _spec_source("y[i] := x[i]^3 + x[i]^-2", "float32")
    assert "^3" in source and "^(-2)" in source and "pow_nan" not in source
    env = {"x": np.array([-2.0, -0.5, 3.0], np.float32)}
    np.testing.assert_allclose(run_julia(spec, env), [-7.75, 3.875, 27.0 + 1 / 9], rtol=1e-6)


def test_parameters_scalars_and_layout():
    spec, kernel, source = _spec_source("y[i,j] := a*W[j,i] + b", "float32")
    assert "@kernel function kernel!(a0, a1, s0::Float64, s1::Float64, n0::Int, n1::Int)" in source
    cuda_source = _spec_source("y[i,j] := a*W[j,i] + b", "float32", target=CUDA)[2]
    assert "@kernel function kernel!(a0, @Const(a1), s0::Float64, s1::Float64, n0::Int, n1::Int)" in cuda_source
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


# ---------------------------------------------------------------------------------------------
# CPU launch geometry: every Julia thread gets work
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("nthreads", [1, 4, 16])
def test_a_tiled_kernel_with_a_small_ndrange_runs_on_every_julia_thread(nthreads: int):
    """The README benchmark's shape class: the tiled CPU ndrange is (1 tile, 1024 rows), each work-item a whole
    tile. KernelAbstractions' default work-group size makes that ONE group, so one task on one thread; the
    printed launcher's work-group size gives every thread groups."""
    spec, kernel, source = _spec_source("D[i,j] := (W[k,i] - X[k,j])^2")
    rng = np.random.default_rng(0)
    env = {"W": rng.standard_normal((2, 1024)), "X": rng.standard_normal((2, 8))}
    arrays, _, out = prepared(spec, env)
    args, _ = launch_arguments(kernel, spec, out, arrays)
    module = load_module(source, nthreads=nthreads)
    module.call(launcher_name(kernel), CPU_BACKEND, *args)
    np.testing.assert_allclose(out, naive_eval(spec, env), rtol=1e-12)
    (launch,) = module.geometry
    assert launch.ndrange == (1, 1024) and launch.tasks == nthreads and launch.groups >= nthreads
    assert cpu_launch(launch.kernel, launch.ndrange, None, nthreads).tasks == 1  # KA's default: one task


NDRANGES = [(1,), (7,), (1024,), (5000,), (10**6,), (1, 1024), (2, 1024), (3, 10**6), (1024, 1024), (1, 3, 5),
            (2, 2, 10**5), (10**4, 1, 7)]


@pytest.mark.parametrize("nthreads", [1, 2, 16, 64])
def test_cpu_workgroupsize_gives_every_thread_work_in_groups_of_at_most_1024(nthreads: int):
    module = load_module(_spec_source("y[i] := x[i]")[2], nthreads=nthreads)
    for ndrange in NDRANGES:
        launch = cpu_launch("k", ndrange, module.call(CPU_WORKGROUP_HELPER, ndrange), nthreads)
        assert launch.tasks == min(nthreads, math.prod(ndrange)), (ndrange, launch)
        assert math.prod(launch.workgroupsize) <= CPU_GROUP_MAX_ITEMS, (ndrange, launch)


def test_cuda_launches_leave_the_work_group_size_to_kernelabstractions():
    source = _spec_source("D[i,j] := (W[k,i] - X[k,j])^2", target=CUDA)[2]
    assert CPU_WORKGROUP_HELPER not in source and "forward!" not in source
    # a 2x2 register tile per work-item (tullax.compiler.jam): the ndrange counts tiles
    assert "kernel!(backend)(a0, a1, a2, n0, n1, n2; ndrange = (fld(n1 + 1, 2), fld(n2 + 1, 2)))" in source


HALVES = [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 0.49999997]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_round_is_half_to_even_in_printed_julia(dtype: str):
    """``round`` prints as Julia's round (RoundNearest: ties to the even neighbour), as NumPy's rint."""
    spec, _, source = _spec_source("y[i] := round(x[i]) + sign(x[i]) + atan(x[i], 2) + hypot(x[i], 2)", dtype)
    assert "round(" in source and "atan(" in source and "hypot(" in source
    env = {"x": np.asarray(HALVES, dtype)}
    x = env["x"].astype(np.float64)
    expected = np.rint(x) + np.sign(x) + np.arctan2(x, 2) + np.hypot(x, 2)
    np.testing.assert_allclose(run_julia(spec, env), expected, rtol=1e-6)


def test_erf_is_a_spec_error_on_julia():
    with pytest.raises(SpecError, match="erf is not supported on the Julia backends.*use backend='numba' or 'xla'"):
        _spec_source("y[i] := erf(x[i])")
