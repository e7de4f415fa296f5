"""``index.json``: one record per cache key (spec, backend, dtypes, timings, hits, created, last_used).

Readers take no lock (writers replace the file atomically). A file that is unreadable, foreign, or whose entries
table is malformed is rebuilt from the entries' manifests; a record with a field of the wrong type ("hits":
"many") loses that field. Either repair happens under the index lock, is written back, and warns once.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tullax.runtime.cache_files import CacheWarning, is_plain_name, load_json
from tullax.runtime.cache_locks import CacheLocks

INDEX_FORMAT = 1
Records = dict[str, dict[str, Any]]

INDEX_LOCK = "index"  # the name of its lock
_TIMING_SUFFIX = "_ms"
_NUMBER_FIELDS = ("created", "last_used")
_TEXT_FIELDS = ("backend", "kind")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _malformed_fields(record: dict[str, Any]) -> list[str]:
    """The fields of ``record`` whose values readers cannot use."""
    bad = []
    for name, value in record.items():
        if name == "hits":
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        elif name in _NUMBER_FIELDS:
            ok = _is_number(value)
        elif name.endswith(_TIMING_SUFFIX):
            ok = value is None or _is_number(value)
        elif name in _TEXT_FIELDS:
            ok = isinstance(value, str)
        elif name == "spec":
            ok = value is None or isinstance(value, str)
        else:
            ok = True  # descriptive fields (dtypes, shapes, options) are shown as they are
        if not ok:
            bad.append(name)
    return bad


class CacheIndex:
    """The index file of one cache. ``rebuild`` makes records from the entries on disk; ``write`` stores the
    file's bytes (the cache decides whether it can)."""

    def __init__(self, path: Path, locks: CacheLocks, rebuild: Callable[[], Records],
                 write: Callable[[Path, bytes], None], encode: Callable[[Any], bytes]):
        self.path = path
        self._locks = locks
        self._rebuild = rebuild
        self._write = write
        self._encode = encode

    def read(self) -> Records:
        """The records, repaired (under the lock, with a warning) when the file needs it."""
        try:
            records = self._parse()
            if not any(_malformed_fields(record) for record in records.values()):
                return records
        except ValueError:
            pass
        with self._locks.hold(INDEX_LOCK, "the cache index"):
            return self._read_repaired()

    def update(self, change: Callable[[Records], bool]) -> None:
        """Read, let ``change`` edit the records in place (it returns whether it changed them), write back: all
        under the index lock, so concurrent processes never lose each other's updates."""
        with self._locks.hold(INDEX_LOCK, "the cache index"):
            records = self._read_repaired()
            if change(records):
                self.store(records)

    def store(self, records: Records) -> None:
        """Replace the file (the caller holds the index lock)."""
        self._write(self.path, self._encode({"format": INDEX_FORMAT, "entries": records}))

    def _parse(self) -> Records:
        """The records as stored; ValueError when the file is corrupt, truncated, foreign or malformed."""
        doc = load_json(self.path)
        if doc is None:
            return {}
        if not isinstance(doc, dict) or doc.get("format") != INDEX_FORMAT:
            raise ValueError("not a tullax cache index of this format")
        records = doc.get("entries")
        if not isinstance(records, dict) or not all(
            is_plain_name(key) and isinstance(record, dict) for key, record in records.items()
        ):
            raise ValueError("the entries table is malformed")
        return records

    def _read_repaired(self) -> Records:
        try:
            records = self._parse()
        except (ValueError, UnicodeDecodeError) as err:
            warnings.warn(
                f"the tullax cache index {self.path} is corrupt ({err}); rebuilding it from the entries on disk "
                "(their timings are lost)",
                CacheWarning, stacklevel=5)
            records = self._rebuild()
            self.store(records)
            return records
        repaired = []
        for key, record in records.items():
            for name in _malformed_fields(record):
                repaired.append(f"{key}: {name}={record.pop(name)!r}")
        if repaired:
            warnings.warn(
                f"the tullax cache index {self.path} had malformed fields, which were dropped: "
                f"{'; '.join(repaired)}",
                CacheWarning, stacklevel=5)
            self.store(records)
        return records
