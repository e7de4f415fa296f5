"""Shared-memory window tiles (``tullax.compiler.window_tiles``: implicit GEMM for windowed reads) in the printed
CUDA, run on the CPU by the host harness (one OS thread per GPU thread of a block) against NumPy float64
(``naive_eval``): valid, padded ("same") and strided 2-D convolutions, forward and both gradients, each with
small tiles (one block per tile; and split-K, blocks adding into a zeroed output), under the thread sanitizer
where it runs, with a barrier removed (caught), and the memory-traffic tracer's counts at the GPU benchmark's
conv2d shapes (tests/trace_cases.py): every global load coalesced, far fewer loads per output.

Cost: one g++ build of about 30 small launches, one sanitizer build of 4, one small racy build, one tracer
build of the three conv2d kernels before and after (block 0 each)."""
from __future__ import annotations

import numpy as np
import pytest
from cuda_harness import GPP, assert_race_is_caught, build, run, sanitizer_works
from cuda_trace import trace
from test_cuda_host import TOL, launch_for
from trace_cases import CASES, launches, step_shapes

from tullax.backends.cuda.estimate import estimate
from tullax.backends.cuda.launch import size_values
from tullax.backends.host import kernel_steps
from tullax.compiler.loops import BlockTile, Shared, walk_stmts
from tullax.compiler.tiles import TilePolicy
from tullax.spec.examples import random_inputs
from tullax.spec.frontend import compile_spec
from tullax.testing.oracle import naive_eval

pytestmark = pytest.mark.skipif(GPP is None, reason="g++ is not installed")

# small tiles: 16 threads, every kernel tiles; WHOLE never splits the reduction over blocks, SPLIT always does
WHOLE = TilePolicy(BlockTile(8, 8, 2, 2, 4), min_outputs=1, min_length=1, min_blocks=1)
SPLIT = TilePolicy(BlockTile(8, 8, 2, 2, 4), min_outputs=1, min_length=1, min_blocks=1 << 20)
CONVS = (
    ("valid", "y[n,o,h,w] := x[n,c,h+p,w+q]*k[o,c,p,q]", {"x": (2, 10, 7, 11), "k": (5, 10, 3, 3)}),
    ("same", "y[n,o,h,w] := x[n,c,pad(h+p-1),pad(w+q-1)]*k[o,c,p,q]  (h in 0:size(x,2))  (w in 0:size(x,3))",
     {"x": (2, 9, 6, 9), "k": (4, 9, 3, 3)}),
    ("strided", "y[n,o,h,w] := x[n,c,2h+p,2w+q]*k[o,c,p,q]", {"x": (1, 9, 9, 13), "k": (3, 9, 3, 3)}),
)


def steps(text: str, shapes: dict, dtype) -> list[tuple[str, object, dict]]:
    """The forward and every gradient step of ``text`` with inputs for ``shapes``."""
    forward = compile_spec(text)[1]
    out, full = [], dict(shapes)
    for number, step in enumerate(kernel_steps(forward, np.dtype(dtype).name)):
        step_shapes = {}
        for name in step.spec.input_names:
            base = name[1:] if name.startswith("Δ") and name not in full else name
            step_shapes[name] = full[base]
        full[step.spec.out] = tuple(s.eval(step_shapes) for s in step.spec.out_shape)
        out.append((step.label, step.spec, random_inputs(step.spec, step_shapes, seed=number + 3, dtype=dtype)))
    return out


def collect():
    jobs = []
    for name, text, shapes in CONVS:
        for policy_name, policy in (("whole", WHOLE), ("split", SPLIT)):
            for dtype in (np.float32, np.float64):
                for label, spec, env in steps(text, shapes, dtype):
                    launch = launch_for(spec, env, f"k{len(jobs)}", False, tiles=policy)
                    jobs.append((f"{name} {policy_name} {np.dtype(dtype).name}: {label}", launch,
                                 naive_eval(spec, env), dtype))
    # the default policy (128-thread blocks, one 32 x 64 tile each) over ragged edges; the kernel gradient's few
    # blocks split its reduction
    for label, spec, env in steps(CONVS[0][1], {"x": (2, 8, 10, 70), "k": (8, 8, 3, 3)}, np.float32):
        launch = launch_for(spec, env, f"k{len(jobs)}", False)
        jobs.append((f"valid default float32: {label}", launch, naive_eval(spec, env), np.float32))
    return jobs


@pytest.fixture(scope="module")
def jobs():
    return collect()


def check(jobs, outputs):
    for (label, _, expected, dtype), got in zip(jobs, outputs, strict=True):
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(expected, np.float64),
                                   rtol=TOL[dtype], atol=TOL[dtype], equal_nan=True, err_msg=label)


def test_every_convolution_kernel_takes_window_tiles(jobs):
    for label, launch, _, _ in jobs:
        kernel = launch.kernel
        if label.startswith("strided") and label.endswith("gradient wrt x"):
            # Δy[n,o,pad((m-p)/2),...]: a division, not a window; one thread per element (or register tile)
            assert kernel.tile is None, label
            continue
        if label == "valid default float32: gradient wrt k":  # 576 outputs: below the policy's 4096, split sums
            assert kernel.tile is None and kernel.split, label
            continue
        assert kernel.tile is not None, label
        if " whole " in label:
            assert not kernel.split, label
        elif " split " in label and not label.startswith("strided") and not label.endswith("gradient wrt x"):
            assert kernel.split, label  # (the input gradient's o, 5, and the strided kernel's windows: one chunk)


def test_window_tiles_equal_numpy_float64(jobs, tmp_path):
    exe = build([(launch.kernel, launch.index_bits) for _, launch, _, _ in jobs], tmp_path)
    check(jobs, run(exe, list(enumerate(launch for _, launch, _, _ in jobs))))


@pytest.mark.skipif(not sanitizer_works(), reason="the thread sanitizer does not run here")
def test_under_the_sanitizer(jobs, tmp_path):
    chosen = [job for job in jobs if job[0].startswith(("valid whole float64", "same split float64: gradient wrt k"))]
    assert len(chosen) == 4
    exe = build([(launch.kernel, launch.index_bits) for _, launch, _, _ in chosen], tmp_path, sanitize=True)
    check(chosen, run(exe, list(enumerate(launch for _, launch, _, _ in chosen))))


def test_the_halo_is_staged():
    """The forward's x patch is the output tile plus the window (a T_h + 2 by T_w + 2 patch per channel of the
    chunk), k's the whole 3 x 3 window: Shared arrays of those lengths are IR data."""
    _, spec, env = steps(*CONVS[0][1:], np.float32)[0]
    kernel = launch_for(spec, env, "k", False, tiles=WHOLE).kernel
    lengths = sorted(s.length for s in walk_stmts(kernel.body) if isinstance(s, Shared))
    # side o: its 5 outputs; side (n, h, w): w 8 wide, h 1; chunk: q 3, p 3 (a small window whole), c 1; a patch
    # row of even width padded by one (rows start in different banks)
    assert lengths == [1 * 1 * (1 + 2) * (8 + 2 + 1), 5 * 1 * 3 * 3]


def test_a_missing_barrier_is_caught(tmp_path):
    """Without the barrier after the copies threads read patches not yet staged: the sanitizer or the result
    says so."""
    _, spec, env = steps(*CONVS[0][1:], np.float64)[0]
    launch = launch_for(spec, env, "racy", False, tiles=WHOLE)

    def drop(source: str) -> str:
        head, rest = source.split('extern "C"', 1)
        return head + 'extern "C"' + rest.replace("__syncthreads();\n", "\n", 1)

    exe = build([(launch.kernel, launch.index_bits)], tmp_path, edit=drop)
    assert_race_is_caught(exe, launch, naive_eval(spec, env), "a window tile")


# -- the tracer at the GPU benchmark's conv2d shapes ----------------------------------------------------------
TERMS = 32 * 3 * 3  # terms per output of the forward and the input gradient (c or o, p, q)


@pytest.fixture(scope="module")
def traced():
    conv = next(case for case in CASES if case[0] == "conv2d")
    found, jobs, labels = {}, [], []
    for when, tiles in (("before", TilePolicy(min_outputs=1 << 62)), ("after", TilePolicy())):
        for label, launch, plan in launches(*conv, tiles=tiles):
            labels.append((when, label))
            jobs.append((launch, plan.grid, plan.block))
    for key, counted in zip(labels, trace(jobs, warps=None)):
        found[key] = counted
        print(key, counted.summary(), f"loads per output {counted.loads / max(counted.outputs, 1):.2f}")
    return found


@pytest.mark.parametrize("label", ["conv2d forward", "conv2d gradient wrt x", "conv2d gradient wrt k"])
def test_the_tracer_shows_conv2d_coalesced_with_fewer_loads(traced, label):
    """Every global request of the tiled kernel's block reads at most 4 sectors (the untiled kernels read up to
    9, 7 and 22), and its loads and sectors per output element fall at least tenfold."""
    before, after = traced["before", label], traced["after", label]
    assert before.outputs and after.outputs
    assert max(a.max_sectors for a in before.arrays) > 4
    assert all(a.max_sectors <= 4 for a in after.arrays)
    per_before, per_after = before.loads / before.outputs, after.loads / after.outputs
    assert per_before / per_after >= 10
    assert (before.sectors / before.outputs) / (after.sectors / after.outputs) >= 10
    if label != "conv2d gradient wrt k":  # one block holds every term of its outputs: at most 1 load per 8
        assert per_after <= TERMS / 8


@pytest.mark.parametrize("label", ["conv2d forward", "conv2d gradient wrt x", "conv2d gradient wrt k"])
def test_the_estimates_traffic_is_near_the_tracers(traced, label):
    """The roofline estimate counts a window tile's copies as its patches' elements (halo included): at most the
    tracer's sector bytes (block 0's sectors times the grid, plus the output), and at least 70% of them (patch
    rows that start mid-sector cost the tracer whole sectors)."""
    conv = next(case for case in CASES if case[0] == "conv2d")
    full = dict(conv[2])
    for step, (found, launch, plan) in zip(kernel_steps(compile_spec(conv[1])[1], "float32"), launches(*conv)):
        shapes = step_shapes(step.spec, full)
        shapes[step.spec.out] = full[step.spec.out] = tuple(s.eval(shapes) for s in step.spec.out_shape)
        if found == label:
            break
    model = estimate(launch.kernel, step.spec, shapes, plan.grid, size_values(launch.kernel, shapes)).traffic_bytes
    after = traced["after", label]
    counted = 32 * after.sectors * after.grid + 4 * np.prod(shapes[step.spec.out])
    assert 0.7 * counted <= model <= counted
