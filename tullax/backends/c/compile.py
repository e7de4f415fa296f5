"""The host C compiler of the ``c`` backend: which one, with which flags, whether it works here, and one
compilation of a translation unit to a shared library.

* ``compiler()``: ``$TULLAX_CC``, else ``cc``. ``identity()``: the compiler's resolved path, size and mtime and
  the CPU's model and feature flags (``-march=native`` code is for this CPU): part of every cache key, so a
  changed compiler or a cache directory shared with another machine never loads a stale library. No
  subprocess: the key costs microseconds.
* ``flags()``: ``-O3 -march=native -fopenmp -fPIC -shared`` (on x86-64 ``-mprefer-vector-width=256``), plus
  the fast-math flags that change no IEEE value (NaN, infinities, signed zeros): ``-fno-math-errno
  -fno-trapping-math -ffp-contract=fast``. Never ``-ffinite-math-only`` (-inf initial values of max, NaN
  propagation) nor ``-fno-signed-zeros`` (GCC folds ``x*0`` to 0 under it, NaN*0 included); sums vectorise
  through the printer's vector lanes of partial sums (float sums along a row) or its ``#pragma omp simd
  reduction`` instead of ``-fassociative-math``.
  ``$TULLAX_CFLAGS`` adds flags after ours; glibc's libmvec is linked where it exists (``vector_math``).
* ``probe()``: whether the compiler builds an OpenMP shared library here (remembered in the compile cache per
  ``identity()``, so a warm process does not pay for it).
* ``compile_library(source_path, library_path)``: a module of several kernels as ``PARALLEL_UNITS`` (or
  ``units``) translation units (``split_units``), compiled at once (or as many at a time as ``room()`` says)
  and linked, else one compiler run; a failure is a TullaxError with the compiler's message and the source path:
  a compiler that exits non-zero, exits 0 without writing the library, or runs longer than ``timeout_s()``
  (``$TULLAX_CC_TIMEOUT``, seconds) is stopped (its whole process group) and reported, never an OSError.
  ``probe()`` also dlopens what it built, so a compiler writing a library that does not load is unavailable too.
"""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from tullax import settings
from tullax.errors import TullaxError
from tullax.runtime import forks

CC_ENV = "TULLAX_CC"
CFLAGS_ENV = "TULLAX_CFLAGS"  # extra flags after ours (in the cache key too): experiments, another -march
TIMEOUT_ENV = "TULLAX_CC_TIMEOUT"  # seconds one compile may take before it is stopped and reported
DEFAULT_TIMEOUT_S = settings.SETTINGS[TIMEOUT_ENV].default
PROBE_TIMEOUT_S = 60.0  # the probe's tiny compile, at most (less where the setting is less)
# IEEE values: no -fno-signed-zeros (GCC then folds x*0 to 0, NaN and inf included), so no -fassociative-math
# (which needs it; the printer's sum lanes and `omp simd reduction` reorder the sums they vectorise), no
# -freciprocal-math (a/b as a*(1/b): inf for a subnormal b); -fno-trapping-math and -fno-math-errno change no value
BASE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math",
              "-ffp-contract=fast")
# the fast-math flags before issue 44 (benchmarks/ieee_flags.py compares them with ours)
OLD_FAST_FLAGS = ("-fno-signed-zeros", "-fassociative-math", "-freciprocal-math")
# x86-64 GCC schedules instructions only after register allocation: a kernel holding two copies of a register
# tile's sum lanes (the first block, then the float64-blocked rest) kept the tile's loaded vectors on the stack.
# Scheduling first, aware of register pressure, keeps them in registers (Linear and Dist grad W as fast as under
# the old fast-math flags again, benchmarks/ieee_flags.py). Values are unchanged; Clang ignores both flags.
SCHEDULE_FLAGS = ("-fschedule-insns", "-fsched-pressure")
# x86-64: 256-bit vectors even where AVX-512 exists, as LLVM (Numba) prefers: the reductions of a convolution's
# gradient run ~60 iterations, which 16-float vectors mostly spend in their remainder (measured: the conv2d
# kernel gradient on one core 64 -> 37 ms; Linear, Dist, attention unchanged or faster).
X86_FLAGS = ("-mprefer-vector-width=256",) + SCHEDULE_FLAGS
# glibc's vector math library: with it the prelude declares its functions (the registry's ``libmvec``) and pow as
# OpenMP SIMD functions, so a loop calling them vectorises (measured: the float32 row logsumexp forward 71 ms ->
# see the report; Numba prints a vectorisable exp of its own, tullax.backends.numba.math). Within 4 ulp.
MVEC_FLAGS = ("-DTX_MVEC",)
MVEC_LIBS = ("-lmvec",)


@functools.cache
def vector_math() -> bool:
    """Whether glibc's libmvec is there to link (x86-64 Linux)."""
    import ctypes.util

    return platform.machine() in ("x86_64", "AMD64") and ctypes.util.find_library("mvec") is not None


def flags() -> tuple[str, ...]:
    """The compiler flags before the source: ours, then ``$TULLAX_CFLAGS``."""
    x86 = X86_FLAGS if platform.machine() in ("x86_64", "AMD64") else ()
    return BASE_FLAGS + x86 + (MVEC_FLAGS if vector_math() else ()) + tuple(settings.value(CFLAGS_ENV).split())


def libraries() -> tuple[str, ...]:
    """The libraries after the source."""
    return (MVEC_LIBS if vector_math() else ()) + ("-lm",)
_PROBE = "int tx_probe(int n) {\n    int s = 0;\n    #pragma omp parallel for reduction(+:s)\n" \
         "    for (int i = 0; i < n; ++i) s += i;\n    return s;\n}\n"


def timeout_s() -> float:
    """How long one compile may run: ``$TULLAX_CC_TIMEOUT`` seconds where set to a positive number, else
    ``DEFAULT_TIMEOUT_S`` (a hung compiler is stopped and reported, never waited for)."""
    return settings.value(TIMEOUT_ENV)


def compiler() -> str:
    """The compiler command: ``$TULLAX_CC`` or ``cc``."""
    return settings.value(CC_ENV)


def resolved() -> str | None:
    """The compiler's executable, or None when there is none on the PATH."""
    found = shutil.which(compiler())
    return os.path.realpath(found) if found else None


def identity() -> dict[str, object]:
    """What the compiled code depends on besides the source: the compiler binary, its flags and this CPU. Looked
    up once per process for each setting of the variables it depends on (every build and availability check
    asks, and the PATH search and stat cost ~2 ms each time): a compiler binary replaced while a process runs
    is seen by the next process."""
    found = _identity(compiler(), os.environ.get("PATH", ""), settings.value(CFLAGS_ENV))
    return {**found, "flags": list(found["flags"])}


@functools.lru_cache(maxsize=32)
def _identity(cc: str, search_path: str, cflags: str) -> dict[str, object]:
    """``identity()`` for the current environment (the arguments are the variables it reads: the cache key)."""
    path = resolved()
    stat = os.stat(path) if path else None
    return {"cc": cc, "path": path, "size": stat.st_size if stat else None,
            "mtime": stat.st_mtime_ns if stat else None, "flags": tuple(flags() + libraries()), "cpu": _cpu()}


@functools.cache
def _cpu() -> str:
    """The CPU model and its feature flags (a digest), which ``-march=native`` compiles for."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine() + " " + platform.processor()
    lines = [line for line in text.splitlines() if line.startswith(("model name", "flags", "Features"))][:2]
    return platform.machine() + " " + hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


BACKGROUND_NICE = 10  # a background compile's niceness (of 19): the fast tier's calls go first
PARALLEL_UNITS = 2  # translation units compiled at once: the machines we target have at least 2 cores
_POLL_S = 0.01  # how often units waiting for room look whether they may start


def cores() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def split_units(text: str, units: int | None = None) -> list[str]:
    """The printed module ``text`` as at most ``units`` translation units of about equal length, each the prelude
    and some of the kernel functions (every function in exactly one); ``[text]`` when it has a single kernel."""
    from tullax.printers.c import UNIT_MARK  # compiling only: a warm process imports no printer

    units = PARALLEL_UNITS if units is None else units
    prelude, *kernels = text.split(UNIT_MARK)
    if len(kernels) < 2 or units < 2:
        return [text]
    groups: list[list[str]] = [[] for _ in range(min(units, len(kernels)))]
    for kernel in sorted(kernels, key=len, reverse=True):  # longest first, each into the shortest group
        min(groups, key=lambda g: sum(map(len, g))).append(kernel)
    return [UNIT_MARK.join([prelude, *group]) for group in groups]


def private_library(data: bytes, prefix: str) -> Path:
    """A compiled library kept in a private temporary file, where the compile cache could not store it."""
    fd, private = tempfile.mkstemp(prefix=prefix, suffix=".so")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return Path(private)


def compile_library(source: Path, library: Path, timeout: float | None = None, units: int | None = None,
                    room: Callable[[], int] | None = None, include: Sequence[Path] = (),
                    background: bool = False) -> float:
    """Compile ``source`` into the shared library ``library`` (written atomically: a temporary file renamed,
    so a concurrent reader never dlopens half a file); returns the seconds the compiler ran. A module of
    several kernels is cut into ``PARALLEL_UNITS`` (or ``units``) translation units, compiled longest first,
    as many at once as ``room()`` says when it is given, else all at once, and linked: the compiler's time goes
    mostly to the kernel functions, so two units take about half the wall time of one. ``include``: header
    directories (``-I``); ``timeout``: seconds for each compiler run (``timeout_s()`` when None); ``background``:
    the compiler runs at ``BACKGROUND_NICE`` (a fast tier's optimised build: the first calls, on the fast tier,
    keep the cores)."""
    cc = compiler()
    timeout = timeout_s() if timeout is None else timeout
    cflags = [*flags(), *(f"-I{path}" for path in include)]
    tmp = library.with_name(f".{library.name}.{os.getpid()}.tmp")
    start = time.perf_counter()
    units = sorted(split_units(source.read_text(encoding="utf-8"), units), key=len, reverse=True)
    try:
        if len(units) == 1:
            _run([[cc, *cflags, "-o", str(tmp), str(source), *libraries()]], source, timeout, background=background)
        else:
            with tempfile.TemporaryDirectory(prefix="tullax-c-units-") as scratch:
                objects = []
                for number, unit in enumerate(units):
                    path = Path(scratch) / f"unit{number}.c"
                    path.write_text(unit, encoding="utf-8")
                    objects.append(path.with_suffix(".o"))

                _run([[cc, *cflags, "-c", "-o", str(obj), str(obj.with_suffix(".c"))] for obj in objects],
                     source, timeout, room, background)
                _run([[cc, *cflags, "-o", str(tmp), *map(str, objects), *libraries()]], source, timeout,
                     background=background)
        if not tmp.is_file():  # a "compiler" that exits 0 and writes nothing
            raise TullaxError(f"the C compiler {cc!r} exited without an error but wrote no library for {source}")
    except TullaxError:
        tmp.unlink(missing_ok=True)  # whatever a failed compiler or linker left behind
        raise
    os.replace(tmp, library)
    return time.perf_counter() - start


def _run(commands: list[list[str]], source: Path, timeout: float, room: Callable[[], int] | None = None,
         background: bool = False) -> None:
    """Run the compiler ``commands``, in order, as many at once as ``room()`` says (at least one; all of them
    without it); a TullaxError with the compiler's words if one fails, the others stopped. Each process is
    waited for by a thread blocked in ``waitpid``: ``Popen.wait`` with a timeout polls, every 50 ms at worst,
    which added 40 ms to a 70 ms compile."""
    cc = compiler()
    deadline = time.monotonic() + timeout
    waiting = list(commands)
    running: list[tuple[subprocess.Popen, IO[str]]] = []
    ended: list[tuple[subprocess.Popen, IO[str]]] = []
    changed = threading.Condition()

    def watch(entry: tuple[subprocess.Popen, IO[str]]) -> None:
        entry[0].wait()
        with changed:
            ended.append(entry)
            changed.notify()

    failures = []
    try:
        while waiting or running:
            while waiting and len(running) < (max(1, room()) if room else len(commands)):
                log = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a long message never blocks gcc
                try:
                    # a session of its own: a timeout stops the compiler's children (cc1, as, ld) with it
                    entry = (subprocess.Popen(waiting.pop(0), stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True), log)
                except OSError as err:
                    log.close()
                    raise TullaxError(f"the c backend could not run its C compiler {cc!r} on {source}: {err}") \
                        from None
                running.append(entry)
                if background:  # its session's group: the driver and the cc1/as/ld it started
                    _lower_priority(entry[0].pid)
                threading.Thread(target=watch, args=(entry,), name="tullax-cc-wait", daemon=True).start()
            with changed:
                left = deadline - time.monotonic()
                if not ended and left <= 0:
                    raise TullaxError(f"the C compiler {cc!r} ran for more than {timeout:g} s on {source}")
                if not ended:  # units waiting for room look again shortly (it grows when an event is set)
                    changed.wait(min(left, _POLL_S) if waiting else left)
                finished, ended[:] = list(ended), []
            for process, log in finished:
                running.remove((process, log))
                if process.returncode != 0:
                    log.seek(0)
                    failures.append(log.read().strip())
                log.close()
            if failures:
                break
    finally:
        for process, log in running:  # a failure or a timeout: stop the others
            _stop(process)
            process.wait()
            log.close()
    if failures:
        raise TullaxError(f"the C compiler {cc!r} could not compile the module generated at {source}; please "
                          f"report it. The compiler said:\n{failures[0]}")


def _lower_priority(pid: int) -> None:
    try:
        os.setpriority(os.PRIO_PGRP, pid, BACKGROUND_NICE)
    except (OSError, AttributeError):  # gone already, or not POSIX: it runs at ours
        pass


def _stop(process: subprocess.Popen) -> None:
    """Kill a compiler run and every process it started (its session's group)."""
    try:
        os.killpg(process.pid, 9)
    except (OSError, AttributeError):  # gone already, or no process groups here
        process.kill()


def probe() -> tuple[bool, str]:
    """(the compiler builds an OpenMP shared library here, why not): one tiny compile, remembered in the
    compile cache by ``identity()`` and in this process."""
    if identity()["path"] is None:
        return False, _NO_COMPILER.format(cc=compiler(), env=CC_ENV)
    with _PROBE_LOCK:  # one probe at a time: a caller waits for the one running (``start_probe``)
        return _probe(repr(sorted(identity().items())))


_NO_COMPILER = "no C compiler: {cc!r} is not on the PATH (install gcc, or set {env} to a C compiler with OpenMP)"


def probe_answer() -> tuple[bool, str] | None:
    """``probe()``'s answer where it is known without waiting (no compiler on the PATH, or this process probed
    already); None while the probe has not answered."""
    if identity()["path"] is None:
        return False, _NO_COMPILER.format(cc=compiler(), env=CC_ENV)
    return _ANSWERS.get(repr(sorted(identity().items())))


_ANSWERS: dict[str, tuple[bool, str]] = {}  # ``_probe``'s answers in this process, read without its lock


_PROBE_LOCK = forks.lock()


@functools.cache
def start_probe() -> None:
    """Run ``probe()`` in a thread, once per process: a kernel made for ``c`` or ``auto`` starts it, so its compile
    (0.1-0.5 s with an empty cache) runs beside the spec's analysis and imports instead of after them."""
    def run() -> None:
        try:
            probe()
        except Exception:  # noqa: BLE001 - the probe asked for again when the backend resolves says why
            pass

    threading.Thread(target=run, name="tullax-c-probe", daemon=True).start()


def _probe(ident: str) -> tuple[bool, str]:
    if ident not in _ANSWERS:
        _ANSWERS[ident] = _probe_now(ident)
    return _ANSWERS[ident]


def probe_known() -> bool:
    """Whether ``probe()`` answers without compiling: there is no compiler, this process probed, or the compile
    cache holds the answer (a process ran here before with this cache)."""
    if probe_answer() is not None:
        return True
    cache, key = _probe_entry(repr(sorted(identity().items())))
    return cache.read_text(key, "probe.txt") == "ok"


def _probe_entry(ident: str) -> tuple[object, str]:
    from tullax.runtime.cache import cache_key, get_cache

    return get_cache(), cache_key(probe="c-compiler", identity=ident)


def _probe_now(ident: str) -> tuple[bool, str]:
    cache, key = _probe_entry(ident)
    if cache.read_text(key, "probe.txt") == "ok":
        return True, ""
    with tempfile.TemporaryDirectory(prefix="tullax-c-probe-") as tmp:
        source = Path(tmp) / "probe.c"
        source.write_text(_PROBE)
        try:
            compile_library(source, Path(tmp) / "probe.so", timeout=min(PROBE_TIMEOUT_S, timeout_s()))
            _loads(Path(tmp) / "probe.so")
        except TullaxError as err:
            return False, f"the C compiler {compiler()!r} cannot build an OpenMP shared library here: {err}"
    cache.write_text(key, "probe.txt", "ok")
    return True, ""


def _loads(library: Path) -> None:
    """dlopen the probe's library (without running it: no OpenMP team starts) and find its function; a
    TullaxError where that fails (a compiler that writes something that is not a shared library)."""
    from tullax.backends.c.load import load_library

    try:
        load_library(str(library)).tx_probe
    except (OSError, AttributeError) as err:
        raise TullaxError(f"the library it built does not load: {err}") from None


__all__ = ["BASE_FLAGS", "CC_ENV", "CFLAGS_ENV", "OLD_FAST_FLAGS", "PARALLEL_UNITS", "TIMEOUT_ENV",
           "compile_library", "compiler", "cores", "flags", "identity", "libraries", "probe", "resolved",
           "probe_answer", "probe_known", "split_units", "start_probe", "timeout_s", "vector_math"]
