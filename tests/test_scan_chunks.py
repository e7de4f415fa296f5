"""The chunked GPU form of a linear recurrence over a long ``t`` and few lanes (issue 48,
``tullax.compiler.scan_chunks``): a block per lane, ``t`` cut into chunks over its threads, the chunk carries
composed by one thread between two barriers. Printed as CUDA C and run by the host harness (thread sanitizer; a
removed barrier is caught), printed for KernelAbstractions and run by the Julia-subset evaluator, forward and
every gradient step (the adjoint reverse scan is linear, so chunked too) against jax.grad of ``lax.scan``;
ragged ``t`` (not a multiple of the chunk), ``t`` = 1, a reverse scan, Mamba's 3 lane axes; float32 against
float64; NVRTC for sm_80/sm_90 without spills.

Cost: one g++ build of 15 distinct small kernels (13 s with the sanitizer on a loaded machine; the 40 launches
run in 8 s), most of the test's time the XLA lowering of each step and jax.grad of the oracles; one build of a
kernel with a barrier removed; one traced kernel; the evaluator interprets 8 launches at ``t`` = 13; NVRTC 4
modules of 12 kernels (slow-marked, as test_cuda_compile)."""
from __future__ import annotations

import re
from dataclasses import replace

import jax
import numpy as np
import pytest
from cuda_harness import GPP, assert_race_is_caught, build, run
from scan_cases import _lru, _lru_inputs, _mamba, _mamba_inputs, _returns_inputs
from test_cuda_host import launch_for
from test_scan_gpu import _chain, _check, run_in_julia_subset

from tullax.backends.base import Signature
from tullax.backends.cuda.launch import SCAN_CHUNKS_ENV, device_lowering
from tullax.compiler import scan_chunks
from tullax.compiler.loops import Barrier, Loop, parallel_nest
from tullax.compiler.scan_chunks import GROUP, MAX_LANES, is_chunked
from tullax.spec.frontend import compile_spec

LRU = "h[b,t,n] := lam[n]*h[b,t-1,n] + x[b,t,n]  (t scan from h0)"
RETURNS = "G[b,t] := r[b,t] + gamma[b,t]*G[b,t+1]  (t scan reverse from g0)"
MAMBA = "h[b,t,d,n] := exp(dt[b,t,d]*A[d,n])*h[b,t-1,d,n] + dt[b,t,d]*B[b,t,n]*u[b,t,d]  (t scan)"
TANH = "h[b,t,n] := tanh(lam[n]*h[b,t-1,n] + x[b,t,n])  (t scan)"
ELMAN = "h[b,t,n] := W[n,m]*h[b,t-1,m] |> tanh(_ + x[b,t,n])  (t scan)"


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


@pytest.fixture
def chunk_every_scan(monkeypatch):
    """Chunk every linear scan however short (the tests' ``t`` are small), and group lanes however few blocks
    remain (the tests' lanes are few): the LRU's 3 lanes in groups of 2 (the second ragged), Mamba's 2 in one."""
    monkeypatch.setenv(SCAN_CHUNKS_ENV, "1")
    monkeypatch.setattr(scan_chunks, "MIN_BLOCKS", 1)


def _returns(r, gamma, g0):
    def step(G, rg):
        G = rg[0] + rg[1] * G
        return G, G
    return jax.lax.scan(step, g0, (r.T, gamma.T), reverse=True)[1].T


def _problems(T: int, dtype: str = "float64"):
    """(spec text, inputs, lax.scan oracle) at ``T`` steps: a forward scan from h0, a reverse one from g0 (the
    state after the end), Mamba's."""
    rng = np.random.default_rng(T)
    returns = {**_returns_inputs(rng, dtype, B=2, T=T), "g0": rng.normal(size=2).astype(dtype)}
    return [(LRU, _lru_inputs(rng, dtype, B=2, T=T, N=3), _lru),
            (RETURNS, returns, _returns),
            (MAMBA, _mamba_inputs(rng, dtype, B=1, T=T, D=2, N=2), _mamba)]


def _lowered(text, shapes, dtype="float64"):
    spec = compile_spec(text)[1]
    shapes = dict(shapes)
    shapes[spec.out] = tuple(s.eval(shapes) for s in spec.out_shape)
    return device_lowering(spec, Signature.for_dtype(spec, dtype), shapes, "forward")[0]


_chunked = is_chunked


def test_long_linear_scans_over_few_lanes_are_chunked(monkeypatch):
    lru = {"lam": (64,), "x": (16, 4096, 64), "h0": (16, 64)}
    kernel = _lowered(LRU, lru)
    assert _chunked(kernel)
    loops, body = parallel_nest(kernel)
    assert [loop.var == GROUP for loop in loops] == [False, True]  # a block per batch row and 8 lanes of n
    passes = [s for s in body if isinstance(s, (Loop, Barrier))]
    assert [type(s) for s in passes] == [Loop, Barrier, Loop, Barrier, Loop]
    assert [s.lanes for s in passes if isinstance(s, Loop)] == [True, True, True]
    few = _lowered(LRU, {"lam": (16,), "x": (1, 4096, 16), "h0": (1, 16)})  # 16 lanes: a block each
    assert _chunked(few) and [loop.var == GROUP for loop in parallel_nest(few)[0]] == [False, False]
    assert _chunked(_lowered(RETURNS, {"r": (4, 65536), "gamma": (4, 65536), "g0": (4,)}))
    assert _chunked(_lowered(MAMBA, {"dt": (1, 2048, 4), "A": (4, 16), "B": (1, 2048, 16), "u": (1, 2048, 4)}))
    # short, many lanes, nonlinear, mixing: as before
    assert not _lowered(LRU, {"lam": (64,), "x": (16, 512, 64), "h0": (16, 64)}).cooperative
    many = MAX_LANES // 64 + 1
    assert not _lowered(LRU, {"lam": (64,), "x": (many, 4096, 64), "h0": (many, 64)}).cooperative
    assert not _lowered(TANH, {"lam": (64,), "x": (16, 4096, 64)}).cooperative
    elman = _lowered(ELMAN, {"W": (64, 64), "x": (16, 4096, 64)})
    assert elman.cooperative and not _chunked(elman)
    monkeypatch.setenv(SCAN_CHUNKS_ENV, "0")  # the setting turns it off
    assert not _lowered(LRU, lru).cooperative


def test_the_schedule_is_named_and_a_built_kernel_is_kept_per_setting(monkeypatch):
    """The cuda backend keeps built kernels per call AND per the settings that choose the schedule: a process
    that turns the chunks off (benchmarks/scan_gpu.py) gets the other kernel, not the one built before."""
    from tullax.backends.cuda.backend import table_key
    from tullax.backends.cuda.display import shaped_module_source

    spec = compile_spec(LRU)[1]
    shapes = {"lam": (4,), "x": (2, 2048, 4), "h0": (2, 4)}
    signature = Signature.for_dtype(spec, "float32")
    assert "a block per lane, the scan in chunks over its threads" in shaped_module_source(spec, signature, shapes)
    chunked = table_key(spec, signature, shapes)
    monkeypatch.setenv(SCAN_CHUNKS_ENV, "0")
    assert table_key(spec, signature, shapes) != chunked
    assert "a thread per lane walking the scan" in shaped_module_source(spec, signature, shapes)


@pytest.mark.skipif(GPP is None, reason="g++ is not installed")
def test_chunked_scans_in_the_host_harness(tmp_path, chunk_every_scan):
    """Forward and every gradient step, printed as CUDA C, in one build (each step on the inputs the XLA lowering
    of the steps before it gives); T = 37 (ragged chunks of 4), 300 (more chunks than the harness's threads, so a
    thread takes several) and 1; float64 against jax.grad of lax.scan."""
    from tullax.backends.xla.lower import lower as xla_lower

    launches, steps = [], []

    def record(step, step_env):
        launches.append(launch_for(step, step_env, f"k{len(launches)}", False))
        steps.append(step)
        return np.asarray(xla_lower(step)(step_env))

    problems = _problems(37) + _problems(300)[:1] + _problems(1)[:2]
    for text, env, _ in problems:
        _chain(text, env, record)
    # every forward and adjoint scan chunked; the other gradient steps a thread per element
    assert [_chunked(launch.kernel) for launch in launches] == [step.scan is not None for step in steps]
    grouped = [any(loop.var == GROUP for loop in parallel_nest(launch.kernel)[0]) for launch in launches]
    assert 0 < sum(grouped) < sum(map(_chunked, (launch.kernel for launch in launches)))  # LRU, Mamba; returns not
    built: dict = {}  # each distinct kernel once (the adjoint scan recurs in every input's gradient, T changes none)
    jobs = [(built.setdefault((replace(launch.kernel, name="k"), launch.index_bits), len(built)), launch)
            for launch in launches]
    exe = build([(replace(kernel, name=f"k{n}"), bits) for n, (kernel, bits) in enumerate(built)], tmp_path)
    outputs = iter(run(exe, jobs))  # the second pass runs the same steps in the same order
    for text, env, oracle in problems:
        _check(text, env, oracle, lambda step, step_env: next(outputs))


@pytest.mark.skipif(GPP is None, reason="g++ is not installed")
def test_float32_chunks_keep_the_precision_of_the_serial_scan(tmp_path):
    """T = 4096 steps of the LRU in float32 with lam within 1e-4 of 1 (a memory longer than the scan: nothing
    damps an error), chunked (lam's products over a chunk and the carries reassociated, in float64): against the
    exact recurrence of the float32 inputs its error stays within twice lax.scan's own float32 error plus 2 ulps of
    the largest |h| (with float32 carries it was 10x lax.scan's; benchmarks/scan_chunks_precision.py)."""
    rng = np.random.default_rng(11)
    env = {"lam": rng.uniform(0.9999, 1.0, 16).astype(np.float32),
           "x": rng.normal(size=(1, 4096, 16)).astype(np.float32), "h0": rng.normal(size=(1, 16)).astype(np.float32)}
    spec = compile_spec(LRU)[1]
    launch = launch_for(spec, env, "lru32", False)
    assert _chunked(launch.kernel)  # T = 4096 > the default 1024
    got = run(build([(launch.kernel, launch.index_bits)], tmp_path, sanitize=False), [(0, launch)])[0]
    lam, x, h0 = (v.astype(np.float64) for v in env.values())
    want = np.empty(x.shape)
    h = h0
    for t in range(x.shape[1]):
        h = lam * h + x[:, t]
        want[:, t] = h
    ulp = np.abs(want).max() * np.finfo(np.float32).eps
    serial = np.abs(np.asarray(_lru(*env.values()), np.float64) - want).max()
    error = np.abs(got.astype(np.float64) - want).max()
    assert error <= 2 * serial + 2 * ulp, (error / ulp, serial / ulp)


@pytest.mark.skipif(GPP is None, reason="g++ is not installed")
def test_a_missing_barrier_between_the_passes_is_caught(tmp_path, chunk_every_scan):
    spec = compile_spec(LRU)[1]
    env = _lru_inputs(np.random.default_rng(8), "float64", B=2, T=300, N=3)
    launch = launch_for(spec, env, "racy", False)
    assert _chunked(launch.kernel)

    def drop(source: str) -> str:  # the barrier before the carries are composed
        head, kernel = source.split("// racy: ", 1)
        assert kernel.count("__syncthreads();") == 2
        return head + "// racy: " + kernel.replace("__syncthreads();", "", 1)

    exe = build([(launch.kernel, launch.index_bits)], tmp_path, edit=drop)
    assert_race_is_caught(exe, launch, np.asarray(_lru(*env.values())), "a chunked scan")


def test_chunked_scans_in_the_julia_subset(chunk_every_scan):
    """The same kernels printed for KernelAbstractions on a GPU (work-groups, @localmem, @synchronize), run by
    the Julia-subset evaluator at T = 13 (chunks of 4, the last ragged): forward and gradients."""
    julia_subset = pytest.importorskip("julia_subset")
    seen = []

    def julia(step, step_env):
        result, kernel = run_in_julia_subset(julia_subset, step, step_env, f"k{len(seen)}")
        seen.append(_chunked(kernel) == (step.scan is not None))
        return result

    for text, env, oracle in _problems(13)[:2]:
        _check(text, env, oracle, julia)
    assert all(seen) and len(seen) >= 6


@pytest.mark.slow
def test_chunked_scans_compile_without_spills(chunk_every_scan):
    """NVRTC for sm_90 and sm_80, float32 and float64: every chunked forward and adjoint scan of the three
    problems, no register spill."""
    from test_cuda_compile import ARCHS, BITS, NVRTC_MISSING

    if NVRTC_MISSING:
        pytest.skip(f"NVRTC cannot be loaded: {NVRTC_MISSING}")
    from tullax.backends.cuda import compile as cuda_compile
    from tullax.backends.xla.lower import lower as xla_lower
    from tullax.printers.cuda import print_module

    for dtype in BITS:
        kernels = []

        def record(step, step_env):
            kernel = launch_for(step, step_env, f"k{len(kernels)}", False).kernel
            kernels.extend([kernel] if _chunked(kernel) else [])
            return np.asarray(xla_lower(step)(step_env))

        for text, env, _ in _problems(37, dtype):
            _chain(text, env, record)
        assert len({k.spec_text for k in kernels}) == 6  # a forward and an adjoint scan each (some adjoints twice)
        for arch in ARCHS:
            _, report = cuda_compile.compile_with_report(print_module([(k, BITS[dtype]) for k in kernels]), arch)
            spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
            assert len(spills) >= len(kernels) and all(s == ("0", "0") for s in spills), report


@pytest.mark.skipif(GPP is None, reason="g++ is not installed")
def test_grouped_lanes_read_whole_sectors():
    """The memory-traffic tracer on one warp of the LRU's chunked kernel at 1024 lanes: the 8 lanes of n a group
    holds read one 32-byte sector per chunk, so a warp request (4 chunks x 8 lanes) touches at most 4 sectors,
    every byte of them used (a block per lane: 32 sectors, one per chunk, 4 bytes of each used)."""
    from cuda_trace import trace

    from tullax.backends.cuda.launch import plan_launch

    rng = np.random.default_rng(0)
    env = {"lam": rng.uniform(0.9, 0.99, 64).astype(np.float32),
           "x": rng.normal(size=(16, 256, 64)).astype(np.float32), "h0": rng.normal(size=(16, 64)).astype(np.float32)}
    spec = compile_spec(LRU)[1]
    assert not _chunked(launch_for(spec, env, "lru", False).kernel)  # T = 256: below the default 1024 steps
    shapes = {n: np.shape(v) for n, v in env.items()}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SCAN_CHUNKS_ENV, "256")
        launch = launch_for(spec, env, "lru", False)
        plan = plan_launch(launch.kernel, spec, {**shapes, spec.out: (16, 256, 64)}, "float32")
    assert _chunked(launch.kernel) and plan.grid == 16 * 8
    (traffic,) = trace([(launch, plan.grid, plan.block)])
    x = next(a for a in traffic.arrays if a.source == "x")
    assert x.coalesced and x.max_sectors == 4, traffic.summary()
