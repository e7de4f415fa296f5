"""``tullax.benchmarking.timing``: the timing loop the benchmark scripts share."""
from __future__ import annotations

import time

import pytest

from tullax.benchmarking.timing import Timings, blocked, timed


def test_timed_runs_the_warm_ups_then_every_round_and_reads_a_batch_as_the_mean_of_one_call():
    calls = []
    ticks = iter(range(100))  # a CPU clock that advances one second per reading

    found = timed(lambda: calls.append(None), 3, warmup=2, batch=4, cpu_clock=lambda: float(next(ticks)))
    assert len(calls) == 2 + 3 * 4
    assert found.cpu_ms == (250.0, 250.0, 250.0)  # 1 s per round over a batch of 4
    assert len(found.wall_ms) == 3 and all(ms >= 0 for ms in found.wall_ms)


def test_timed_measures_wall_time():
    found = timed(lambda: time.sleep(0.002), 3, warmup=0)
    assert all(ms >= 2.0 for ms in found.wall_ms)
    assert found.best_ms == min(found.wall_ms) and found.best_ms <= found.median_ms


def test_the_summaries_of_timings():
    found = Timings(wall_ms=(3.0, 1.0, 2.0), cpu_ms=(6.0, 2.0, 4.0))
    assert (found.best_ms, found.median_ms, found.median_cpu_ms) == (1.0, 2.0, 4.0)


@pytest.mark.parametrize("repeat, batch", [(0, 1), (1, 0)])
def test_timed_refuses_an_empty_round(repeat, batch):
    with pytest.raises(ValueError, match="at least one round"):
        timed(lambda: None, repeat, batch=batch)


def test_blocked_waits_for_the_jax_result():
    import jax.numpy as jnp

    x = jnp.arange(4.0)
    assert list(blocked(lambda: x * 2)()) == [0.0, 2.0, 4.0, 6.0]
