"""Timing the candidates of a close call as a planned kernel runs them: ``race`` makes random inputs of the call's
shapes and each candidate's run (``candidates.prepared``), and ``time_runs``, the one timing helper, times the
runs interleaved round by round on the call's clock. A race's compiles stay within ``compile_budget`` of what
the loops alone take to compile."""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Mapping

from tullax.planner import candidates as made
from tullax.planner import tuning
from tullax.planner.call import Call
from tullax.planner.rules import LOOPS
from tullax.runtime import own_compiles


class Timings(list):
    """Best ms per candidate, ``(candidate, ms or None)`` pairs (None: it cannot run here, or was not made ready
    in time). ``over_budget``: the race ran out of its compile budget (``compile_budget``) before every candidate
    was ready, and timed nothing: the plan is then the rule's default."""

    over_budget: bool = False
    beside_compiles: bool = False  # timed while this process's own compiles still ran (``quiet``): not settled


def compile_budget(loop_seconds: float) -> float:
    """Seconds a race may spend making its candidates ready, given what the loops alone took to compile: a first
    call's race never costs more than a bounded multiple of the loops' own first call, under load too (the
    loops' compile slows with it)."""
    return max(tuning.RACE_COMPILE_FLOOR_S, tuning.RACE_COMPILE_RATIO * loop_seconds)


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
    clock = call.clock
    began = clock()
    # the loop module compiles (a C compiler in subprocesses) while XLA compiles its forms in this thread
    building = made.start_module_build(call, values, data) if LOOPS in candidates else None
    runs: dict[str, Any] = {}
    loops = _LoopClock(clock, began, building, LOOPS in candidates)
    if LOOPS in candidates and building is None:  # the loops compile in their preparation: first, for the budget
        runs[LOOPS] = made.prepared(call, LOOPS, values)
        loops.finished()
    over = False
    for candidate in candidates:
        if candidate != LOOPS:
            runs[candidate], over = (None, True) if over else _prepared_in_budget(call, candidate, values, loops)
    if building is not None:
        building.join()
        runs[LOOPS] = made.prepared(call, LOOPS, values)
    if over:
        timings = Timings((c, None) for c in candidates)
        timings.over_budget = True
        return timings
    quiet = _quiet(loops)
    timings = time_runs({c: runs[c] for c in candidates}, tuning.TIMING_RUNS if rounds is None else rounds,
                        call.clock)
    timings.beside_compiles = not quiet
    return timings


def _quiet(loops: "_LoopClock") -> bool:
    """Wait until none of this process's own compiles runs (a steps module's C compile, XLA compiling races to
    come: ``tullax.runtime.own_compiles``), within the race's compile budget; whether none runs. Timed beside
    them, the loops' thread team shares the cores with a compiler and loses races it wins in the program."""
    while own_compiles.running():
        if loops.over_budget():
            return False
        time.sleep(tuning.RACE_POLL_S)
    return True


class _LoopClock:
    """When the loops of a race finished compiling, on the race's clock: ``seconds()`` is what they took, None
    while they still compile (a thread building the module), 0 for a race without them."""

    def __init__(self, clock: Callable[[], float], began: float, building: threading.Thread | None,
                 raced: bool) -> None:
        self.clock, self.began, self.building = clock, began, building
        self.took: float | None = None if raced else 0.0

    def finished(self) -> None:
        self.took = self.clock() - self.began

    def seconds(self) -> float | None:
        if self.took is None and self.building is not None and not self.building.is_alive():
            self.finished()
        return self.took

    def over_budget(self) -> bool:
        took = self.seconds()
        return took is not None and self.clock() - self.began > compile_budget(took)


def _prepared_in_budget(call: Call, candidate: str, values: list, loops: _LoopClock) -> tuple[Any, bool]:
    """``candidates.prepared`` of an XLA candidate, in a thread of its own that the race stops waiting for when it
    runs out of its compile budget (XLA compiles without the GIL; an abandoned compile ends on its own); with
    whether the budget ran out."""
    if loops.over_budget():
        return None, True
    made_ready: list = []
    done = threading.Event()

    def prepare() -> None:
        try:
            made_ready.append(made.prepared(call, candidate, values))
        finally:
            done.set()

    threading.Thread(target=prepare, name="tullax-race-prepare", daemon=True).start()
    while not done.wait(tuning.RACE_POLL_S):
        if loops.over_budget():
            return None, True
    return (made_ready[0] if made_ready else None), False


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
    return Timings(best.items())
