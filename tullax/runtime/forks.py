"""What ``os.fork()`` leaves unusable in the child, and how the backends keep working there.

A forked child has only the thread that forked. Two things a parent's other threads owned break there:

* Thread pools. libgomp (OpenMP, the ``c`` backend and Numba's ``omp`` threading layer) keeps its team's
  threads in a pool the child inherits without the threads: the child's first parallel region with more than one
  thread waits for them forever (a team of one never touches the pool), and Numba's ``omp`` layer terminates
  such a child instead ("fork() called from a process already using GNU OpenMP"). A runtime calls
  ``started(name)`` before it starts its pool; in a process forked after that, ``lost(name)`` is True, and its
  kernels run serially there (the c backend with a team of one, Numba its serial variant). A process that
  started no pool before the fork keeps its threads.
* Locks that a parent's thread held at the fork (a compile in progress) stay held in the child for ever.
  ``lock()`` and ``rlock()`` make locks that are re-initialised in every child; the backends' build locks are
  made so, and ``on_fork(fn)`` runs ``fn`` in the child to drop state that such a thread left half-done.

jax is not fork-safe itself (a jitted call in a forked child of a process that ran one can hang): a child's
jit calls are out of scope; its eager calls on NumPy arrays run on the loop backends.
"""
from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Callable

OPENMP = "openmp"  # libgomp's team threads: the c backend's kernels, its FFI handler, Numba's 'omp' layer
NUMBA_LAYER = "numba"  # Numba's threading layer (prange), whichever it is

_STARTED: set[str] = set()  # pools started in this process, or in an ancestor before the fork that made it
_LOST: frozenset[str] = frozenset()  # pools started before a fork into this process: gone here
_LOCKS: "weakref.WeakSet[Any]" = weakref.WeakSet()
_HOOKS: list[Callable[[], None]] = []


def started(pool: str) -> None:
    """Say that ``pool``'s threads are (about to be) started in this process."""
    _STARTED.add(pool)


def lost(pool: str) -> bool:
    """Whether ``pool`` was started before a fork into this process, so its threads are not here."""
    return pool in _LOST


def lock() -> Any:
    """A ``threading.Lock`` that every forked child gets released."""
    made = threading.Lock()
    _LOCKS.add(made)
    return made


def rlock() -> Any:
    """A ``threading.RLock`` that every forked child gets released."""
    made = threading.RLock()
    _LOCKS.add(made)
    return made


def on_fork(hook: Callable[[], None]) -> None:
    """Run ``hook()`` in every forked child, after the locks are released."""
    _HOOKS.append(hook)


def _after_in_child() -> None:
    global _LOST
    _LOST = frozenset(_STARTED)
    for made in list(_LOCKS):
        made._at_fork_reinit()  # the same object, released: what threading does for its own locks
    for hook in _HOOKS:
        hook()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_in_child)

__all__ = ["NUMBA_LAYER", "OPENMP", "lock", "lost", "on_fork", "rlock", "started"]
