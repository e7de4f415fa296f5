"""Runtime counters: how many times each kernel ran inside a JAX computation, and on which path.

The host callbacks increment these, so tests can prove that ``jax.vmap`` of a kernel runs ONE batched kernel
per call (not one per batch element) and benchmarks can tell which path ran. XLA may run callbacks on several
threads at once (``shard_map`` over host devices), hence the lock. A kernel that XLA calls as a custom call
(``tullax.backends.ffi``) runs no Python: its compiled handler counts, and its counter is ``watch``ed here and
read into these counts whenever they are read.

    from tullax.runtime import stats
    stats.reset()
    ...
    stats.launches[(spec_text, "numba")]      # kernel runs of that spec on that backend
    stats.total()                             # all kernel runs
"""
from __future__ import annotations

import threading
from collections import Counter
from typing import Any, Callable

_lock = threading.RLock()
# (spec text, backend, path) -> (read the native counter, its value already counted)
_watched: dict[tuple[str, str, str, Any], list[Any]] = {}


class _Counts(Counter):
    """A Counter that first adds what the watched native counters counted since it last looked."""

    def __getitem__(self, key: Any) -> int:
        _fold()
        return super().__getitem__(key)

    def __iter__(self):
        _fold()
        return super().__iter__()

    def __len__(self) -> int:
        _fold()
        return super().__len__()

    def __contains__(self, key: object) -> bool:
        _fold()
        return super().__contains__(key)

    def __eq__(self, other: object) -> bool:
        _fold()
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        _fold()
        return super().__repr__()

    def items(self):
        _fold()
        return super().items()

    def keys(self):
        _fold()
        return super().keys()

    def values(self):
        _fold()
        return super().values()

    def get(self, key: Any, default: Any = None) -> Any:
        _fold()
        return super().get(key, default)


# (canonical spec text, backend name) -> number of kernel runs
launches: Counter = _Counts()
# path ("ffi", "buffer" or "pure") -> number of kernel runs
paths: Counter = _Counts()


def record_launch(spec_text: str, backend: str, path: str) -> None:
    """Count one kernel run (called from inside the host callbacks)."""
    with _lock:
        _add(spec_text, backend, path, 1)


def watch(spec_text: str, backend: str, path: str, source: Any, read: Callable[[], int]) -> None:
    """Count the runs a native counter reports (``read()``: its running total) as runs of ``spec_text`` on
    ``backend`` and ``path``; ``source`` tells counters apart (watching one twice counts it once)."""
    with _lock:
        _watched.setdefault((spec_text, backend, path, source), [read, read()])


def _fold() -> None:
    with _lock:
        for (spec_text, backend, path, _), seen in _watched.items():
            now = seen[0]()
            if now != seen[1]:
                delta, seen[1] = now - seen[1], now
                _add(spec_text, backend, path, delta)


def _add(spec_text: str, backend: str, path: str, runs: int) -> None:
    """Count ``runs`` more runs, through dict's own methods (the counters' would fold again)."""
    for counter, key in ((launches, (spec_text, backend)), (paths, path)):
        dict.__setitem__(counter, key, dict.get(counter, key, 0) + runs)


def reset() -> None:
    """Forget every count."""
    with _lock:
        _fold()
        Counter.clear(launches)
        Counter.clear(paths)


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


__all__ = ["launches", "paths", "record_launch", "reset", "total", "by_spec", "watch"]
