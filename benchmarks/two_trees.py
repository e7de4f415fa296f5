"""One benchmark case's jitted forward and backward (``make bench``'s subjects) in two source trees side by side:
a worker process per tree (its own ``PYTHONPATH`` and ``TULLAX_CACHE_DIR``), timed in alternating rounds in one
run, so a load change on a shared machine moves both alike. Per round each worker runs a batch of calls and
reports its process CPU time per call (``--threads 1``: the kernels' own work, which other processes' load does
not change) and wall time; the ratio new/old is paired within each round.

    python benchmarks/two_trees.py OLD_TREE NEW_TREE "row max" [--backend c] [--rounds 15] [--threads 1]

Under ``auto`` each worker also prints the planner's decision per kernel, so a different plan shows as such.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

WORKER = r"""
import json, os, sys, time
if os.environ.get("TWO_TREES_CPU"):  # both workers on one core: the same neighbours on a shared machine
    os.sched_setaffinity(0, {int(os.environ["TWO_TREES_CPU"])})
from tullax.benchmarking import worker as w
job = json.loads(sys.argv[1])
state = {}
subject, args, cotangent = w._subject_and_inputs(job, state)
calls = {which: w._phase_call(subject, which, args, cotangent) for which in ("fwd", "bwd")}
for call in calls.values():
    call(); call()
describe = getattr(w, "_described", str)
plans = [f"{key[0].out}: {describe(found)}" for key, found in w._planned(job).items()]
print(json.dumps({"ready": True, "plans": plans}), flush=True)
for line in sys.stdin:
    which, count = line.split()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(int(count)):
        calls[which]()
    print(json.dumps({"cpu_ms": (time.process_time() - cpu) * 1e3 / int(count),
                      "wall_ms": (time.perf_counter() - wall) * 1e3 / int(count)}), flush=True)
"""


def start(tree: str, cache: str, job: dict, threads: int | None, extra: list[str],
          pin: int | None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": tree, "TULLAX_CACHE_DIR": cache, **dict(e.split("=", 1) for e in extra)}
    if threads:
        env["TULLAX_C_THREADS"] = str(threads)
    if pin is not None:
        env["TWO_TREES_CPU"] = str(pin)
    process = subprocess.Popen([sys.executable, "-c", WORKER, json.dumps(job)], cwd=tree, env=env, text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    return process


def ask(process: subprocess.Popen, request: str | None = None) -> dict:
    if request is not None:
        process.stdin.write(request + "\n")
        process.stdin.flush()
    line = process.stdout.readline()
    if not line:
        raise SystemExit(f"a worker died (exit {process.wait()})")
    return json.loads(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("case")
    parser.add_argument("--backend", default="c")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--phases", default="fwd,bwd")
    parser.add_argument("--cache", default="/tmp/two-trees-cache",
                        help="CACHE/old and CACHE/new: the trees' TULLAX_CACHE_DIR")
    parser.add_argument("--pin", type=int, default=None, metavar="CPU", help="run both workers on this core")
    parser.add_argument("--env-old", action="append", default=[], metavar="KEY=VALUE", help="for the old worker")
    parser.add_argument("--env-new", action="append", default=[], metavar="KEY=VALUE", help="for the new worker")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.cases import suite

    case = suite(quick=args.quick, names=[args.case])[0]
    job = {"spec": case.spec, "ranges": None, "backend": args.backend, "shapes": case.shapes, "dtype": "float32",
           "seed": 0, "idiomatic": case.idiomatic}
    workers = {name: start(tree, os.path.join(args.cache, name), job, args.threads, extra, args.pin)
               for name, tree, extra in (("old", args.old, args.env_old), ("new", args.new, args.env_new))}
    for name, process in workers.items():
        ready = ask(process)
        print(f"{name} plans: {ready['plans']}", flush=True)
    found = {}
    for phase in args.phases.split(","):
        one = min(ask(workers["new"], f"{phase} 1")["wall_ms"] for _ in range(3))
        batch = max(1, min(50, round(20.0 / max(one, 1e-3))))
        times: dict[str, list[dict]] = {"old": [], "new": []}
        for round_ in range(args.rounds):
            for name in (("old", "new") if round_ % 2 == 0 else ("new", "old")):
                times[name].append(ask(workers[name], f"{phase} {batch}"))
        row = {}
        for clock in ("cpu_ms", "wall_ms"):
            paired = sorted(n[clock] / o[clock] for o, n in zip(times["old"], times["new"]))
            q = statistics.quantiles(paired, n=4)
            row[clock] = {"old": statistics.median(t[clock] for t in times["old"]),
                          "new": statistics.median(t[clock] for t in times["new"]),
                          "paired": statistics.median(paired), "q1": q[0], "q3": q[2]}
        found[phase] = row
        c, wl = row["cpu_ms"], row["wall_ms"]
        print(f"{case.name} {args.backend} {phase}: cpu old {c['old']:.3f} new {c['new']:.3f} ms, new/old "
              f"{c['paired']:.3f} [{c['q1']:.3f}-{c['q3']:.3f}]; wall old {wl['old']:.3f} new {wl['new']:.3f}, "
              f"new/old {wl['paired']:.3f} [{wl['q1']:.3f}-{wl['q3']:.3f}] ({args.rounds} rounds of {batch})",
              flush=True)
    for process in workers.values():
        process.stdin.close()
        process.wait()
    print(json.dumps(found))


if __name__ == "__main__":
    main()
