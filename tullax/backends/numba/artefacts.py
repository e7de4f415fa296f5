"""Numba's compiled code of a kernel, kept in the kernel's compile-cache entry and checked like every file there.

Numba's own disk cache (``cache=True``, ``numba.core.caching``) puts a function's artefacts in a directory found
by its locators, keyed by the absolute path of the source file (``<NUMBA_CACHE_DIR>/<dir name>_<sha1 of the
absolute directory>``), writes an index (``.nbi``: which data file holds which overload, stamped with the
source's hash) and data files (``.nbc``: one pickled compile result each) without checksums, and unpickles
whatever it finds there. So a moved or copied cache recompiled everything; a truncated, empty or garbage file
broke every later process (UnpicklingError, EOFError) until the cache was cleared; and a data file swapped in
from another entry loaded silently and computed the other spec.

``install`` gives each njit function of a stored kernel module an ``EntryCache``: Numba's own logic (the index
keys: signature, CPU, bytecode hash; serialising compile results) over storage of ours:

* the directory is the entry itself, and nothing in the artefacts names it: a moved or copied cache hits;
* artefacts are written with ``CompileCache.write_bytes`` (atomic, their checksum in the entry's manifest) and
  read with ``read_checked``: a file that does not match its checksum is never unpickled;
* a file that fails that check, or that Numba cannot load, discards all of that function's artefacts with one
  warning; Numba then compiles the function again and the result is stored in their place;
* when the cache does not store files (a full disk), the compiled code stays in memory.

These are Numba's private classes (``Cache``, ``CompileResultCacheImpl``, ``IndexDataCacheFile``). When they lack
what is used here, ``install`` turns the disk cache off for the function (it then compiles in every process),
with one warning: slower, never wrong.
"""
from __future__ import annotations

import hashlib
import io
import pickle
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

from numba.core.caching import (
    CompileResultCacheImpl,
    FunctionCache,
    IndexDataCacheFile,
    NullCache,
    _CacheLocator,
)

from tullax.runtime.cache import CompileCache
from tullax.runtime.cache_files import CacheWarning

# What this module overrides or calls on Numba's classes: without any of them it would not be in control of
# what is read and written.
_REQUIRED = {
    IndexDataCacheFile: ("load", "save", "_load_index", "_save_index", "_load_data", "_save_data", "_dump",
                         "_data_name", "_index_name", "_version", "_source_stamp"),
    FunctionCache: ("load_overload", "save_overload", "_load_overload", "_save_overload", "_index_key"),
    CompileResultCacheImpl: ("get_filename_base", "reduce", "rebuild", "check_cachable"),
}
_unsupported_warned = threading.Event()


def _missing_numba_api() -> list[str]:
    try:  # instance attributes are only seen on an instance
        probe = IndexDataCacheFile(cache_path="", filename_base="probe", source_stamp=None)
    except TypeError:
        return ["IndexDataCacheFile(cache_path, filename_base, source_stamp)"]
    return [f"{cls.__name__}.{name}" for cls, names in _REQUIRED.items() for name in names
            if not hasattr(probe if cls is IndexDataCacheFile else cls, name)]


class _ArtefactStore:
    """The artefact files of one function in one cache entry."""

    def __init__(self, cache: CompileCache, key: str, filename_base: str, qualname: str):
        self.cache = cache
        self.key = key
        self.filename_base = filename_base  # "<module>.<function>-<line>.py<version>": every file starts with it
        self._qualname = qualname

    def read(self, name: str) -> bytes | None:
        """The file's bytes when they match the manifest; None when missing or discarded (with a warning)."""
        data, problem = self.cache.read_checked(self.key, name)
        if problem is not None:
            self.discard(f"{name} {problem}")
        return data

    def write(self, name: str, data: bytes) -> None:
        self.cache.write_bytes(self.key, name, data)  # not stored on a full disk: the code stays in memory

    def discard(self, why: str) -> None:
        """Delete this function's index and data files (all of them: an index may name any data file)."""
        entry = self.cache.entry_path(self.key)
        names = [path.name for path in entry.glob(f"{self.filename_base}.*")] if entry.is_dir() else []
        self.cache.discard_files(self.key, names)
        warnings.warn(
            f"Numba's compiled code for {self._qualname} in tullax cache entry {self.key} was discarded ({why}); "
            "it is compiled again", CacheWarning, stacklevel=2)


class _EntryFiles(IndexDataCacheFile):
    """Numba's bookkeeping of which data file holds which overload, over the files of a cache entry. The index
    keeps Numba's format: its version pickled first, then the source stamp and the overloads table."""

    def __init__(self, store: _ArtefactStore, source_stamp: bytes):
        super().__init__(cache_path=str(store.cache.entry_path(store.key)), filename_base=store.filename_base,
                         source_stamp=source_stamp)
        self.store = store

    def _load_index(self) -> dict:
        data = self.store.read(self._index_name)
        if data is None:
            return {}
        try:
            stream = io.BytesIO(data)
            if pickle.load(stream) != self._version:
                return {}  # written by another Numba: compile again, as Numba does
            stamp, overloads = pickle.loads(stream.read())
        except Exception as err:  # noqa: BLE001 - a checked file should parse; if not, never trust it
            self.store.discard(f"{self._index_name} cannot be read: {type(err).__name__}: {err}")
            return {}
        return overloads if stamp == self._source_stamp else {}

    def _save_index(self, overloads: dict) -> None:
        version = pickle.dumps(self._version, protocol=-1)
        self.store.write(self._index_name, version + self._dump((self._source_stamp, overloads)))

    def _load_data(self, name: str) -> Any:
        data = self.store.read(name)
        if data is None:  # IndexDataCacheFile.load reads an OSError as "not cached"
            raise FileNotFoundError(name)
        return pickle.loads(data)

    def _save_data(self, name: str, data: Any) -> None:
        self.store.write(name, self._dump(data))


class _EntryLocator(_CacheLocator):
    """The entry as the cache directory; the stamp is the hash of the module text itself."""

    def __init__(self, directory: Path, py_func: Any, source: str):
        self._directory = directory
        self._py_file = py_func.__code__.co_filename  # Numba names it in its can't-cache warning
        self._lineno = py_func.__code__.co_firstlineno
        self._stamp = hashlib.sha256(source.encode("utf-8")).digest()

    def ensure_cache_path(self) -> None:
        """Nothing to do: the compile cache makes the entry when it writes a file there."""

    def get_cache_path(self) -> str:
        return str(self._directory)

    def get_source_stamp(self) -> bytes:
        return self._stamp

    def get_disambiguator(self) -> str:
        return str(self._lineno)


class _EntryImpl(CompileResultCacheImpl):
    """Numba's (de)serialisation of compile results, located by ``_EntryLocator``."""

    def __init__(self, py_func: Any, locator: _EntryLocator):  # not CacheImpl's: it searches Numba's locators
        self._lineno = py_func.__code__.co_firstlineno
        self._locator = locator
        module_stem = Path(py_func.__code__.co_filename).stem
        self._filename_base = self.get_filename_base(f"{module_stem}.{py_func.__qualname__}", sys.abiflags)


class EntryCache(FunctionCache):
    """A Numba function cache whose files are checked files of a tullax cache entry."""

    def __init__(self, py_func: Any, cache: CompileCache, key: str, source: str):
        # Not Cache.__init__: it would locate the directory by the absolute path and hash the file on disk.
        locator = _EntryLocator(cache.entry_path(key), py_func, source)
        self._name = repr(py_func)
        self._py_func = py_func
        self._impl = _EntryImpl(py_func, locator)
        self._cache_path = locator.get_cache_path()
        store = _ArtefactStore(cache, key, self._impl.filename_base, py_func.__qualname__)
        self._cache_file = _EntryFiles(store, locator.get_source_stamp())
        self.enable()

    def _load_overload(self, sig: Any, target_context: Any) -> Any:
        try:
            return super()._load_overload(sig, target_context)
        except Exception as err:  # noqa: BLE001 - whatever a checked but unloadable file raises: compile instead
            self._cache_file.store.discard(f"it cannot be loaded: {type(err).__name__}: {err}")
            return None


def install(dispatchers: list[Any], cache: CompileCache, key: str, source: str) -> None:
    """Give each dispatcher of the module stored under ``key`` (whose text is ``source``) an ``EntryCache``;
    where this Numba lacks what that needs, no disk cache (one warning per process)."""
    for dispatcher in dispatchers:
        dispatcher._cache = NullCache() if _MISSING else EntryCache(dispatcher.py_func, cache, key, source)
    if _MISSING and not _unsupported_warned.is_set():
        _unsupported_warned.set()
        warnings.warn(
            f"this Numba ({', '.join(_MISSING)} missing) does not support tullax's checked disk cache; Numba "
            "kernels are compiled in every process", CacheWarning, stacklevel=3)


_MISSING = _missing_numba_api()
