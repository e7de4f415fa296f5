"""Runtime counters: how many times each kernel ran inside a JAX computation, and through which callback.

The host callbacks increment these, so tests can prove that ``jax.vmap`` of a kernel runs ONE batched kernel
per call (not one per batch element) and benchmarks can tell which callback path ran. XLA may run callbacks
on several threads at once (``shard_map`` over host devices), hence the lock.

    from tullax.runtime import stats
    stats.reset()
    ...
    stats.launches[(spec_text, "numba")]      # kernel runs of that spec on that backend
    stats.total()                             # all kernel runs
"""
from __future__ import annotations

import threading
from collections import Counter

# (canonical spec text, backend name) -> number of kernel runs
launches: Counter = Counter()
# callback path ("buffer" or "pure") -> number of kernel runs
paths: Counter = Counter()

_lock = threading.Lock()


def record_launch(spec_text: str, backend: str, path: str) -> None:
    """Count one kernel run (called from inside the host callbacks)."""
    with _lock:
        launches[(spec_text, backend)] += 1
        paths[path] += 1


def reset() -> None:
    """Forget every count."""
    with _lock:
        launches.clear()
        paths.clear()


def total(backend: str | None = None) -> int:
    """Kernel runs so far, on every backend or on ``backend`` only."""
    with _lock:
        return sum(n for (_, name), n in launches.items() if backend is None or name == backend)


def by_spec() -> dict[str, int]:
    """Kernel runs per spec text, all backends together (a snapshot)."""
    with _lock:
        counts: Counter = Counter()
        for (spec_text, _), n in launches.items():
            counts[spec_text] += n
        return dict(counts)


__all__ = ["launches", "paths", "record_launch", "reset", "total", "by_spec"]
