"""The Julia printer's GPU flavour of the schedules whose threads cooperate (``tullax.printers.julia_groups``):
block-tiled kernels (``tullax.compiler.tiles``) and block- and warp-cooperative reductions
(``tullax.compiler.cooperate``), printed for KernelAbstractions and run by the Julia-subset evaluator
(tests/julia_subset.py: each work-group's work-items at once, ``@synchronize()`` a barrier, ``@localmem`` one
array per group) against NumPy float64 (``naive_eval``). No Julia runs here: this checks the printed text's
semantics as the evaluator reads KernelAbstractions, not a GPU run.

Cost: no compiler; the evaluator interprets about 30 small launches (small tiles, rows of a few dozen)."""
from __future__ import annotations

import numpy as np
import pytest
from corpus import CORPUS
from test_cuda_host import TOL, case_env, kernel_runs, launch_for

from tullax.compiler.cooperate import FORCE_BLOCK, FORCE_WARP
from tullax.compiler.tiles import FORCE_TILES
from tullax.errors import TullaxError
from tullax.printers.cuda import parameters
from tullax.printers.julia import CPU_FLAVOUR, GPU_FLAVOUR, launcher_name, print_module
from tullax.spec.examples import random_inputs
from tullax.spec.frontend import compile_spec
from tullax.testing.oracle import naive_eval

julia_subset = pytest.importorskip("julia_subset")

# conv2d_nchw and batched_matmul's gradients: window tiles (tullax.compiler.window_tiles), split-K at these shapes
TILED = ("dist", "matmul", "matmul_bias", "accumulate_matmul", "bias_after_reduction", "conv2d_nchw", "batched_matmul")
ROWS = ("row_logsumexp", "row_max", "row_min")
SCHEDULES = {"tile": {"tiles": FORCE_TILES}, "block": {"cooperation": FORCE_BLOCK},
             "warp": {"cooperation": FORCE_WARP}}


def julia_run(launch) -> np.ndarray:
    """The launch's kernel printed for KernelAbstractions on a GPU, run by the evaluator through its launcher."""
    kernel = launch.kernel
    source = print_module([kernel], flavour=GPU_FLAVOUR)
    args = []
    for param, value in zip(parameters(kernel, launch.index_bits), launch.arguments):
        if param.kind == "array":
            args.append(value)
        elif param.kind == "scalar":
            args.append(np.asarray(value).item())
        elif param.kind == "size":
            args.append(int(value))
    julia_subset.load_module(source).call(launcher_name(kernel), julia_subset.CPU_BACKEND, *args)
    return args[0]


def collect():
    jobs = []
    by_id = {case.id: case for case in CORPUS}
    for dtype in (np.float32, np.float64):
        for schedule, wanted in (("tile", TILED), ("block", ROWS), ("warp", ROWS)):
            for case_id in wanted:
                spec, env = case_env(by_id[case_id], dtype)
                for step, step_env in kernel_runs(spec, env, dtype):
                    launch = launch_for(step, step_env, f"k{len(jobs)}", False, **SCHEDULES[schedule])
                    if launch.kernel.tile is not None or launch.kernel.cooperative:
                        jobs.append((f"{case_id} {schedule} {np.dtype(dtype).name}: {step.out}", launch,
                                     naive_eval(step, step_env), dtype))
    spec = compile_spec("(logsumexp) l[i] := x[i,j]")[1]
    env = random_inputs(spec, {"x": (4, 45)}, seed=4, dtype=np.float64)
    env["x"][1, 7] = np.inf  # an infinite max
    env["x"][2] = -np.inf  # every term 0: log(0)
    env["x"][3, 20] = np.nan
    for schedule in ("block", "warp"):
        launch = launch_for(spec, env, f"k{len(jobs)}", False, **SCHEDULES[schedule])
        jobs.append((f"logsumexp special rows {schedule} float64", launch, naive_eval(spec, env), np.float64))
    return jobs


JOBS = collect()


def test_every_schedule_is_printed():
    found = {label.split(" ")[1] for label, *_ in JOBS}
    assert found >= {"tile", "block", "warp"}
    assert sum(" tile " in label for label, *_ in JOBS) >= 20


@pytest.mark.parametrize("label,launch,expected,dtype", JOBS, ids=[job[0] for job in JOBS])
def test_the_julia_gpu_flavour_equals_numpy_float64(label, launch, expected, dtype):
    got = julia_run(launch)
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(expected, np.float64), rtol=TOL[dtype],
                               atol=TOL[dtype], equal_nan=True, err_msg=label)


def test_the_printed_source_synchronises_in_local_memory():
    tiled = next(launch for label, launch, *_ in JOBS if label.startswith("dist tile float32: D"))
    source = print_module([tiled.kernel], flavour=GPU_FLAVOUR)
    assert source.count("@localmem Float32 (32,)") == 2 and source.count("@synchronize()") == 2
    assert "@index(Local, Linear)" in source and "@index(Group, Linear)" in source
    assert f"(backend, {tiled.kernel.tile.threads})(" in source
    warp = next(launch for label, launch, *_ in JOBS if label.startswith("row_max warp float64"))
    source = print_module([warp.kernel], flavour=GPU_FLAVOUR)
    assert "for i1 in thread:32:" in source and "@localmem Float64 (32,)" in source
    assert source.count("@synchronize()") == 1 + 5 + 1  # the partials, five halvings, the read of the total


def test_the_cpu_flavour_refuses_them():
    tiled = JOBS[0][1]
    with pytest.raises(TullaxError, match="GPU_FLAVOUR only"):
        print_module([tiled.kernel], flavour=CPU_FLAVOUR)


def test_a_missing_synchronize_gives_a_wrong_result():
    """The tile without the barrier after its copies: work-items read staged values before they are written."""
    spec = compile_spec("C[i,j] := W[k,i]*X[k,j]")[1]
    env = random_inputs(spec, {"W": (12, 16), "X": (12, 16)}, seed=5, dtype=np.float64)
    launch = launch_for(spec, env, "racy", False, tiles=FORCE_TILES)
    kernel = launch.kernel
    source = print_module([kernel], flavour=GPU_FLAVOUR)
    broken = source.replace("@synchronize()\n", "\n", 1)
    assert broken != source
    args = [v if p.kind == "array" else int(v) for p, v in zip(parameters(kernel, launch.index_bits),
                                                               launch.arguments) if p.kind != "extent"]
    julia_subset.load_module(broken).call(launcher_name(kernel), julia_subset.CPU_BACKEND, *args)
    assert not np.allclose(args[0], naive_eval(spec, env), rtol=1e-10, equal_nan=False)
