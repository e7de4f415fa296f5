"""Per-call cost of a tiny loop kernel under jax.jit (issue 14 item 3): a 32x48x24 matmul on Numba, host C and
``auto`` (which plans a call this small onto XLA), with the parallel variant (before: ``TULLAX_SERIAL_WORK=0``,
every call wakes the thread pool) and with the serial variant below the work threshold (after: the default),
each in several fresh processes; the median per process, the median over processes and the worst process. Also
a sweep of matmul sizes on Numba, serial against parallel, in one process: where the threshold
``tullax.backends.workload.SERIAL_WORK`` comes from. For host C the parallel variant is its OpenMP team of every
thread, the serial one a team of one.

    .venv/bin/python benchmarks/tiny_kernels.py [--processes 10] [--threads 2] [--backends numba,c,auto]
                                                [--out results/tiny_kernels.json]
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

if __package__ in (None, ""):  # run as a script: make `tullax` importable from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS = Path(__file__).resolve().parent / "results" / "tiny_kernels.json"
SPEC = "C[i,j] := A[i,k]*B[k,j]"
SHAPES = {"A": (32, 24), "B": (24, 48)}  # a 32x48 result, 24 terms each
CALLS = 2000


def per_call_us(i: int, j: int, k: int, calls: int, backend: str = "numba") -> dict:
    """In this process: the median of 5 rounds of ``calls`` jitted calls, in microseconds per call."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import tullax

    kernel = tullax.einsum_kernel(SPEC, backend=backend)
    a = jnp.asarray(np.random.default_rng(0).standard_normal((i, k)).astype(np.float32))
    b = jnp.asarray(np.random.default_rng(1).standard_normal((k, j)).astype(np.float32))
    fn = jax.jit(kernel)
    np.testing.assert_allclose(fn(a, b), np.asarray(a) @ np.asarray(b), rtol=1e-4, atol=1e-4)
    from tullax.benchmarking.timing import blocked, timed

    rounds = [ms * 1e3 for ms in timed(blocked(lambda: fn(a, b)), 5, warmup=0, batch=calls).wall_ms]
    ran = []
    if backend == "numba":
        from tullax.backends.numba import backend as numba_backend

        ran = sorted({name for kernel in numba_backend._BUILDER._built.values()
                      for name in getattr(kernel, "variants_run", ())})
    return {"us_per_call": statistics.median(rounds), "rounds_us": rounds, "variants_run": ran}


def child_main(args: argparse.Namespace) -> int:
    i, j, k = args.child
    print(json.dumps(per_call_us(i, j, k, args.calls, args.backends)))
    return 0


def run_child(size: tuple[int, int, int], serial_work: str | None, threads: int, cache: str, calls: int,
              backend: str = "numba") -> dict:
    env = {**os.environ, "NUMBA_NUM_THREADS": str(threads), "TULLAX_C_THREADS": str(threads),
           "TULLAX_CACHE_DIR": cache}
    if serial_work is None:
        env.pop("TULLAX_SERIAL_WORK", None)
    else:
        env["TULLAX_SERIAL_WORK"] = serial_work
    command = [sys.executable, __file__, "--child", *map(str, size), "--calls", str(calls), "--backends", backend]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"child failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2, help="NUMBA_NUM_THREADS of the children")
    parser.add_argument("--calls", type=int, default=CALLS)
    parser.add_argument("--sweep", action="store_true", help="also time matmul sizes serial vs parallel")
    parser.add_argument("--backends", default="numba,c,auto", help="comma-separated loop backends (a child: one)")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--child", nargs=3, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args)
    from tullax.backends.workload import SERIAL_WORK

    size = (SHAPES["A"][0], SHAPES["B"][1], SHAPES["A"][1])
    result: dict = {"spec": SPEC, "shapes": SHAPES, "threads": args.threads, "calls_per_round": args.calls,
                    "serial_work_threshold": SERIAL_WORK, "cpu_count": os.cpu_count(),
                    "load_average": os.getloadavg()}
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        with tempfile.TemporaryDirectory(prefix="tullax-tiny-") as cache:
            run_child(size, None, args.threads, cache, 10, backend)  # compile both variants into the cache first
            run_child(size, "0", args.threads, cache, 10, backend)
            for label, serial_work in (("before (parallel variant)", "0"),
                                       ("after (serial below the threshold)", None)):
                samples = [run_child(size, serial_work, args.threads, cache, args.calls, backend)
                           for _ in range(args.processes)]
                per_process = [s["us_per_call"] for s in samples]
                median = statistics.median(per_process)
                key = label if backend == "numba" else f"{backend}: {label}"
                result[key] = {"backend": backend, "median_us": median, "worst_us": max(per_process),
                               "worst_over_median": max(per_process) / median, "per_process_us": per_process,
                               "variants_run": samples[0]["variants_run"]}
                print(f"{backend} {label}: median {median:.1f} us per call over {args.processes} processes, "
                      f"worst {max(per_process):.1f} us ({max(per_process) / median:.2f}x the median)")
    if args.sweep:
        with tempfile.TemporaryDirectory(prefix="tullax-tiny-") as cache:
            sweep = []
            for n in (16, 32, 48, 64, 96, 128):
                work = n * n * n * 2
                row = {"size": n, "work": work}
                for label, serial_work in (("parallel_us", "0"), ("serial_us", str(1 << 62))):
                    row[label] = run_child((n, n, n), serial_work, args.threads, cache, max(args.calls // 4, 50))[
                        "us_per_call"]
                print(f"matmul {n}^3 (work {work}): parallel {row['parallel_us']:.1f} us, "
                      f"serial {row['serial_us']:.1f} us")
                sweep.append(row)
            result["sweep"] = sweep
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
