"""The persistent compile cache: generated sources, backend artefacts and a timings index, in one directory.

Layout under the root (``TULLAX_CACHE_DIR``, else the platform's user cache dir)::

    index.json          one record per key: spec, backend, dtypes, timings, hits, created, last_used
    entries/<key>/      everything stored for the key: the backend's files (for Numba the generated module, its
                        bytecode and Numba's compiled artefacts) and manifest.json (the sha256 of every file)
    locks/              lock files: one per key (around a compile), one per entry manifest, one for the index

Nothing in an entry depends on where the root is: a cache directory can be moved or copied.

Every write goes to a temporary file in the same directory, is fsynced and then renamed over the target, so a
reader sees the old file or the new one, never half of one. Read-modify-write updates (manifests, the index)
happen under a lock, so concurrent processes never lose each other's updates; deleting an entry (``clear``,
``prune``, a corrupt file) happens under its locks, so it never pulls an entry from under a process that is
writing or loading it. A file that does not match its checksum is dropped with a warning and rebuilt; the
index repairs itself (``tullax.runtime.cache_index``). A kernel's first call defers its index updates
(``record_later``, ``hit_later``): they are written together by ``flush``, soon after, on reading, or at
exit. A directory that cannot be written degrades (one warning) to a private temporary directory that lives as
long as the process; a write that fails later (a full disk) stops this process from storing anything (one
warning): kernels are then compiled in memory.
"""

from __future__ import annotations

import atexit
import contextlib
import enum
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any, NamedTuple

from tullax import settings
from tullax._version import __version__
from tullax.errors import TullaxError
from tullax.runtime import cache_hygiene
from tullax.runtime.cache_files import (
    CacheWarning,
    atomic_write,
    dump_json,
    is_plain_name,
    load_json,
    make_room_for_directory,
    probe_writable,
    remove,
    sha256,
    tree_size,
)
from tullax.runtime.cache_index import CacheIndex, Records
from tullax.runtime.cache_later import DeferredUpdates, Pending
from tullax.runtime.cache_locks import CacheLocks
from tullax.runtime.cache_root import CACHE_DIR_ENV, ENTRIES, default_cache_dir

LOCK_TIMEOUT_ENV = "TULLAX_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT_S = 600.0  # a cold Julia GPU compile can take minutes; waiting is cheaper than compiling

__all__ = ["CACHE_DIR_ENV", "CacheWarning", "Checked", "CompileCache", "cache_key", "default_cache_dir",
           "get_cache"]

_MANIFEST_FILE = "manifest.json"
_SUBDIRECTORIES = (ENTRIES, "locks")
# What record() accepts besides spec/backend/kind: descriptive fields, and any timing named "<what>_ms".
_DESCRIPTIVE_FIELDS = frozenset({"dtypes", "ranks", "shapes", "options"})
_TIMING_SUFFIX = "_ms"
_META_FIELDS = ("spec", "backend", "kind", "dtypes", "created")  # copied into manifests for rebuilds
_MEAN_FIELDS = ("compile_ms", "parse_codegen_ms", "first_run_ms", "ttfk_cold_ms", "ttfk_warm_ms")


# ---------------------------------------------------------------------------------------------------- keys


def cache_key(**parts: Any) -> str:
    """A short stable hash of everything that determines a compiled artefact, plus the tullax version.

    Callers pass the canonical spec text, dtypes, ranks, backend and options; values may be strings, numbers,
    booleans, None, lists, tuples, dicts, sets, paths and NumPy dtypes or scalars.
    """
    canonical = json.dumps(
        {**parts, "tullax_version": __version__},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=_jsonable,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:24]


def _jsonable(value: Any) -> Any:
    """JSON stand-ins for the non-JSON values a key or record may hold; never repr() (addresses change)."""
    if isinstance(value, set | frozenset):
        return sorted((_jsonable_item(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, type) and value.__module__.split(".")[0] == "numpy":
        return value.__name__  # np.float32 the class
    if type(value).__module__.split(".")[0] == "numpy":
        return value.item() if hasattr(value, "item") else str(value)  # scalars by value, dtypes by name
    raise TypeError(
        f"cannot put a {type(value).__name__} into a tullax cache key or record; "
        "pass strings, numbers, lists or dicts"
    )


def _jsonable_item(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool | type(None)) else _jsonable(value)


def _encode(value: Any) -> bytes:
    return dump_json(value, default=_jsonable)


def _checked_name(name: str, what: str) -> str:
    if not is_plain_name(name):
        raise TullaxError(f"invalid cache {what} {name!r}: use letters, digits, '.', '_' and '-' only")
    return name


# ------------------------------------------------------------------------------------------ the directory


def _lock_timeout_from_env() -> float:
    configured = settings.value(LOCK_TIMEOUT_ENV)
    return DEFAULT_LOCK_TIMEOUT_S if configured is None else configured


def _make_subdirectories(root: Path) -> None:
    for sub in _SUBDIRECTORIES:
        if make_room_for_directory(root / sub):
            warnings.warn(f"{root / sub} in the tullax cache was not a directory; it was removed", CacheWarning,
                          stacklevel=5)
        (root / sub).mkdir(parents=True, exist_ok=True)


def _open_root(requested: Path) -> tuple[Path, bool]:
    """The directory to use and whether it is the requested, persistent one."""
    try:
        requested.mkdir(parents=True, exist_ok=True)
        _make_subdirectories(requested)
        probe_writable(requested)
        return requested, True
    except OSError as err:
        private = Path(tempfile.mkdtemp(prefix="tullax-cache-"))
        _make_subdirectories(private)
        atexit.register(shutil.rmtree, private, ignore_errors=True)
        warnings.warn(
            f"the tullax cache directory {requested} cannot be written ({err.strerror or err}); "
            f"using a private temporary directory for this process, so compiled kernels will not be reused "
            f"by later processes. Set {CACHE_DIR_ENV} to a writable directory to fix this.",
            CacheWarning,
            stacklevel=4,
        )
        return private, False


class Checked(NamedTuple):
    """A stored file read back: its bytes when they match the manifest's checksum; otherwise ``problem`` says
    why not (None with no data: the file is missing)."""

    data: bytes | None
    problem: str | None


# ------------------------------------------------------------------------------------------------ the cache


class CompileCache:
    """One cache directory. Safe to share between threads and processes; every method may block on a lock."""

    def __init__(self, root: str | os.PathLike[str] | None = None, *, lock_timeout: float | None = None):
        requested = Path(root).expanduser() if root is not None else default_cache_dir()
        self.requested_root = requested
        self.root, self.writable = _open_root(requested)
        self.lock_timeout = _lock_timeout_from_env() if lock_timeout is None else lock_timeout
        self.locks = CacheLocks(self.root / "locks", self.lock_timeout, LOCK_TIMEOUT_ENV)
        self.index = CacheIndex(self.root / "index.json", self.locks, lambda: _rebuilt_records(self), self._store,
                                _encode)
        # False once a write failed (a full disk): from then on this process stores nothing and compiles in memory.
        self.storing = threading.Event()
        self.storing.set()
        self._next_auto_prune = 0.0  # time.monotonic() after which a new entry checks the size limits again
        self._deferred = DeferredUpdates(self._apply_pending)  # record_later/hit_later, for flush()

    def __repr__(self) -> str:
        return f"CompileCache(root={str(self.root)!r}, writable={self.writable})"

    # -- paths and locks -----------------------------------------------------------------------------------

    @property
    def index_path(self) -> Path:
        return self.index.path

    def entry_path(self, key: str) -> Path:
        """Where the entry of ``key`` lives (it may not exist)."""
        return self.root / "entries" / _checked_name(key, "key")

    def entry_dir(self, key: str) -> Path:
        """The directory of one entry (created; a file in its place is removed): backends put files here."""
        path = self.entry_path(key)
        if make_room_for_directory(path):
            warnings.warn(f"tullax cache entry {key} was a file, not a directory; it was removed", CacheWarning,
                          stacklevel=3)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def lock(self, key: str, *, remove: bool = False) -> contextlib.AbstractContextManager[None]:
        """Hold this across "look up, else compile and write" so concurrent processes compile a key once.
        Loading an entry happens under it too, so the entry cannot be deleted meanwhile."""
        return self.locks.hold(f"key-{_checked_name(key, 'key')}", f"cache entry {key}", remove=remove)

    def try_lock(self, key: str, *, remove: bool = False) -> contextlib.AbstractContextManager[bool]:
        """``lock(key)`` if no other process holds it right now; yields whether it is held."""
        return self.locks.try_hold(f"key-{_checked_name(key, 'key')}", remove=remove)

    def manifest_lock(self, key: str, *, remove: bool = False) -> contextlib.AbstractContextManager[None]:
        """Held while an entry's files and their checksums change together. Separate from ``lock(key)``: a
        caller holding that still writes files, and locks do not nest."""
        return self.locks.hold(f"manifest-{_checked_name(key, 'key')}", f"the manifest of cache entry {key}",
                               remove=remove)

    # -- storing -------------------------------------------------------------------------------------------

    def _store(self, path: Path, data: bytes) -> None:
        """Write ``path`` atomically, unless this process has stopped storing; a failed write stops it."""
        if not self.storing.is_set():
            return
        try:
            atomic_write(path, data)
        except OSError as err:
            self._stop_storing(err)

    def _stop_storing(self, err: OSError) -> None:
        if not self.storing.is_set():
            return
        self.storing.clear()
        warnings.warn(
            f"cannot write to the tullax cache {self.root} ({err.strerror or err}); this process stores nothing "
            "more there: kernels that are not cached yet are compiled in memory and compiled again by the next "
            f"process. Free some space, or set {CACHE_DIR_ENV} to a writable directory.",
            CacheWarning, stacklevel=4)

    # -- entry files ---------------------------------------------------------------------------------------

    def _read_manifest(self, key: str) -> dict[str, Any]:
        """The entry's manifest; ValueError when it exists but is unreadable."""
        manifest = load_json(self.entry_path(key) / _MANIFEST_FILE)
        if manifest is None:
            return {"files": {}}
        if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
            raise ValueError("manifest has no files table")
        return manifest

    def _manifest_or_new(self, key: str) -> dict[str, Any]:
        try:
            return self._read_manifest(key)
        except ValueError:
            return {"files": {}}  # the other files become unverifiable and are rebuilt when read

    def write_bytes(self, key: str, filename: str, data: bytes) -> Path | None:
        """Store one file of an entry atomically and record its checksum; returns its path, or None when this
        process does not store files (a full disk, warned about once)."""
        name = _checked_name(filename, "file name")
        if name == _MANIFEST_FILE:
            raise TullaxError(f"{_MANIFEST_FILE} is reserved for the cache's own bookkeeping")
        if not self.storing.is_set():
            return None
        with self.manifest_lock(key):
            try:
                entry = self.entry_dir(key)  # under the lock: a concurrent clear cannot remove it meanwhile
                atomic_write(entry / name, data)
                manifest = self._manifest_or_new(key)
                manifest["files"][name] = sha256(data)
                atomic_write(entry / _MANIFEST_FILE, _encode(manifest))
            except OSError as err:
                self._stop_storing(err)
                return None
        return entry / name

    def write_text(self, key: str, filename: str, text: str) -> Path | None:
        """``write_bytes`` of ``text`` in UTF-8."""
        return self.write_bytes(key, filename, text.encode("utf-8"))

    def read_checked(self, key: str, filename: str) -> Checked:
        """One stored file, checked against the checksum its manifest holds."""
        name = _checked_name(filename, "file name")
        path = self.entry_path(key) / name
        if not os.path.lexists(path):
            return Checked(None, None)
        with self.manifest_lock(key):  # a writer replaces a file and its checksum together
            try:
                data = path.read_bytes()
            except (FileNotFoundError, NotADirectoryError):
                return Checked(None, None)
            except OSError as err:
                return Checked(None, f"cannot be read ({err.strerror or err})")
            problem = self._integrity_problem(key, name, data)
        return Checked(data, None) if problem is None else Checked(None, problem)

    def read_text(self, key: str, filename: str) -> str | None:
        """The stored file, or None when it is missing or corrupt (then the entry is deleted, warning)."""
        data, problem = self.read_checked(key, filename)
        if problem is None:
            return None if data is None else data.decode("utf-8")
        self._drop_entry(key, f"{filename} {problem}")
        return None

    def discard_files(self, key: str, filenames: list[str]) -> None:
        """Delete files of an entry and forget their checksums (the caller warns about why)."""
        with self.manifest_lock(key):
            entry = self.entry_path(key)
            for name in filenames:
                remove(entry / _checked_name(name, "file name"))
            manifest = self._manifest_or_new(key)
            forgotten = [manifest["files"].pop(name, None) for name in filenames]
            if entry.is_dir() and any(forgotten):
                self._store(entry / _MANIFEST_FILE, _encode(manifest))

    def _drop_entry(self, key: str, problem: str) -> None:
        with self.manifest_lock(key):
            remove(self.entry_path(key))
        warnings.warn(f"tullax cache entry {key} is corrupt ({problem}); it was deleted and will be rebuilt",
                      CacheWarning, stacklevel=3)
        self.index.update(lambda records: records.pop(key, None) is not None)

    def _integrity_problem(self, key: str, name: str, data: bytes) -> str | None:
        try:
            expected = self._read_manifest(key)["files"].get(name)
        except ValueError:
            return "is listed in a manifest that does not parse"
        if expected is None:
            return "has no checksum in the manifest"
        if expected != sha256(data):
            return "does not match its checksum"
        return None

    # -- the index -----------------------------------------------------------------------------------------

    def record(
        self, key: str, *, spec: str, backend: str, kind: str = "kernel", **fields: Any
    ) -> dict[str, Any]:
        """Create or update the index record of ``key``; returns the record.

        Fields: ``dtypes``, ``ranks``, ``shapes``, ``options`` and timings in milliseconds named ``*_ms``:
        ``parse_codegen_ms``, ``compile_ms``, ``first_run_ms``, ``ttfk_cold_ms`` (time to first kernel in a
        process that had to compile) and ``ttfk_warm_ms`` (in a new process that found the cache populated).
        Fields not given keep their previous values. ``kind`` says what the key holds ("module", ...). A new
        record may prune the cache to its limits (``tullax.runtime.cache_hygiene``).
        """
        _checked_name(key, "key")
        _check_record_fields(fields)
        now = time.time()
        result: dict[str, Any] = {}

        def change(records: Records) -> bool:
            result.update(_apply_record(records, key, dict(fields, spec=spec, backend=backend, kind=kind), now))
            return True

        self.index.update(change)
        self._remember_meta(key, result)
        if result["created"] == now:
            self._auto_prune()
        return result

    def _auto_prune(self) -> None:
        """Keep the cache within its limits, checked at most once per ``AUTO_PRUNE_INTERVAL_S`` per process."""
        if time.monotonic() < self._next_auto_prune or not self.storing.is_set():
            return
        self._next_auto_prune = time.monotonic() + cache_hygiene.AUTO_PRUNE_INTERVAL_S
        cache_hygiene.prune(self, cache_hygiene.Limits.from_env())

    def _remember_meta(self, key: str, record: dict[str, Any]) -> None:
        """Copy what identifies the entry into its manifest, so a lost index can be rebuilt with it."""
        entry = self.entry_path(key)
        meta = {name: record[name] for name in _META_FIELDS if name in record}
        with self.manifest_lock(key):
            if not entry.is_dir():
                return  # cleared (or never stored): nothing to describe
            try:
                manifest = self._read_manifest(key)
            except ValueError:
                return  # the next read_text reports and rebuilds the entry
            if manifest.get("meta") != meta:
                manifest["meta"] = meta
                self._store(entry / _MANIFEST_FILE, _encode(manifest))

    def hit(self, key: str) -> None:
        """Count one reuse of ``key`` (call it once per process and kernel, not per kernel call)."""
        _checked_name(key, "key")
        self.index.update(lambda records: _apply_hit(records, key, time.time()))

    # -- deferred index updates (``tullax.runtime.cache_later``) ---------------------------------------------

    def record_later(self, key: str, *, spec: str, backend: str, kind: str = "kernel", **fields: Any) -> None:
        """``record`` at the next ``flush``."""
        _checked_name(key, "key")
        _check_record_fields(fields)
        self._deferred.add("record", key, dict(fields, spec=spec, backend=backend, kind=kind))

    def hit_later(self, key: str, *, spec: str | None = None, backend: str | None = None, kind: str = "kernel",
                  **fields: Any) -> None:
        """``hit`` at the next ``flush``; with ``spec`` and ``backend`` (and ``record``'s fields) an entry that has no
        index record gets one first (one written before records were made at writing), so its reuse counts."""
        _check_record_fields(fields)
        describe = {} if spec is None or backend is None else dict(fields, spec=spec, backend=backend, kind=kind)
        self._deferred.add("hit", _checked_name(key, "key"), describe)

    def flush(self) -> None:
        """Write the pending ``record_later``/``hit_later`` updates, in order, in one index update."""
        self._deferred.flush()

    def _apply_pending(self, pending: list[Pending]) -> None:
        now = time.time()
        results: dict[str, dict[str, Any]] = {}

        def change(records: Records) -> bool:
            for what, key, fields in pending:
                if what == "hit":
                    if fields and key not in records:
                        results[key] = dict(_apply_record(records, key, fields, now))
                    _apply_hit(records, key, now)
                else:
                    results[key] = dict(_apply_record(records, key, fields, now))
            return True

        self.index.update(change)
        for key, record in results.items():
            self._remember_meta(key, record)
        if any(record["created"] == now for record in results.values()):
            self._auto_prune()

    def entries(self) -> list[dict[str, Any]]:
        """Every index record with its ``key`` and ``size_bytes``, most recently used first."""
        self.flush()
        rows = [
            {"key": key, **record, "size_bytes": tree_size(self.entry_path(key))}
            for key, record in self.index.read().items()
        ]
        rows.sort(key=lambda row: row.get("last_used") or 0, reverse=True)
        return rows

    def stats(self) -> dict[str, Any]:
        """Counts, size on disk, hits and mean timings, overall and per backend."""
        rows = self.entries()
        by_backend: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            by_backend.setdefault(str(row.get("backend")), []).append(row)
        return {
            "root": str(self.root),
            "writable": self.writable,
            "size_bytes": tree_size(self.root),
            **_summary(rows),
            "by_backend": {name: _summary(group) for name, group in sorted(by_backend.items())},
        }

    # -- hygiene -------------------------------------------------------------------------------------------

    def clear(self, backend: str | None = None) -> int:
        """Delete every entry (or those of one backend) and their index records; returns how many."""
        self.flush()
        return cache_hygiene.clear(self, backend)

    def prune(self, limits: cache_hygiene.Limits | None = None) -> cache_hygiene.PruneReport:
        """Delete the least recently used entries beyond the size and age limits (``TULLAX_CACHE_MAX_BYTES``,
        ``TULLAX_CACHE_MAX_AGE_DAYS``) and what interrupted writes left behind."""
        self.flush()
        return cache_hygiene.prune(self, limits or cache_hygiene.Limits.from_env())


def _check_record_fields(fields: dict[str, Any]) -> None:
    unknown = [n for n in fields if n not in _DESCRIPTIVE_FIELDS and not n.endswith(_TIMING_SUFFIX)]
    if unknown:
        raise TypeError(
            f"record() got unknown field(s) {', '.join(sorted(unknown))}: use "
            f"{', '.join(sorted(_DESCRIPTIVE_FIELDS))} or timings named '*{_TIMING_SUFFIX}'"
        )
    for name, value in fields.items():
        if name.endswith(_TIMING_SUFFIX) and value is not None and not isinstance(value, int | float):
            raise TypeError(f"record() timing {name} must be a number of milliseconds, got {value!r}")


def _mean(rows: list[dict[str, Any]], field: str) -> float | None:
    values = [float(row[field]) for row in rows if isinstance(row.get(field), int | float)]
    return sum(values) / len(values) if values else None


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "entries": len(rows),
        "hits": sum(int(row.get("hits") or 0) for row in rows),
        **{f"mean_{field}": _mean(rows, field) for field in _MEAN_FIELDS},
    }


def _apply_record(records: Records, key: str, fields: dict[str, Any], now: float) -> dict[str, Any]:
    """Create or update the index record of ``key`` in ``records`` with ``fields``; returns it."""
    record = records[key] = records.get(key) or {"created": now, "hits": 0}
    record.update(fields, last_used=now)
    return record


def _apply_hit(records: Records, key: str, now: float) -> bool:
    """Count one reuse of ``key`` in ``records``; False (nothing changed) when it has no record."""
    record = records.get(key)
    if record is None:
        return False
    record["hits"] = record.get("hits", 0) + 1
    record["last_used"] = now
    return True


def _rebuilt_records(cache: CompileCache) -> Records:
    """Index records made from the entries' manifests (their meta), for an index that was lost."""
    records: Records = {}
    for entry in sorted((cache.root / "entries").glob("*")):
        if not entry.is_dir() or not is_plain_name(entry.name):
            continue
        try:
            meta = cache._read_manifest(entry.name).get("meta")
        except ValueError:
            meta = None
        meta = meta if isinstance(meta, dict) else {}
        try:
            created = meta.get("created", entry.stat().st_mtime)
        except FileNotFoundError:
            continue  # deleted meanwhile
        records[entry.name] = {
            "spec": None, "backend": "unknown", "kind": "unknown", "hits": 0,
            **meta, "created": created, "last_used": created,
        }
    return records


# ------------------------------------------------------------------------------------------- the singleton

_caches: dict[str, CompileCache] = {}
_caches_guard = threading.Lock()


def get_cache() -> CompileCache:
    """The process-wide cache for the current ``TULLAX_CACHE_DIR`` (a changed variable gets its own cache)."""
    setting = settings.SETTINGS[CACHE_DIR_ENV].raw()
    with _caches_guard:
        cache = _caches.get(setting)
        if cache is None:
            cache = _caches[setting] = CompileCache(setting or None)
        return cache
