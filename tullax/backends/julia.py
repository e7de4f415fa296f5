"""The Julia backends: KernelAbstractions kernels printed from the loop IR, run through juliacall.

* ``julia`` runs on KernelAbstractions' ``CPU()`` (Julia's threads), ``julia-cuda`` on ``CUDABackend()``. Both
  print the kernels of ``tullax.lower`` with ``julia_printer``; the CPU flavour lowers with ``tile=True`` (strip-
  mined, contiguous inner loops), the CUDA one keeps one output element per work-item.
* Availability never imports juliacall (``import juliacall`` without a Julia downloads one): ``julia_detect``
  looks for a Julia; ``julia-cuda`` also needs an NVIDIA device and CUDA.jl in juliapkg's environment
  (``tullax julia install-cuda``). Without them ``build`` raises BackendUnavailableError saying how to get them.
* Starting Julia (on first build): the environment from ``julia_env_vars`` is applied first: Julia threads =
  ``TULLAX_JULIA_THREADS`` or ``os.cpu_count()`` (unless ``PYTHON_JULIACALL_THREADS`` is already set: KA's CPU
  backend spreads work-groups over Julia's threads, and juliacall starts one by default) and
  ``PYTHON_JULIACALL_HANDLE_SIGNALS=yes`` (required for a multi-threaded Julia inside Python; the cost is that
  Ctrl-C does not raise KeyboardInterrupt while a Julia kernel runs). Then ``using TullaxBridge``.
* One Julia thread: juliacall is imported, and every Julia call made, on ONE dedicated Python thread
  (``tullax-julia``). JAX calls host kernels from XLA's threads, and Julia may only be entered from the thread
  that initialised it: a garbage collection triggered from any other Python thread waits forever for the
  initialising thread (PythonCall.jl issue 578; the Julia manual's embedding chapter). Julia objects (the bridge,
  loaded kernel modules) live in this backend's registry and never leave that thread; the host kernel passes only
  NumPy arrays and Python numbers. At interpreter exit that thread parks in a GC-safe state before juliacall's own
  exit hook runs Julia's on the main thread (best effort). If juliacall was imported by someone else before tullax
  starts Julia, tullax calls it from the calling thread instead, with a warning.
* Numba and Julia each load an LLVM and have crashed together in one process (numba issue 7857): starting Julia
  when numba is already imported warns (``TULLAX_ALLOW_NUMBA_AND_JULIA=1`` silences it). tullax itself never
  imports both unless asked (the numba backend checks the reverse).
* Zero copy: the host kernel passes the NumPy arrays (views of XLA's buffers under jit) to
  ``TullaxBridge.run_launcher_cpu!``, which wraps each as ``unsafe_wrap(Array, pointer, reverse(size))`` (the
  printed kernels index reversed) and calls the printed launcher ``run_kernel!`` (ndrange, synchronize). Python
  keeps the arrays alive for the call. ``julia-cuda`` copies them to the device and the output back (the host
  kernel contract is NumPy memory); the zero-copy device path (DLPack) needs device buffers from the JAX op.
* Caching: the module text goes to the compile cache (``kernels.jl`` per key, plus ``workload.json``: tiny
  arguments for precompiling it). ``JuliaBackend.warm_package()`` (``tullax cache warm --backend julia``) writes
  every cached CPU module into one precompiled package (``TullaxBridge.write_precompile_package``, a
  PrecompileTools workload per kernel) and precompiles it; a later process loads those kernels from Julia's
  package image instead of compiling them (``ttfk_warm_ms`` in the cache index, ``ttfk_cold_ms`` otherwise).
"""
from __future__ import annotations

import atexit
import concurrent.futures
import json
import os
import queue
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tullax.backends import julia_detect
from tullax.backends.base import Signature
from tullax.compiler.loops import LoopKernel
from tullax.compiler.lower import lower
from tullax.errors import BackendUnavailableError, ShapeError, TullaxError
from tullax.printers.julia import (
    arrival_dtype,
    julia_type,
    launcher_name,
    name_of_module,
    print_module,
)
from tullax.spec.ir import Spec
from tullax.spec.text import format_spec

NAME = "julia"
CUDA_NAME = "julia-cuda"
PRINTER_VERSION = 1  # part of every cache key: bump when the printed code changes meaning
SOURCE_FILE = "kernels.jl"
WORKLOAD_FILE = "workload.json"
PACKAGE_NAME = "TullaxPrecompiledKernels"
PACKAGE_MODULES_FILE = "modules.json"
THREADS_ENV = "TULLAX_JULIA_THREADS"
ALLOW_BOTH_ENV = "TULLAX_ALLOW_NUMBA_AND_JULIA"
KERNEL_NAME = "kernel"


@dataclass(frozen=True)
class Target:
    """One Julia backend flavour: its registry name, the lowering's ``tile`` option, the bridge device."""

    name: str
    tile: bool
    device: str  # "cpu" | "cuda"

    @property
    def options(self) -> dict[str, Any]:
        return {"printer": PRINTER_VERSION, "tile": self.tile, "device": self.device}


CPU = Target(NAME, tile=True, device="cpu")
CUDA = Target(CUDA_NAME, tile=False, device="cuda")


# =============================================================================================
# Source
# =============================================================================================
def signature_for(spec: Spec, dtype: str) -> Signature:
    """Data and scalars in ``dtype``, index arrays int64 (what ``generate_source`` shows)."""
    import numpy as np

    name = np.dtype(dtype).name
    return Signature(tuple("int64" if i.kind == "index" else name for i in spec.inputs), name)


def module_source(spec: Spec, signature: Signature | str = "float32", gradients: tuple | None = None, *,
                  target: Target = CPU) -> str:
    """The whole module: the forward kernel and every gradient step kernel (``forward!``, ``grad<k>_step<n>!``
    where k is the input's position), each with its ``run_...!`` launcher. Gradients that cannot be derived
    are left out."""
    sig = signature_for(spec, signature) if isinstance(signature, str) else signature
    kernels = [lower(spec, sig, name="forward", tile=target.tile)]
    if gradients is None:
        try:
            from tullax.grad import gradients as derive

            gradients = derive(spec)
        except TullaxError:
            gradients = ()
    for position, grad in enumerate(gradients):
        wrt = spec.input_names.index(grad.wrt) if grad.wrt in spec.input_names else position
        for number, step in enumerate(grad.steps):  # names from positions: never user text
            step_sig = signature_for(step, sig.out_dtype)
            kernels.append(lower(step, step_sig, name=f"grad{wrt}_step{number}", tile=target.tile))
    return print_module(kernels)


def kernel_module(spec: Spec, signature: Signature, target: Target = CPU) -> tuple[LoopKernel, str]:
    """The kernel of ``spec`` (named ``kernel``) and the module that holds it with its launcher."""
    kernel = lower(spec, signature, name=KERNEL_NAME, tile=target.tile)
    return kernel, print_module([kernel])


def generate_source(spec: Spec, signature: Signature, target: Target = CPU) -> str:
    return kernel_module(spec, signature, target)[1]


# =============================================================================================
# Host-side arguments
# =============================================================================================
def launch_arguments(kernel: LoopKernel, spec: Spec, out: Any, inputs: Sequence[Any]) -> tuple[list[Any], Any]:
    """The launcher's arguments after ``backend``, in the kernel's parameter order: arrays (``out`` first) as
    C-contiguous NumPy arrays, scalars as Python numbers of the kind juliacall turns into the type the kernel
    declares (float -> Float64, int -> Int64, bool -> Bool), sizes as ints evaluated from the shapes.

    Returns (arguments, the contiguous copy of ``out`` to copy back after the call, or None when ``out`` itself is
    passed). Only a non-contiguous, unaligned or read-only array is copied."""
    import numpy as np

    names = spec.input_names
    shapes = {name: np.shape(value) for name, value in zip(names, inputs)}
    shapes[spec.out] = out.shape
    target = out
    if not (out.flags.c_contiguous and out.flags.aligned and out.flags.writeable):
        target = np.ascontiguousarray(out).copy()
    args: list[Any] = [target]
    for array in kernel.arrays[1:]:
        value = inputs[names.index(array.source)]
        if not (isinstance(value, np.ndarray) and value.flags.c_contiguous and value.flags.aligned):
            value = np.ascontiguousarray(value)
        args.append(value)
    for scalar in kernel.scalars:
        args.append(_python_number(inputs[names.index(scalar.source)], scalar.dtype))
    args += [int(size.size.eval(shapes)) for size in kernel.sizes]
    return args, (None if target is out else target)


def _python_number(value: Any, dtype: str) -> Any:
    kind = arrival_dtype(dtype)
    if kind == "bool":
        return bool(value)
    return float(value) if kind == "float64" else int(value)


def workload_call(kernel: LoopKernel, spec: Spec, signature: Signature, modname: str) -> dict | None:
    """A precompile workload entry for ``TullaxBridge.write_precompile_package``: the launcher called once with
    arrays of tiny valid shapes (filled with ones by the bridge) and the matching scalars and sizes; None when no
    small shapes fit the spec (the kernel then compiles at first use)."""
    from tullax.spec.examples import shapes_for

    try:
        shapes = dict(shapes_for(spec))
    except (ShapeError, TullaxError):
        return None
    out_shape = tuple(int(s.eval(shapes)) for s in spec.out_shape)
    shapes[spec.out] = out_shape
    dtype_of = dict(zip(spec.input_names, signature.in_dtypes))
    args: list[dict[str, Any]] = []
    for array in kernel.arrays:
        shape = out_shape if array.role != "in" else shapes[array.source]
        args.append({"type": julia_type(array.dtype if array.role != "in" else dtype_of[array.source]),
                     "dims": list(reversed(shape))})
    for scalar in kernel.scalars:
        kind = arrival_dtype(scalar.dtype)
        args.append({"type": julia_type(kind), "value": True if kind == "bool" else 1})
    args += [{"type": "Int64", "value": int(size.size.eval(shapes))} for size in kernel.sizes]
    return {"kernel": f"{modname}.{launcher_name(kernel)}", "launcher": True, "ndrange": [], "args": args}


# =============================================================================================
# Availability
# =============================================================================================
def cpu_availability() -> tuple[bool, str]:
    import importlib.util

    if importlib.util.find_spec("juliacall") is None:
        return False, "juliacall is not installed: pip install juliacall (then a Julia >= 1.10 is needed)"
    return julia_detect.availability()


def cuda_availability() -> tuple[bool, str]:
    ok, why = cpu_availability()
    if not ok:
        return ok, why
    if not _nvidia_device():
        return False, "no NVIDIA GPU found (no /dev/nvidiactl and no nvidia-smi): use backend='julia' on the CPU"
    if not _cuda_jl_installed():
        return False, ("CUDA.jl is not installed in juliapkg's environment: run `tullax julia install-cuda` "
                       "(a large download), then start a new process")
    return True, why


def _nvidia_device() -> bool:
    import shutil

    return os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi") is not None


def _cuda_jl_installed() -> bool:
    """CUDA listed in the Project.toml of the juliapkg environment juliacall will use (read, never resolved)."""
    import tomllib

    project = julia_detect.juliapkg_project_dirs(os.environ)[0] / "Project.toml"
    try:
        deps = tomllib.loads(project.read_text()).get("deps", {})
    except (OSError, ValueError):
        return False
    return "CUDA" in deps


# =============================================================================================
# The Julia thread and runtime
# =============================================================================================
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

    def start(self, availability: Callable[[], tuple[bool, str]] = cpu_availability) -> None:
        with self._lock:
            if self._failed is not None:
                raise BackendUnavailableError(self._failed)
            if self.started:
                return
            ok, why = availability()
            if not ok:
                raise BackendUnavailableError(why)
            warn_if_numba_loaded()
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

    def start_cuda(self) -> None:
        """``using CUDA`` (loads TullaxBridge's CUDA extension); BackendUnavailableError if it is not functional."""
        self.start(cuda_availability)
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

    def write_package(self, directory: str, sources: list[str], workloads: list[dict]) -> tuple[str, float]:
        """Write and precompile the kernel package; (its path, seconds precompiling took)."""

        def write() -> tuple[str, float]:
            path = str(self._bridge.write_precompile_package(directory, PACKAGE_NAME, sources, workloads))
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


def warn_if_numba_loaded() -> None:
    if "numba" in sys.modules and os.environ.get(ALLOW_BOTH_ENV) != "1":
        warnings.warn(
            "starting Julia in a process that has already imported numba: both load their own LLVM, and the two "
            "have crashed together in one process (numba issue 7857). Prefer one backend per process (run "
            f"comparisons in separate processes); set {ALLOW_BOTH_ENV}=1 to silence this warning.",
            RuntimeWarning, stacklevel=4)


_RUNTIME = JuliaRuntime()


def runtime() -> JuliaRuntime:
    return _RUNTIME


# =============================================================================================
# Host kernels, the cache and the precompiled package
# =============================================================================================
_build_lock = threading.RLock()
_BUILT: dict[tuple[str, Spec, Signature], "HostKernel"] = {}


def module_key(spec: Spec, signature: Signature, target: Target) -> str:
    from tullax.runtime.cache import cache_key

    return cache_key(spec=format_spec(spec), ranges=[(n, str(r.lo), str(r.hi)) for n, r in spec.ranges],
                     inputs=[(i.name, i.kind, i.rank) for i in spec.inputs], in_dtypes=list(signature.in_dtypes),
                     out_dtype=signature.out_dtype, backend=target.name, options=target.options)


def package_key() -> str:
    """The cache entry holding the precompiled kernel package (one per cache directory and tullax version)."""
    from tullax.runtime.cache import cache_key

    return cache_key(kind="julia-precompiled-package", backend=NAME, printer=PRINTER_VERSION)


class HostKernel:
    """``kernel(out, *inputs)``: computes sizes from the shapes and calls the launcher in Julia on the NumPy
    arrays without copies (only a non-contiguous or unaligned array is copied)."""

    def __init__(self, kernel: LoopKernel, spec: Spec, modname: str, key: str, target: Target, timings: dict):
        self.kernel, self.spec, self.modname, self.key, self.target = kernel, spec, modname, key, target
        self.launcher = launcher_name(kernel)
        self._timings = timings  # codegen_ms, load_ms, precompiled
        self._ran = False

    def __call__(self, out, *inputs) -> None:
        args, copy_back = launch_arguments(self.kernel, self.spec, out, inputs)
        start = time.perf_counter()
        runtime().launch(self.modname, self.launcher, args, self.target.device)
        if not self._ran:
            self._ran = True
            self._record((time.perf_counter() - start) * 1e3)
        if copy_back is not None:
            out[...] = copy_back

    def _record(self, first_run_ms: float) -> None:
        from tullax.runtime.cache import get_cache

        t = self._timings
        ttfk = t["codegen_ms"] + t["load_ms"] + first_run_ms
        which = "ttfk_warm_ms" if t["precompiled"] else "ttfk_cold_ms"
        try:
            get_cache().record(self.key, spec=self.kernel.spec_text, backend=self.target.name, kind="module",
                               dtypes=[a.dtype for a in self.kernel.arrays], parse_codegen_ms=t["codegen_ms"],
                               compile_ms=t["load_ms"], first_run_ms=first_run_ms, **{which: ttfk})
        except OSError:  # a read-only cache already warned; timings are a nicety
            pass


def build(spec: Spec, signature: Signature, target: Target = CPU) -> HostKernel:
    """The host kernel of ``spec`` for ``signature``: from this process's table, else the module from the
    precompiled package or the cache (written when missing), loaded into Julia."""
    from tullax.runtime.cache import get_cache

    with _build_lock:
        found = _BUILT.get((target.name, spec, signature))
        if found is not None:
            return found
        start = time.perf_counter()
        kernel, source = kernel_module(spec, signature, target)
        modname = name_of_module(source)
        codegen_ms = (time.perf_counter() - start) * 1e3
        key = module_key(spec, signature, target)
        cache = get_cache()
        with cache.lock(key):
            if cache.read_text(key, SOURCE_FILE) == source:
                cache.hit(key)
            else:
                cache.write_text(key, SOURCE_FILE, source)
                workload = workload_call(kernel, spec, signature, modname) if target.device == "cpu" else None
                cache.write_text(key, WORKLOAD_FILE, json.dumps(workload))
            pkgdir = _package_with(modname) if target.device == "cpu" else None
            if pkgdir is not None:
                load_ms = runtime().load_from_package(modname, pkgdir)
            else:
                load_ms = runtime().load_source(modname, source)
        host = HostKernel(kernel, spec, modname, key, target,
                          {"codegen_ms": codegen_ms, "load_ms": load_ms, "precompiled": pkgdir is not None})
        _BUILT[(target.name, spec, signature)] = host
        return host


def _package_with(modname: str) -> str | None:
    """The precompiled package directory when it holds ``modname``, else None."""
    from tullax.runtime.cache import get_cache

    cache = get_cache()
    key = package_key()
    listed = cache.read_text(key, PACKAGE_MODULES_FILE)
    if listed is None or modname not in json.loads(listed):
        return None
    path = cache.entry_dir(key) / PACKAGE_NAME
    return str(path) if (path / "Project.toml").is_file() else None


def cached_modules() -> list[tuple[str, str, dict | None]]:
    """(module name, source, workload) of every CPU Julia module in the compile cache."""
    from tullax.runtime.cache import get_cache

    cache = get_cache()
    found: dict[str, tuple[str, str, dict | None]] = {}
    for entry in cache.entries():
        if entry.get("backend") != NAME or entry.get("kind") != "module":
            continue
        source = cache.read_text(entry["key"], SOURCE_FILE)
        if source is None:
            continue
        workload_text = cache.read_text(entry["key"], WORKLOAD_FILE)
        workload = json.loads(workload_text) if workload_text else None
        name = name_of_module(source)
        found.setdefault(name, (name, source, workload))
    return sorted(found.values())


def warm_package() -> dict[str, Any]:
    """Write every cached CPU module into the precompiled package and precompile it (``tullax cache warm
    --backend julia`` calls this after warming the specs). Returns {"path", "modules", "precompile_ms"}."""
    from tullax.runtime.cache import get_cache

    modules = cached_modules()
    runtime().start(cpu_availability)
    cache = get_cache()
    key = package_key()
    with cache.lock(key):
        directory = cache.entry_dir(key)
        sources = [source for _, source, _ in modules]
        workloads = [workload for _, _, workload in modules if workload is not None]
        path, seconds = runtime().write_package(str(directory), sources, workloads)
        names = [name for name, _, _ in modules]
        cache.write_text(key, PACKAGE_MODULES_FILE, json.dumps(names))
        cache.record(key, spec=f"precompiled Julia package ({len(names)} kernel modules)", backend=NAME,
                     kind="package", compile_ms=seconds * 1e3)
    return {"path": path, "modules": names, "precompile_ms": seconds * 1e3}


# =============================================================================================
# The backend objects
# =============================================================================================
class JuliaBackend:
    """KernelAbstractions on ``CPU()`` (Julia threads)."""

    name = NAME
    target = CPU

    def availability(self) -> tuple[bool, str]:
        return cpu_availability()

    def _start(self) -> None:
        runtime().start(cpu_availability)

    def build(self, spec: Spec, signature: Signature) -> HostKernel:
        self._start()
        return build(spec, signature, self.target)

    def generate_source(self, spec: Spec, signature: Signature) -> str:
        return generate_source(spec, signature, self.target)

    def module_source(self, spec: Spec, dtype: Signature | str = "float32", gradients: tuple | None = None) -> str:
        return module_source(spec, dtype, gradients, target=self.target)

    def warm_package(self) -> dict[str, Any]:
        """See ``warm_package``: precompile every cached CPU kernel into Julia's package images."""
        return warm_package()


class JuliaCudaBackend(JuliaBackend):
    """KernelAbstractions on ``CUDABackend()`` (CUDA.jl)."""

    name = CUDA_NAME
    target = CUDA

    def availability(self) -> tuple[bool, str]:
        return cuda_availability()

    def _start(self) -> None:
        runtime().start_cuda()

    def warm_package(self) -> dict[str, Any]:
        raise TullaxError("precompiled kernel packages hold CPU kernels; CUDA kernels compile once per process "
                          "(use `tullax cache warm --backend julia`)")


__all__ = ["JuliaBackend", "JuliaCudaBackend", "module_source", "generate_source", "launch_arguments",
           "workload_call", "warm_package", "runtime", "JuliaThread", "Target", "CPU", "CUDA"]
