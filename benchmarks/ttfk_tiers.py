"""Cold time to first kernel with and without the c backend's tiered compilation (issue 45, item 5), on specs the
bench corpus does not hold, against the ``xla`` backend's own cold time.

Each run is a new process with a new empty compile cache (``TULLAX_CACHE_DIR``): jax and tullax are imported and
the tiny inputs made before the clock starts, as ``make bench``'s TTFK phase does; then the kernel is made, and
its ``jax.jit`` forward and ``jax.jit`` VJP w.r.t. every float input are called once each (``ttfk``). Then, in the
same process, after a first call at larger shapes and once every optimised build has landed
(``finish_step_builds``), the steady state: the median of ``--calls`` calls of the jitted forward and VJP at those
shapes (the optimised kernels, switched in). Also the process's CPU time over the TTFK window, its C compiler's
processes' (``os.times``, 10 ms steps) and how many modules it imported then: on a loaded machine the wall times
swing with the load, the CPU times much less.

Configurations, interleaved within each round (the machine is shared): ``xla``; ``c`` and ``auto`` with
``TULLAX_C_TIERS=off`` (every module waits for the optimising compiler) and ``on`` (after); with ``--before DIR``
(a checkout of an earlier commit, its bytecode compiled), ``c`` and ``auto`` of that code too ("before", with
its tiers on: the default); ``--configs`` runs only some.
Reported: the best and the median over ``--reps`` rounds, in ms, and the ratio of the best to ``xla``'s best.
Compile the bytecode first (``python -m compileall -q tullax``): a process that compiles tullax's modules from
source pays for it on its first kernel.

    PYTHONPATH=$PWD python benchmarks/ttfk_tiers.py [--reps 3] [--calls 15] [--specs Dist ...] [--before DIR]

writes ``benchmarks/results/ttfk_tiers.json`` and prints a Markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARK = "@@ttfk-tiers "

# held-out specs (none is in benchmarks/cases.py as written here): tiny TTFK shapes, larger steady-state shapes
HELD_OUT = {
    "gaussian distance": ("D[i,j] := exp(-(x[i,k]-y[j,k])^2) * w[k]",
                          {"x": (16, 3), "y": (12, 3), "w": (3,)}, {"x": (512, 3), "y": (512, 3), "w": (3,)}),
    "padded conv1d tanh": ("y[b,i] := x[b,pad(i+k-1)]*w[k] |> tanh",
                           {"x": (4, 16), "w": (3,)}, {"x": (32, 2048), "w": (3,)}),
    "Dist": ("D[i,j] := (W[k,i]-X[k,j])^2", {"W": (8, 16), "X": (8, 12)}, {"W": (128, 256), "X": (128, 256)}),
    "bilinear": ("s[b] := x[b,i]*W[i,j]*y[b,j]", {"x": (8, 6), "W": (6, 5), "y": (8, 5)},
                 {"x": (256, 64), "W": (64, 64), "y": (256, 64)}),
    "manhattan": ("P[i,j] := abs(a[i,k]-b[j,k])", {"a": (16, 4), "b": (12, 4)}, {"a": (256, 16), "b": (256, 16)}),
}
CONFIGS = (("xla", "off"), ("c", "off"), ("c", "on"), ("auto", "off"), ("auto", "on"))


def child(job: dict) -> dict:
    import jax  # noqa: F401 - imported before the clock, as in make bench

    import tullax  # noqa: F401
    from tullax.benchmarking.worker import Subject, block, device_inputs
    from tullax.spec.frontend import compile_spec

    _, spec = compile_spec(job["spec"])
    args, cotangent = device_inputs(spec, job["shapes"], "float32", 0)
    modules = len(sys.modules)
    began = os.times()
    start = time.perf_counter()
    subject = Subject(job["spec"], None, job["backend"])
    block(subject.fwd(*args))
    forward = time.perf_counter()
    block(subject.bwd(cotangent, *args))
    end = time.perf_counter()
    ended = os.times()
    cpu = {"cpu_ms": (ended.user + ended.system - began.user - began.system) * 1e3,
           "compiler_cpu_ms": (ended.children_user + ended.children_system - began.children_user
                               - began.children_system) * 1e3, "modules": len(sys.modules) - modules}
    big, big_cotangent = device_inputs(spec, job["big"], "float32", 1)
    block(subject.fwd(*big))
    block(subject.bwd(big_cotangent, *big))
    if job["backend"] != "xla" and "tullax.backends.c.backend" in sys.modules:  # the optimised builds, switched in
        from tullax.backends.c.backend import finish_step_builds

        finish_step_builds()
    steady = {}
    for name, call in (("fwd", lambda: subject.fwd(*big)), ("bwd", lambda: subject.bwd(big_cotangent, *big))):
        times = []
        for _ in range(job["calls"]):
            began = time.perf_counter()
            block(call())
            times.append((time.perf_counter() - began) * 1e3)
        steady[name] = statistics.median(times)
    return {"ttfk_ms": (end - start) * 1e3, "fwd_ms": (forward - start) * 1e3, "steady_fwd_ms": steady["fwd"],
            "steady_bwd_ms": steady["bwd"], **cpu}


def run_child(job: dict, tiers: str, code: Path = REPO) -> dict:
    return run_script_child(__file__, MARK, job, {"TULLAX_C_TIERS": tiers}, code)


def run_script_child(script: str, mark: str, job: dict, env: dict[str, str], code: Path = REPO) -> dict:
    """``script --child JOB`` in a new process on a new empty compile cache, with ``code`` first on the path and
    ``env`` added: the record it printed after ``mark``."""
    with tempfile.TemporaryDirectory(prefix="tullax-ttfk-") as cache:
        env = {**os.environ, **env, "TULLAX_CACHE_DIR": cache,
               "PYTHONPATH": os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run([sys.executable, script, "--child", json.dumps(job)], env=env, capture_output=True,
                              text=True, timeout=900, cwd=code)
    for line in done.stdout.splitlines():
        if line.startswith(mark):
            return json.loads(line[len(mark):])
    raise SystemExit(f"the child failed:\n{done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--calls", type=int, default=15)
    parser.add_argument("--specs", nargs="*", default=list(HELD_OUT))
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "ttfk_tiers.json"))
    parser.add_argument("--before", help="a checkout of the code to compare with (c and auto)")
    parser.add_argument("--configs", nargs="*", help="only these configurations (labels as in the table, e.g. "
                        "'c tiers=on'; xla's always runs)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(MARK + json.dumps(child(json.loads(args.child))), flush=True)
        return
    results: dict[str, dict[str, list[dict]]] = {}
    configs = [(f"{b} tiers={t}", b, t, REPO) for b, t in CONFIGS]
    if args.before:
        configs += [(f"{b} before", b, "on", Path(args.before).resolve()) for b in ("c", "auto")]
    if args.configs:
        configs = [c for c in configs if c[0] in args.configs or c[1] == "xla"]
    for name in args.specs:
        text, tiny, big = HELD_OUT[name]
        runs = results.setdefault(name, {label: [] for label, *_ in configs})
        for _ in range(args.reps):
            for label, backend, tiers, code in configs:
                job = {"spec": text, "shapes": tiny, "big": big, "backend": backend, "calls": args.calls}
                runs[label].append(run_child(job, tiers, code))
                print(name, label, json.dumps(runs[label][-1]), flush=True)
    record = {"before": args.before, "reps": args.reps, "calls": args.calls, "cores": os.cpu_count(),
              "load_after": os.getloadavg(), "specs": {n: HELD_OUT[n][0] for n in args.specs}, "results": results}
    Path(args.out).write_text(json.dumps(record, indent=1))
    print("\n| spec | config | TTFK best ms | TTFK median ms | best / xla best | CPU best ms (+ compiler) | "
          "CPU best / xla's | modules | steady fwd ms | steady bwd ms |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, runs in results.items():
        xla = min(r["ttfk_ms"] for r in runs["xla tiers=off"])
        xla_cpu = min(r.get("cpu_ms", float("nan")) + r.get("compiler_cpu_ms", 0) for r in runs["xla tiers=off"])
        for config, found in runs.items():
            ttfk = [r["ttfk_ms"] for r in found]
            cpu = min(found, key=lambda r: r.get("cpu_ms", float("nan")) + r.get("compiler_cpu_ms", 0))
            whole = cpu.get("cpu_ms", float("nan")) + cpu.get("compiler_cpu_ms", 0)
            print(f"| {name} | {config} | {min(ttfk):.0f} | {statistics.median(ttfk):.0f} | {min(ttfk) / xla:.2f} | "
                  f"{cpu.get('cpu_ms', float('nan')):.0f} (+{cpu.get('compiler_cpu_ms', 0):.0f}) | "
                  f"{whole / xla_cpu:.2f} | {cpu.get('modules', '')} | "
                  f"{statistics.median(r['steady_fwd_ms'] for r in found):.2f} | "
                  f"{statistics.median(r['steady_bwd_ms'] for r in found):.2f} |")


if __name__ == "__main__":
    main()
