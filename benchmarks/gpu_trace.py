"""Global-memory traffic per output element of the printed CUDA kernels, before and after the shared-memory
block tiles, counted by the memory-traffic tracer on the CPU (no GPU): block 0 of each kernel (forward and
every gradient step) at the trace shapes of ``tests/trace_cases.py`` (the GPU benchmark's shapes, cut only where
an extent merely adds blocks), every warp of the block, float32, with the host's own launch plan.

Per kernel and schedule: the launch, global loads per output element, 32-byte sectors per output element (the
bytes the L1 fetches, /32), the coalescing ratio (bytes the loads use / bytes of the sectors they touch: 1.0 when
a warp's 32 loads fill 4 sectors, 0.125 when each lane touches its own sector) and the most sectors one warp
request touches. "before" is ``TULLAX_CUDA_TILES=0 TULLAX_CUDA_VECTORS=0`` (the schedule the backend picked without
block tiles and vector lanes).

    PYTHONPATH=$PWD python benchmarks/gpu_trace.py            # Dist and Linear
    PYTHONPATH=$PWD python benchmarks/gpu_trace.py --all      # every GPU benchmark case

writes ``benchmarks/results/gpu-trace-cpu.{json,md}`` (``--out`` another stem).

Also per kernel: shared-memory bank conflicts (the traced warps' shared reads and writes: wavefronts per request
and passes beyond the conflict-free ideal; 32 banks of 4 bytes; a window copy's writes are approximate, its lanes
outside the patch skip theirs) and a roofline estimate for each device of
``gpu_device.PEAKS`` named in ``DEVICES``: FLOPs (two per term) against (a) the compulsory bytes (inputs and
output once) and (b) the tracer's sector bytes (block 0's 32-byte sectors times the grid, plus the output),
both at the device's HBM bandwidth; (b) bounds the kernel's time from below when its sectors miss in L2.
Beside it, the estimate ``tullax explain --backend cuda`` prints (``tullax.backends.cuda.estimate``: the same
roofline from the schedule alone, no trace). Estimates from the CPU trace, not measurements.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the tracer and the trace cases live beside the tests

from cuda_trace import trace  # noqa: E402
from gpu_device import PEAKS, kernel_work  # noqa: E402
from trace_cases import CASES, launches  # noqa: E402

from tullax.backends.cuda.estimate import estimate  # noqa: E402
from tullax.backends.cuda.launch import START_GIVEN, size_values  # noqa: E402
from tullax.compiler.loops import parallel_nest  # noqa: E402
from tullax.compiler.tiles import TilePolicy  # noqa: E402
from tullax.compiler.vectorize import vector_arrays  # noqa: E402

SCHEDULES = (("before", TilePolicy(min_outputs=1 << 62)), ("after", TilePolicy()))
ITEMSIZE = 4  # float32
DEVICES = ("H100", "H200")  # the roofline columns: rows of gpu_device.PEAKS (FP32 FLOP/s, HBM bytes/s)


def roofline(flops: float, compulsory: float, sectors: float) -> dict:
    """Per device: the least time (µs) at its peaks for the compulsory bytes and for the tracer's sector bytes."""
    out = {}
    for device in DEVICES:
        rate, bandwidth = next((f, b) for name, f, b in PEAKS if name == device)
        out[device] = {"flop_us": flops / rate * 1e6, "compulsory_us": compulsory / bandwidth * 1e6,
                       "sector_us": sectors / bandwidth * 1e6,
                       "bound_us": max(flops / rate, sectors / bandwidth, compulsory / bandwidth) * 1e6}
    return out


def schedule_name(kernel) -> str:
    tile = kernel.tile
    if tile is not None:
        window = kernel.split or len(parallel_nest(kernel)[0]) != 2  # tullax.compiler.window_tiles
        return (f"{'window' if window else 'block'} tile {tile.rows}x{tile.cols}, "
                f"{tile.thread_rows}x{tile.thread_cols} per thread" + (", split-K" if kernel.split else ""))
    if kernel.cooperative:
        return "a warp per element" if kernel.warp else "a block per element"
    if kernel.vector:
        return f"vector lanes: {kernel.vector} elements per thread"
    return "split sum" if kernel.split else "a thread per element (or register tile)"


def useful_bytes(kernel, counted) -> int:
    """The bytes the traced loads deliver: 4 per load, and a vector read's other lanes (a request per warp of
    32 vectors; tullax.compiler.vectorize)."""
    vectors = set(vector_arrays(kernel))
    extra = sum(a.requests for a in counted.arrays if a.array in vectors) * 32 * max(kernel.vector - 1, 0)
    return (counted.loads + extra) * ITEMSIZE


def model_us(kernel, plan, done: dict) -> dict:
    """The schedule's own estimate (tullax.backends.cuda.estimate) at each device of DEVICES, in µs."""
    shapes = {**done["shapes"], done["spec"].out: done["out_shape"]}
    found = estimate(kernel, done["spec"], shapes, plan.grid, size_values(kernel, shapes), plan.start == START_GIVEN)
    return {device: found.micros(*next((f, b) for name, f, b in PEAKS if name == device)) for device in DEVICES}


def measure(cases) -> list[dict]:
    rows = []
    for when, tiles in SCHEDULES:
        # "before" has neither block tiles nor vector lanes (tullax.compiler.vectorize)
        os.environ["TULLAX_CUDA_VECTORS"] = "0" if when == "before" else "1"
        jobs, meta = [], []
        for case in cases:
            work = kernel_work(case[1], case[2])
            for (label, launch, plan), done in zip(launches(*case, tiles=tiles), work, strict=True):
                jobs.append((launch, plan.grid, plan.block))
                meta.append((label, launch.kernel, plan, done))
        for (label, kernel, plan, done), counted in zip(meta, trace(jobs, warps=None)):
            outputs = max(counted.outputs, 1)
            sectors = counted.sectors
            out_bytes = ITEMSIZE * math.prod(done["out_shape"])
            sector_bytes = 32 * sectors * plan.grid + out_bytes
            shared = counted.shared
            rows.append({
                "flops": done["flops"], "compulsory_bytes": done["bytes"], "sector_bytes": sector_bytes,
                "intensity": done["flops"] / sector_bytes,
                "roofline": roofline(done["flops"], done["bytes"], sector_bytes),
                "model_us": model_us(kernel, plan, done),
                "shared_requests": shared.requests, "shared_wavefronts": shared.wavefronts,
                "bank_conflicts": shared.conflicts, "max_bank_ways": shared.max_ways,
                "shared_write_requests": counted.shared_writes.requests,
                "shared_write_wavefronts": counted.shared_writes.wavefronts,
                "write_bank_conflicts": counted.shared_writes.conflicts,
                "kernel": label, "schedule": when, "chosen": schedule_name(kernel), "grid": plan.grid,
                "block": plan.block, "outputs_in_block": counted.outputs, "loads": counted.loads,
                "loads_per_output": counted.loads / outputs, "sectors_per_output": sectors / outputs,
                "bytes_per_output": 32 * sectors / outputs,
                "coalescing": useful_bytes(kernel, counted) / (32 * sectors) if sectors else None,
                "max_sectors_per_request": max((a.max_sectors for a in counted.arrays), default=0),
                "arrays": {a.source: {"requests": a.requests, "sectors": a.sectors, "lines": a.lines,
                                      "broadcasts": a.broadcasts} for a in counted.arrays},
            })
    return rows


def markdown(rows: list[dict], command: str) -> str:
    lines = ["# Global-memory traffic per output element, before and after the block tiles (tracer, CPU, no GPU)",
             "", f"Made by: `{command}` (benchmarks/gpu_trace.py; block 0 of each printed kernel, every warp, "
             "float32, tests/trace_cases.py shapes). Loads and 32-byte sectors per output element the block wrote; "
             "coalescing = bytes the loads use / bytes of the sectors they touch.", "",
             "| kernel | schedule | launch | loads / output | sectors / output | bytes / output | coalescing | "
             "max sectors / request |", "|---|---|---|---:|---:|---:|---:|---:|"]
    by_kernel: dict[str, dict[str, dict]] = {}
    for row in rows:
        by_kernel.setdefault(row["kernel"], {})[row["schedule"]] = row
    for kernel, found in by_kernel.items():
        for when in ("before", "after"):
            row = found[when]
            coalescing = "-" if row["coalescing"] is None else f"{row['coalescing']:.3f}"
            lines.append(f"| {kernel} | {when}: {row['chosen']} | {row['grid']} x {row['block']} | "
                         f"{row['loads_per_output']:.2f} | {row['sectors_per_output']:.3f} | "
                         f"{row['bytes_per_output']:.1f} | {coalescing} | {row['max_sectors_per_request']} |")
    lines += ["", "Shared memory and roofline, after (estimates from the trace, float32; sector bytes = block 0's "
              "sectors x the grid + the output; µs at the peaks of benchmarks/gpu_device.py's PEAKS):", "",
              "| kernel | shared reads | wavefronts / read | bank conflicts | shared writes | wavefronts / write | "
              "write conflicts | GFLOP | MB compulsory | MB sectors | FLOP / sector byte | "
              + " | ".join(f"{d} bound µs (flop, compulsory, sectors)" for d in DEVICES) + " | "
              + " | ".join(f"{d} estimate µs (explain)" for d in DEVICES) + " |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * (2 * len(DEVICES))]
    for kernel, found in by_kernel.items():
        row = found["after"]
        reads = row["shared_requests"]
        per = f"{row['shared_wavefronts'] / reads:.2f}" if reads else "-"
        writes = row["shared_write_requests"]
        per_write = f"{row['shared_write_wavefronts'] / writes:.2f}" if writes else "-"
        bounds = " | ".join(f"{r['bound_us']:.1f} ({r['flop_us']:.1f}, {r['compulsory_us']:.1f}, {r['sector_us']:.1f})"
                            for r in (row["roofline"][d] for d in DEVICES))
        lines.append(f"| {kernel} | {reads} | {per} | {row['bank_conflicts']} | {writes} | {per_write} | "
                     f"{row['write_bank_conflicts']} | {row['flops'] / 1e9:.3f} | "
                     f"{row['compulsory_bytes'] / 1e6:.2f} | {row['sector_bytes'] / 1e6:.2f} | "
                     f"{row['intensity']:.2f} | {bounds} | "
                     + " | ".join(f"{row['model_us'][d]:.1f}" for d in DEVICES) + " |")
    lines += ["", "Ratios before / after:", ""]
    for kernel, found in by_kernel.items():
        b, a = found["before"], found["after"]
        if a["loads_per_output"] and a["sectors_per_output"]:
            lines.append(f"- {kernel}: loads per output {b['loads_per_output'] / a['loads_per_output']:.1f}x, "
                         f"sectors per output {b['sectors_per_output'] / a['sectors_per_output']:.1f}x")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="every GPU benchmark case, not only Dist and Linear")
    parser.add_argument("--out", default=str(HERE / "results" / "gpu-trace-cpu"), help="results path stem")
    args = parser.parse_args(argv)
    cases = CASES if args.all else [c for c in CASES if c[0] in ("Dist", "Linear")]
    rows = measure(cases)
    command = "PYTHONPATH=$PWD python benchmarks/gpu_trace.py" + (" --all" if args.all else "")
    Path(args.out + ".json").write_text(json.dumps({"command": command, "rows": rows}, indent=1) + "\n")
    text = markdown(rows, command)
    Path(args.out + ".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
