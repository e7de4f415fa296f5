"""Time to first kernel (issue 14) and run time of the ``c`` backend against ``numba``, on every `make bench` case.

For each case and backend, in fresh processes (``TULLAX_CACHE_DIR`` a new empty directory for each cold run):

* TTFK cold and warm: building the kernel (``tullax.einsum_kernel``, resolving the backend), then the first
  ``jax.jit`` forward call and the first ``jax.jit`` VJP w.r.t. every float input, as ``make bench``'s ttfk
  phase (``tullax.benchmarking.worker``): inputs are made (and jax imported) before the clock starts. Cold: an
  empty compile cache; warm: the same cache again, in a new process. At the tiny shapes of ``make bench``'s
  TTFK (every extent capped at 32) and at the case's real shapes (the first call then includes one full-size
  run of the forward and the backward).
* Run time at the real shapes, in the warm real-shape process: the median of ``--calls`` calls of the jitted
  forward and of the VJP after the first.

Every figure is the median over ``--reps`` rounds, the backends alternating within a round (the machine is
shared). Wall time and CPU time (this process's threads plus its children: the C compiler runs as a child) are
both reported; on a loaded machine CPU time is the steadier one for TTFK. Threads: ``--threads`` for both
(``NUMBA_NUM_THREADS`` and ``TULLAX_C_THREADS``).

    PYTHONPATH=$PWD python benchmarks/ttfk_backends.py [--reps 3] [--calls 7] [--threads 2] [--cases Dist ...]

writes ``benchmarks/results/ttfk_backends.json`` and prints a Markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
BACKENDS = ("c", "numba")


def _cpu() -> float:
    """CPU seconds of this process (all threads) and of its finished children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def child(job: dict) -> dict:
    """One process: TTFK of ``job``'s case on its backend at its shapes; with ``calls``, then the run times."""
    from tullax.benchmarking.timing import timed
    from tullax.benchmarking.worker import Subject, block, device_inputs
    from tullax.spec.frontend import compile_spec

    _, spec = compile_spec(job["spec"])
    args, cotangent = device_inputs(spec, job["shapes"], "float32", 0)
    wall, cpu = time.perf_counter(), _cpu()
    subject = Subject(job["spec"], None, job["backend"])
    block(subject.fwd(*args))
    fwd_wall = time.perf_counter() - wall
    if subject.wrt:
        block(subject.bwd(cotangent, *args))
    record = {"ttfk_ms": (time.perf_counter() - wall) * 1e3, "ttfk_cpu_ms": (_cpu() - cpu) * 1e3,
              "ttfk_fwd_ms": fwd_wall * 1e3}
    if job.get("calls"):
        for which, call in (("fwd", lambda: block(subject.fwd(*args))),
                            ("bwd", lambda: block(subject.bwd(cotangent, *args)))):
            if which == "bwd" and not subject.wrt:
                continue
            found = timed(call, job["calls"], warmup=0, cpu_clock=_cpu)
            record[f"{which}_ms"] = found.median_ms
            record[f"{which}_cpu_ms"] = found.median_cpu_ms
    if job["backend"] == "c":
        from tullax.backends.c.backend import compile_stats
    else:
        from tullax.backends.numba.backend import compile_stats
    record["compile_stats"] = compile_stats()
    return record


def run_child(job: dict, cache: str, threads: int) -> dict:
    env = {**os.environ, "TULLAX_CACHE_DIR": cache, "NUMBA_NUM_THREADS": str(threads),
           "TULLAX_C_THREADS": str(threads), "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(job)], env=env, capture_output=True,
                          text=True, timeout=1200)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"rc {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(case, backend: str, calls: int, threads: int) -> dict:
    """One round of one backend on one case: tiny cold, tiny warm, real cold, real warm (+ run times)."""
    from tullax.benchmarking.case import capped_shapes

    rows = {}
    for label, shapes in (("tiny", capped_shapes(case.shapes)), ("real", dict(case.shapes))):
        job = {"spec": case.spec, "backend": backend, "shapes": {k: list(v) for k, v in shapes.items()}}
        with tempfile.TemporaryDirectory(prefix="tullax-ttfk-") as cache:
            rows[f"{label}_cold"] = run_child(job, cache, threads)
            rows[f"{label}_warm"] = run_child({**job, "calls": calls if label == "real" else 0}, cache, threads)
    return rows


def median_of(rounds: list[dict], phase: str, field: str) -> float | None:
    values = [r[phase][field] for r in rounds if field in r.get(phase, {})]
    return statistics.median(values) if values else None


def summarise(results: dict) -> list[dict]:
    rows = []
    for name, by_backend in results.items():
        for backend, rounds in by_backend.items():
            row = {"case": name, "backend": backend}
            for phase in ("tiny_cold", "tiny_warm", "real_cold", "real_warm"):
                row[f"{phase}_ms"] = median_of(rounds, phase, "ttfk_ms")
                row[f"{phase}_cpu_ms"] = median_of(rounds, phase, "ttfk_cpu_ms")
            for which in ("fwd", "bwd"):
                row[f"{which}_ms"] = median_of(rounds, "real_warm", f"{which}_ms")
                row[f"{which}_cpu_ms"] = median_of(rounds, "real_warm", f"{which}_cpu_ms")
            errors = {r[p]["error"] for r in rounds for p in r if "error" in r[p]}
            if errors:
                row["errors"] = sorted(errors)
            rows.append(row)
    return rows


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1e3:.2f} s" if value >= 1000 else f"{value:.0f} ms" if value >= 10 else f"{value:.2f} ms"


def table(rows: list[dict]) -> str:
    head = ("| case | backend | TTFK tiny cold | tiny warm | real cold | real warm | forward | backward |\n"
            "|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        cells = [f"{_fmt(r[f'{p}_ms'])} ({_fmt(r[f'{p}_cpu_ms'])} cpu)"
                 for p in ("tiny_cold", "tiny_warm", "real_cold", "real_warm")]
        cells += [f"{_fmt(r[f'{w}_ms'])} ({_fmt(r[f'{w}_cpu_ms'])} cpu)" for w in ("fwd", "bwd")]
        lines.append(f"| {r['case']} | {r['backend']} | " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--calls", type=int, default=7, help="timed calls of forward and backward (median)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cases", nargs="*", help="case names (default: the whole make bench suite)")
    parser.add_argument("--backends", nargs="*", default=list(BACKENDS))
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "ttfk_backends.json"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    from benchmarks.cases import suite

    cases = suite(names=args.cases)
    results: dict = {case.name: {b: [] for b in args.backends} for case in cases}
    for rep in range(args.reps):
        for case in cases:
            order = args.backends if rep % 2 == 0 else list(reversed(args.backends))  # alternate who goes first
            for backend in order:
                results[case.name][backend].append(measure(case, backend, args.calls, args.threads))
                print(f"round {rep + 1}/{args.reps} {case.name} {backend} done", file=sys.stderr, flush=True)
        rows = summarise(results)
        payload = {"command": "PYTHONPATH=$PWD python " + shlex.join(sys.argv), "threads": args.threads,
                   "reps_done": rep + 1, "calls": args.calls, "loadavg_at_end": os.getloadavg(),
                   "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows, "rounds": results}
        Path(args.out).write_text(json.dumps(payload, indent=1))
    print(table(summarise(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
