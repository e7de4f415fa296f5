"""Shared-memory block tiles (``tullax.compiler.tiles``) in the printed CUDA, run on the CPU by the host harness
with one OS thread per GPU thread of a block (``__syncthreads`` a barrier, shared memory one buffer per block,
under the thread sanitizer where it runs): every corpus kernel the stage accepts, forced with small tiles,
against NumPy float64 (``naive_eval``); ragged edges at the default 64 x 64 tiles; a barrier removed must fail;
and the memory-traffic tracer's counts before and after: global loads and sectors per output element.

Cost: ONE g++ build for every tiled kernel (about 40 launches), one more under the sanitizer, two small
tracer builds."""
from __future__ import annotations

import numpy as np
import pytest
from corpus import CORPUS
from cuda_harness import GPP, assert_race_is_caught, build, run, sanitizer_works
from cuda_trace import trace
from test_cuda_host import DTYPES, TOL, case_env, kernel_runs, launch_for
from trace_cases import launches, step_shapes

from tullax.backends.cuda.estimate import estimate
from tullax.backends.cuda.launch import size_values
from tullax.backends.cuda.tile_sizes import TILE_SIZES
from tullax.backends.host import kernel_steps
from tullax.compiler.loops import THREAD, Barrier, Shared, VectorLoad, walk_stmts
from tullax.compiler.tiles import FORCE_TILES, TilePolicy, vector_lanes
from tullax.spec.examples import random_inputs
from tullax.spec.frontend import compile_spec
from tullax.testing.oracle import naive_eval

pytestmark = pytest.mark.skipif(GPP is None, reason="g++ is not installed")

NEVER = TilePolicy(min_outputs=1 << 62)  # the schedule before the tiles: one thread per register tile
# the corpus cases whose every kernel (forward and gradients) must tile: matmul-like by construction
EXPECTED = ("matmul", "dist", "matmul_bias", "accumulate_matmul")
RAGGED = (("Dist", "D[i,j] := (W[k,i]-X[k,j])^2"), ("Linear", "C[i,j] := W[k,i]*X[k,j]"))


def collect():
    jobs = []
    for dtype in DTYPES:
        for case in CORPUS:
            spec, env = case_env(case, dtype)
            for step, step_env in kernel_runs(spec, env, dtype):
                launch = launch_for(step, step_env, f"k{len(jobs)}", False, tiles=FORCE_TILES)
                if launch.kernel.tile is not None:
                    jobs.append((f"{case.id} {np.dtype(dtype).name}: {step.out}", launch,
                                 naive_eval(step, step_env), dtype))
    # the default 64 x 64 tiles over ragged edges: 70 = 64 + 6 rows, 65 = 64 + 1 columns, 70 = 4 x 16 + 6 steps
    for name, text in RAGGED:
        spec = compile_spec(text)[1]
        env = random_inputs(spec, {"W": (70, 70), "X": (70, 65)}, seed=2, dtype=np.float64)
        launch = launch_for(spec, env, f"k{len(jobs)}", False)
        assert launch.kernel.tile is not None and launch.kernel.tile.threads == 256
        jobs.append((f"{name} ragged 64x64 float64", launch, naive_eval(spec, env), np.float64))
    # each other architecture's tile of the table (tullax.backends.cuda.tile_sizes) over ragged edges of its own
    spec = compile_spec(RAGGED[0][1])[1]
    for tile in sorted(set(TILE_SIZES.values()) - {TilePolicy().tile}, key=str):
        env = random_inputs(spec, {"W": (70, tile.rows + 2), "X": (70, tile.cols + 1)}, seed=3, dtype=np.float64)
        launch = launch_for(spec, env, f"k{len(jobs)}", False, tiles=TilePolicy(tile))
        assert launch.kernel.tile == tile
        jobs.append((f"Dist ragged {tile.rows}x{tile.cols} float64", launch, naive_eval(spec, env), np.float64))
    return jobs


def build_and_run(jobs, directory, sanitize: bool):
    exe = build([(launch.kernel, launch.index_bits) for _, launch, _, _ in jobs], directory, sanitize=sanitize)
    return run(exe, list(enumerate(launch for _, launch, _, _ in jobs)))


def check(jobs, outputs):
    for (label, _, expected, dtype), got in zip(jobs, outputs, strict=True):
        expected = np.asarray(expected, dtype=np.float64)
        got = np.asarray(got, dtype=np.float64)
        assert got.shape == expected.shape, label
        np.testing.assert_allclose(got, expected, rtol=TOL[dtype], atol=TOL[dtype], equal_nan=True, err_msg=label)


@pytest.fixture(scope="module")
def jobs():
    return collect()


@pytest.fixture(scope="module")
def results(jobs, tmp_path_factory):
    """Every job in one build, without the sanitizer (``test_under_the_sanitizer`` runs a part with it)."""
    return jobs, build_and_run(jobs, tmp_path_factory.mktemp("tiles"), sanitize=False)


def test_the_matmul_like_kernels_of_the_corpus_tile(jobs):
    found = {(label.split(" ")[0], label.split(": ")[1]) for label, _, _, _ in jobs if ": " in label}
    for case in EXPECTED:
        outs = {out for name, out in found if name == case}
        assert len(outs) == 3, (case, outs)  # the forward and both gradients
    assert len(jobs) >= 30


@pytest.mark.parametrize("case", EXPECTED + ("bias_after_reduction", "ragged", "conv2d_nchw", "batched_matmul"))
def test_tiled_kernels_equal_numpy_float64(results, case):
    """Each tiled kernel of ``case`` (float32 and float64) against NumPy float64 loops."""
    jobs, outputs = results
    chosen = [(job, out) for job, out in zip(jobs, outputs) if job[0].split(" ")[0] == case or case in job[0]]
    assert chosen
    check([job for job, _ in chosen], [out for _, out in chosen])


@pytest.mark.skipif(not sanitizer_works(), reason="the thread sanitizer does not run here")
def test_under_the_sanitizer(jobs, tmp_path):
    chosen = [job for job in jobs if job[0].startswith(("dist float64", "matmul float32"))]
    assert len(chosen) == 6
    check(chosen, build_and_run(chosen, tmp_path, sanitize=True))


@pytest.mark.parametrize("name,text", RAGGED)
def test_the_gpu_tests_shapes_tile_every_kernel(name, text):
    """tests/test_gpu_device.py's TILED_SHAPES (run against XLA on a GPU) give block tiles in the forward and both
    gradients, at the default policy."""
    found = launches(name, text, {"W": (100, 130), "X": (100, 70)})
    assert len(found) == 3 and all(launch.kernel.tile is not None for _, launch, _ in found)


def test_the_schedule_is_ir_data():
    """Shared arrays, two barriers per chunk and the thread's position are IR; the pseudo printer shows them."""
    from tullax.printers.pseudo import format_kernel

    spec = compile_spec(RAGGED[0][1])[1]
    env = random_inputs(spec, {"W": (70, 70), "X": (70, 65)}, seed=2, dtype=np.float32)
    kernel = launch_for(spec, env, "k", False).kernel
    stmts = list(walk_stmts(kernel.body))
    assert [s.length for s in stmts if isinstance(s, Shared)] == [16 * 64, 16 * 64]
    assert sum(isinstance(s, Barrier) for s in stmts) == 2
    text = format_kernel(kernel)
    assert "barrier" in text and "shared(float32, 1024)" in text and f"256 threads ({THREAD})" in text
    # each thread's 4-element row of each staged operand is one aligned vector read (LDS.128 in CUDA)
    reads = [s for s in stmts if isinstance(s, VectorLoad)]
    assert [(s.array, len(s.vars)) for s in reads] == [(s.var, 4) for s in stmts if isinstance(s, Shared)]


def test_vector_reads_fit_16_bytes_and_divide_the_row():
    assert [vector_lanes("float32", n) for n in (1, 2, 4, 6, 8)] == [1, 2, 4, 2, 4]
    assert [vector_lanes("float64", n) for n in (1, 2, 3, 4)] == [1, 2, 1, 2]


@pytest.mark.parametrize("barrier", [0, 1])
def test_a_missing_barrier_is_caught(tmp_path, barrier):
    """Without the barrier after the copies, threads read staged values not yet written; without the one after
    the chunk's terms, the next copy overwrites values still being read: the sanitizer or the result says so."""
    spec = compile_spec(RAGGED[1][1])[1]
    env = random_inputs(spec, {"W": (24, 20), "X": (24, 18)}, seed=5, dtype=np.float64)
    launch = launch_for(spec, env, "racy", False, tiles=FORCE_TILES)

    def drop(source: str) -> str:
        bar = "__syncthreads();\n"
        head, rest = source.split('extern "C"', 1)
        parts = rest.split(bar)
        assert len(parts) == 3
        kept = parts[0] + parts[1] + bar + parts[2] if barrier == 0 else parts[0] + bar + parts[1] + parts[2]
        return head + 'extern "C"' + kept

    exe = build([(launch.kernel, launch.index_bits)], tmp_path, edit=drop)
    assert_race_is_caught(exe, launch, naive_eval(spec, env), "a tile")


# -- the tracer: what the tiles save ---------------------------------------------------------------------------
K = 128  # the reduction's length in the traced shapes (a whole number of 16-step chunks)
TRACED = (("Dist", "D[i,j] := (W[k,i]-X[k,j])^2", {"W": (K, 192), "X": (K, 160)}),
          ("Linear", "C[i,j] := W[k,i]*X[k,j]", {"W": (K, 192), "X": (K, 160)}))
# per kernel: the reduction's length (k, j or i) and the loads per output element that do not move with it
# (the gradients' hoisted W[k,i] or X[k,j])
LENGTH = {"forward": K, "gradient wrt W": 160, "gradient wrt X": 192}
HOISTED = {"Dist forward": 0, "Dist gradient wrt W": 1, "Dist gradient wrt X": 1,
           "Linear forward": 0, "Linear gradient wrt W": 0, "Linear gradient wrt X": 0}


@pytest.fixture(scope="module")
def traced():
    """Block 0 of every kernel of Dist and Linear, every warp, before (tiles off) and after (64 x 64 tiles)."""
    found = {}
    for when, tiles in (("before", NEVER), ("after", TilePolicy())):
        jobs, labels = [], []
        for case in TRACED:
            for label, launch, plan in launches(*case, tiles=tiles):
                labels.append(label)
                jobs.append((launch, plan.grid, plan.block))
        for label, counted in zip(labels, trace(jobs, warps=None)):
            found[when, label] = counted
    return found


@pytest.mark.parametrize("label", sorted(HOISTED))
def test_the_tracer_shows_the_global_traffic_drop(traced, label):
    """Loads per output element: 2 per term before (one of each operand, every term, every element), 2/64 per
    term after (a 64 x 64 tile stages 64 + 64 values per step for 64 x 64 elements), plus the hoisted ones: the
    ratio is exactly the model's. Every tiled request reads at most 4 sectors, and the sectors per output drop
    at least as much as the loads: the staged copies are coalesced where the loads before were not."""
    before, after = traced["before", label], traced["after", label]
    assert before.outputs and after.outputs == 64 * 64
    per_before, per_after = before.loads / before.outputs, after.loads / after.outputs
    hoisted, length = HOISTED[label], LENGTH[label.split(" ", 1)[1]]
    assert per_before == 2 * length + hoisted
    assert per_after == 2 * length / 64 + hoisted
    assert (per_after - hoisted) / length <= 1 / 8  # the hot loop: at most one global load per 8 terms
    assert all(a.max_sectors <= 4 for a in after.arrays)
    sectors_before, sectors_after = before.sectors / before.outputs, after.sectors / after.outputs
    assert sectors_before / sectors_after >= per_before / per_after


@pytest.mark.parametrize("label", sorted(HOISTED))
def test_the_estimates_traffic_is_the_tracers(traced, label):
    """The roofline estimate's global traffic (``tullax.backends.cuda.estimate``: the staged chunks of every
    block and the loads hoisted out of it, from the schedule alone) against the tracer's: block 0's 32-byte
    sectors times the grid, plus the output once: the same bytes."""
    case = next(c for c in TRACED if label.startswith(c[0]))
    full = dict(case[2])
    for step, (found, launch, plan) in zip(kernel_steps(compile_spec(case[1])[1], "float32"), launches(*case)):
        shapes = step_shapes(step.spec, full)
        shapes[step.spec.out] = full[step.spec.out] = tuple(s.eval(shapes) for s in step.spec.out_shape)
        if found == label:
            break
    model = estimate(launch.kernel, step.spec, shapes, plan.grid, size_values(launch.kernel, shapes)).traffic_bytes
    after = traced["after", label]
    counted = 32 * after.sectors * after.grid + 4 * np.prod(shapes[step.spec.out])
    assert model == counted
