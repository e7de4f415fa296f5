"""Running the chunks of one Numba kernel call on this process's own threads.

A chunked variant (``tullax.printers.numba.chunked``) is serial code over ``range(p_lo, p_hi)`` of its
outermost parallel loop; it is compiled with ``nogil=True``, so threads that call it run at the same time.
Splitting one call into as many even chunks as Numba has threads (``numba.get_num_threads()``: the same
setting, ``NUMBA_NUM_THREADS`` or ``numba.set_num_threads``) is what Numba's default static schedule does
with a prange; the calling thread runs the first chunk itself and waits for the others.

Why not Numba's prange: compiling a parfor costs two to three times compiling the same loop nest serially
(``benchmarks/ttfk_breakdown.py``), and a kernel's parallel variant is the first thing a real-sized call
compiles.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Sequence

_POOL: ThreadPoolExecutor | None = None
_POOL_SIZE = 0
_LOCK = threading.Lock()


def _pool(workers: int) -> ThreadPoolExecutor:
    """The process's worker threads, at least ``workers`` of them (grown, never shrunk: idle ones cost
    nothing)."""
    global _POOL, _POOL_SIZE
    with _LOCK:
        if _POOL is None or _POOL_SIZE < workers:
            old, _POOL = _POOL, ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tullax-numba")
            _POOL_SIZE = workers
            if old is not None:
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
    """``function(*args, lo, hi)`` over ``split(start, stop, threads)``, the chunks on different threads;
    returns when every chunk has run (the first exception any chunk raised is raised here)."""
    chunks = split(start, stop, threads)
    if len(chunks) <= 1:
        for lo, hi in chunks:
            function(*args, lo, hi)
        return
    pool = _pool(len(chunks) - 1)
    futures: list[Future] = [pool.submit(function, *args, lo, hi) for lo, hi in chunks[1:]]
    try:
        lo, hi = chunks[0]
        function(*args, lo, hi)
    finally:
        for future in futures:
            future.result()
