"""Compiling Numba kernels in a helper process, so that a process that compiles many kernels stays small.

Why: every Numba compile leaves about 4 MiB behind in the compiling process (LLVM modules and contexts, Numba's
target tables): nothing in Python keeps it alive and nothing can free it, so compiling 500 distinct specs grew a
process by 2.3 GB. Loading a compiled kernel from the compile cache costs about 0.3 MiB. So once a process has
compiled ``TULLAX_NUMBA_INPROCESS_COMPILES`` kernels itself (default 32; "off": no limit), further compiles go to
a helper process: it compiles the kernel into its compile-cache entry, and the process loads it from there. The
helper is replaced after ``HELPER_COMPILES`` compiles, so it stays bounded too.

Whatever goes wrong with the helper (it cannot start, it dies, Numba raises there, the cache cannot store the
result) leaves the compile to the process itself, as without a helper: the helper saves memory, it never adds
a failure. Replies come back on the helper's stdout, so the helper sends anything it prints to stderr.
"""
from __future__ import annotations

import atexit
import os
import pickle
import struct
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, BinaryIO

from tullax import settings
from tullax.runtime import forks

INPROCESS_COMPILES_ENV = "TULLAX_NUMBA_INPROCESS_COMPILES"
DEFAULT_INPROCESS_COMPILES = settings.SETTINGS[INPROCESS_COMPILES_ENV].default
# Compiles by one helper process before it is replaced: it keeps ~4 MiB of each too (at most ~250 MiB then),
# and starting one costs about a second (importing Numba and initialising its target).
HELPER_COMPILES = 64
_OK = "ok"
_LENGTH = struct.Struct("<Q")  # every message: its length, then its pickle
_STOP_WAIT_S = 5.0  # a helper told to stop (its stdin closed) that has not exited by then is killed


@dataclass(frozen=True)
class CompileRequest:
    """Compile ``function`` of the module stored under ``key`` (file ``path``, text ``source``) in the cache
    at ``root`` for ``arg_types`` (Numba types), storing the result in the entry; ``chunk``: a chunk variant
    (``tullax.backends.numba.modules.compile_variant``)."""

    root: str
    key: str
    path: str
    source: str
    function: str
    arg_types: tuple
    chunk: bool = False


def inprocess_compiles() -> int | None:
    """How many kernels a process compiles itself before it uses the helper (None: all of them)."""
    return settings.value(INPROCESS_COMPILES_ENV)


def _send(stream: BinaryIO, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def _receive(stream: BinaryIO) -> Any:
    """The next message; EOFError when the other side is gone."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError("the other process closed the pipe")
    (length,) = _LENGTH.unpack(head)
    data = stream.read(length)
    if len(data) < length:
        raise EOFError("the other process closed the pipe mid-message")
    return pickle.loads(data)


class CompileHelper:
    """This process's helper process (started on first use, replaced after ``HELPER_COMPILES``) and the
    counts that decide when to use it."""

    def __init__(self) -> None:
        self._lock = forks.lock()  # one request at a time: Numba compiles one kernel at a time anyway
        self._process: subprocess.Popen | None = None
        self._owner = os.getpid()  # the process that started it: a forked child must start its own
        self._served = 0  # compiles by the current helper process
        self._unusable = False  # a helper died before its first reply: this process stops asking for one
        self.local_compiles = 0  # kernels this process compiled itself
        self.helper_compiles = 0  # kernels the helper compiled and this process then loaded
        atexit.register(self.stop)

    def count(self, *, here: bool, helped: bool) -> None:
        """Count one kernel made ready: compiled in this process (``here``), or by the helper (``helped``)."""
        with self._lock:
            self.local_compiles += here
            self.helper_compiles += helped

    def wanted(self) -> bool:
        """Whether the next compile goes to the helper: this process has compiled its share (and a helper can
        run here)."""
        budget = inprocess_compiles()
        return budget is not None and self.local_compiles >= budget and not self._unusable

    def compile(self, request: CompileRequest) -> bool:
        """Have the helper compile ``request`` into the cache; True when it says it stored the result."""
        with self._lock:
            try:
                process = self._running()
                _send(process.stdin, request)
                reply = _receive(process.stdout)
            except (OSError, EOFError, pickle.PickleError):
                self._unusable = self._served == 0  # it cannot even start here; one that crashed later may
                self._stop_locked()  # ... work again: the next compile starts a new one
                return False
            self._served += 1
            if self._served >= HELPER_COMPILES:
                self._stop_locked()
            return reply == _OK

    def stop(self) -> None:
        with self._lock:
            self._stop_locked()

    def _running(self) -> subprocess.Popen:
        if self._owner != os.getpid():  # inherited through a fork: the parent's helper is not ours to use
            self._process, self._owner = None, os.getpid()
        if self._process is None or self._process.poll() is not None:
            self._served = 0
            # The helper imports tullax the way this process did, wherever that came from.
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
            self._process = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, env=env)
        return self._process

    def _stop_locked(self) -> None:
        process, self._process = self._process, None
        if process is None or self._owner != os.getpid():
            return
        try:
            process.stdin.close()  # the helper exits at the end of its input
            process.wait(_STOP_WAIT_S)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()


# ---------------------------------------------------------------------------------------- the helper side


def _compile(request: CompileRequest) -> str:
    """Compile one request into the cache: "ok", or what went wrong (the asking process compiles instead)."""
    from tullax.backends.numba import artefacts as numba_artefacts
    from tullax.backends.numba.modules import compile_variant, import_stored_module
    from tullax.runtime.cache import CompileCache

    try:
        cache = CompileCache(request.root)
        module = import_stored_module(request.path, request.key)
        function = getattr(module, request.function)
        numba_artefacts.install([function], cache, request.key, request.source)
        compile_variant(function, request.arg_types, chunk=request.chunk)
    except Exception as err:  # noqa: BLE001 - reported, and the asking process compiles the kernel itself
        return f"{type(err).__name__}: {err}"
    return _OK if cache.storing.is_set() else "the cache stores nothing (a full disk?)"


def serve() -> None:
    """The helper: answer compile requests on stdin until it closes."""
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a print anywhere must not corrupt the replies
    while True:
        try:
            request = _receive(requests)
        except EOFError:
            return
        _send(replies, _compile(request))


if __name__ == "__main__":
    serve()
