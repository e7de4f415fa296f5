"""The GPU forms of recurrences (issue 48): a lane-wise state runs a thread per lane walking ``t``; a state that
mixes its lanes (an Elman RNN, a second-order mixing recurrence) runs a block per batch row with a barrier per
step, the state rows in shared memory (``tullax.compiler.scan_block``). Printed as CUDA C and run by the host
harness (thread sanitizer; a removed per-step barrier is caught), and printed for KernelAbstractions on a GPU and
run by the Julia-subset evaluator, forward and gradients, against ``lax.scan`` oracles (``jax.grad`` of them).

Cost: one g++ build of 12 small kernels and one of a kernel with its barrier removed (~25 s with the sanitizer);
the evaluator interprets the same launches at rows of 6."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cuda_harness import GPP, assert_race_is_caught, build, run
from scan_cases import CASES
from test_cuda_host import launch_for

from tullax.backends.base import Signature
from tullax.backends.cuda.launch import device_lowering
from tullax.compiler.loops import Barrier, Loop, Shared, parallel_nest, walk_stmts
from tullax.grad import gradients
from tullax.grad.run import gradient_env, run_gradient
from tullax.printers.cuda import parameters
from tullax.spec.frontend import compile_spec

BY_NAME = {case.name: case for case in CASES}
SECOND = "h[b,t,n] := A[n,m]*h[b,t-1,m] + B[n,m]*h[b,t-2,m] |> _ + x[b,t,n]  (t scan)"


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def _second(A, B, x):
    def step(carry, xt):
        older, prev = carry
        h = prev @ A.T + older @ B.T + xt
        return (prev, h), h
    zero = jnp.zeros((x.shape[0], A.shape[0]), x.dtype)
    _, hs = jax.lax.scan(step, (zero, zero), jnp.moveaxis(x, 1, 0))
    return jnp.moveaxis(hs, 0, 1)


def _problems(N=34):
    """(spec text, inputs by name, lax.scan oracle): rows of ``N`` (34: more than a warp, so in the harness's
    blocks of 32 threads two of them take two positions of the row), 2 batch rows, 5 steps."""
    rng = np.random.default_rng(3)
    B, T = 2, 5
    elman = {"W": rng.normal(size=(N, N)) / np.sqrt(N), "x": rng.normal(size=(B, T, N))}
    second = {"A": rng.normal(size=(N, N)) / (2 * np.sqrt(N)), "B": rng.normal(size=(N, N)) / (2 * np.sqrt(N)),
              "x": rng.normal(size=(B, T, N))}
    return [(BY_NAME["elman"].spec, elman, BY_NAME["elman"].oracle), (SECOND, second, _second)]


def _chain(text, env, execute):
    """The forward result and the gradient of sum(h * weight) w.r.t. every input, each kernel run by
    ``execute(step, step_env)``; and the same from jax.grad of the oracle is compared by the caller."""
    spec = compile_spec(text)[1]
    result = execute(spec, env)
    weight = np.random.default_rng(5).normal(size=np.shape(result))
    genv = gradient_env(spec, env, result, weight)
    grads = {g.wrt: run_gradient(g, spec, genv, execute) for g in gradients(spec)}
    return result, grads, weight


def _check(text, env, oracle, execute):
    got, grads, weight = _chain(text, env, execute)
    names = list(env)
    np.testing.assert_allclose(got, oracle(*env.values()), rtol=1e-10, atol=1e-10)
    want = jax.grad(lambda *a: jnp.sum(oracle(*a) * weight), tuple(range(len(names))))(*env.values())
    for name, expected in zip(names, want):
        np.testing.assert_allclose(grads[name], expected, rtol=1e-9, atol=1e-9, err_msg=name)


def _lowered(text, env):
    spec = compile_spec(text)[1]
    shapes = {n: np.shape(v) for n, v in env.items()}
    shapes[spec.out] = tuple(s.eval(shapes) for s in spec.out_shape)
    return device_lowering(spec, Signature.for_dtype(spec, "float64"), shapes, "forward")[0]


def test_a_mixing_state_is_a_block_per_row_and_a_lanewise_one_a_thread_per_lane():
    text, env, _ = _problems()[0]
    kernel = _lowered(text, env)
    assert kernel.cooperative and not kernel.warp
    loops, body = parallel_nest(kernel)
    (t_loop,) = [s for s in body if isinstance(s, Loop)]
    assert len(loops) == 1  # a block per batch row
    assert not t_loop.parallel and isinstance(t_loop.body[-1], Barrier)  # one barrier per step, at its end
    assert [s.lanes for s in t_loop.body if isinstance(s, Loop)] == [True]  # the row's positions over the threads
    (shared,) = [s for s in walk_stmts(kernel.body) if isinstance(s, Shared)]
    assert shared.length == 2 * 34  # depth + 1 rows of the state
    lru = BY_NAME["lru"]
    lam, x, h0 = lru.inputs(np.random.default_rng(0), "float64").values()
    kernel = _lowered(lru.spec, {"lam": lam, "x": x, "h0": h0})
    loops, body = parallel_nest(kernel)
    assert not kernel.cooperative and len(loops) == 2  # a thread per (b, n) lane
    assert [type(s) for s in body] == [Loop] and not body[0].parallel  # walking t


@pytest.mark.skipif(GPP is None, reason="g++ is not installed")
def test_block_per_row_scans_in_the_host_harness(tmp_path):
    """Forward and every gradient step of the Elman RNN and a second-order mixing recurrence, printed as CUDA C,
    in one build, each step on the inputs the XLA lowering of the steps before it gives; against jax.grad of
    lax.scan."""
    launches, steps = [], []

    def record(step, step_env):  # first pass: collect the launches (inputs from the XLA lowering of each step)
        from tullax.backends.xla.lower import lower as xla_lower

        launches.append(launch_for(step, step_env, f"k{len(launches)}", False))
        steps.append(step)
        return np.asarray(xla_lower(step)(step_env))

    problems = _problems()
    for text, env, _ in problems:
        _chain(text, env, record)
    # each forward and each adjoint scan a block per row; the other gradient steps a thread per element
    assert [launch.kernel.cooperative for launch in launches] == [step.scan is not None for step in steps]
    exe = build([(launch.kernel, launch.index_bits) for launch in launches], tmp_path)
    outputs = iter(run(exe, list(enumerate(launches))))
    got = {id(step): next(outputs) for step in steps}
    order = iter(steps)

    def harness(step, step_env):  # second pass: the same steps, in the same order, the harness's results
        return got[id(next(order))]

    for text, env, oracle in problems:
        _check(text, env, oracle, harness)


@pytest.mark.skipif(GPP is None, reason="g++ is not installed")
def test_a_missing_step_barrier_is_caught(tmp_path):
    text, env, oracle = _problems()[0]
    spec = compile_spec(text)[1]
    env = {"W": env["W"], "x": np.random.default_rng(8).normal(size=(6, 8, 34))}
    launch = launch_for(spec, env, "racy", False)
    assert launch.kernel.cooperative

    def drop(source: str) -> str:
        head, kernel = source.split("// racy: ", 1)
        assert kernel.count("__syncthreads();") == 1
        return head + "// racy: " + kernel.replace("__syncthreads();", "")

    exe = build([(launch.kernel, launch.index_bits)], tmp_path, edit=drop)
    assert_race_is_caught(exe, launch, np.asarray(oracle(*env.values())), "a scan step")


def run_in_julia_subset(julia_subset, step, step_env, name: str):
    """(the result, the kernel) of ``step`` on ``step_env``: the kernel the cuda backend launches for these shapes,
    printed for KernelAbstractions on a GPU and run by the Julia-subset evaluator."""
    from tullax.printers.julia import GPU_FLAVOUR, launcher_name, print_module

    launch = launch_for(step, step_env, name, False)
    kernel = launch.kernel
    args = []
    for param, value in zip(parameters(kernel, launch.index_bits), launch.arguments):
        if param.kind == "array":
            args.append(value)
        elif param.kind == "scalar":
            args.append(np.asarray(value).item())
        elif param.kind == "size":
            args.append(int(value))
    julia_subset.load_module(print_module([kernel], flavour=GPU_FLAVOUR)).call(
        launcher_name(kernel), julia_subset.CPU_BACKEND, *args)
    return args[0], kernel


def test_block_per_row_scans_in_the_julia_subset():
    """The same kernels printed for KernelAbstractions on a GPU (work-groups, @localmem, @synchronize), run by
    the Julia-subset evaluator: forward and gradients against jax.grad of lax.scan."""
    julia_subset = pytest.importorskip("julia_subset")
    seen = []

    def julia(step, step_env):
        result, kernel = run_in_julia_subset(julia_subset, step, step_env, f"k{len(seen)}")
        seen.append(kernel.cooperative == (step.scan is not None))
        return result

    for text, env, oracle in _problems(N=6):  # a work-group is 256 work-items whatever N: rows of 6 suffice
        _check(text, env, oracle, julia)
    assert len(seen) == 12 and all(seen)
