"""The juliacall side of the Julia backends: Julia started once, on one dedicated thread.

* One Julia thread: juliacall is imported, and every Julia call made, on ONE dedicated Python thread
  (``tullax-julia``). JAX calls host kernels from XLA's threads, and Julia may only be entered from the thread
  that initialised it: a garbage collection triggered from any other Python thread waits forever for the
  initialising thread (PythonCall.jl issue 578; the Julia manual's embedding chapter). Julia objects (the bridge,
  loaded kernel modules) live in this runtime and never leave that thread; callers pass only NumPy arrays and
  Python numbers. If juliacall was imported by someone else before tullax starts Julia, tullax calls it from the
  calling thread instead, with a warning.
* Starting Julia (on first build): the environment from ``julia_env_vars`` is applied first, then
  ``using TullaxBridge``.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import os
import queue
import sys
import threading
import time
import warnings
from typing import Any, Callable, Sequence

from tullax.backends import host, julia_detect
from tullax.errors import BackendUnavailableError, TullaxError

THREADS_ENV = "TULLAX_JULIA_THREADS"


class JuliaThread:
    """Runs callables on one long-lived daemon thread, in submission order; ``run`` blocks until done and returns
    the result or raises the exception (converted to TullaxError when it comes from juliacall, so no Julia object
    travels to the caller's thread)."""

    def __init__(self, name: str = "tullax-julia"):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def on_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self.on_thread():
            return fn(*args)
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((fn, args, future))
        return future.result()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn`` without waiting for it."""
        self._jobs.put((fn, args, concurrent.futures.Future()))

    def _loop(self) -> None:
        while True:
            fn, args, future = self._jobs.get()
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                future.set_exception(_portable(exc))
            else:
                future.set_result(result)
            del fn, args, future


def _portable(exc: BaseException) -> BaseException:
    """``exc`` as it may leave the Julia thread: a juliacall error becomes a TullaxError carrying its message."""
    if type(exc).__module__.split(".")[0] == "juliacall":
        error = TullaxError(f"Julia raised {type(exc).__name__}: {exc}")
        error.__traceback__ = None
        return error
    return exc


class JuliaRuntime:
    """Julia, TullaxBridge and the loaded kernel modules of this process (started once, lazily)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._thread: JuliaThread | None = None
        self._direct_lock: threading.RLock | None = None  # set when juliacall was started by someone else
        self._failed: str | None = None
        self._cuda: bool = False
        self._jl: Any = None
        self._bridge: Any = None
        self._modules: dict[str, Any] = {}
        self._packages: dict[str, Any] = {}

    @property
    def started(self) -> bool:
        return self._bridge is not None

    def start(self, availability: Callable[[], tuple[bool, str]]) -> None:
        with self._lock:
            if self._failed is not None:
                raise BackendUnavailableError(self._failed)
            if self.started:
                return
            ok, why = availability()
            if not ok:
                raise BackendUnavailableError(why)
            host.warn_if_other_llvm_loaded("Julia")
            os.environ.update(julia_env_vars())
            if "juliacall" in sys.modules:
                self._direct_lock = threading.RLock()
                warnings.warn("juliacall was imported before tullax started Julia, so tullax calls Julia from "
                              "whichever thread calls a kernel; calls from JAX's callback threads may hang when "
                              "Julia collects garbage (PythonCall.jl issue 578). Let tullax import juliacall.",
                              RuntimeWarning, stacklevel=3)
            else:
                self._thread = JuliaThread()
            try:
                self.run(self._boot)
            except BackendUnavailableError as err:
                self._failed = str(err)
                raise

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call ``fn(*args)`` where Julia may be called (see the module docstring)."""
        if self._direct_lock is not None:
            with self._direct_lock:
                return fn(*args)
        if self._thread is None:
            raise TullaxError("internal error: Julia is not started")
        return self._thread.run(fn, *args)

    def _boot(self) -> None:
        try:
            from juliacall import Main as jl  # starts Julia (juliapkg resolves tullax/juliapkg.json first)

            jl.seval("using TullaxBridge")
        except Exception as err:  # noqa: BLE001 - any failure to start is "unavailable", with its message
            raise BackendUnavailableError(
                f"a Julia was found but juliacall could not start it with TullaxBridge: {err}. On a machine "
                "without network, first resolve the environment once online (or point PYTHON_JULIAPKG_PROJECT at "
                "a resolved one)") from None
        self._jl, self._bridge = jl, jl.TullaxBridge
        if self._thread is not None:
            atexit.register(self._park)  # runs before juliacall's own exit hook (registered earlier)

    def start_cuda(self, availability: Callable[[], tuple[bool, str]]) -> None:
        """``using CUDA`` (loads TullaxBridge's CUDA extension); BackendUnavailableError if it is not functional."""
        self.start(availability)
        with self._lock:
            if self._cuda:
                return

            def load() -> bool:
                self._jl.seval("using CUDA")
                return bool(self._jl.seval("CUDA.functional()"))

            try:
                functional = self.run(load)
            except TullaxError as err:
                raise BackendUnavailableError(f"CUDA.jl could not be loaded: {err}") from None
            if not functional:
                raise BackendUnavailableError("CUDA.jl is installed but reports no functional GPU "
                                              "(CUDA.functional() is false); see CUDA.versioninfo() in Julia")
            self._cuda = True

    # -- modules and launches (all on the Julia thread) -------------------------------------------
    def has_module(self, modname: str) -> bool:
        return modname in self._modules

    def load_source(self, modname: str, source: str) -> float:
        """Evaluate a printed module (``TullaxBridge.load_kernels``); returns the milliseconds it took."""

        def load() -> float:
            if modname not in self._modules:
                start = time.perf_counter()
                self._modules[modname] = self._bridge.load_kernels(source, modname)
                return (time.perf_counter() - start) * 1e3
            return 0.0

        return self.run(load)

    def load_from_package(self, modname: str, pkgdir: str) -> float:
        """Take ``modname`` from the precompiled package at ``pkgdir`` (loaded once); milliseconds it took."""

        def load() -> float:
            start = time.perf_counter()
            package = self._packages.get(pkgdir)
            if package is None:
                package = self._packages[pkgdir] = self._bridge.load_precompiled(pkgdir)
            self._modules[modname] = getattr(package, modname)
            return (time.perf_counter() - start) * 1e3

        return self.run(load)

    def launch(self, modname: str, launcher: str, args: Sequence[Any], device: str) -> float:
        """Call the printed launcher through the bridge; returns the seconds Julia measured."""

        def call() -> float:
            module = self._modules[modname]
            entry = self._bridge.run_launcher_cpu_b if device == "cpu" else self._bridge.run_launcher_cuda_b
            return float(entry(module, launcher, *args))

        return self.run(call)

    def write_package(self, directory: str, name: str, sources: list[str], workloads: list[dict]) -> tuple[str, float]:
        """Write and precompile the kernel package; (its path, seconds precompiling took)."""

        def write() -> tuple[str, float]:
            path = str(self._bridge.write_precompile_package(directory, name, sources, workloads))
            return path, float(self._bridge.precompile_package(path))

        return self.run(write)

    def _park(self) -> None:
        """At interpreter exit: leave the Julia thread GC-safe for good and idle, so that a collection during
        Julia's exit hooks (run by juliacall on the main thread) does not wait for it forever. Best effort."""
        parked = threading.Event()

        def park() -> None:
            import ctypes

            try:
                from juliacall import CONFIG

                enter = CONFIG["lib"].jl_gc_safe_enter
                enter.restype = ctypes.c_int8
                enter.argtypes = []
                enter()
            except (ImportError, KeyError, AttributeError):
                pass
            parked.set()
            threading.Event().wait()  # never returns to Julia

        if self._thread is not None:
            self._thread.submit(park)
            parked.wait(timeout=10)


def julia_env_vars() -> dict[str, str]:
    """What to put in ``os.environ`` before juliacall starts Julia (only variables the user has not set)."""
    threads = os.environ.get(THREADS_ENV) or str(os.cpu_count() or 1)
    return julia_detect.julia_env_vars(threads)


_RUNTIME = JuliaRuntime()


def runtime() -> JuliaRuntime:
    return _RUNTIME

