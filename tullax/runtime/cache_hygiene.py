"""Keeping the compile cache bounded and clean.

* ``prune``: delete the least recently used entries beyond a size limit (``TULLAX_CACHE_MAX_BYTES``, default
  2 GiB) and the entries unused for longer than an age limit (``TULLAX_CACHE_MAX_AGE_DAYS``, default 90); "off"
  turns a limit off. A process that adds an entry prunes (at most every ``AUTO_PRUNE_INTERVAL_S``);
  ``tullax cache prune`` does it on demand.
* ``clear``: delete every entry, or a backend's.
* ``sweep`` (both of the above): temporary files that interrupted writes left behind, and lock files of
  entries that are gone.

An entry is deleted under its key lock and its manifest lock (each lock file goes with it): ``prune`` skips an
entry another process holds (it is compiling or loading it), ``clear`` waits for it.
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tullax import settings
from tullax.runtime.cache_files import (
    TEMP_GRACE_S,
    is_plain_name,
    is_temporary,
    older_than,
    remove,
    temporaries,
    tree_size,
)
from tullax.runtime.cache_index import INDEX_LOCK, CacheIndex
from tullax.runtime.cache_locks import LOCK_SUFFIX, CacheLocks
from tullax.settings import parse_size  # noqa: F401 (where callers have found it)


class CompileCache(Protocol):
    """What pruning and clearing use of ``tullax.runtime.cache.CompileCache``, which imports this module (a
    Protocol, so the two do not import each other)."""

    root: Path
    index: CacheIndex
    locks: CacheLocks

    def entry_path(self, key: str) -> Path: ...

    def lock(self, key: str, *, remove: bool = False) -> contextlib.AbstractContextManager[None]: ...

    def try_lock(self, key: str, *, remove: bool = False) -> contextlib.AbstractContextManager[bool]: ...

    def manifest_lock(self, key: str, *, remove: bool = False) -> contextlib.AbstractContextManager[None]: ...

MAX_BYTES_ENV = "TULLAX_CACHE_MAX_BYTES"
MAX_AGE_ENV = "TULLAX_CACHE_MAX_AGE_DAYS"
# Sizing the cache walks every entry: a process that compiles many kernels does it at most this often.
AUTO_PRUNE_INTERVAL_S = 600.0
_SECONDS_PER_DAY = 86_400.0
# Where tullax kept Numba's artefacts before they moved into the entries (keyed by absolute paths, so a moved
# cache recompiled everything): clear removes it.
_RETIRED_DIRECTORIES = ("numba",)
_LOCK_OWNERS = re.compile(r"(?:key|manifest)-(.+)\Z")  # the entry a lock file belongs to


def _limit(name: str, given: str | None) -> float | None:
    """A limit from ``given`` (a command-line value), else the setting ``name``; None: no limit ("off")."""
    setting = settings.SETTINGS[name]
    return setting.value() if given is None else setting.convert(given, source="the limit")


@dataclass(frozen=True)
class Limits:
    """What ``prune`` keeps: at most ``max_bytes`` of entries, none unused for more than ``max_age_s``
    (None: no limit)."""

    max_bytes: int | None
    max_age_s: float | None

    @classmethod
    def from_env(cls, max_bytes: str | None = None, max_age_days: str | None = None) -> "Limits":
        """The limits the environment sets (defaults where it sets none); given values take precedence."""
        size = _limit(MAX_BYTES_ENV, max_bytes)
        days = _limit(MAX_AGE_ENV, max_age_days)
        return cls(None if size is None else int(size), None if days is None else days * _SECONDS_PER_DAY)


@dataclass(frozen=True)
class PruneReport:
    removed: tuple[str, ...]  # the keys deleted
    freed_bytes: int
    busy: tuple[str, ...]  # beyond a limit but held by another process: left for a later prune
    kept: int  # entries left
    size_bytes: int  # their size
    swept: int  # temporary files and lock files removed


@dataclass(frozen=True)
class _OnDisk:
    key: str
    size: int
    last_used: float


def _entry_paths(cache: CompileCache) -> list[Path]:
    try:
        return list((cache.root / "entries").iterdir())
    except (FileNotFoundError, NotADirectoryError):  # the next write makes the directory again
        return []


def _entries_on_disk(cache: CompileCache) -> list[_OnDisk]:
    """Every entry directory, most recently used first (by its index record; by its mtime without one)."""
    records = cache.index.read()
    found = []
    for path in _entry_paths(cache):
        try:
            mtime = path.lstat().st_mtime
        except FileNotFoundError:
            continue  # deleted meanwhile
        last_used = records.get(path.name, {}).get("last_used", mtime)
        found.append(_OnDisk(path.name, tree_size(path), float(last_used)))
    found.sort(key=lambda entry: entry.last_used, reverse=True)
    return found


def _delete_entry(cache: CompileCache, key: str, *, wait: bool) -> bool:
    """Delete one entry under its locks (waiting for them, or only if free); False when it was busy."""
    if not is_plain_name(key):  # not a name tullax makes, so nothing locks it
        remove(cache.root / "entries" / key)
        return True
    holding = cache.lock(key, remove=True) if wait else cache.try_lock(key, remove=True)
    with holding as held:
        if held is False:
            return False
        with cache.manifest_lock(key, remove=True):
            remove(cache.entry_path(key))
    return True


def _forget(cache: CompileCache, keys: list[str]) -> None:
    """Drop the index records of ``keys``."""

    def change(records: dict) -> bool:
        return any([records.pop(key, None) is not None for key in keys])  # a list: pop every key

    cache.index.update(change)


def prune(cache: CompileCache, limits: Limits, *, now: float | None = None) -> PruneReport:
    """Delete the least recently used entries until the rest fit in ``limits.max_bytes``, and every entry
    unused for longer than ``limits.max_age_s``; then ``sweep``."""
    now = time.time() if now is None else now
    kept_size, full, doomed = 0, False, []
    for entry in _entries_on_disk(cache):
        full = full or (limits.max_bytes is not None and kept_size + entry.size > limits.max_bytes)
        if full or (limits.max_age_s is not None and now - entry.last_used > limits.max_age_s):
            doomed.append(entry)
        else:
            kept_size += entry.size
    removed = [entry for entry in doomed if _delete_entry(cache, entry.key, wait=False)]
    _forget(cache, [entry.key for entry in removed])
    busy = tuple(entry.key for entry in doomed if entry not in removed)
    return PruneReport(
        removed=tuple(entry.key for entry in removed), freed_bytes=sum(entry.size for entry in removed),
        busy=busy, kept=len(_entry_paths(cache)),
        size_bytes=kept_size + sum(entry.size for entry in doomed if entry.key in busy), swept=sweep(cache))


def clear(cache: CompileCache, backend: str | None = None) -> int:
    """Delete every entry (or those whose index record names ``backend``) and their index records, then
    ``sweep``; returns how many entries."""
    records = cache.index.read()
    if backend is None:
        doomed = sorted(set(records) | {path.name for path in _entry_paths(cache)})
    else:
        doomed = sorted(key for key, record in records.items() if record.get("backend") == backend)
    for key in doomed:
        _delete_entry(cache, key, wait=True)
    _forget(cache, doomed)
    if backend in (None, "numba"):
        for name in _RETIRED_DIRECTORIES:
            remove(cache.root / name)
    sweep(cache)
    return len(doomed)


def sweep(cache: CompileCache) -> int:
    """Remove what interrupted writes left behind and the lock files of entries that no longer exist (those
    no process holds); returns how many files. A temporary file is removed under the lock its writer holds, so
    never from under a live writer: in an entry under its key and manifest locks (an entry another process
    holds is left for later), next to the index under the index lock."""
    swept = 0
    for entry in _entry_paths(cache):
        leftovers = temporaries(entry)
        if not leftovers or not is_plain_name(entry.name):
            continue
        with cache.try_lock(entry.name) as held:
            if held:
                with cache.manifest_lock(entry.name):
                    swept += _remove_all(leftovers)
    with cache.locks.hold(INDEX_LOCK, "the cache index"):
        swept += _remove_all([path for path in _temporaries_beside(cache.root)
                              if path.name.startswith(f".{cache.index.path.name}.")])
    swept += _remove_all([path for path in _temporaries_beside(cache.root) if older_than(path, TEMP_GRACE_S)])
    for path in sorted(cache.locks.directory.glob(f"*{LOCK_SUFFIX}")):
        name = path.name[: -len(LOCK_SUFFIX)]
        owner = _LOCK_OWNERS.match(name)
        if owner and is_plain_name(owner.group(1)) and cache.entry_path(owner.group(1)).exists():
            continue
        with cache.locks.try_hold(name, remove=True) as held:
            swept += held
    return swept


def _temporaries_beside(root: Path) -> list[Path]:
    """The temporary files directly in ``root`` (the index's, the writability probe's)."""
    return [path for path in root.iterdir() if is_temporary(path.name) and path.is_file()]


def _remove_all(paths: list[Path]) -> int:
    for path in paths:
        remove(path)
    return len(paths)
