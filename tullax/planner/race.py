"""Timing the candidates of a close call as a planned kernel runs them: ``race`` makes random inputs of the call's
shapes and each candidate's run (``candidates.prepared``), and ``time_runs``, the one timing helper, times the
runs interleaved round by round on the call's clock."""
from __future__ import annotations

import time
from typing import Callable, Mapping

from tullax.planner import candidates as made
from tullax.planner import tuning
from tullax.planner.call import Call
from tullax.planner.rules import LOOPS

Timings = list[tuple[str, "float | None"]]


def race(call: Call, candidates: tuple[str, ...], rounds: int | None = None) -> Timings:
    """Best ms per candidate of ``call`` (None: it cannot run here), over at most ``rounds`` rounds
    (``tuning.TIMING_RUNS``). ``call.zero_start``: each candidate starts from zeros of its own."""
    import numpy as np

    from tullax.spec.examples import make_inputs
    from tullax.spec.shapes import result_dtype

    spec, dtypes = call.spec, call.dtypes
    data = np.dtype(result_dtype(spec, {n: np.dtype(d) for n, d in dtypes.items()})).name
    values = make_inputs(spec, call.shapes, data, seed=0)
    values = [v.astype(dtypes[item.name]) if hasattr(v, "astype") else v for item, v in zip(spec.inputs, values)]
    # the loop module compiles (a C compiler in subprocesses) while XLA compiles its forms in this thread
    building = made.start_module_build(call, values, data) if LOOPS in candidates else None
    runs = {c: made.prepared(call, c, values) for c in candidates if c != LOOPS}
    if building is not None:
        building.join()
    if LOOPS in candidates:
        runs[LOOPS] = made.prepared(call, LOOPS, values)
    return time_runs({c: runs[c] for c in candidates}, tuning.TIMING_RUNS if rounds is None else rounds, call.clock)


def time_runs(runs: Mapping[str, Callable[[], None] | None], rounds: int,
              clock: Callable[[], float] = time.perf_counter) -> Timings:
    """Best ms per candidate over ``rounds`` rounds on ``clock`` (seconds), the candidates interleaved within each
    round, so a burst of load from other processes slows every candidate alike instead of deciding the race.
    A candidate FIRST_DROP_RATIO slower than the fastest is not timed again, and from the third round one
    DROP_RATIO slower that was timed after a settling run or takes SETTLE_MS or more; the race ends early once
    every candidate but one was dropped. A candidate under SETTLE_MS is timed on a few runs in a row per round
    (SAMPLES, SAMPLE_MS; SCOUT_SAMPLE_MS when it is more than CLOSE_RATIO behind), after one untimed run."""
    best: dict[str, float | None] = {c: (None if run is None else float("inf")) for c, run in runs.items()}
    settled: set[str] = set()  # the fast candidates timed after a run that took the switch (not judged before)
    began = clock()
    for round_ in range(rounds):
        if round_ >= 2 and clock() - began > tuning.TIMING_BUDGET_S:
            break
        fastest = min((ms for ms in best.values() if ms is not None), default=float("inf"))
        running = [c for c, run in runs.items() if run is not None and best[c] <= fastest * (
            tuning.DROP_RATIO if round_ >= 2 and (c in settled or best[c] >= tuning.SETTLE_MS)
            else tuning.FIRST_DROP_RATIO)]
        if round_ > 0 and len(running) < 2:
            break  # every other candidate is a clear loser: nothing is left to decide
        for candidate in running:
            run = runs[candidate]
            fast = best[candidate] < tuning.SETTLE_MS
            if fast:
                run()  # not timed: it takes the switch from the previous candidate (see SETTLE_MS)
                settled.add(candidate)
            stretch = tuning.SAMPLE_MS if best[candidate] <= tuning.CLOSE_RATIO * fastest else tuning.SCOUT_SAMPLE_MS
            sampling = clock()
            for _ in range(tuning.SAMPLES if fast else 1):
                start = clock()
                run()
                end = clock()
                best[candidate] = min(best[candidate], (end - start) * 1e3)
                if (end - sampling) * 1e3 >= stretch:
                    break
    return list(best.items())
