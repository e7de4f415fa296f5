"""Every kernel (forward and each gradient step) of chosen suite cases: what ``backend="auto"`` plans for it and
what every candidate (the loop backend, each XLA form) costs on it, so a wrong choice shows up.

    PYTHONPATH=$PWD python benchmarks/planner_check.py "Gaussian kernel sum" conv2d --rounds 7

Each candidate runs on random inputs of the step's shapes through the planner's own timing harness
(``tullax.planner.candidates.prepared``: compiled and run once, then ``--rounds`` rounds with the
candidates interleaved, so load from other processes slows all alike); the median and best per candidate
(wall) and the median process CPU time (all threads) are printed with the plan a fresh process would make
(timing on, an empty compile cache in a temp dir).
The XLA broadcast lowering ('grid') is skipped where its index space exceeds ``--grid-limit`` points."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help="suite case names (default: all)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="the suite's --quick sizes")
    parser.add_argument("--grid-limit", type=float, default=3e8)
    args = parser.parse_args(argv)
    os.environ.setdefault("TULLAX_CACHE_DIR", tempfile.mkdtemp(prefix="tullax-plancheck-"))

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.cases import suite
    from tullax.backends import workload
    from tullax.backends.xla import forms as xla_forms
    from tullax.planner import decide as planner
    from tullax.planner.call import kernel_shapes
    from tullax.planner.explain import describe, text
    from tullax.planner.rules import LOOPS, loop_backend
    from tullax.spec.frontend import compile_spec

    loops = loop_backend()
    for case in suite(quick=args.quick, names=args.cases or None):
        _, spec = compile_spec(case.spec)
        print(f"== {case.name}: {case.spec}  {dict(case.shapes)}", flush=True)
        for label, step, shapes in kernel_shapes(spec, case.shapes):
            dtypes = {i.name: ("int64" if i.kind == "index" else "float32") for i in step.inputs}
            start = time.perf_counter()
            chosen = planner.plan(step, shapes, dtypes)
            planning = time.perf_counter() - start
            candidates = [LOOPS] + [f"xla:{f}" for f in xla_forms.forms(step)
                                           if f != "grid" or workload.iterations(step, shapes) <= args.grid_limit]
            samples = _samples(step, shapes, dtypes, tuple(candidates), loops, args.rounds)
            print(f"  {label}: {text(step)}")
            print(f"    plan ({planning:.2f} s to decide): {describe(chosen)}")
            for candidate, (times, used) in samples.items():
                if times:
                    print(f"    {candidate:12s} wall median {statistics.median(times):9.3f} best {min(times):9.3f} ms;"
                          f"  CPU median {statistics.median(used):9.3f} ms")
                else:
                    print(f"    {candidate:12s} cannot run")
    return 0


def _samples(spec, shapes, dtypes, candidates, loops, rounds):
    import numpy as np

    from tullax.planner import candidates as made
    from tullax.planner.call import Call
    from tullax.spec.examples import make_inputs
    from tullax.spec.shapes import result_dtype

    data = np.dtype(result_dtype(spec, {n: np.dtype(d) for n, d in dtypes.items()})).name
    values = make_inputs(spec, shapes, data, seed=0)
    values = [v.astype(dtypes[i.name]) if hasattr(v, "astype") else v for i, v in zip(spec.inputs, values)]
    call = Call.of(spec, shapes, dtypes, loops)
    calls = {c: made.prepared(call, c, values) for c in candidates}
    times: dict[str, tuple[list[float], list[float]]] = {c: ([], []) for c in candidates}
    for _ in range(rounds):
        for candidate, call in calls.items():
            if call is not None:
                start, cpu = time.perf_counter(), time.process_time()
                call()
                times[candidate][0].append((time.perf_counter() - start) * 1e3)
                times[candidate][1].append((time.process_time() - cpu) * 1e3)
    return times


if __name__ == "__main__":
    raise SystemExit(main())
