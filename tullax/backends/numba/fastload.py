"""Load a kernel from Numba's disk cache without initialising Numba's whole CPU target.

Why: ``Dispatcher.compile`` refreshes the target context before it looks in the disk cache, and that refresh
imports every lowering registry Numba has (arraymath, the random module, typed containers, ...) and, through
its BLAS check, ``scipy.linalg``: about 0.6 s in every new process, on a 2-core machine three times what loading
our cached kernels costs. A cached overload needs none of it: it is object code plus a pickled function
descriptor. What it does need is the NRT (its array unboxing calls it) and the parfor thread pool, which the
cached result's own ``reload_init`` starts.

This relies on private Numba APIs (``Dispatcher._cache``, ``_cache_hits``, ``Cache._load_overload``), so every
failure returns ``False`` and the caller takes Numba's ordinary path, which is always correct. Numba's
dispatcher then treats the loaded overload exactly like one it loaded itself (``compile`` finds it in
``overloads``; calls dispatch to it without typing).
"""
from __future__ import annotations

from typing import Any

_UNSUPPORTED: list[str] = []  # why the fast path was given up on, once per process (shown by tests/doctor)


def load_cached(dispatcher: Any, arg_types: tuple) -> bool:
    """Install the cached overload of ``dispatcher`` for ``arg_types``; False when there is none or the fast
    path is unavailable (the caller then runs ``dispatcher.compile``)."""
    if _UNSUPPORTED:
        return False
    try:
        return _load(dispatcher, tuple(arg_types))
    except Exception as err:  # noqa: BLE001 - any surprise inside Numba's internals: use the ordinary path
        _UNSUPPORTED.append(f"{type(err).__name__}: {err}")
        return False


def _load(dispatcher: Any, arg_types: tuple) -> bool:
    from numba.core.caching import NullCache
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.runtime import rtsys

    cache = getattr(dispatcher, "_cache", None)
    if isinstance(cache, NullCache):
        return False  # a kernel run from memory: nothing on disk to load
    if cache is None or not hasattr(cache, "_load_overload"):
        raise AttributeError("this Numba's dispatcher has no disk cache API we know")
    with global_compiler_lock:
        if arg_types in dispatcher.overloads:
            return True
        target = dispatcher.targetctx
        rtsys.initialize(target)  # idempotent; what refresh() would have done first
        result = cache._load_overload(arg_types, target)
        if result is None or result.objectmode:
            return False
        target.insert_user_function(result.entry_point, result.fndesc, [result.library])
        dispatcher.add_overload(result)
        dispatcher._cache_hits[arg_types] += 1
        return True


def fast_load_problem() -> str | None:
    """Why this process gave up on the fast path (None while it works)."""
    return _UNSUPPORTED[0] if _UNSUPPORTED else None
