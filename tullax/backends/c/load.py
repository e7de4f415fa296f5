"""Loading the c backend's compiled libraries (kernel modules and the XLA FFI handler) into this process.

Every such library links libgomp (``-fopenmp``). libgomp reads ``GOMP_SPINCOUNT`` once, as it loads, so the
first library to load it decides how long idle team threads spin: ``load_library`` binds the spin before any
of them loads, once per process, under a lock (the forward module, the steps module compiled beside it and the
FFI handler load from different threads).
"""
from __future__ import annotations

import ctypes
import os

from tullax import settings
from tullax.runtime import forks

# libgomp's idle team threads spin this many iterations before they sleep, unless the user set GOMP_SPINCOUNT
# or OMP_WAIT_POLICY. Its default (300000 iterations, several ms here) keeps a core busy long after a kernel
# returns, and the XLA ops that follow it in the same program run on one core: the row norm's VJP (C forward,
# XLA gradient step) took 27 ms against 21 ms bounded. 10000 (a fraction of a ms) still catches the next call
# of a loop calling kernels back to back; 0 (passive) made mid-size calls 50-80 us slower.
OPENMP_SPIN = "10000"  # the write is declared in tullax.settings.WRITTEN
_SPIN_VARIABLES = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")
_LOCK = forks.lock()
_BOUND: list[bool] = []  # the one answer of this process, once decided


def bound_openmp_spin() -> bool:
    """Load libgomp with ``GOMP_SPINCOUNT=OPENMP_SPIN``, then restore the environment; True when this process's
    first call set the spin. A no-op where the user set either variable, where libgomp was already loaded (its
    setting stands), or where there is no libgomp (another OpenMP runtime). Decided once, under a lock: a
    second thread asking while the first has the variable set must not read that as the user's setting."""
    with _LOCK:
        if not _BOUND:
            _BOUND.append(_bind())
        return _BOUND[0]


def _bind() -> bool:
    if any(name in os.environ for name in _SPIN_VARIABLES) or _libgomp_loaded():
        return False
    os.environ["GOMP_SPINCOUNT"] = OPENMP_SPIN
    try:
        ctypes.CDLL("libgomp.so.1", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return False
    finally:
        del os.environ["GOMP_SPINCOUNT"]
    return True


def _libgomp_loaded() -> bool:
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return "libgomp" in maps.read()
    except OSError:  # not Linux: nothing to tell, so leave the runtime as it is
        return True


def load_library(path: str) -> ctypes.CDLL:
    """``ctypes.CDLL(path)`` after the spin is bound (OSError as CDLL raises it)."""
    bound_openmp_spin()
    return ctypes.CDLL(path)


THREADS_ENV = "TULLAX_C_THREADS"


def threads() -> int:
    """The OpenMP team size of a parallel call of a c kernel (or of the FFI handler's layout change); asked
    just before such a call runs: more than one thread marks libgomp's pool as started (``forks``). 1 in a
    process forked after that: the pool's threads are not there, and a larger team would wait for them."""
    if forks.lost(forks.OPENMP):
        return 1
    team = configured_threads()
    if team > 1:
        forks.started(forks.OPENMP)
    return team


def configured_threads() -> int:
    """The team size the settings give, whether or not a fork took the pool away."""
    configured = settings.value(THREADS_ENV)
    if configured is not None:
        return configured
    for env in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS"):  # the user's OpenMP setting, else the one Numba reads
        value = os.environ.get(env, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


__all__ = ["OPENMP_SPIN", "THREADS_ENV", "bound_openmp_spin", "configured_threads", "load_library", "threads"]
