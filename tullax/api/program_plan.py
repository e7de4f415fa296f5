"""Planning a program as one unit under ``auto`` (issue 50): the fused kernel (``tullax.compiler.fuse`` on ``c``)
is ONE candidate, the program's XLA lowering (its statements as jnp, jitted together) the other; both are timed on
random inputs of the call's shapes with the planner's own interleaved rounds (``tullax.planner.race.time_runs``),
once per shapes and dtypes, and the faster runs. With ``TULLAX_PLAN_TIMING`` off the rule decides: a program that
fuses runs fused."""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

FUSED, XLA = "fused", "xla"


def plan_key(names: tuple[str, ...], env: Mapping[str, Any]) -> tuple:
    return tuple((n, tuple(np.shape(env[n])), np.dtype(getattr(env[n], "dtype", np.float64)).name) for n in names)


def decide(names: tuple[str, ...], env: Mapping[str, Any], fused: Callable[..., Any],
           xla: Callable[..., Any]) -> tuple[str, list[tuple[str, float | None]]]:
    """(the winner, each candidate's best ms) for a call on values like ``env``'s; ``fused`` and ``xla`` take the
    inputs positionally in ``names``' order."""
    import jax

    from tullax import settings
    from tullax.planner import tuning
    from tullax.planner.race import time_runs

    if not settings.value("TULLAX_PLAN_TIMING"):
        return FUSED, []
    rng = np.random.default_rng(0)
    values = []
    for n in names:
        value = env[n]
        dtype = np.dtype(getattr(value, "dtype", np.float64))
        # concrete stand-ins of every input, scalars too (under jit the call's own values are tracers)
        values.append(jax.numpy.asarray(np.asarray(rng.normal(size=np.shape(value))).astype(dtype)))
    runs = {}
    for label, fn in ((FUSED, fused), (XLA, xla)):
        jitted = jax.jit(fn)
        jax.block_until_ready(jitted(*values))  # compiled before the race

        def run(jitted=jitted) -> None:
            jax.block_until_ready(jitted(*values))
        runs[label] = run
    timings = time_runs(runs, tuning.TIMING_RUNS)
    winner = min((ms, label) for label, ms in timings if ms is not None)[1]
    return winner, timings
