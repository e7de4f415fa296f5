"""How much work one call of a spec is, from its static shapes: the product of its index extents (the loop
nest's iteration count) times the cost of one body evaluation. Used to run tiny kernels serially (no thread
pool wake-up) and by the planner to decide whether timing both implementations on first use is cheap."""
from __future__ import annotations

from typing import Mapping

from tullax import settings
from tullax.spec.ir import Access, Binary, Call, Spec, walk

# Below this much work (estimated operations, ``work``) a loop kernel runs its serial variant: waking the
# thread pool costs more than the parallel part saves. A wake-up costs 20-40 us on a quiet 2-core machine
# (issue 14: 0.04 ms per call of a 32x48x24 matmul) and far more on a busy one (benchmarks/tiny_kernels.py
# measured 1 ms per call under a load average of 10, the serial variant 0.12 ms); the serial loop does a few
# operations per nanosecond, so up to ~2^18 estimated operations (a 45^3 matmul) the wake-up alone outweighs
# what a second thread can save.
SERIAL_WORK = 1 << 18
SERIAL_WORK_ENV = "TULLAX_SERIAL_WORK"  # overrides SERIAL_WORK and TEAM_WORK (0: never serial, as before)
# Below this much work a kernel runs on one thread (the planner's 'tiny' rule keeps SERIAL_WORK). The vectorised
# loops do tens of estimated operations per nanosecond, not a few: the MLP layer's forward (256x64 by 64x64,
# 3.1M) takes ~60 us on one core, about what a second thread's wake-up and barrier cost on a quiet machine, and
# on a busy one its team took ~10x its serial time (benchmarks/small_grad.py, TULLAX_C_THREADS=1 against 2).
TEAM_WORK = 1 << 22
# A recurrence whose steps sum nothing (``h[b,t,n] := lam[n]*h[b,t-1,n] + x[b,t,n]``, its reverse adjoint scan)
# streams each element once at a few operations each: memory-bound. A team over its batch rows bought no wall time
# at 16x1024x64 float32 (the forward 0.39 ms on one thread or two) for twice the CPU time, more under load
# (benchmarks/results/scan-threads.json): such a scan runs on one thread up to this much work.
STREAM_SCAN_WORK = 1 << 24

# Relative cost of one evaluation of a body node: a transcendental call costs several arithmetic operations.
_CALL_COST = 8
# What a reduction adds per term beyond the body: a logsumexp takes an exp of every term, after a pass that finds
# the max (a 2048x1024 logsumexp counted as one read per term ran on one thread and was never raced)
_REDUCTION_COST = {"logsumexp": _CALL_COST + 2}


def body_cost(spec: Spec) -> int:
    """Estimated operations per iteration of the loop nest: one per arithmetic node and per array read,
    ``_CALL_COST`` per function call, and what the reduction itself takes per term (a logsumexp's exp)."""
    cost = _REDUCTION_COST.get(spec.redop, 0) if spec.reduced else 0
    for node in walk(spec.body):
        if isinstance(node, Call):
            cost += _CALL_COST
        elif isinstance(node, Binary | Access):
            cost += 1
    return max(cost, 1)


def iterations(spec: Spec, shapes: Mapping[str, tuple[int, ...]]) -> int:
    """The number of points of the index space (free and reduced indices) for these input shapes."""
    from tullax.spec.shapes import eval_shapes

    total = 1
    for lo, hi in eval_shapes(spec, shapes).values():
        total *= max(hi - lo, 0)
    return total


def work(spec: Spec, shapes: Mapping[str, tuple[int, ...]]) -> int:
    """Estimated operations of one call: ``iterations * body_cost`` (at least 1)."""
    return max(iterations(spec, shapes) * body_cost(spec), 1)


def runs_serially(spec: Spec, shapes: Mapping[str, tuple[int, ...]]) -> bool:
    """Whether a loop kernel of ``spec`` should skip the parallel launch for a call with these shapes: below
    ``TEAM_WORK`` (``STREAM_SCAN_WORK`` for a recurrence that sums nothing), or the integer in
    ``TULLAX_SERIAL_WORK``."""
    configured = settings.value(SERIAL_WORK_ENV)
    if configured is not None:
        return work(spec, shapes) < configured
    streams = spec.scan is not None and not spec.reduced
    return work(spec, shapes) < (STREAM_SCAN_WORK if streams else TEAM_WORK)


def serial_threshold() -> int:
    """``SERIAL_WORK``, or the integer in ``TULLAX_SERIAL_WORK``."""
    configured = settings.value(SERIAL_WORK_ENV)
    return SERIAL_WORK if configured is None else configured
