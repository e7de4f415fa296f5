"""The file primitives of the compile cache: atomic writes, JSON documents, sizes, temporary files, and clearing
a path that holds the wrong kind of thing (a directory where a file belongs, or the reverse).

Nothing here knows about entries, manifests or the index (``tullax.runtime.cache``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

# A writer that holds no lock (the writability probe) keeps its temporary file for microseconds: a sweep leaves
# younger ones alone, in case their writer is still running.
TEMP_GRACE_S = 60.0
_TEMP_SUFFIX = ".tmp"
_PROBE_PREFIX = ".probe-"
# Our atomic writes (".<name>.<random>.tmp"), the writability probe, and importlib's own atomic write of a
# .pyc ("<name>.pyc.<id>"), which py_compile uses.
_TEMPORARY = re.compile(r"(\..+\.tmp|\.probe-.*|.+\.pyc\.\d+)\Z")


_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}\Z")


class CacheWarning(UserWarning):
    """The cache could not be used as asked (a corrupt entry, an unwritable directory); tullax carried on."""


def is_plain_name(name: str) -> bool:
    """Keys and file names become path components: plain names only (no separators, no '..', no dot first)."""
    return isinstance(name, str) and bool(_PLAIN_NAME.match(name))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
    """Write through a temporary file in the same directory, fsync it, then rename it over ``path`` (a
    directory in its place, which only damage can put there, is removed first)."""
    make_room_for_file(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=_TEMP_SUFFIX)
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
    fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    """Make the rename itself durable; some filesystems refuse to open directories, which is fine."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def probe_writable(directory: Path) -> None:
    """Raise OSError unless a file can be created in ``directory``."""
    fd, probe = tempfile.mkstemp(dir=directory, prefix=_PROBE_PREFIX)
    os.close(fd)
    os.unlink(probe)


def make_room_for_file(path: Path) -> bool:
    """Remove a directory where the file ``path`` belongs; True when there was one."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
        return True
    return False


def make_room_for_directory(path: Path) -> bool:
    """Remove a file (or a dangling link) where the directory ``path`` belongs; True when there was one."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
        return True
    return False


def remove(path: Path) -> None:
    """Delete a file or a whole directory; a path that is already gone is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def tree_size(path: Path) -> int:
    """Bytes in the files under ``path`` (0 when it is missing)."""
    total = 0
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for item in os.scandir(path):
            with contextlib.suppress(OSError):
                if item.is_dir(follow_symlinks=False):
                    total += tree_size(Path(item.path))
                else:
                    total += item.stat(follow_symlinks=False).st_size
    return total


def load_json(path: Path) -> Any:
    """The parsed file, or None when it is missing; ValueError when it is corrupt, truncated or not a file."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except (IsADirectoryError, NotADirectoryError) as err:
        raise ValueError(f"{path.name} is not a file") from err
    return json.loads(raw.decode("utf-8"))


def dump_json(value: Any, default: Any = None) -> bytes:
    return json.dumps(value, indent=1, sort_keys=True, default=default).encode("utf-8")


def is_temporary(name: str) -> bool:
    """A file name that only an interrupted write leaves behind."""
    return bool(_TEMPORARY.match(name))


def temporaries(directory: Path) -> list[Path]:
    """The temporary files under ``directory``, recursively."""
    return [Path(folder) / name for folder, _, files in os.walk(directory) for name in files if is_temporary(name)]


def older_than(path: Path, seconds: float) -> bool:
    try:
        return path.lstat().st_mtime <= time.time() - seconds
    except FileNotFoundError:
        return False
