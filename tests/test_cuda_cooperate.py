"""Block-cooperative reductions (``tullax.compiler.cooperate``) in the printed CUDA, run on the CPU by the host
harness with one OS thread per GPU thread of a block (``__syncthreads`` a barrier, ``__shfl_xor_sync`` emulated,
under the thread sanitizer where it runs): every corpus kernel the stage accepts, forced at the corpus's small
sizes, against ``naive_eval``; rows of ragged lengths; NaN through max; and a kernel with a barrier removed,
which must fail."""
from __future__ import annotations

import numpy as np
import pytest
from corpus import CORPUS
from cuda_harness import GPP, assert_race_is_caught, build, run, sanitizer_works
from test_cuda_host import DTYPES, FLOAT32_TIES, TOL, case_env, kernel_runs, launch_for

from tullax.backends.base import Signature
from tullax.backends.cuda.launch import device_lowering
from tullax.compiler.cooperate import FORCE_BLOCK, FORCE_WARP
from tullax.compiler.loops import Combine, Loop, walk_stmts
from tullax.compiler.tiles import TilePolicy
from tullax.spec.examples import random_inputs
from tullax.spec.frontend import compile_spec
from tullax.testing.oracle import naive_eval

pytestmark = pytest.mark.skipif(GPP is None, reason="g++ is not installed")

ROWS = "(logsumexp) l[i] := x[i,j]"
# the corpus cases whose forward kernel must go cooperative when every row counts as long
EXPECTED = ("row_logsumexp", "row_max", "row_min")


def collect():
    jobs = []
    for dtype in DTYPES:
        for case in CORPUS:
            spec, env = case_env(case, dtype)
            for step, step_env in kernel_runs(spec, env, dtype):
                for unit, cooperation in (("block", FORCE_BLOCK), ("warp", FORCE_WARP)):
                    launch = launch_for(step, step_env, f"k{len(jobs)}", dtype == np.float64,
                                        cooperation=cooperation)
                    if launch.kernel.cooperative:
                        compare = dtype == np.float64 or case.id not in FLOAT32_TIES
                        jobs.append((f"{case.id} {np.dtype(dtype).name} {unit}: {step.out}", launch,
                                     naive_eval(step, step_env) if compare else None, dtype))
    for length in (1, 31, 33, 64, 97):  # shorter than a warp, ragged, whole warps, more than the block
        for dtype, cooperation in ((np.float32, FORCE_BLOCK), (np.float64, FORCE_BLOCK), (np.float32, FORCE_WARP)):
            spec = compile_spec(ROWS)[1]
            env = random_inputs(spec, {"x": (5, length)}, seed=length, dtype=dtype)
            if length == 33:
                env["x"][2, 7] = np.inf  # a row whose max is infinite, its logsumexp too
            if length == 97:
                env["x"][0] -= 200  # exp(200) overflows float32: the one-pass sum must not rescale 0 by it
                env["x"][3] = -np.inf  # every term 0: log(0)
                env["x"][4, 50] = np.nan
            launch = launch_for(spec, env, f"k{len(jobs)}", dtype == np.float64, cooperation=cooperation)
            unit = "warp" if cooperation is FORCE_WARP else "block"
            jobs.append((f"rows of {length} {np.dtype(dtype).name} {unit}", launch, naive_eval(spec, env), dtype))
    for dtype in DTYPES:
        spec = compile_spec("(max) m[i] := x[i,j]")[1]
        env = random_inputs(spec, {"x": (4, 70)}, seed=3, dtype=dtype)
        env["x"][1, 45] = np.nan
        launch = launch_for(spec, env, f"k{len(jobs)}", dtype == np.float64, cooperation=FORCE_BLOCK)
        expected = np.max(env["x"].astype(np.float64), axis=1)  # NaN propagates as jnp.max
        jobs.append((f"max with a NaN {np.dtype(dtype).name}", launch, expected, dtype))
    return jobs


def build_and_run(jobs, directory, sanitize: bool):
    exe = build([(launch.kernel, launch.index_bits) for _, launch, _, _ in jobs], directory, sanitize=sanitize)
    return run(exe, list(enumerate(launch for _, launch, _, _ in jobs)))


@pytest.fixture(scope="module")
def jobs():
    return collect()


@pytest.fixture(scope="module")
def results(jobs, tmp_path_factory):
    """Every job, built without the thread sanitizer (130-odd launches of cooperating OS threads would take
    minutes under it); ``test_under_the_sanitizer`` runs the ragged rows and the corpus's rows with it."""
    return jobs, build_and_run(jobs, tmp_path_factory.mktemp("coop"), sanitize=False)


def check(jobs, outputs):
    for (label, launch, expected, dtype), got in zip(jobs, outputs, strict=True):
        if expected is None:
            continue
        expected = np.asarray(expected, dtype=np.float64)
        got = np.asarray(got, dtype=np.float64)
        assert got.shape == expected.shape, label
        np.testing.assert_allclose(got, expected, rtol=TOL[dtype], atol=TOL[dtype], equal_nan=True, err_msg=label)


def test_the_row_reductions_of_the_corpus_go_cooperative(results):
    jobs, _ = results
    for unit in ("block", "warp"):
        found = {label.split(" ")[0] for label, _, _, _ in jobs if f" {unit}: " in label}
        assert set(EXPECTED) <= found, (unit, found)
    assert any(launch.kernel.warp for _, launch, _, _ in jobs)


def test_cooperative_kernels_match_the_naive_evaluator(results):
    check(*results)


@pytest.mark.skipif(not sanitizer_works(), reason="the thread sanitizer does not run here")
def test_under_the_sanitizer(jobs, tmp_path):
    """The ragged rows, the NaN rows and the corpus's row reductions, with races reported."""
    chosen = [job for job in jobs if job[0].startswith(("rows ", "max ")) or job[0].split(" ")[0] in EXPECTED]
    assert len(chosen) >= 16
    check(chosen, build_and_run(chosen, tmp_path, sanitize=True))


def test_logsumexp_reads_each_row_once():
    """The max and the sum in one pass: one loop over the row, one merge of (max, sum) pairs."""
    spec = compile_spec(ROWS)[1]
    shapes = {"x": (4096, 4096), "l": (4096,)}
    kernel, _ = device_lowering(spec, Signature.for_dtype(spec, "float32"), shapes, "k")
    combines = [s for s in walk_stmts(kernel.body) if isinstance(s, Combine)]
    assert [c.op for c in combines] == ["logsumexp"]
    assert sum(isinstance(s, Loop) and s.lanes for s in walk_stmts(kernel.body)) == 1


def test_the_choice_is_by_shapes():
    """At the default threshold a row of 4096 goes cooperative, a row of 64 does not; Dist, whose reduced
    index is not any load's contiguous axis, never does."""
    def kernel(text, shapes, tiles=TilePolicy(min_outputs=1 << 62)):  # matmul-like kernels tile first
        spec = compile_spec(text)[1]
        shapes = {**shapes, spec.out: tuple(s.eval(shapes) for s in spec.out_shape)}
        return device_lowering(spec, Signature.for_dtype(spec, "float32"), shapes, "k", tiles=tiles)

    long, plan = kernel(ROWS, {"x": (4096, 4096)})
    assert long.cooperative and plan.grid == 4096 and plan.block == 256
    assert sum(isinstance(s, Combine) for s in walk_stmts(long.body)) == 1  # max and sum together
    assert not kernel(ROWS, {"x": (4096, 64)})[0].cooperative
    assert not kernel("D[i,j] := (W[k,i]-X[k,j])^2", {"W": (784, 1024), "X": (784, 512)})[0].cooperative
    # rows of 512 over many elements (a Dist gradient's shape): a warp each
    medium, plan = kernel("ΔW[k,i] := ΔD[i,j]*X[k,j]", {"ΔD": (1024, 512), "X": (784, 512)})
    assert medium.cooperative and medium.warp and plan.grid * plan.block == 784 * 1024 * 32
    tiled, plan = kernel("ΔW[k,i] := ΔD[i,j]*X[k,j]", {"ΔD": (1024, 512), "X": (784, 512)}, TilePolicy())
    assert tiled.tile is not None and not tiled.cooperative and plan.block == 256 and plan.grid == 13 * 16
    assert not kernel(ROWS, {"x": (64, 512)})[0].cooperative  # too few elements for a warp each


@pytest.mark.parametrize("text,helper", [("(max) m[i] := x[i,j]", "tx_block_combine(T v"),
                                         (ROWS, "tx_block_logsumexp(T& m")])
@pytest.mark.parametrize("barrier", [0, 1])
def test_a_missing_barrier_is_caught(tmp_path, text, helper, barrier):
    """The block merge (``helper``) without one of its two __syncthreads: the thread sanitizer reports the race
    between warps on the shared partials, or (without the sanitizer) the result is wrong."""
    spec = compile_spec(text)[1]
    # 8 rows per block: the sanitizer keeps only a few past accesses of each word, so give it many chances
    env = random_inputs(spec, {"x": (24, 300)}, seed=5, dtype=np.float64)
    launch = launch_for(spec, env, "racy", wide=False, cooperation=FORCE_BLOCK)

    def drop(source: str) -> str:
        head, rest = source.split(helper, 1)
        body, tail = rest.split("\n}\n", 1)
        bar = "    __syncthreads();"
        parts = body.split(bar)
        assert len(parts) == 3
        kept = parts[0] + parts[1] + bar + parts[2] if barrier == 0 else parts[0] + bar + parts[1] + parts[2]
        return head + helper + kept + "\n}\n" + tail

    # several warps and several rows per block: COOPERATIVE_GEOMETRIES' first launch, (3, 64)
    exe = build([(launch.kernel, launch.index_bits)], tmp_path, edit=drop)
    assert_race_is_caught(exe, launch, naive_eval(spec, env), "a merge")
