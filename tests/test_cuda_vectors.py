"""Vector lanes of elementwise kernels (``tullax.compiler.vectorize``) in the printed CUDA: run on the CPU by the
host harness against NumPy float64 (aligned vector path, the scalar fallback forced, ragged extents that stay
scalar, NaN and infinities), the memory-traffic tracer's requests per element, NVRTC's SASS (128-bit global
loads and stores), and the Julia GPU flavour through the subset evaluator.

Cost: two g++ harness builds of about a dozen small kernels, one tracer build, one NVRTC compile per
architecture."""
from __future__ import annotations

import re
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from cuda_harness import GPP, build, run
from test_cuda_host import TOL, launch_for

from tullax.compiler.loops import ALIGNED, VectorLoad, VectorStore, walk_stmts
from tullax.compiler.vectorize import ENV
from tullax.spec.examples import random_inputs
from tullax.spec.frontend import compile_spec
from tullax.testing.oracle import naive_eval

pytestmark = pytest.mark.skipif(GPP is None, reason="g++ is not installed")

# (spec, shapes, vectorised): the last axis a multiple of 4 vectorises (float64: of 2), a ragged one does not
CASES = (
    ("y[i,j] := exp(x[i,j]) * b[j] + 2", {"x": (5, 16), "b": (16,)}, True),
    ("y[i,j] := x[i,j] * b[i] - x[i,j]", {"x": (3, 8), "b": (3,)}, True),
    ("y[i] := tanh(x[i]) + x[i]^2", {"x": (12,)}, True),
    ("y[i,j] := max(x[i,j], z[i,j])", {"x": (4, 12), "z": (4, 12)}, True),
    ("y[i,j] := exp(x[i,j]) * b[j] + 2", {"x": (5, 13), "b": (13,)}, False),  # ragged: 13 columns
    ("y[i,j] := x[pad(i+1),j] * 2", {"x": (4, 8)}, False),  # a checked read: never read ahead of its check
    ("y[i,j] := x[i,pad(j+1)] * 2", {"x": (4, 8)}, False),  # a run starting at j+1 is not aligned
    # a gather whose row is contiguous (the embedding): ix[b] read once per run, checked, then a vector of W's row
    ("y[b,d] := W[ix[b],d]", {"W": (6, 8), "ix": (5,)}, True),
)


def jobs_for(dtype):
    jobs = []
    for n, (text, shapes, expected) in enumerate(CASES):
        spec = compile_spec(text)[1]
        env = random_inputs(spec, shapes, seed=n, dtype=dtype)
        first = env[spec.input_names[0]]
        first.flat[0], first.flat[-1] = np.nan, np.inf  # special values pass through the lanes
        if first.size > 5:
            first.flat[5] = -np.inf
        oracle = naive_eval(spec, env)
        if "ix" in env:  # past the end and negative: a row of NaN (the checked read's else, a vector of NaN too)
            env["ix"][1], env["ix"][3] = 6, -1
            oracle = np.array(oracle, np.float64)
            oracle[[1, 3]] = np.nan
        launch = launch_for(spec, env, f"v{np.dtype(dtype).itemsize}_{n}", False)
        jobs.append((text, launch, oracle, expected))
        if "ix" in env:  # the benchmark's int64 indices: declared in their own type, compared before narrowing
            env = {**env, "ix": env["ix"].astype(np.int64)}
            launch = launch_for(spec, env, f"v{np.dtype(dtype).itemsize}_{n}_wide", False)
            assert launch.index_bits == 32
            jobs.append((text + " int64", launch, oracle, expected))
    return jobs


JOBS = [(dtype, *job) for dtype in (np.float32, np.float64) for job in jobs_for(dtype)]


def check(jobs, outputs):
    for (dtype, text, _, expected, _), got in zip(jobs, outputs, strict=True):
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(expected, np.float64), rtol=TOL[dtype],
                                   atol=TOL[dtype], equal_nan=True, err_msg=f"{text} {np.dtype(dtype).name}")


def test_the_schedule_picks_vector_lanes_where_the_extents_allow():
    for dtype, text, launch, _, expected in JOBS:
        kernel = launch.kernel
        assert bool(kernel.vector) == expected, (text, dtype)
        if expected:
            assert kernel.vector == 16 // np.dtype(dtype).itemsize
            stmts = list(walk_stmts(kernel.body))
            # one vector store, the gather's two: under its index check and in its else (a vector of NaN)
            assert sum(isinstance(s, VectorStore) for s in stmts) == (2 if "ix" in text else 1)
            assert all(len(s.vars) == kernel.vector for s in stmts if isinstance(s, VectorLoad))


def test_the_gather_reads_its_row_index_once_per_run():
    """``y[b,d] := W[ix[b],d]``: ix[b] is read once before the lanes (not once per element), the vector read of
    W's row stands under the check of ix[b] against W's rows."""
    from tullax.compiler.loops import If, Let, Load

    kernel = next(launch.kernel for _, text, launch, _, _ in JOBS if text.startswith("y[b,d]"))
    stmts = list(walk_stmts(kernel.body))
    index_reads = [s for s in stmts if isinstance(s, Let) and any(
        isinstance(e, Load) and e.dtype.startswith("int") for e in _walk(s.value))]
    assert len(index_reads) == 1
    checked = next(s for s in stmts if isinstance(s, If) and isinstance(s.then[0], VectorLoad))
    assert checked.then[0].array == "a1" and "n0" in str(checked.cond)


def _walk(expr):
    from tullax.compiler.loops import walk_expr

    return list(walk_expr(expr))


def test_the_setting_turns_them_off(monkeypatch):
    monkeypatch.setenv(ENV, "0")
    text, shapes, _ = CASES[0]
    spec = compile_spec(text)[1]
    assert not launch_for(spec, random_inputs(spec, shapes, seed=0), "v", False).kernel.vector


@pytest.mark.parametrize("forced", [False, True], ids=["aligned", "scalar-fallback"])
def test_vector_lanes_equal_numpy_float64(tmp_path, forced):
    """Every case in both precisions; ``forced``: the kernel's alignment test edited to false, so the scalar
    lanes of the fallback run."""
    edit = (lambda source: re.sub(rf"const bool {ALIGNED} = [^;]*;", f"const bool {ALIGNED} = false;", source)) \
        if forced else None
    kernels = [(launch.kernel, launch.index_bits) for _, _, launch, _, _ in JOBS]
    exe = build(kernels, tmp_path, edit=edit, sanitize=False)
    check(JOBS, run(exe, [(n, launch) for n, (_, _, launch, _, _) in enumerate(JOBS)]))


def test_the_tracer_counts_a_quarter_of_the_requests(monkeypatch):
    """One warp of ``y[i,j] := exp(x[i,j]) * b[j] + 2`` over 64 x 256 float32: per output element a quarter of
    the global load requests of the scalar kernel, each of 16 bytes per lane: 4 sectors per warp request, the
    ideal of a warp reading 512 contiguous bytes."""
    from cuda_trace import trace

    from tullax.backends.cuda.launch import plan_launch

    spec = compile_spec(CASES[0][0])[1]
    env = random_inputs(spec, {"x": (64, 256), "b": (256,)}, seed=0, dtype=np.float32)
    counted = {}
    for on in ("1", "0"):
        monkeypatch.setenv(ENV, on)
        launch = launch_for(spec, env, "v", False)
        shapes = {"x": (64, 256), "b": (256,), spec.out: (64, 256)}
        plan = plan_launch(launch.kernel, spec, shapes, "float32")
        (counted[on],) = trace([(launch, plan.grid, plan.block)])
    vector, scalar = counted["1"], counted["0"]
    assert vector.threads == scalar.threads == 32
    # one request per input per warp either way, but the vector warp's covers 4 x 32 elements, not 32: per element
    # a quarter of the requests, and the same sectors (16 per x request of 512 bytes, 4 of 128)
    assert vector.requests == scalar.requests == 2
    assert vector.array("x").sectors == 16 and scalar.array("x").sectors == 4
    assert vector.sectors / (32 * 4) == scalar.sectors / 32


def test_the_julia_gpu_flavour_prints_them():
    julia_subset = pytest.importorskip("julia_subset")
    from test_julia_groups import julia_run

    del julia_subset
    for dtype, text, launch, expected, vectorised in JOBS:
        if vectorised:
            got = julia_run(launch)
            np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(expected, np.float64),
                                       rtol=TOL[dtype], atol=TOL[dtype], equal_nan=True, err_msg=text)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_sass_reads_and_writes_128_bits(arch, tmp_path):
    from test_cuda_compile import CUOBJDUMP, NVDISASM, NVRTC_MISSING

    if NVRTC_MISSING or CUOBJDUMP is None or NVDISASM is None:
        pytest.skip("NVRTC, cuobjdump or nvdisasm is missing")
    from tullax.backends.cuda import compile as cuda_compile
    from tullax.printers.cuda import print_module

    kernels = [(replace(launch.kernel, name=f"vec{n}"), launch.index_bits)
               for n, (_, text, launch, _, vectorised) in enumerate(JOBS)
               if vectorised and (text.startswith('y[i,j] := exp') or 'ix' in text)]
    assert len(kernels) == 6
    image, report = cuda_compile.compile_with_report(print_module(kernels), arch)
    assert "0 bytes spill stores" in report
    path = tmp_path / "vec.cubin"
    path.write_bytes(image)
    sass = subprocess.run([CUOBJDUMP, "-sass", str(path)], capture_output=True, text=True, check=True,
                          env={"PATH": str(Path(NVDISASM).parent)}).stdout
    bodies = dict(re.findall(r"Function : (\w+)\n(.*?)(?=\n\s*Function : |\Z)", sass, re.S))
    assert len(bodies) == 6
    for name, body in bodies.items():
        assert re.search(r"\bLDG\.E\.128", body) and re.search(r"\bSTG\.E\.128", body), name
