"""The compile cache's file locks: one small file per lock in one directory, safe to delete.

A lock is an OS lock (``flock``; ``msvcrt.locking`` on Windows) on an open lock file. After taking it, the taker
checks that the path still names the file it locked: a remover deletes a lock file only while holding it, so a
process that waited on the deleted file notices and locks the new one instead (two holders of "one" lock is the
classic race of deleting lock files). That is what lets ``clear`` and ``prune`` remove lock files.

A lock that cannot be taken at all (its directory is unwritable, the disk has no room for the file) is bypassed
with one warning: every cache write is atomic on its own, so the worst outcome is that two processes compile
the same kernel. A directory sitting where a lock file belongs is removed (with a warning) and the lock taken.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from tullax.errors import TullaxError
from tullax.runtime.cache_files import CacheWarning, make_room_for_directory, make_room_for_file

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
    import msvcrt

LOCK_SUFFIX = ".lock"
# Waiting for a lock polls: flock has no timeout of its own. Short at first (most waits are for an index
# update of a few milliseconds), capped so a long wait (another process compiling) costs no CPU.
_FIRST_POLL_S = 0.002
_MAX_POLL_S = 0.05


def _try_lock(fd: int) -> bool:
    """Take the lock on ``fd`` if it is free; False when another holds it, OSError when it cannot be locked."""
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except (BlockingIOError, PermissionError):  # held elsewhere (some filesystems say EACCES)
        return False
    except OSError:
        if fcntl is None:  # msvcrt reports a held lock as EDEADLOCK
            return False
        raise
    return True


def _unlock(fd: int) -> None:
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
    else:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)


def _names_same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


class CacheLocks:
    """The lock files of one cache directory. ``hold`` waits up to ``timeout`` seconds (then a TullaxError
    that says how to fix it), ``try_hold`` does not wait. Locks do not nest: one thread must not hold a lock
    while taking the same one again."""

    def __init__(self, directory: Path, timeout: float, timeout_setting: str):
        self.directory = directory
        self.timeout = timeout
        self._timeout_setting = timeout_setting  # named in the timeout error
        self._bypass_warned = threading.Event()  # one warning per process for locks that cannot be taken

    def path(self, name: str) -> Path:
        return self.directory / f"{name}{LOCK_SUFFIX}"

    @contextlib.contextmanager
    def hold(self, name: str, what: str, *, remove: bool = False) -> Iterator[None]:
        """Hold the lock ``name`` (``what`` describes it in errors); ``remove`` deletes its file before
        releasing it (nothing is left behind for an entry that is gone)."""
        path = self.path(name)
        fd = self._acquire(path, time.monotonic() + self.timeout, what)
        if fd is None:
            raise TullaxError(
                f"waited {self.timeout:g} s for the lock on {what} ({path}) and another process still holds it. "
                f"If no tullax process is running, delete that file; to wait longer set {self._timeout_setting}."
            )
        try:
            yield
        finally:
            self._release(fd, path, remove)

    @contextlib.contextmanager
    def try_hold(self, name: str, *, remove: bool = False) -> Iterator[bool]:
        """Hold the lock ``name`` if it is free right now; yields whether it is held."""
        path = self.path(name)
        fd = self._acquire(path, time.monotonic(), name)
        try:
            yield fd is not None
        finally:
            if fd is not None:
                self._release(fd, path, remove)

    def _acquire(self, path: Path, deadline: float, what: str) -> int | None:
        """An open descriptor holding the lock at ``path``; None when ``deadline`` passed first; -1 when the
        lock cannot be taken at all (bypassed, with a warning)."""
        poll = _FIRST_POLL_S
        while True:
            try:
                fd = self._open(path)
            except OSError as err:
                self._warn_bypass(path, what, err)
                return -1
            try:
                locked = _try_lock(fd)
            except OSError as err:  # a filesystem without locks
                os.close(fd)
                self._warn_bypass(path, what, err)
                return -1
            if locked:
                if _names_same_file(fd, path):
                    return fd
                _unlock(fd)  # a remover deleted the file we waited on: lock the one that is there now
                os.close(fd)
                continue
            os.close(fd)
            if time.monotonic() >= deadline:
                return None
            time.sleep(poll)
            poll = min(2 * poll, _MAX_POLL_S)

    def _open(self, path: Path) -> int:
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            make_room_for_directory(self.directory)
            self.directory.mkdir(parents=True, exist_ok=True)
        except IsADirectoryError:
            make_room_for_file(path)
            warnings.warn(f"the tullax cache lock {path} was a directory; it was removed", CacheWarning,
                          stacklevel=5)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def _warn_bypass(self, path: Path, what: str, err: OSError) -> None:
        if self._bypass_warned.is_set():
            return
        self._bypass_warned.set()
        warnings.warn(
            f"cannot take the lock on {what} ({path}: {err.strerror or err}); going on without cache locks in "
            "this process, so a concurrent process may compile the same kernel again",
            CacheWarning, stacklevel=6)

    @staticmethod
    def _release(fd: int, path: Path, remove: bool) -> None:
        if fd < 0:
            return  # bypassed
        try:
            if remove:
                with contextlib.suppress(OSError):  # Windows cannot delete an open file: it stays, harmlessly
                    os.unlink(path)
            _unlock(fd)
        finally:
            os.close(fd)
