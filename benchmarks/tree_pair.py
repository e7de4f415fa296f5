"""One bench case's jitted forward and VJP on one backend, timed in this process: wall and process CPU time per
call. Run it from two trees in alternating fresh processes (each tree on ``PYTHONPATH`` with its own
``TULLAX_CACHE_DIR``) to compare them on a shared machine, where CPU time stays meaningful and wall time does not.

    PYTHONPATH=$TREE TULLAX_CACHE_DIR=/tmp/cache-$TAG python benchmarks/tree_pair.py CASE BACKEND TAG [REPS]
    python benchmarks/tree_pair.py conv1d c TAG 80 --steps   # conv1d's forward and each gradient step apart

It prints one line ``@@{json}``: the case, backend and tag; per phase the best and median wall ms and the median
and best CPU ms; under ``auto`` the planner's decisions (kernels and whole gradient) the process made. It imports
only what both the tree before issue 44 and today's hold (``tullax.benchmarking.worker``); the case comes from
this script's own ``cases.py``. ``two_trees.py`` pairs two long-lived workers round by round instead; this one
measures each process afresh, which shows the spread between processes of the same code."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable


def _case(name: str) -> tuple[str, dict]:
    """The spec and full-size shapes of a case of ``benchmarks/cases.py`` (this script's own tree)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.cases import case_names, suite

    if name not in case_names():
        raise SystemExit(f"no case {name!r}: one of {', '.join(case_names())}")
    case = suite(names=[name])[0]
    return case.spec, case.shapes


def _decisions(worker: Any) -> dict[str, list[str]]:
    """The planner's decisions this process made (auto), in either tree's layout."""
    found: dict[str, list[str]] = {}
    planned = worker._planned({"backend": "auto"})
    describe = getattr(worker, "_described", None)
    found["plans"] = [f"{key[0].out}: {describe(plan) if describe else plan.describe()}"
                      for key, plan in planned.items()]
    gradients = getattr(worker, "_gradients_planned", None)  # absent from the tree before the whole-gradient race
    if gradients is not None:
        found["gradient"] = [f"{plan.form} ({plan.source}): {plan.timings_ms}"
                             for plan in gradients({"backend": "auto"}).values()]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("case")
    parser.add_argument("backend")
    parser.add_argument("tag")
    parser.add_argument("reps", type=int, nargs="?", default=20)
    parser.add_argument("--steps", action="store_true", help="the forward and the VJP w.r.t. each input apart")
    args = parser.parse_args()

    import jax

    from tullax.benchmarking import worker

    spec, shapes = _case(args.case)
    subject = worker.Subject(spec, None, args.backend)
    values, cotangent = subject.inputs(shapes, "float32", 0)
    calls: dict[str, Callable[[], Any]]
    if args.steps:
        forward = jax.jit(subject.forward_fn)
        steps = {f"d{pos}": jax.jit(worker.vjp_of(subject.forward_fn, (pos,))) for pos in subject.wrt}
        calls = {"fwd": lambda: forward(*values),
                 **{name: (lambda f=f: f(cotangent, *values)) for name, f in steps.items()}}
    else:
        calls = {"fwd": lambda: subject.fwd(*values), "bwd": lambda: subject.bwd(cotangent, *values)}
    for call in calls.values():  # compile, and a warm run each
        worker.block(call())
        worker.block(call())
    walls: dict[str, list[float]] = {name: [] for name in calls}
    cpus: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.reps):  # the phases interleaved, round by round
        for name, call in calls.items():
            cpu, wall = time.process_time(), time.perf_counter()
            worker.block(call())
            walls[name].append((time.perf_counter() - wall) * 1e3)
            cpus[name].append((time.process_time() - cpu) * 1e3)
    out: dict[str, Any] = {"tag": args.tag, "case": args.case, "backend": args.backend}
    for name in calls:
        out.update({f"{name}_wall_min": round(min(walls[name]), 3),
                    f"{name}_wall_med": round(statistics.median(walls[name]), 3),
                    f"{name}_cpu_med": round(statistics.median(cpus[name]), 3),
                    f"{name}_cpu_min": round(min(cpus[name]), 3)})
    if args.backend == "auto":
        out.update(_decisions(worker))
    print("@@" + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
