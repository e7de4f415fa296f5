"""Forward and backward run time of suite cases, two checkouts of tullax against each other (A/B), for a change
that must not slow kernels down (issue 14 item 4: the Numba chunk variants and O2 serial variants).

Each (checkout, case) runs in a new process with its own compile cache (kept between rounds, so only the
first round compiles); the rounds alternate A and B, so a busy machine slows both alike. Every process times
``--repeat`` jitted forward calls and VJP calls (as ``make bench``: ``jax.jit`` of the kernel and of its VJP
w.r.t. every float input) after a warm-up, and reports the median wall time and the median CPU time of the
process (every thread) per call. On a shared machine read the CPU-time medians; wall time is shown beside.

    python benchmarks/runtime_ab.py --a /path/to/base --b . [case ...] [--rounds 3] [--repeat 9] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MARK = "@@runtime-ab "


def child(job: dict, repeat: int) -> None:
    import jax

    from tullax.benchmarking import worker
    from tullax.benchmarking.timing import timed

    subject = worker.make_subject(job)
    args, cotangent = subject.inputs(job["shapes"], job["dtype"], job["seed"])
    result = {}
    calls = {"fwd": lambda: jax.block_until_ready(subject.fwd(*args))}
    if subject.wrt:
        calls["bwd"] = lambda: jax.block_until_ready(subject.bwd(cotangent, *args))
    for name, call in calls.items():
        found = timed(call, repeat, warmup=2)  # the first: tracing, compiling or loading, first run
        result[name] = {"wall_ms": found.median_ms, "cpu_ms": found.median_cpu_ms}
    print(MARK + json.dumps(result), flush=True)


def run(tree: str, job: dict, cache: str, repeat: int, threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": tree, "TULLAX_CACHE_DIR": cache, "NUMBA_NUM_THREADS": str(threads)}
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(job), "--repeat", str(repeat)],
                          env=env, capture_output=True, text=True, timeout=900, cwd=tree)
    for line in done.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise RuntimeError(f"child failed in {tree}:\n{done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("cases", nargs="*")
    parser.add_argument("--a", required=False, help="checkout A (the baseline)")
    parser.add_argument("--b", required=False, help="checkout B (the change)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--backend", default="numba")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child), args.repeat)
        return
    sys.path.insert(0, str(HERE))
    from cases import suite

    trees = {"A": str(Path(args.a).resolve()), "B": str(Path(args.b).resolve())}
    caches = {side: tempfile.mkdtemp(prefix=f"tullax-ab-{side}-") for side in trees}
    print(f"A = {trees['A']}\nB = {trees['B']}\nmedians over {args.rounds} rounds of per-process medians "
          f"({args.repeat} calls), NUMBA_NUM_THREADS={args.threads}; ratio B/A (< 1: B faster)")
    for case in suite(names=args.cases or None):
        job = {"spec": case.spec, "ranges": None, "shapes": {k: list(v) for k, v in case.shapes.items()},
               "idiomatic": case.idiomatic, "backend": args.backend, "dtype": "float32", "seed": 0}
        samples: dict[str, list[dict]] = {"A": [], "B": []}
        for round_ in range(args.rounds):
            for side in ("A", "B") if round_ % 2 == 0 else ("B", "A"):
                samples[side].append(run(trees[side], job, caches[side], args.repeat, args.threads))
        for phase in samples["A"][0]:
            line = [f"{case.name:<20} {phase}"]
            for metric in ("cpu_ms", "wall_ms"):
                a = statistics.median(s[phase][metric] for s in samples["A"])
                b = statistics.median(s[phase][metric] for s in samples["B"])
                line.append(f"{metric[:-3]} A {a:8.2f} B {b:8.2f} ms ({b / a:.2f}x)")
            print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
