"""The one timing loop of the benchmark scripts (``benchmarks/``): ``timed`` calls a function ``repeat`` times
after its warm-up calls and keeps, per round, the wall time and the CPU time, a round being one call or the mean
of a batch of calls back to back. ``blocked`` makes a call of a JAX function wait for its result (JAX returns
before the work is done).

The suite's own loops stay their own: ``worker.best_of`` repeats quick calls until enough time was spent, the
head-to-head phase and the planner's race alternate candidates round by round.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

from tullax.errors import TullaxError


@dataclass(frozen=True)
class Timings:
    """Per round: ``wall_ms`` and ``cpu_ms`` (the CPU clock ``timed`` was given: this process's threads unless
    the caller counts more)."""

    wall_ms: tuple[float, ...]
    cpu_ms: tuple[float, ...]

    @property
    def best_ms(self) -> float:
        """The fastest round: on a shared machine, the one least disturbed by other processes."""
        return min(self.wall_ms)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.wall_ms)

    @property
    def median_cpu_ms(self) -> float:
        return statistics.median(self.cpu_ms)


def timed(call: Callable[[], Any], repeat: int, *, warmup: int = 1, batch: int = 1,
          cpu_clock: Callable[[], float] = time.process_time) -> Timings:
    """``repeat`` rounds of ``call()`` after ``warmup`` untimed calls; each round is ``batch`` calls back to back
    and reads as the mean of one. ``cpu_clock`` is in seconds (``time.process_time``: every thread of this
    process)."""
    if repeat < 1 or batch < 1:
        raise TullaxError(f"timed needs at least one round of at least one call, not {repeat} of {batch}")
    for _ in range(warmup):
        call()
    wall, cpu = [], []
    for _ in range(repeat):
        started, cpu_started = time.perf_counter(), cpu_clock()
        for _ in range(batch):
            call()
        wall.append((time.perf_counter() - started) * 1e3 / batch)
        cpu.append((cpu_clock() - cpu_started) * 1e3 / batch)
    return Timings(tuple(wall), tuple(cpu))


def blocked(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` made to wait until its JAX result is computed."""
    import jax

    return lambda: jax.block_until_ready(fn())


__all__ = ["Timings", "blocked", "timed"]
