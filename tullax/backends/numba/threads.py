"""Running the chunks of one Numba kernel call on this process's own threads.

A chunked variant (``tullax.printers.numba.chunked``) is serial code over ``range(p_lo, p_hi)`` of its
outermost parallel loop; it is compiled with ``nogil=True``, so threads that call it run at the same time.
One call runs on as many threads as Numba has (``numba.get_num_threads()``: the same setting,
``NUMBA_NUM_THREADS`` or ``numba.set_num_threads``), the caller's among them; the range is split into
``CHUNKS_PER_THREAD`` even chunks per thread, and each thread takes the next chunk until none is left, so a
thread the OS descheduled (a busy machine) delays the call by one small chunk, not by a whole share, as a
static schedule would.

Why not Numba's prange: compiling a parfor costs two to three times compiling the same loop nest serially
(``benchmarks/ttfk_breakdown.py``), and a kernel's parallel variant is the first thing a real-sized call
compiles.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Sequence

from tullax.runtime import forks

# Chunks per thread: enough that a late thread costs little, few enough that dispatching a chunk (a Numba
# call, a few microseconds) stays negligible next to a call above the serial work threshold.
CHUNKS_PER_THREAD = 4
_POOL: ThreadPoolExecutor | None = None
_POOL_SIZE = 0
_POOL_PID = 0
_LOCK = forks.lock()


def _pool(workers: int) -> ThreadPoolExecutor:
    """The process's worker threads, at least ``workers`` of them (grown, never shrunk: idle ones cost
    nothing). A forked child starts its own: it inherits the parent's executor without its threads, and
    work submitted there would never run."""
    global _POOL, _POOL_SIZE, _POOL_PID
    with _LOCK:
        inherited = _POOL_PID != os.getpid()
        if _POOL is None or inherited or _POOL_SIZE < workers:
            old, _POOL = _POOL, ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tullax-numba")
            _POOL_SIZE, _POOL_PID = workers, os.getpid()
            if old is not None and not inherited:
                old.shutdown(wait=False)
        return _POOL


def split(start: int, stop: int, parts: int) -> list[tuple[int, int]]:
    """``[start, stop)`` as at most ``parts`` non-empty, contiguous ranges whose lengths differ by at most
    one, in order."""
    total = stop - start
    if total <= 0:
        return []
    parts = max(1, min(parts, total))
    base, extra = divmod(total, parts)
    ranges, lo = [], start
    for k in range(parts):
        hi = lo + base + (k < extra)
        ranges.append((lo, hi))
        lo = hi
    return ranges


def run_chunks(function: Callable[..., Any], args: Sequence[Any], start: int, stop: int, threads: int) -> None:
    """``function(*args, lo, hi)`` over the chunks of ``[start, stop)`` (``split`` into ``CHUNKS_PER_THREAD``
    per thread), on ``threads`` threads (the caller's among them) that each take the next chunk until none
    is left; returns when every chunk has run (the first exception a chunk raised is raised here)."""
    chunks = split(start, stop, max(threads, 1) * CHUNKS_PER_THREAD)
    if threads <= 1 or len(chunks) <= 1:
        for lo, hi in chunks:
            function(*args, lo, hi)
        return
    pending = iter(chunks)
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                chunk = next(pending, None)
            if chunk is None:
                return
            function(*args, *chunk)

    helpers = min(threads, len(chunks)) - 1
    futures: list[Future] = [_pool(helpers).submit(work) for _ in range(helpers)]
    try:
        work()
    finally:
        for future in futures:
            future.result()
