"""The printed CUDA C, run on the CPU: every corpus kernel (forward and every gradient step, float32 and
float64) and the kernels of random specs, compiled with g++ through ``tests/cuda_host.h`` (ONE g++ build for
the module), launched with the host's own launch plan (``tullax.backends.cuda.launch``) over shuffled blocks on
several threads (under the thread sanitizer where it runs), and compared with ``tullax.testing.naive_eval``.

float32 kernels use the index width the host picks (32 bits at these sizes); float64 kernels are printed with
64-bit index arithmetic and get int64 index arrays, so both widths and both index dtypes run.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from corpus import CORPUS, Case
from cuda_harness import GPP, SPLIT_EVERYTHING, Launch, RaceError, build, run, sanitizer_works

from tullax.backends.base import Signature
from tullax.backends.cuda.launch import START_GIVEN, START_ZERO, device_lowering
from tullax.compiler.cooperate import Cooperation
from tullax.compiler.loops import Loop, Store, walk_stmts
from tullax.compiler.split import CHUNK, SplitPolicy
from tullax.compiler.tiles import TilePolicy
from tullax.errors import TullaxError
from tullax.grad import gradients
from tullax.grad.run import gradient_env, run_gradient
from tullax.printers.launch import launch_nest
from tullax.spec.arguments import as_numpy_inputs, check_call, result_dtype
from tullax.spec.examples import random_inputs, shapes_for
from tullax.spec.frontend import compile_spec
from tullax.testing.oracle import naive_eval
from tullax.testing.specgen import random_spec

pytestmark = pytest.mark.skipif(GPP is None, reason="g++ is not installed")

DTYPES = (np.float32, np.float64)
TOL = {np.float64: 1e-10, np.float32: 2e-4}
RANDOM_SPECS = 60
# Gradients that find the maximum's position by equality with the float32 result: the naive evaluator
# recomputes x*w in float64, misses the float32 tie and divides by a count of 0. Run, but not compared.
FLOAT32_TIES = ("max_all",)
NAN_CASES = ("row_max", "row_min", "max_all", "max_min_calls", "row_logsumexp", "maxpool")


def kernel_runs(spec, env, dtype) -> list[tuple[object, dict]]:
    """(step spec, its environment) for the forward kernel and every gradient step, the environments flowing
    as in ``run_gradient`` (reference results from naive_eval, in ``dtype``)."""
    runs = [(spec, env)]
    try:
        grads = gradients(spec)
    except TullaxError:
        return runs

    def reference(step, step_env):
        runs.append((step, step_env))
        return naive_result(step, step_env)

    result = naive_result(spec, env)
    cotangent = np.asarray(np.random.default_rng(7).standard_normal(result.shape)).astype(result.dtype)
    genv = gradient_env(spec, env, result, cotangent)
    for grad in grads:
        if np.issubdtype(np.asarray(env[grad.wrt]).dtype, np.inexact):
            run_gradient(grad, spec, genv, reference)
    return runs


def naive_result(step, step_env) -> np.ndarray:
    arrays = as_numpy_inputs(step, [step_env[n] for n in step.input_names])
    return naive_eval(step, step_env).astype(result_dtype(step, arrays))


def launch_for(step, env, name: str, wide: bool, policy: SplitPolicy = SplitPolicy(),
               cooperation: Cooperation = Cooperation(), tiles: TilePolicy = TilePolicy()) -> Launch:
    """The launch of ``step`` on ``env``: the kernel the cuda backend lowers for these shapes (split as
    ``policy`` says) with the arguments the host's launch plan gives (the output filled as the plan's ``start``
    says; NaN where the kernel must write)."""
    arrays = as_numpy_inputs(step, [env[n] for n in step.input_names])
    if wide:
        arrays = [a.astype(np.int64) if i.kind == "index" else a for i, a in zip(step.inputs, arrays)]
    check_call(step, arrays)
    dtype = np.dtype(result_dtype(step, arrays))
    signature = Signature(tuple(np.dtype(a.dtype).name for a in arrays), dtype.name)
    shapes = {n: np.shape(a) for n, a in zip(step.input_names, arrays)}
    shapes[step.out] = tuple(s.eval(shapes) for s in step.out_shape)
    kernel, plan = device_lowering(step, signature, shapes, name, policy, cooperation, tiles)
    if plan.start == START_GIVEN:
        out = np.array(arrays[0], dtype=dtype, copy=True)
    elif plan.start == START_ZERO:
        out = np.zeros(shapes[step.out], dtype)
    else:
        out = np.full(shapes[step.out], np.nan, dtype)
    pointers = [out if source is None else arrays[source] for source in plan.pointers]
    return Launch(kernel, 64 if wide else plan.index_bits, (*pointers, *plan.values))


def case_env(case: Case, dtype):
    spec = compile_spec(case.spec, case.ranges)[1]
    shapes = dict(case.shapes or {})
    if any(i.name not in shapes for i in spec.inputs if i.kind != "scalar"):
        shapes = {**shapes_for(spec, seed=0), **shapes}
    return spec, random_inputs(spec, shapes, seed=1, dtype=dtype)


def random_envs(count: int):
    rng = np.random.default_rng(20260511)
    found = []
    while len(found) < count:
        text = random_spec(rng)
        try:
            spec = compile_spec(text)[1]
            found.append((text, spec, random_inputs(spec, seed=len(found), dtype=np.float64)))
        except TullaxError:
            continue
    return found


def collect(policy: SplitPolicy = SplitPolicy()):
    """Every (label, launch, expected result, dtype) of the module, sums split as ``policy`` says."""
    jobs = []

    def add(label, spec, env, dtype, gradients_compared=True):
        for step, step_env in kernel_runs(spec, env, dtype):
            wide = dtype == np.float64
            launch = launch_for(step, step_env, f"k{len(jobs)}", wide, policy)
            expected = naive_eval(step, step_env) if step is spec or gradients_compared else None
            jobs.append((f"{label}: {step.out}", launch, expected, dtype))

    for dtype in DTYPES:
        for case in CORPUS:
            spec, env = case_env(case, dtype)
            compared = dtype == np.float64 or case.id not in FLOAT32_TIES
            add(f"{case.id} {np.dtype(dtype).name}", spec, env, dtype, compared)
    for case_id in NAN_CASES:  # max/min propagate NaN like jnp.maximum (fmaxf would drop it)
        for dtype in DTYPES:
            spec, env = case_env(next(c for c in CORPUS if c.id == case_id), dtype)
            x = env["x"].copy()
            x.reshape(-1)[1] = np.nan
            add(f"{case_id} with a NaN {np.dtype(dtype).name}", spec, {**env, "x": x}, dtype, False)
    for text, spec, env in random_envs(RANDOM_SPECS):
        try:
            add(text, spec, env, np.float64)
        except TullaxError as err:  # a spec the loop backends refuse (complex inputs): not a printer matter
            assert "complex" in str(err) or "loop backends" in str(err), (text, err)
    return jobs


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    jobs = collect()
    exe = build([(launch.kernel, launch.index_bits) for _, launch, _, _ in jobs], tmp_path_factory.mktemp("cuda"))
    outputs = run(exe, list(enumerate(launch for _, launch, _, _ in jobs)))
    return jobs, outputs, exe


def test_every_kernel_matches_the_naive_evaluator(results):
    jobs, outputs, _ = results
    failures = _differences(jobs, outputs)
    assert not failures, f"{len(failures)} of {len(jobs)} kernels differ:\n" + "\n".join(failures[:10])


def _differences(jobs, outputs) -> list[str]:
    failures = []
    for (label, launch, expected, dtype), got in zip(jobs, outputs):
        if expected is None:
            continue
        tol = TOL[dtype]
        try:
            np.testing.assert_allclose(got.astype(np.float64), np.asarray(expected, np.float64).real, rtol=tol,
                                       atol=tol)
        except AssertionError as err:
            failures.append(f"{label} ({launch.kernel.name}):\n{err}")
    return failures


@pytest.fixture(scope="module")
def split_results(tmp_path_factory):
    jobs = collect(SPLIT_EVERYTHING)
    exe = build([(launch.kernel, launch.index_bits) for _, launch, _, _ in jobs], tmp_path_factory.mktemp("split"))
    return jobs, run(exe, list(enumerate(launch for _, launch, _, _ in jobs)), seed=5)


def test_every_split_sum_matches_the_naive_evaluator(split_results):
    """The corpus and the random specs again, with every plain sum split over several threads per output
    element: their pieces meet in the output through atomicAdd, blocks in shuffled order on several threads."""
    jobs, outputs = split_results
    split = [launch.kernel for _, launch, _, _ in jobs if launch.kernel.split]
    assert len(split) > 300 and sum(any(isinstance(s, Loop) and s.var == CHUNK for s in walk_stmts(k.body))
                                    for k in split) > 200
    assert all(s.mode == "atomic_add" for k in split for s in walk_stmts(k.body) if isinstance(s, Store))
    failures = _differences(jobs, outputs)
    assert not failures, f"{len(failures)} of {len(jobs)} kernels differ:\n" + "\n".join(failures[:10])


def test_the_module_covers_both_index_widths_scatters_and_single_thread_kernels(results):
    jobs, _, _ = results
    kernels = [launch.kernel for _, launch, _, _ in jobs]
    assert len(jobs) > 400
    assert {launch.index_bits for _, launch, _, _ in jobs} == {32, 64}
    assert any(isinstance(s, Store) and s.mode == "atomic_add" for k in kernels for s in walk_stmts(k.body))
    assert any(not launch_nest(k)[0] for k in kernels)  # one-thread kernels


@pytest.mark.skipif(not sanitizer_works(), reason="g++'s thread sanitizer does not run on this machine")
def test_a_scatter_without_its_atomic_is_caught_as_a_race(tmp_path):
    spec, env = case_env(next(c for c in CORPUS if c.id == "scatter_indirect"), np.float64)
    env["ix"] = np.zeros_like(env["ix"])  # every element adds into h[0]
    launch = launch_for(spec, env, "racy", wide=False)

    def plain(stmts):
        return tuple(_plain_store(s, plain) for s in stmts)

    racy = replace(launch.kernel, body=plain(launch.kernel.body))
    exe = build([(racy, launch.index_bits)], tmp_path)
    with pytest.raises(RaceError):
        run(exe, [(0, replace(launch, kernel=racy))])
    exe = build([(launch.kernel, launch.index_bits)], tmp_path)
    (got,) = run(exe, [(0, launch)])
    np.testing.assert_allclose(got, naive_eval(spec, env))


@pytest.mark.skipif(not sanitizer_works(), reason="g++'s thread sanitizer does not run on this machine")
def test_a_split_sum_without_its_atomic_is_caught_as_a_race(tmp_path):
    spec, env = case_env(next(c for c in CORPUS if c.id == "conv1d"), np.float64)
    grad = next(step for g in gradients(spec) if g.wrt == "w" for step in g.steps)
    genv = gradient_env(spec, env, naive_result(spec, env), np.ones_like(naive_result(spec, env)))
    launch = launch_for(grad, genv, "split", wide=False, policy=SPLIT_EVERYTHING)
    assert launch.kernel.split

    def plain(stmts):
        return tuple(_plain_store(s, plain) for s in stmts)

    racy = replace(launch.kernel, body=plain(launch.kernel.body))
    with pytest.raises(RaceError):
        run(build([(racy, launch.index_bits)], tmp_path), [(0, replace(launch, kernel=racy))])


def _plain_store(stmt, plain):
    if isinstance(stmt, Store) and stmt.mode == "atomic_add":
        return replace(stmt, mode="add")
    if hasattr(stmt, "body"):
        return replace(stmt, body=plain(stmt.body))
    if hasattr(stmt, "then"):
        return replace(stmt, then=plain(stmt.then), orelse=plain(stmt.orelse))
    return stmt
