"""The juliacall side of the Julia backends: Julia started once, on one dedicated thread, and shut down there.

* One Julia thread: juliacall is imported, and every Julia call made, on ONE dedicated Python thread
  (``tullax-julia``). JAX calls host kernels from XLA's threads, and Julia may only be entered from the thread
  that initialised it: a garbage collection triggered from any other Python thread waits forever for the
  initialising thread (PythonCall.jl issue 578; the Julia manual's embedding chapter). Julia objects (the bridge,
  loaded kernel modules) live in this runtime and never leave that thread: callers pass only NumPy arrays,
  Python numbers, strings and tuples of them, and every exception leaves it as a TullaxError carrying text only.
  If juliacall was imported by someone else before tullax starts Julia, tullax calls it from the calling thread
  instead, with a warning, and leaves start-up and exit to juliacall.
* Starting Julia (on first build): the environment from ``julia_env_vars`` is applied first (threads:
  ``TULLAX_JULIA_THREADS``, else ``JULIA_NUM_THREADS``, else the CPU count; ``TULLAX_JULIA_OFFLINE=1`` for
  juliapkg's offline mode), then ``using TullaxBridge``. Then the Julia thread enters Julia's GC-safe state for
  good: juliacall's entry points are ``@cfunction``s, which switch to GC-unsafe on entry and back on return (as
  for any thread Julia adopts), so a collection started by one of Julia's own threads between two tullax calls
  (a package's background task) does not wait for the next call.
* Exit: juliacall runs Julia's exit hook from its ``atexit`` function on the main thread, a thread Julia never
  saw. tullax's ``atexit`` function runs first (registered later) and runs the hook on the Julia thread instead,
  the thread that initialised Julia, as a ``julia`` process does, after replacing juliacall's handle to it with a
  no-op; where that handle cannot be replaced it leaves the hook to juliacall (the thread stays GC-safe).
* libstdc++: tullax starts Julia long after NumPy and jax are imported. If one of them loaded an older system
  libstdc++, Julia fails to start ("PythonCall.jl did not start properly", "ccall requires the compiler"); the
  BackendUnavailableError then says so and how to work around it (PythonCall's FAQ: import juliacall first).
"""
from __future__ import annotations

import atexit
import concurrent.futures
import ctypes
import importlib.util
import os
import queue
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from tullax import settings
from tullax.backends import host
from tullax.backends.julia import detect as julia_detect
from tullax.errors import BackendUnavailableError, TullaxError

THREADS_ENV = "TULLAX_JULIA_THREADS"
OFFLINE_ENV = "TULLAX_JULIA_OFFLINE"
EXIT_TIMEOUT_S = 30.0  # Julia's exit hook normally takes well under a second; never hold up exit for longer

# Text of start-up failures caused by another extension's older libstdc++ (PythonCall's FAQ).
_LIBSTDCXX_SIGNS = ("libstdc++", "GLIBCXX", "ccall requires the compiler", "PythonCall.jl did not start properly")
LIBSTDCXX_HINT = (
    "This looks like an older system libstdc++ loaded by another extension (NumPy, jax) before Julia started: "
    "import juliacall at the very start of your program, before NumPy and jax (PythonCall's FAQ, "
    "https://juliapy.github.io/PythonCall.jl/stable/faq/), or put a newer libstdc++ first with LD_PRELOAD.")

# JAX's CUDA support, present when jax may preallocate GPU memory (jax installs it as a plugin package).
_JAX_CUDA_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin")


# =============================================================================================
# The Julia thread
# =============================================================================================
class JuliaThread:
    """Runs callables on one long-lived daemon thread, in submission order; ``run`` blocks until done and returns
    the result or raises the exception as ``portable`` makes it, so no Julia object travels to the caller's
    thread. A job may ``close`` it: every later job fails with a TullaxError instead of running."""

    def __init__(self, name: str = "tullax-julia"):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    @property
    def closed(self) -> bool:
        return self._closed

    def on_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._closed:
            raise _closed_error()
        if self.on_thread():
            return fn(*args)
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((fn, args, future))
        return future.result()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn`` without waiting for it."""
        self._jobs.put((fn, args, concurrent.futures.Future()))

    def close(self) -> None:
        """From a job on this thread: run no further job (Julia has shut down)."""
        self._closed = True

    def _loop(self) -> None:
        while True:
            fn, args, future = self._jobs.get()
            if self._closed:
                future.set_exception(_closed_error())
                continue
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                future.set_exception(portable(exc))
            else:
                future.set_result(result)
            del fn, args, future


def _closed_error() -> TullaxError:
    return TullaxError("Julia has shut down: the interpreter is exiting")


def portable(exc: BaseException) -> TullaxError:
    """``exc`` as it may leave the Julia thread: text only. A TullaxError keeps its type and message; anything
    else (a juliacall error, a TypeError from converting an argument) becomes a TullaxError naming its type. No
    traceback, cause or context: their frames hold juliacall objects, which must be freed on the Julia thread (a
    Julia wrapper freed on an XLA thread runs Julia code there). The message is built here, on the Julia thread
    (a juliacall error's text comes from Julia)."""
    error = exc if isinstance(exc, TullaxError) else TullaxError(f"Julia raised {type(exc).__name__}: {exc}")
    error.__traceback__ = error.__cause__ = error.__context__ = None
    error.__suppress_context__ = True
    return error


# =============================================================================================
# juliacall and Julia's C API
# =============================================================================================
@dataclass(frozen=True)
class Juliacall:
    """How the runtime reaches juliacall (tests pass fakes): ``start`` imports it, which starts Julia, and loads
    TullaxBridge, returning (``juliacall.Main``, the bridge module); ``library`` is the ctypes handle of
    libjulia that juliacall opened."""

    start: Callable[[], tuple[Any, Any]]
    library: Callable[[], Any]


def _start_juliacall() -> tuple[Any, Any]:
    from juliacall import Main as jl  # starts Julia (juliapkg resolves tullax/juliapkg.json first)

    jl.seval("using TullaxBridge")
    return jl, jl.TullaxBridge


def _juliacall_library() -> Any:
    from juliacall import CONFIG

    return CONFIG["lib"]


JULIACALL = Juliacall(_start_juliacall, _juliacall_library)


def _c_function(library: Any, name: str, restype: Any, argtypes: list[Any]) -> Any:
    function = getattr(library, name)
    function.restype, function.argtypes = restype, argtypes
    return function


def enter_gc_safe(library: Any) -> None:
    """``jl_gc_safe_enter()`` on this thread (exported by libjulia): the garbage collector no longer waits for it
    until it enters Julia again."""
    _c_function(library, "jl_gc_safe_enter", ctypes.c_int8, [])()


class _HookAlreadyRun:
    """Stands in for ``jl_atexit_hook`` in juliacall's library handle once tullax has run the hook: juliacall's
    ``atexit`` function looks the hook up there, sets ``argtypes`` and ``restype``, and calls it with 0."""

    argtypes: Any = None
    restype: Any = None

    def __call__(self, *args: Any) -> None:
        return None


def run_exit_hook_here(library: Any) -> bool:
    """Julia's exit hook, ``jl_atexit_hook(0)``, on this thread (the one that initialised Julia, GC-safe since
    start-up), in place of juliacall's call from the main thread: ctypes keeps a library's functions as
    attributes of its handle, and juliacall reads ``jl_atexit_hook`` from there at exit, so that attribute is
    replaced by a no-op first. Returns False, running nothing, when it cannot be replaced."""
    hook = getattr(library, "jl_atexit_hook", None)
    if hook is None:
        return False
    try:
        library.jl_atexit_hook = _HookAlreadyRun()
    except AttributeError:
        return False
    _c_function(library, "jl_gc_unsafe_enter", ctypes.c_int8, [])()  # the hook runs Julia code
    hook.argtypes, hook.restype = [ctypes.c_int], None
    hook(0)
    return True


def start_failure_message(err: BaseException) -> str:
    """The BackendUnavailableError text for a Julia that was found but did not start."""
    text = (f"a Julia was found but juliacall could not start it with TullaxBridge: {err}. On a machine without "
            "network, first resolve the environment once online (or point PYTHON_JULIAPKG_PROJECT at a resolved "
            f"one), and set {OFFLINE_ENV}=1.")
    if any(sign in str(err) for sign in _LIBSTDCXX_SIGNS):
        text += " " + LIBSTDCXX_HINT
    return text


def gpu_memory_warning(environ: Mapping[str, str], modules: Mapping[str, Any]) -> str | None:
    """The warning for ``julia-cuda`` in a process where jax may use the same GPU, else None. jax preallocates 75%
    of the GPU's memory on its first GPU operation (jax's "GPU memory allocation" docs), and CUDA.jl allocates
    its own device memory (a julia-cuda call on NumPy inputs copies them into new device arrays)."""
    if "jax" not in modules or not any(importlib.util.find_spec(name) for name in _JAX_CUDA_PLUGINS):
        return None
    if (environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "").lower() == "false"
            or "XLA_PYTHON_CLIENT_MEM_FRACTION" in environ or environ.get("XLA_PYTHON_CLIENT_ALLOCATOR")):
        return None
    return ("julia-cuda runs next to jax, which preallocates 75% of the GPU's memory on its first GPU operation, "
            "while CUDA.jl allocates from what is left (its own kernels' state, and device copies of NumPy "
            "inputs): large kernels may run out of GPU memory. Set XLA_PYTHON_CLIENT_PREALLOCATE=false (or "
            "XLA_PYTHON_CLIENT_MEM_FRACTION) before jax starts.")


def julia_env_vars(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What to put in ``os.environ`` before juliacall starts Julia (only variables the user has not set): Julia
    threads from ``TULLAX_JULIA_THREADS``, else ``JULIA_NUM_THREADS`` (juliacall's own default), else the CPU
    count; juliapkg's offline mode when ``TULLAX_JULIA_OFFLINE=1``."""
    env = os.environ if environ is None else environ
    return julia_detect.julia_env_vars(julia_threads(env), offline=settings.value(OFFLINE_ENV, env), environ=env)


def julia_threads(environ: Mapping[str, str]) -> int | str:
    """Julia's thread count as tullax starts it: ``TULLAX_JULIA_THREADS``, else ``JULIA_NUM_THREADS``, else the CPU
    count (a count or "auto")."""
    return settings.value(THREADS_ENV, environ) or environ.get("JULIA_NUM_THREADS") or str(os.cpu_count() or 1)


# =============================================================================================
# The runtime
# =============================================================================================
class JuliaRuntime:
    """Julia, TullaxBridge and the loaded kernel modules of this process (started once, lazily)."""

    def __init__(self, juliacall: Juliacall = JULIACALL) -> None:
        self._juliacall = juliacall
        self._lock = threading.RLock()
        self._thread: JuliaThread | None = None
        self._direct_lock: threading.RLock | None = None  # set when juliacall was started by someone else
        self._failed: str | None = None
        self._library: Any = None  # libjulia's ctypes handle (juliacall's), when tullax owns the Julia thread
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
            if self._thread is not None and self._thread.closed:
                raise _closed_error()
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
            self._jl, self._bridge = self._juliacall.start()
        except Exception as err:  # noqa: BLE001 - any failure to start is "unavailable", with its message
            raise BackendUnavailableError(start_failure_message(err)) from None
        if self._thread is None:
            return
        try:
            self._library = self._juliacall.library()
        except (ImportError, KeyError, AttributeError):  # another juliacall layout: leave both to juliacall
            return
        enter_gc_safe(self._library)
        atexit.register(self._shutdown)  # runs before juliacall's own exit function (registered earlier)

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
            warning = gpu_memory_warning(os.environ, sys.modules)
            if warning is not None:
                warnings.warn(warning, RuntimeWarning, stacklevel=3)

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

    def launch_device(self, modname: str, launcher: str, stream: int, device: int, given: tuple,
                      arrays: tuple, scalars: tuple, sizes: tuple) -> None:
        """Enqueue the printed GPU launcher on XLA's device buffers, ordered on XLA's ``stream``
        (``TullaxBridge.run_launcher_cuda_device!``); returns once it is enqueued. Every argument is a tuple of
        ints and strings (juliacall hands a tuple over as a Julia ``Tuple``)."""

        def call() -> None:
            self._bridge.run_launcher_cuda_device_b(self._modules[modname], launcher, stream, device, given,
                                                    arrays, scalars, sizes)

        self.run(call)

    def write_package(self, directory: str, name: str, sources: tuple[str, ...],
                      workloads: tuple[tuple, ...]) -> tuple[str, float]:
        """Write and precompile the kernel package (``workloads`` as ``julia.bridge_workload`` makes them: plain
        tuples, never lists or dicts, which reach Julia as PyList/PyDict of Py objects); (its path, seconds
        precompiling took)."""

        def write() -> tuple[str, float]:
            path = str(self._bridge.write_precompile_package(directory, name, sources, workloads))
            return path, float(self._bridge.precompile_package(path))

        return self.run(write)

    def _shutdown(self) -> None:
        """At interpreter exit: Julia's exit hook on the Julia thread (``run_exit_hook_here``), after dropping the
        Julia objects this runtime holds there; the thread then runs no further job (later calls raise). Best
        effort, at most EXIT_TIMEOUT_S."""
        thread = self._thread
        if thread is None:
            return
        done = threading.Event()

        def shut_down() -> None:
            try:
                self._modules.clear()
                self._packages.clear()
                self._jl = self._bridge = None
                thread.close()
                run_exit_hook_here(self._library)
            finally:
                done.set()

        thread.submit(shut_down)
        done.wait(timeout=EXIT_TIMEOUT_S)


_RUNTIME = JuliaRuntime()


def runtime() -> JuliaRuntime:
    return _RUNTIME


__all__ = ["JuliaThread", "JuliaRuntime", "Juliacall", "runtime", "julia_env_vars", "portable", "enter_gc_safe",
           "run_exit_hook_here", "start_failure_message", "gpu_memory_warning", "THREADS_ENV", "OFFLINE_ENV"]
