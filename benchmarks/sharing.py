"""Loop nests that share work (issue 14 item 2): the Numba kernels lowered without (``lower(..., share=False)``)
and with register tiles and shared calls, compared in ONE process on one thread, calls alternating old/new,
medians of CPU time (``time.process_time``: the machine is shared, so wall time measures the neighbours). Also
the count of ``exp`` calls per innermost iteration is visible in ``--show`` (the pseudo code).

    NUMBA_NUM_THREADS=1 python benchmarks/sharing.py [--rounds 15] [--out benchmarks/results/sharing.json]

Each case is a spec and input shapes; every kernel step (the forward and each gradient) is timed separately.
The kernels are compiled from memory (no compile cache), and the compile time of each is recorded too.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from tullax.backends import host  # noqa: E402
from tullax.backends.base import Signature  # noqa: E402
from tullax.backends.numba.backend import _load  # noqa: E402
from tullax.compiler.lower import lower  # noqa: E402
from tullax.printers.numba import print_module  # noqa: E402
from tullax.printers.pseudo import format_kernel  # noqa: E402
from tullax.spec.analyze import analyze  # noqa: E402
from tullax.spec.parse import parse_spec  # noqa: E402

GAUSS = ("out[i,d] := exp(-((x[i,0]-y[j,0])^2 + (x[i,1]-y[j,1])^2 + (x[i,2]-y[j,2])^2)) * b[j,d]")
CASES = (
    ("Gaussian kernel sum", GAUSS, {"x": (2000, 3), "y": (2000, 3), "b": (2000, 4)}),
    ("Dist", "D[i,j] := (W[k,i]-X[k,j])^2", {"W": (256, 512), "X": (256, 256)}),
    ("Linear", "C[i,j] := W[k,i]*X[k,j]", {"W": (256, 512), "X": (256, 256)}),
    ("matmul", "C[i,j] := A[i,k]*B[k,j]", {"A": (256, 256), "B": (256, 512)}),
    ("conv1d", "y[b,i] := x[b,i+k]*w[k]", {"x": (32, 8192), "w": (31,)}),
)


def _host_kernel(spec, kernel, key: str):
    generated = host.GeneratedModule("numba", spec, Signature.for_dtype(spec, kernel.compute_dtype), kernel,
                                     print_module([kernel], disk_cache=False), key, None, 0.0)
    return _load(generated)


def _steps(spec):
    """(label, step spec, output name) for the forward and every one-step gradient."""
    steps = [("forward", spec)]
    for kernel_step in host.kernel_steps(spec)[1:]:
        steps.append((kernel_step.label.replace("gradient wrt ", "grad "), kernel_step.spec))
    return steps


def _placed(rng, array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``array`` starting at a random multiple of 16 bytes into a fresh buffer."""
    shift = int(rng.integers(0, 64)) * (16 // array.itemsize)
    buffer = np.empty(array.size + shift, array.dtype)
    copy = buffer[shift:].reshape(array.shape)
    copy[...] = array
    return copy


def _timed(fn) -> float:
    """CPU milliseconds of the process (one thread runs the kernel): the machine is shared, wall time is not."""
    start = time.process_time()
    fn()
    return (time.process_time() - start) * 1e3


def run_case(name: str, text: str, shapes: dict, rounds: int, show: bool, dtype: str = "float32",
             tile: bool = True) -> list[dict]:
    """Old vs new kernel of every step of ``text``; ``tile=False``: the per-element nests a GPU printer gets
    (run here by the Numba printer: what sharing saves there, measured on the CPU)."""
    rng = np.random.default_rng(0)
    spec = analyze(parse_spec(text), None)
    arrays = {k: rng.standard_normal(v).astype(dtype) for k, v in shapes.items()}
    results = []
    forward_out = None
    for label, step in _steps(spec):
        env = dict(arrays)
        if forward_out is not None:
            env[f"Δ{spec.out}"] = rng.standard_normal(forward_out.shape).astype(dtype)
        inputs = [env[n] for n in step.input_names]
        out_shape = forward_shape(step, env) if label == "forward" else env[step.out.removeprefix("Δ")].shape
        signature = Signature.for_dtype(step, dtype)
        kernels = {"old": lower(step, signature, "kernel", tile=tile, share=False),
                   "new": lower(step, signature, "kernel", tile=tile)}
        if not tile:
            label += " untiled"
        if show:
            print(format_kernel(kernels["new"]))
        hosts, outs, compile_ms = {}, {}, {}
        for which, kernel in kernels.items():
            hosts[which] = _host_kernel(step, kernel, f"sharing_{which}_{abs(hash((text, label, tile)))}")
            outs[which] = np.zeros(out_shape, dtype)
            compile_ms[which] = _timed(lambda: hosts[which](outs[which], *inputs))
        reference = outs["old"].copy()
        times: dict[str, list[float]] = {"old": [], "new": []}
        for _ in range(rounds):
            for which in ("old", "new"):  # fresh arrays at random offsets: timings vary with relative alignment
                out, moved = _placed(rng, outs[which]), [_placed(rng, a) for a in inputs]
                times[which].append(_timed(lambda: hosts[which](out, *moved)))
                outs[which] = out
        if forward_out is None:
            forward_out = reference
        scale = float(np.max(np.abs(reference))) or 1.0
        row = {"case": name, "step": label, "spec": step_text(step), "shapes": {k: list(v) for k, v in shapes.items()},
               "old_ms": statistics.median(times["old"]), "new_ms": statistics.median(times["new"]),
               "old_min_ms": min(times["old"]), "new_min_ms": min(times["new"]),
               "compile_old_ms": compile_ms["old"], "compile_new_ms": compile_ms["new"],
               "max_rel_diff": float(np.max(np.abs(outs["new"] - reference))) / scale}
        row["speedup"] = row["old_ms"] / row["new_ms"]
        row["kernel_changed"] = kernels["old"] != kernels["new"]  # False: the same kernel twice (the noise)
        print(f"{name:20s} {label:16s} old {row['old_ms']:8.3f} (min {row['old_min_ms']:8.3f}) ms  "
              f"new {row['new_ms']:8.3f} (min {row['new_min_ms']:8.3f}) ms  "
              f"x{row['speedup']:.2f}  (compile {compile_ms['old']:.0f} / {compile_ms['new']:.0f} ms, "
              f"rel diff {row['max_rel_diff']:.1e}){'' if row['kernel_changed'] else '  same kernel'}", flush=True)
        results.append(row)
    return results


def step_text(step) -> str:
    from tullax.spec.text import format_spec

    return format_spec(step).replace("\n", " ")


def forward_shape(spec, env) -> tuple[int, ...]:
    """The result's shape: the extents of the free indices (they start at 0)."""
    from tullax.spec.shapes import eval_shapes, input_shapes

    ranges = eval_shapes(spec, input_shapes(spec, env))
    return tuple(ranges[n][1] - ranges[n][0] for n in spec.free)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--cases", nargs="*", default=None)
    parser.add_argument("--show", action="store_true", help="print the new kernels' loop IR")
    parser.add_argument("--untiled", nargs="*", default=["Gaussian kernel sum"],
                        help="cases also run with the per-element (GPU printers') nests")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "sharing.json"))
    args = parser.parse_args()
    rows = []
    for name, text, shapes in CASES:
        if args.cases and name.lower() not in {c.lower() for c in args.cases}:
            continue
        rows += run_case(name, text, shapes, args.rounds, args.show)
        if name in args.untiled:
            rows += run_case(name, text, shapes, args.rounds, args.show, tile=False)
    payload = {"threads": int(os.environ["NUMBA_NUM_THREADS"]), "rounds": args.rounds, "dtype": "float32",
               "results": rows}
    Path(args.out).write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
