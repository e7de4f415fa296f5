"""How many threads a loop backend's kernels run on here, read from the settings now, without starting the
backend: the planner puts it in a decision's cache key, so a race decided with 2 threads is not reused with 16."""
from __future__ import annotations

import os


def loop_threads(backend: str | None) -> int | str | None:
    """The thread count of ``backend``'s parallel kernels (None for a GPU backend or none: a GPU's decisions are
    keyed by the device instead)."""
    if backend == "c":
        from tullax.backends.c.load import configured_threads

        return configured_threads()  # not threads(): asking for a key starts no OpenMP pool (forks)
    if backend == "numba":  # Numba's own rule: NUMBA_NUM_THREADS, else every CPU
        configured = os.environ.get("NUMBA_NUM_THREADS", "").strip()
        return int(configured) if configured.isdigit() else os.cpu_count() or 1
    if backend == "julia":  # what juliacall starts (started) Julia with
        from tullax.backends.julia.runtime import julia_threads

        return os.environ.get("PYTHON_JULIACALL_THREADS") or julia_threads(os.environ)
    return None


__all__ = ["loop_threads"]
