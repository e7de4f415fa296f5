"""This process's own compiles that run beside its work: a steps module's C compile started with the forward's,
XLA compiling the candidates of races to come. A race timed while they run times the loops against the compiler
for the cores (an OpenMP team waits for its slowest thread, and on 2 cores one thread shares its core with the
compiler: an elementwise kernel timed 4.5-15 ms there and runs in well under 1 ms), so ``tullax.planner.race``
waits for them before it times, within its compile budget."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

_LOCK = threading.Lock()
_RUNNING = [0]


@contextmanager
def compiling() -> Iterator[None]:
    """Marks a compile this process runs beside its work, for as long as the block runs."""
    with _LOCK:
        _RUNNING[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _RUNNING[0] -= 1


def running() -> int:
    """How many of this process's own compiles are running now."""
    return _RUNNING[0]
