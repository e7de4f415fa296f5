"""The persistent compile cache: generated sources, backend artefacts and a timings index, in one directory.

Layout under the root (``TULLAX_CACHE_DIR``, else the platform's user cache dir)::

    index.json          one record per key: spec, backend, dtypes, timings, hits, created, last_used
    entries/<key>/      files a backend wrote for the key, plus manifest.json (sha256 of every file)
    numba/              NUMBA_CACHE_DIR: Numba's own compiled artefacts
    locks/              file locks: one per key (callers, around a compile), one per entry manifest, one index

Every write goes to a temporary file in the same directory, is fsynced and then renamed over the target, so a
reader sees the old file or the new one, never half of one. Read-modify-write updates (manifests, the index)
happen under a file lock, so concurrent processes never lose each other's updates. A file whose checksum does
not match, or an index that does not parse, is dropped with a warning and rebuilt. A directory that cannot be
written degrades (one warning) to a private temporary directory that lives as long as the process.
"""

from __future__ import annotations

import atexit
import contextlib
import enum
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import filelock
import platformdirs

from tullax._version import __version__
from tullax.errors import TullaxError

CACHE_DIR_ENV = "TULLAX_CACHE_DIR"
LOCK_TIMEOUT_ENV = "TULLAX_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT_S = 600.0  # a cold Julia GPU compile can take minutes; waiting is cheaper than compiling
INDEX_FORMAT = 1

_INDEX_FILE = "index.json"
_MANIFEST_FILE = "manifest.json"
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}\Z")
# What record() accepts besides spec/backend/kind: descriptive fields, and any timing named "<what>_ms".
_DESCRIPTIVE_FIELDS = frozenset({"dtypes", "ranks", "shapes", "options"})
_TIMING_SUFFIX = "_ms"
_META_FIELDS = ("spec", "backend", "kind", "dtypes", "created")  # copied into manifests for rebuilds
_MEAN_FIELDS = ("compile_ms", "parse_codegen_ms", "first_run_ms", "ttfk_cold_ms", "ttfk_warm_ms")


class CacheWarning(UserWarning):
    """The cache could not be used as asked (a corrupt entry, an unwritable directory); tullax carried on."""


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


def _checked_name(name: str, what: str) -> str:
    """Keys and file names become path components: allow only plain names (no separators, no '..')."""
    if not isinstance(name, str) or not _SAFE_NAME.match(name):
        raise TullaxError(f"invalid cache {what} {name!r}: use letters, digits, '.', '_' and '-' only")
    return name


# ------------------------------------------------------------------------------------------------ the files


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    """Write through a temporary file in the same directory, fsync it, then rename it over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)  # mkstemp makes 0600; a shared cache should stay readable
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable; some filesystems refuse to open directories, which is fine."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _tree_size(path: Path) -> int:
    total = 0
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for item in os.scandir(path):
            with contextlib.suppress(OSError):
                if item.is_dir(follow_symlinks=False):
                    total += _tree_size(Path(item.path))
                else:
                    total += item.stat(follow_symlinks=False).st_size
    return total


def _load_json(path: Path) -> Any:
    """The parsed file, or None when it is missing; ValueError when it is corrupt or truncated."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    return json.loads(raw.decode("utf-8"))


def _dump_json(value: Any) -> bytes:
    return json.dumps(value, indent=1, sort_keys=True, default=_jsonable).encode("utf-8")


def default_cache_dir() -> Path:
    """``TULLAX_CACHE_DIR`` when set, else the platform's user cache directory."""
    configured = os.environ.get(CACHE_DIR_ENV)
    return Path(configured).expanduser() if configured else Path(platformdirs.user_cache_dir("tullax"))


def _lock_timeout_from_env() -> float:
    raw = os.environ.get(LOCK_TIMEOUT_ENV)
    if not raw:
        return DEFAULT_LOCK_TIMEOUT_S
    try:
        return float(raw)
    except ValueError:
        raise TullaxError(f"{LOCK_TIMEOUT_ENV}={raw!r} is not a number of seconds") from None


def _open_root(requested: Path) -> tuple[Path, bool]:
    """The directory to use and whether it is the requested, persistent one."""
    try:
        for sub in ("entries", "numba", "locks"):
            (requested / sub).mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=requested, prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
        return requested, True
    except OSError as err:
        private = Path(tempfile.mkdtemp(prefix="tullax-cache-"))
        for sub in ("entries", "numba", "locks"):
            (private / sub).mkdir()
        atexit.register(shutil.rmtree, private, ignore_errors=True)
        warnings.warn(
            f"the tullax cache directory {requested} cannot be written ({err.strerror or err}); "
            f"using a private temporary directory for this process, so compiled kernels will not be reused "
            f"by later processes. Set {CACHE_DIR_ENV} to a writable directory to fix this.",
            CacheWarning,
            stacklevel=4,
        )
        return private, False


# ------------------------------------------------------------------------------------------------ the cache


class CompileCache:
    """One cache directory. Safe to share between threads and processes; every method may block on a lock."""

    def __init__(self, root: str | os.PathLike[str] | None = None, *, lock_timeout: float | None = None):
        requested = Path(root).expanduser() if root is not None else default_cache_dir()
        self.requested_root = requested
        self.root, self.writable = _open_root(requested)
        self.lock_timeout = _lock_timeout_from_env() if lock_timeout is None else lock_timeout

    def __repr__(self) -> str:
        return f"CompileCache(root={str(self.root)!r}, writable={self.writable})"

    # -- paths ---------------------------------------------------------------------------------------------

    @property
    def index_path(self) -> Path:
        return self.root / _INDEX_FILE

    def _entry_path(self, key: str) -> Path:
        return self.root / "entries" / _checked_name(key, "key")

    def entry_dir(self, key: str) -> Path:
        """The directory of one entry (created): backends put their generated files here."""
        path = self._entry_path(key)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def numba_cache_dir(self) -> Path:
        """Where Numba keeps its artefacts: set ``NUMBA_CACHE_DIR`` to this before importing numba."""
        path = self.root / "numba"
        path.mkdir(parents=True, exist_ok=True)
        return path

    # -- locks ---------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _file_lock(self, name: str, what: str) -> Iterator[None]:
        path = self.root / "locks" / f"{name}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(path, timeout=self.lock_timeout)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise TullaxError(
                f"waited {self.lock_timeout:g} s for the lock on {what} ({path}) and another process still "
                f"holds it. If no tullax process is running, delete that file; to wait longer set "
                f"{LOCK_TIMEOUT_ENV}."
            ) from None
        try:
            yield
        finally:
            lock.release()

    def lock(self, key: str) -> contextlib.AbstractContextManager[None]:
        """Hold this across "look up, else compile and write" so concurrent processes compile a key once."""
        return self._file_lock(f"key-{_checked_name(key, 'key')}", f"cache entry {key}")

    def _manifest_lock(self, key: str) -> contextlib.AbstractContextManager[None]:
        # Separate from lock(key): a caller holding lock(key) still writes files, and file locks don't nest.
        return self._file_lock(f"manifest-{_checked_name(key, 'key')}", f"the manifest of cache entry {key}")

    def _index_lock(self) -> contextlib.AbstractContextManager[None]:
        return self._file_lock("index", "the cache index")

    # -- entry files ---------------------------------------------------------------------------------------

    def _read_manifest(self, key: str) -> dict[str, Any]:
        """The entry's manifest; ValueError when it exists but is unreadable."""
        manifest = _load_json(self._entry_path(key) / _MANIFEST_FILE)
        if manifest is None:
            return {"files": {}}
        if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
            raise ValueError("manifest has no files table")
        return manifest

    def write_text(self, key: str, filename: str, text: str) -> Path:
        """Store one file of an entry atomically and record its checksum; returns its path."""
        name = _checked_name(filename, "file name")
        if name == _MANIFEST_FILE:
            raise TullaxError(f"{_MANIFEST_FILE} is reserved for the cache's own bookkeeping")
        data = text.encode("utf-8")
        entry = self.entry_dir(key)
        with self._manifest_lock(key):
            _atomic_write(entry / name, data)
            try:
                manifest = self._read_manifest(key)
            except ValueError:
                manifest = {"files": {}}  # the other files become unverifiable and are rebuilt when read
            manifest["files"][name] = _sha256(data)
            _atomic_write(entry / _MANIFEST_FILE, _dump_json(manifest))
        return entry / name

    def read_text(self, key: str, filename: str) -> str | None:
        """The stored file, or None when it is missing or corrupt (then the entry is deleted, warning)."""
        name = _checked_name(filename, "file name")
        entry = self._entry_path(key)
        if not (entry / name).exists():
            return None
        with self._manifest_lock(key):
            try:
                data = (entry / name).read_bytes()
            except FileNotFoundError:
                return None
            problem = self._integrity_problem(key, name, data)
            if problem is None:
                return data.decode("utf-8")
            shutil.rmtree(entry, ignore_errors=True)
        warnings.warn(
            f"tullax cache entry {key} is corrupt ({name} {problem}); it was deleted and will be rebuilt",
            CacheWarning,
            stacklevel=2,
        )
        self._forget(key)
        return None

    def _integrity_problem(self, key: str, name: str, data: bytes) -> str | None:
        try:
            expected = self._read_manifest(key)["files"].get(name)
        except ValueError:
            return "is listed in a manifest that does not parse"
        if expected is None:
            return "has no checksum in the manifest"
        if expected != _sha256(data):
            return "does not match its checksum"
        return None

    # -- the index -----------------------------------------------------------------------------------------

    def _read_index(self) -> dict[str, dict[str, Any]]:
        """The index records by key; ValueError when index.json is corrupt, truncated or foreign."""
        doc = _load_json(self.index_path)
        if doc is None:
            return {}
        if not isinstance(doc, dict) or doc.get("format") != INDEX_FORMAT:
            raise ValueError("not a tullax cache index of this format")
        records = doc.get("entries")
        if not isinstance(records, dict) or not all(
            _SAFE_NAME.match(key) and isinstance(record, dict) for key, record in records.items()
        ):
            raise ValueError("the entries table is malformed")
        return records

    def _read_index_locked(self) -> dict[str, dict[str, Any]]:
        """The index, rebuilt from the entries' manifests (with a warning) when it is unreadable."""
        try:
            return self._read_index()
        except ValueError as err:
            warnings.warn(
                f"the tullax cache index {self.index_path} is corrupt ({err}); rebuilding it from the "
                "entries on disk (their timings are lost)",
                CacheWarning,
                stacklevel=4,
            )
            records = self._rebuild_index()
            self._write_index(records)
            return records

    def _current_index(self) -> dict[str, dict[str, Any]]:
        """For readers: no lock unless the index needs rebuilding (writers replace it atomically)."""
        try:
            return self._read_index()
        except ValueError:
            with self._index_lock():
                return self._read_index_locked()

    def _rebuild_index(self) -> dict[str, dict[str, Any]]:
        records: dict[str, dict[str, Any]] = {}
        for entry in sorted((self.root / "entries").glob("*")):
            if not entry.is_dir() or not _SAFE_NAME.match(entry.name):
                continue
            try:
                meta = self._read_manifest(entry.name).get("meta") or {}
            except ValueError:
                meta = {}
            created = meta.get("created", entry.stat().st_mtime)
            records[entry.name] = {
                "spec": None, "backend": "unknown", "kind": "unknown", "hits": 0,
                **meta, "created": created, "last_used": created,
            }
        return records

    def _write_index(self, records: dict[str, dict[str, Any]]) -> None:
        _atomic_write(self.index_path, _dump_json({"format": INDEX_FORMAT, "entries": records}))

    def _forget(self, key: str) -> None:
        with self._index_lock():
            records = self._read_index_locked()
            if records.pop(key, None) is not None:
                self._write_index(records)

    def record(
        self, key: str, *, spec: str, backend: str, kind: str = "kernel", **fields: Any
    ) -> dict[str, Any]:
        """Create or update the index record of ``key``; returns the record.

        Fields: ``dtypes``, ``ranks``, ``shapes``, ``options`` and timings in milliseconds named ``*_ms``:
        ``parse_codegen_ms``, ``compile_ms``, ``first_run_ms``, ``ttfk_cold_ms`` (time to first kernel in a
        process that had to compile) and ``ttfk_warm_ms`` (in a new process that found the cache populated).
        Fields not given keep their previous values. ``kind`` says what the key holds ("module", ...).
        """
        _checked_name(key, "key")
        _check_record_fields(fields)
        now = time.time()
        with self._index_lock():
            records = self._read_index_locked()
            record = records.get(key) or {"created": now, "hits": 0}
            record.update(fields, spec=spec, backend=backend, kind=kind, last_used=now)
            records[key] = record
            self._write_index(records)
        self._remember_meta(key, record)
        return dict(record)

    def _remember_meta(self, key: str, record: dict[str, Any]) -> None:
        """Copy what identifies the entry into its manifest, so a lost index can be rebuilt with it."""
        entry = self._entry_path(key)
        if not entry.is_dir():
            return
        meta = {name: record[name] for name in _META_FIELDS if name in record}
        with self._manifest_lock(key):
            try:
                manifest = self._read_manifest(key)
            except ValueError:
                return  # the next read_text reports and rebuilds the entry
            if manifest.get("meta") != meta:
                manifest["meta"] = meta
                _atomic_write(entry / _MANIFEST_FILE, _dump_json(manifest))

    def hit(self, key: str) -> None:
        """Count one reuse of ``key`` (call it once per process and kernel, not per kernel call)."""
        _checked_name(key, "key")
        with self._index_lock():
            records = self._read_index_locked()
            record = records.get(key)
            if record is None:
                return
            record["hits"] = int(record.get("hits", 0)) + 1
            record["last_used"] = time.time()
            self._write_index(records)

    def entries(self) -> list[dict[str, Any]]:
        """Every index record with its ``key`` and ``size_bytes``, most recently used first."""
        rows = [
            {"key": key, **record, "size_bytes": _tree_size(self._entry_path(key))}
            for key, record in self._current_index().items()
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
            "size_bytes": _tree_size(self.root),
            **_summary(rows),
            "by_backend": {name: _summary(group) for name, group in sorted(by_backend.items())},
        }

    def clear(self, backend: str | None = None) -> int:
        """Delete every entry (or those of one backend) and their index records; returns how many."""
        with self._index_lock():
            records = self._read_index_locked()
            if backend is None:
                doomed = set(records) | {p.name for p in (self.root / "entries").glob("*")}
            else:
                doomed = {key for key, record in records.items() if record.get("backend") == backend}
            for key in doomed:
                shutil.rmtree(self.root / "entries" / key, ignore_errors=True)
                records.pop(key, None)
            if backend in (None, "numba"):
                shutil.rmtree(self.root / "numba", ignore_errors=True)
                (self.root / "numba").mkdir(exist_ok=True)
            self._write_index(records)
        return len(doomed)


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


# ------------------------------------------------------------------------------------------- the singleton

_caches: dict[str, CompileCache] = {}
_caches_guard = threading.Lock()


def get_cache() -> CompileCache:
    """The process-wide cache for the current ``TULLAX_CACHE_DIR`` (a changed variable gets its own cache)."""
    setting = os.environ.get(CACHE_DIR_ENV, "")
    with _caches_guard:
        cache = _caches.get(setting)
        if cache is None:
            cache = _caches[setting] = CompileCache(setting or None)
        return cache
