"""Where the time to first kernel (TTFK) goes on the Numba backend, per suite case (issue 14, item 4).

TTFK is measured as ``make bench`` does (``tullax.benchmarking.worker.phase_ttfk``: a new process that has
imported jax and tullax, then kernel construction, jit tracing, compiling and the first forward and VJP call
on tiny inputs), cold (empty cache) and warm (the cache the cold run filled). Each child also records:

* ``numba_import``: importing numba (tullax imports it with the first kernel, so TTFK includes it), timed in
  a process of its own after the TTFK (a new interpreter with ``import numba`` minus one without);
* per njit function made ready: its name, whether it was compiled or loaded, and the milliseconds;
* Numba's own event timings: the compiler passes (``numba:run_pass``, by pass name: self time, nested passes
  of a parfor's gufunc compile counted under their own names), the time under the LLVM lock (codegen and
  optimisation) and the time under the compiler lock;
* ``other``: TTFK minus the time spent making functions ready: importing numba, JAX tracing, tullax's
  lowering and printing, the kernel runs, and the first-compile-in-process initialisation is NOT in it (it
  falls inside the first function's compile).

Usage: ``python benchmarks/ttfk_breakdown.py [case ...] [--runs N] [--backend numba] [--json out.json]``.
Every figure is wall time (the breakdown is about one process's latency); compare runs on a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
MARK = "@@ttfk-breakdown "


# ------------------------------------------------------------------------------------------------ child
def _instrument(record: dict) -> None:
    """Hook numba's import, tullax's load-or-compile and Numba's compiler events (only wrappers: the same
    code runs)."""
    from tullax.backends.numba import backend

    original = backend.NumbaHostKernel._load_or_compile

    def timed(self, fn, args):
        if "_passes" not in record:
            _listen(record)
        before = dict(backend.compile_stats())
        start = time.perf_counter()
        original(self, fn, args)
        after = backend.compile_stats()
        ms = (time.perf_counter() - start) * 1e3
        if ms > 0.05:
            record["functions"].append({
                "function": fn.__name__, "spec": self.generated.kernel.spec_text,
                "compiled": after["compiled"] > before["compiled"], "ms": round(ms, 1),
                "module_variants": len(self.generated.source.split("@njit")) - 1})

    backend.NumbaHostKernel._load_or_compile = timed


def _listen(record: dict) -> None:
    from numba.core import event

    passes: dict[str, float] = defaultdict(float)
    stack: list[list] = []  # [name, start, child time]

    class Passes(event.Listener):
        def on_start(self, ev):
            stack.append([ev.data["name"].split(" [")[0], time.perf_counter(), 0.0])

        def on_end(self, ev):
            name, start, children = stack.pop()
            spent = time.perf_counter() - start
            passes[name] += spent - children
            if stack:
                stack[-1][2] += spent

    locks = {"numba:llvm_lock": 0.0, "numba:compiler_lock": 0.0}

    class Lock(event.Listener):
        def __init__(self, kind):
            self.kind, self.depth, self.start = kind, 0, 0.0

        def on_start(self, ev):
            if self.depth == 0:
                self.start = time.perf_counter()
            self.depth += 1

        def on_end(self, ev):
            self.depth -= 1
            if self.depth == 0:
                locks[self.kind] += time.perf_counter() - self.start

    event.register("numba:run_pass", Passes())
    for kind in locks:
        event.register(kind, Lock(kind))
    record["_passes"], record["_locks"] = passes, locks


def child(job: dict) -> None:
    import jax  # noqa: F401 - as the bench worker: imports are not part of TTFK

    import tullax  # noqa: F401
    from tullax.benchmarking import worker

    record: dict = {"functions": [], "numba_import_ms": 0.0}
    _instrument(record)
    cpu = time.process_time()
    result = worker.phase_ttfk(job)
    record["cpu_ms"] = (time.process_time() - cpu) * 1e3  # every thread of the process: robust to a busy machine
    start = time.perf_counter()  # numba's import, measured in a process of its own (it is in TTFK, once)
    subprocess.run([sys.executable, "-c", "import numba"], check=True)
    record["numba_import_ms"] = (time.perf_counter() - start) * 1e3 - _python_startup_ms()
    passes, locks = record.pop("_passes", {}), record.pop("_locks", {})
    ready = sum(f["ms"] for f in record["functions"])
    record.update(ttfk_ms=result["ttfk_ms"], fwd_ms=result["ttfk_fwd_ms"], ready_ms=ready,
                  other_ms=result["ttfk_ms"] - ready,
                  llvm_ms=locks.get("numba:llvm_lock", 0) * 1e3,
                  compiler_lock_ms=locks.get("numba:compiler_lock", 0) * 1e3,
                  passes={k: round(v * 1e3, 1) for k, v in sorted(passes.items(), key=lambda kv: -kv[1])[:8]})
    print(MARK + json.dumps(record), flush=True)


def _python_startup_ms() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return (time.perf_counter() - start) * 1e3


# ----------------------------------------------------------------------------------------------- parent
def run_child(job: dict, cache_dir: str) -> dict:
    env = {**os.environ, "TULLAX_CACHE_DIR": cache_dir}
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(job)], env=env, capture_output=True,
                          text=True, timeout=600)
    for line in done.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise RuntimeError(f"child failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")


def measure(case, backend: str, runs: int) -> dict:
    from tullax.benchmarking.runner import case_document

    document = case_document(case, "float32")
    job = {**{k: document[k] for k in ("spec", "ranges", "shapes", "check_shapes", "ttfk_shapes", "idiomatic")},
           "backend": backend, "dtype": "float32", "seed": 0}
    colds, warms = [], []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="tullax-ttfk-") as cache_dir:
            colds.append(run_child(job, cache_dir))
            warms.append(run_child(job, cache_dir))
    best = min(colds, key=lambda r: r["ttfk_ms"])
    warm = min(warms, key=lambda r: r["ttfk_ms"])
    return {"case": case.name, "cold": best, "warm": warm,
            "cold_samples_ms": [round(r["ttfk_ms"]) for r in colds],
            "warm_samples_ms": [round(r["ttfk_ms"]) for r in warms]}


def show(result: dict) -> None:
    cold, warm = result["cold"], result["warm"]
    compiled = [f for f in cold["functions"] if f["compiled"]]
    print(f"\n## {result['case']}: cold {cold['ttfk_ms']:.0f} ms (fwd {cold['fwd_ms']:.0f}, CPU {cold['cpu_ms']:.0f}), "
          f"warm {warm['ttfk_ms']:.0f} ms (CPU {warm['cpu_ms']:.0f}); samples cold {result['cold_samples_ms']} "
          f"warm {result['warm_samples_ms']}")
    print(f"  cold: numba import {cold['numba_import_ms']:.0f} ms, {len(compiled)} functions compiled in "
          f"{sum(f['ms'] for f in compiled):.0f} ms (LLVM lock {cold['llvm_ms']:.0f} ms), other (jax tracing, "
          f"lowering, runs) {cold['other_ms']:.0f} ms")
    for f in cold["functions"]:
        print(f"    {'compiled' if f['compiled'] else 'loaded  '} {f['ms']:7.1f} ms  {f['function']:<16} "
              f"(module of {f['module_variants']})  {f['spec']}")
    print(f"  passes (self ms): {cold['passes']}")
    print(f"  warm: numba import {warm['numba_import_ms']:.0f} ms, {len(warm['functions'])} functions ready in "
          f"{warm['ready_ms']:.0f} ms, other {warm['other_ms']:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("cases", nargs="*", help="suite case names (default: all)")
    parser.add_argument("--runs", type=int, default=1, help="cold+warm process pairs per case (best is shown)")
    parser.add_argument("--backend", default="numba")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    from cases import suite

    results = []
    for case in suite(names=args.cases or None):
        results.append(measure(case, args.backend, args.runs))
        show(results[-1])
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
