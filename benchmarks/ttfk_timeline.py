"""Where one process's time to first kernel (TTFK) goes, as a timeline: the planner's races, the C module's code
generation and compilation, and every XLA compile, on which thread, from the first call (issue 14, item 4).

The child is ``make bench``'s TTFK phase (``tullax.benchmarking.worker.phase_ttfk``: a new process that has
imported jax and tullax, then kernel construction, tracing, compiling and the first forward and VJP call on the
case's tiny inputs) with wrappers around the functions below; the same code runs. ``cold`` runs on an empty
compile cache, ``warm`` on the one the cold run filled.

* ``resolve``: choosing an explicit backend (``auto`` asks for its loop backend as it plans a kernel that may run
  on the loops: whether Julia, then the C compiler, can run here); ``c probe``: the C compiler's trial build,
  once per cache;
* ``race <out>``: the planner deciding one kernel (``tullax.planner.decide._decide``); inside it
  ``candidate <form>``: one candidate compiled and run once (``tullax.planner.candidates.prepared``), and
  ``compile ahead``: lowering the XLA candidates of the gradient races still to run, compiled meanwhile in threads;
* ``c module, built or loaded``: one loop module from the cache, or generated (``C codegen``) and compiled
  (``C compile``: the compiler's processes);
* ``XLA compile``: one XLA executable: a race's candidate, a loop candidate's wrapper, the user's programs;
* ``GC generation 2``: a pass of Python's garbage collector over every object (it holds the GIL meanwhile).

Under each table: the CPU time of the process (all its threads) and of the C compiler's processes over the TTFK,
and how many cores that kept busy on average: near the core count, only less work can shorten the TTFK.

Usage: ``python benchmarks/ttfk_timeline.py [case] [--backend auto] [--runs 1] [--json out.json]``. Each run is a
new cold process and a new warm one; every figure is wall time in ms. Spans shorter than 0.5 ms are left out of
the table (a plan or a probe answered from memory), not out of the totals.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
MARK = "@@ttfk-timeline "
SHORT_MS = 0.5


# ------------------------------------------------------------------------------------------------ child
def _instrument(spans: list) -> None:
    """Wrap the functions of the timeline: each call appends (start, end, label, thread) to ``spans``."""
    import functools
    import threading
    import time

    from jax._src import compiler as jax_compiler

    from tullax import backends
    from tullax.backends import host
    from tullax.backends.c import backend as c
    from tullax.backends.c import compile as c_compile
    from tullax.planner import candidates as made
    from tullax.planner import decide as planner

    def wrap(module, name, label) -> None:
        original = getattr(module, name, None)
        if original is None:  # another version of jax or tullax: that span is simply not recorded
            return

        @functools.wraps(original)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                text = label(*args, **kwargs) if callable(label) else label
                spans.append((start, time.perf_counter(), text, threading.current_thread().name))

        setattr(module, name, timed)

    wrap(backends, "resolve", lambda name, *_, **__: f"resolve {name}")
    wrap(c_compile, "_probe", "c probe")
    wrap(planner, "_decide", lambda call, *_, **__: f"race {call.spec.out}")
    wrap(made, "prepared", lambda call, candidate, *_, **__: f"candidate {candidate} ({call.spec.out})")
    wrap(planner, "compile_ahead", "compile ahead")
    wrap(host, "build_module", lambda recipe, spec, *_, **__: f"{recipe.backend} module, built or loaded ({spec.out})")
    wrap(c, "generate", lambda spec, *_, **__: f"C codegen ({spec.out})")
    wrap(c_compile, "compile_library", "C compile")
    wrap(jax_compiler, "backend_compile_and_load", "XLA compile")

    import gc

    collecting = {}

    def collection(phase: str, info: dict) -> None:  # the garbage collector's passes over the older objects
        if info["generation"] < 2:
            return
        if phase == "start":
            collecting["t"] = time.perf_counter()
        elif "t" in collecting:
            spans.append((collecting.pop("t"), time.perf_counter(), f"GC generation {info['generation']}",
                          threading.current_thread().name))

    gc.callbacks.append(collection)


def child(job: dict) -> None:
    import time

    import jax  # noqa: F401 - imported before the TTFK starts, as in make bench

    import tullax  # noqa: F401
    from tullax.benchmarking import worker

    spans: list = []
    _instrument(spans)
    began = {}
    make_subject = worker.make_subject

    def timed_subject(*args, **kwargs):  # the TTFK starts here (worker.phase_ttfk)
        began.setdefault("t", time.perf_counter())
        began.setdefault("cpu", os.times())
        return make_subject(*args, **kwargs)

    worker.make_subject = timed_subject
    found = worker.phase_ttfk(job)
    ended = os.times()
    start = began["t"]
    cpu = {"process_cpu_ms": (ended.user + ended.system - began["cpu"].user - began["cpu"].system) * 1e3,
           "compiler_cpu_ms": (ended.children_user + ended.children_system - began["cpu"].children_user
                               - began["cpu"].children_system) * 1e3}
    rows = [((s - start) * 1e3, (e - start) * 1e3, label, thread) for s, e, label, thread in sorted(spans)
            if e >= start]
    print(MARK + json.dumps({"ttfk_ms": found["ttfk_ms"], "ttfk_fwd_ms": found["ttfk_fwd_ms"], "spans": rows, **cpu}),
          flush=True)


# ------------------------------------------------------------------------------------------------ parent
def run_child(job: dict, cache: str) -> dict:
    env = {**os.environ, "TULLAX_CACHE_DIR": cache, "PYTHONPATH": str(HERE.parent)}
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(job)], env=env, capture_output=True,
                          text=True, timeout=600, cwd=HERE.parent)
    for line in done.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise SystemExit(f"the TTFK child failed:\n{done.stderr[-3000:]}")


def totals(spans: list) -> dict[str, float]:
    """Summed wall time of the top-level kinds (a thread's spans may overlap another's: they are not added up
    across kinds into a total)."""
    kinds = {"XLA compile": "XLA compile", "C compile": "C compile", "C codegen": "C codegen", "race": "races",
             "c probe": "C probe"}
    found: dict[str, float] = {}
    for start, end, label, _ in spans:
        for prefix, kind in kinds.items():
            if label.startswith(prefix):
                found[kind] = found.get(kind, 0.0) + end - start
    return found


def show(title: str, record: dict) -> None:
    print(f"\n### {title}: TTFK {record['ttfk_ms']:.0f} ms (forward {record['ttfk_fwd_ms']:.0f} ms)\n")
    print("| from ms | to ms | ms | what | thread |\n|---:|---:|---:|---|---|")
    for start, end, label, thread in record["spans"]:
        if end - start >= SHORT_MS:
            print(f"| {start:.1f} | {end:.1f} | {end - start:.1f} | {label} | {thread} |")
    summed = ", ".join(f"{kind} {ms:.0f} ms" for kind, ms in totals(record["spans"]).items())
    print(f"\nsummed by kind: {summed}")
    if "process_cpu_ms" in record:  # CPU time over the TTFK: how busy the cores were, of os.cpu_count() x wall
        busy = (record["process_cpu_ms"] + record["compiler_cpu_ms"]) / record["ttfk_ms"]
        print(f"CPU time: this process {record['process_cpu_ms']:.0f} ms, the C compiler's processes "
              f"{record['compiler_cpu_ms']:.0f} ms: {busy:.2f} of {os.cpu_count()} cores busy on average")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("case", nargs="?", default="conv2d")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--json", help="write every run's records here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    from cases import suite

    matched = suite(names=[args.case])
    if not matched:
        raise SystemExit(f"no suite case named {args.case!r}")
    job = {**matched[0].job_fields(), "backend": args.backend, "dtype": "float32", "seed": 0}
    records = []
    for run in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory(prefix="tullax-ttfk-timeline-") as cache:
            cold = run_child(job, cache)
            warm = run_child(job, cache)
        show(f"{args.case} on {args.backend}, run {run}, cold", cold)
        show(f"{args.case} on {args.backend}, run {run}, warm", warm)
        records.append({"cold": cold, "warm": warm})
    if args.json:
        Path(args.json).write_text(json.dumps({"case": args.case, "backend": args.backend, "runs": records},
                                              indent=1))


if __name__ == "__main__":
    main()
