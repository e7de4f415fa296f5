"""How often the planner's race of a close call picks the slower candidate, by the length of the stretch of runs in
a row that times a fast contender in each round (``tuning.SAMPLE_MS``; a candidate more than
``tuning.CLOSE_RATIO`` behind keeps ``SCOUT_SAMPLE_MS``) and the number of rounds.

    PYTHONPATH=$PWD python benchmarks/race_stretch.py --races 15

After a switch from another candidate, a kernel on two threads can run 2-3x slower for several ms on a shared
machine; a race whose stretches all fall in that transient hands the call to the other candidate, and the
decision is kept for every later process. The case is the suite's conv1d forward (the shifted slices ~10% faster
than the loops back to back): each variant races it ``--races`` times in one process, the variants interleaved,
and a race is wrong when the loops win it (the loops' time, with the planner's LOOP_MARGIN, under the slices').
The truth is taken from long back-to-back runs of both after the races. Writes
``benchmarks/results/race_stretch.json``."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

CASE = "y[b,i] := x[b,i+k]*w[k]"
SHAPES = {"x": (64, 16384), "w": (31,)}
VARIANTS = ((3.0, 5), (10.0, 5), (15.0, 3), (20.0, 2))  # (SAMPLE_MS, rounds); the first was the planner's


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--races", type=int, default=15, help="races per variant")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "race_stretch.json"))
    args = parser.parse_args(argv)
    os.environ.setdefault("TULLAX_CACHE_DIR", tempfile.mkdtemp(prefix="tullax-race-stretch-"))
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import numpy as np

    from tullax.planner import candidates as made
    from tullax.planner import race as racing
    from tullax.planner import tuning
    from tullax.planner.call import Call
    from tullax.planner.rules import loop_backend
    from tullax.spec.frontend import compile_spec

    _, spec = compile_spec(CASE)
    dtypes = {name: "float32" for name in SHAPES}
    call = Call.of(spec, SHAPES, dtypes, loop_backend())
    candidates = ("loops", "xla:slices", "xla:conv")
    racing.race(call, candidates)  # compiles everything once
    kept = tuning.SAMPLE_MS, tuning.SAMPLES
    races: dict[str, list[dict]] = {f"{ms:g} ms x {rounds}": [] for ms, rounds in VARIANTS}
    for race in range(args.races):
        for ms, rounds in VARIANTS:
            tuning.SAMPLE_MS, tuning.SAMPLES = ms, 1 << 10
            began = time.perf_counter()
            found = dict(racing.race(call, candidates, rounds=rounds))
            races[f"{ms:g} ms x {rounds}"].append({"loops_ms": found["loops"], "slices_ms": found["xla:slices"],
                                                   "race_s": time.perf_counter() - began})
            time.sleep(0.3)  # the machine idles between races, as between a program's first calls
        print(f"race {race + 1}/{args.races}", flush=True)
    tuning.SAMPLE_MS, tuning.SAMPLES = kept
    values = [np.random.default_rng(0).standard_normal(s).astype(np.float32) for s in SHAPES.values()]
    truth = {}
    for name in ("loops", "xla:slices"):
        run = made.prepared(call, name, values)
        times = []
        for _ in range(300):
            start = time.perf_counter()
            run()
            times.append((time.perf_counter() - start) * 1e3)
        truth[name] = {"best_ms": min(times), "median_ms": statistics.median(times)}
    summary = {}
    for label, found in races.items():
        wrong = sum(r["loops_ms"] * tuning.LOOP_MARGIN < r["slices_ms"] for r in found)
        summary[label] = {"wrong": wrong, "races": len(found),
                          "median_race_s": statistics.median(r["race_s"] for r in found)}
        print(f"{label:>12}: loops won {wrong}/{len(found)} races, median race "
              f"{summary[label]['median_race_s']:.2f} s; slices read "
              + " ".join(f"{r['slices_ms']:.2f}" for r in found))
    print("back to back, 300 runs each: " + ", ".join(
        f"{name} best {t['best_ms']:.2f} ms, median {t['median_ms']:.2f} ms" for name, t in truth.items()))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as out:
        json.dump({"case": CASE, "shapes": SHAPES, "summary": summary, "truth": truth, "races": races}, out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
