"""The compile cache's deferred index updates: a kernel's first call notes its timings and hits without waiting for
a locked read-modify-write of the index (one per record took ~26 ms per kernel); they are written together, in
order, in one update by ``flush``: ``FLUSH_DELAY_S`` after the first, when the index is read, or at exit."""
from __future__ import annotations

import atexit
import threading
from typing import Any, Callable

from tullax.errors import TullaxError

Pending = tuple[str, str, dict[str, Any]]  # ("record" or "hit", key, fields)

FLUSH_DELAY_S = 2.0  # after the first deferred update: well after a first call, soon enough to survive a crash
# the deferred updates of every cache that had some, flushed at exit (a registry for the exit hook, under its lock)
_UNFLUSHED: set["DeferredUpdates"] = set()
_UNFLUSHED_LOCK = threading.Lock()


class DeferredUpdates:
    """The updates one cache defers; ``apply`` writes a list of them in one index update."""

    def __init__(self, apply: Callable[[list[Pending]], None]) -> None:
        self._apply = apply
        self._pending: list[Pending] = []
        self._pending_lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._flushing = threading.RLock()  # held while flushing: the exit's flush waits for the timer's

    def add(self, what: str, key: str, fields: dict[str, Any]) -> None:
        with self._pending_lock:
            self._pending.append((what, key, fields))
            with _UNFLUSHED_LOCK:
                _UNFLUSHED.add(self)
            if self._timer is None:
                self._timer = threading.Timer(FLUSH_DELAY_S, self.flush_quietly)
                self._timer.daemon = True
                self._timer.start()

    def flush_quietly(self) -> None:
        try:
            self.flush()
        except (OSError, TullaxError):  # a read-only cache or a held lock: timings are a nicety
            pass

    def flush(self) -> None:
        """Apply the pending updates, in order, in one index update."""
        with self._flushing:
            with self._pending_lock:
                pending, self._pending = self._pending, []
                if self._timer is not None and self._timer is not threading.current_thread():
                    self._timer.cancel()
                self._timer = None
            if pending:
                self._apply(pending)


@atexit.register
def _flush_at_exit() -> None:
    with _UNFLUSHED_LOCK:
        deferred = list(_UNFLUSHED)
    for updates in deferred:
        updates.flush_quietly()
