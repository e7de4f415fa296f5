"""The Julia backends: KernelAbstractions kernels printed from the loop IR, run through juliacall.

* ``julia`` runs on KernelAbstractions' ``CPU()`` (Julia's threads), ``julia-cuda`` on ``CUDABackend()``. Both
  print the kernels of ``tullax.lower`` with ``julia_printer``; the CPU flavour lowers with ``tile=True`` (strip-
  mined, contiguous inner loops), the CUDA one keeps one output element per work-item.
* Availability never imports juliacall (``import juliacall`` without a Julia downloads one): ``julia_detect``
  looks for a Julia; ``julia-cuda`` also needs an NVIDIA device and CUDA.jl in juliapkg's environment
  (``tullax julia install-cuda``). Without them ``build`` raises BackendUnavailableError saying how to get them.
* Starting Julia and calling it: ``tullax.backends.julia.runtime`` (one dedicated thread, the environment juliacall
  starts with, exit). Numba and Julia each load an LLVM and have crashed together in one process (numba issue
  7857): starting Julia when numba is already imported warns (``host.warn_if_other_llvm_loaded``).
* Zero copy: the host kernel passes the NumPy arrays (views of XLA's buffers under jit) to
  ``TullaxBridge.run_launcher_cpu!``, which wraps each as ``unsafe_wrap(Array, pointer, reverse(size))`` (the
  printed kernels index reversed) and calls the printed launcher ``run_kernel!`` (ndrange, synchronize). Python
  keeps the arrays alive for the call. uint64 index arrays go over as their int64 view (``index_view``).
* ``julia-cuda`` inside jax on an NVIDIA GPU takes the device path (``tullax.calls.device``): the callback gets
  XLA's device buffers and stream, and ``TullaxBridge.run_launcher_cuda_device!`` wraps each buffer as a
  ``CuArray`` (``unsafe_wrap``, no copy), orders CUDA.jl's stream after XLA's and XLA's after it with two events,
  and returns without waiting (``JuliaDeviceKernel``). Called on NumPy arrays, it copies them to the device and
  the output back (``run_launcher_cuda!``).
* Caching: the build sequence is ``tullax.backends.host``'s; the module text is ``kernels.jl`` in its cache entry,
  plus ``workload.json``: tiny arguments for precompiling it. ``JuliaBackend.warm_package()`` (``tullax cache
  warm --backend julia``) writes every cached CPU module into one precompiled package
  (``TullaxBridge.write_precompile_package``, a PrecompileTools workload per kernel, handed over as tuples:
  ``bridge_workload``) and precompiles it; a later process loads those kernels from Julia's package image instead
  of compiling them (``ttfk_warm_ms`` in the cache index, ``ttfk_cold_ms`` otherwise).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from tullax.backends import host
from tullax.backends.base import Capabilities, Shapes, Signature, device_pointer
from tullax.backends.julia import detect as julia_detect
from tullax.errors import ShapeError, TullaxError
from tullax.runtime.cache import CompileCache, cache_key, get_cache
from tullax.spec.ir import Spec

if TYPE_CHECKING:  # the loop IR only where a kernel is lowered: a warm process running XLA never imports it
    from tullax.compiler.loops import LoopKernel
    from tullax.printers.julia import Flavour

NAME = "julia"
CUDA_NAME = "julia-cuda"
PRINTER_VERSION = 2  # part of every cache key: bump when the printed code changes meaning
SOURCE_FILE = "kernels.jl"
WORKLOAD_FILE = "workload.json"
PACKAGE_NAME = "TullaxPrecompiledKernels"
PACKAGE_MODULES_FILE = "modules.json"
KERNEL_NAME = "kernel"


@dataclass(frozen=True)
class Target:
    """One Julia backend: its registry name, the lowering's ``tile`` option, the bridge device, what the printer
    prints for its KernelAbstractions backend."""

    name: str
    tile: bool
    device: str  # "cpu" | "cuda"

    @property
    def options(self) -> dict[str, Any]:
        return {"printer": PRINTER_VERSION, "tile": self.tile, "device": self.device}

    @property
    def flavour(self) -> Flavour:
        """What the printer prints for the device's KernelAbstractions backend."""
        return _printer().GPU_FLAVOUR if self.device == "cuda" else _printer().CPU_FLAVOUR


def _printer() -> Any:
    """The Julia printer, imported where a kernel is printed or its arguments laid out: resolving the backend
    (``auto`` asks Julia first) imports neither it nor the loop IR under it."""
    from tullax.printers import julia as printer

    return printer


def runtime() -> Any:
    """The process's Julia (``tullax.backends.julia.runtime.runtime``), imported where Julia is started or called."""
    from tullax.backends.julia.runtime import runtime as julia

    return julia()


CPU = Target(NAME, tile=True, device="cpu")
CUDA = Target(CUDA_NAME, tile=False, device="cuda")


# =============================================================================================
# Source
# =============================================================================================
def module_source(spec: Spec, dtype: str = "float32", *, target: Target = CPU) -> str:
    """The whole module: the forward kernel and every gradient step kernel (``forward!``, ``grad<k>_step<n>!``
    where k is the input's position), each with its ``run_...!`` launcher; data and scalars in ``dtype``, index
    arrays int64. Gradients that cannot be derived are left out."""
    from tullax.compiler.lower import lower  # lowering only: resolving the backend imports no compiler

    return host.module_source(spec, Signature.for_dtype(spec, dtype), partial(lower, tile=target.tile),
                              partial(_printer().print_module, flavour=target.flavour))


def kernel_module(spec: Spec, signature: Signature, target: Target = CPU) -> tuple[LoopKernel, str]:
    """The kernel of ``spec`` (named ``kernel``) and the module that holds it with its launcher."""
    from tullax.compiler.lower import lower

    kernel = lower(spec, signature, name=KERNEL_NAME, tile=target.tile)
    return kernel, _printer().print_module([kernel], flavour=target.flavour)


# =============================================================================================
# Host-side arguments
# =============================================================================================
def launch_arguments(kernel: LoopKernel, spec: Spec, out: Any, inputs: Sequence[Any]) -> tuple[list[Any], Any]:
    """The launcher's arguments after ``backend``, in the kernel's parameter order, for a call of ``kernel``
    (``host.marshal``): arrays (``out`` first) as C-contiguous NumPy arrays, scalars as Python numbers of the
    kind juliacall turns into the type the kernel declares (float -> Float64, int -> Int64, bool -> Bool), sizes
    as ints evaluated from the shapes; uint64 index arrays as their int64 view (``index_view``). Returns
    (arguments, the contiguous copy of ``out`` to copy back after the call, or None when ``out`` itself is
    passed)."""
    return _marshal(_argument_plan(kernel, spec), _index_arguments(kernel, spec), out, inputs,
                    host.call_shapes(spec, out, inputs))


def _argument_plan(kernel: LoopKernel, spec: Spec) -> host.ArgumentPlan:
    return host.ArgumentPlan.of(kernel, spec, scalar=_python_number, rank0_as_vector=False)


def _index_arguments(kernel: LoopKernel, spec: Spec) -> frozenset[int]:
    """Where the index arrays (inputs of kind "index") are among the launcher's arguments after ``backend``."""
    kinds = {i.name: i.kind for i in spec.inputs}
    return frozenset(k for k, a in enumerate(kernel.arrays) if a.role == "in" and kinds[a.source] == "index")


def _julia_arrays(kernel: LoopKernel, spec: Spec, shapes: Mapping[str, tuple[int, ...]]) -> list[tuple[str, tuple]]:
    """Each array parameter of ``kernel`` as Julia receives it: (element type, dims: the NumPy shape reversed),
    a uint64 index array as its Int64 view (``index_view``). ``shapes`` holds the inputs and ``spec.out``."""
    index_arguments = _index_arguments(kernel, spec)
    found = []
    for position, array in enumerate(kernel.arrays):
        shape = shapes[spec.out] if array.role != "in" else shapes[array.source]
        dtype = _INDEX_VIEWS.get(array.dtype, array.dtype) if position in index_arguments else array.dtype
        found.append((_printer().julia_type(dtype), tuple(reversed(tuple(shape)))))
    return found


# Index dtypes that reach Julia as a view of another dtype (see index_view).
_INDEX_VIEWS = {"uint64": "int64"}


def index_view(array: np.ndarray) -> np.ndarray:
    """An index array as Julia receives it: uint64 values as their int64 view (no copy). The printed kernels
    convert an index value with ``Int64(...)``, which throws InexactError for a UInt64 of 2^63 or more, where the
    other backends see an out-of-range index; viewed as Int64 that value is negative, so out of range, and the
    kernel's range guard skips it."""
    view = _INDEX_VIEWS.get(array.dtype.name)
    return array if view is None else array.view(view)


def _marshal(plan: host.ArgumentPlan, index_arguments: frozenset[int], out: Any, inputs: Sequence[Any],
             shapes: Shapes) -> tuple[list[Any], Any]:
    args, copy_back = host.marshal(plan, out, inputs, shapes)
    return [index_view(a) if k in index_arguments else a for k, a in enumerate(args)], copy_back


def _python_number(value: Any, dtype: str) -> Any:
    kind = _printer().arrival_dtype(dtype)
    if kind == "bool":
        return bool(value)
    if kind == "complex128":  # juliacall: a Python complex arrives as ComplexF64
        return complex(value)
    return float(value) if kind == "float64" else int(value)


def workload_call(kernel: LoopKernel, spec: Spec, modname: str) -> dict | None:
    """A precompile workload entry (what the cache stores as JSON; ``bridge_workload`` is what the bridge takes):
    the launcher called once with arrays of tiny valid shapes (filled by the bridge: index arrays with zeros,
    data with ones) and the matching scalars and sizes; None when no small shapes fit the spec (the kernel then
    compiles at first use)."""
    from tullax.spec.examples import shapes_for

    try:
        shapes = dict(shapes_for(spec))
    except (ShapeError, TullaxError):
        return None
    shapes[spec.out] = tuple(int(s.eval(shapes)) for s in spec.out_shape)
    args: list[dict[str, Any]] = [{"type": eltype, "dims": list(dims)}
                                  for eltype, dims in _julia_arrays(kernel, spec, shapes)]
    for scalar in kernel.scalars:
        kind = _printer().arrival_dtype(scalar.dtype)
        args.append({"type": _printer().julia_type(kind), "value": True if kind == "bool" else 1})
    args += [{"type": "Int64", "value": int(size.size.eval(shapes))} for size in kernel.sizes]
    return {"kernel": f"{modname}.{_printer().launcher_name(kernel)}", "launcher": True, "ndrange": [], "args": args}


BridgeWorkload = tuple[str, bool, tuple[int, ...], tuple[tuple[str, Any], ...]]


def bridge_workload(call: dict) -> BridgeWorkload:
    """A stored workload (``workload_call``'s dict) as ``TullaxBridge.write_precompile_package`` takes it: nested
    tuples of str, int, float and bool, ``(kernel, launcher, ndrange, ((type, dims or value), ...))``. juliacall
    hands a tuple to Julia as a ``Tuple`` of converted items, but a list or a dict as a ``PyList{Py}`` /
    ``PyDict`` of ``Py`` objects, which the bridge cannot read."""
    args = tuple((a["type"], tuple(int(d) for d in a["dims"])) if "dims" in a else (a["type"], a["value"])
                 for a in call["args"])
    return (call["kernel"], bool(call.get("launcher", False)), tuple(int(n) for n in call["ndrange"]), args)


# =============================================================================================
# Availability
# =============================================================================================
def cpu_availability() -> tuple[bool, str]:
    """Whether juliacall and a Julia it accepts are here. Looked up once per process for each setting of what
    it reads (the environment variables, ``sys.path`` and ``sys.prefix``), as the C compiler's identity is:
    ``auto`` asks at every plan, and the search stats a dozen paths. A Julia installed while a process runs is
    seen by the next process."""
    return _cpu_availability(tuple(sys.path), sys.prefix, tuple(sorted(os.environ.items())))


@functools.lru_cache(maxsize=16)
def _cpu_availability(search_path: tuple[str, ...], prefix: str, environ: tuple) -> tuple[bool, str]:
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
# Host kernels, the cache and the precompiled package
# =============================================================================================
def package_key() -> str:
    """The cache entry holding the precompiled kernel package (one per cache directory and tullax version)."""
    return cache_key(kind="julia-precompiled-package", backend=NAME, printer=PRINTER_VERSION)


class JuliaHostKernel:
    """``kernel(out, *inputs)``: computes sizes from the shapes and calls the launcher in Julia on the NumPy
    arrays without copies (``host.marshal``)."""

    def __init__(self, generated: host.GeneratedModule, modname: str, target: Target, load_ms: float,
                 precompiled: bool):
        self.generated, self.modname, self.target = generated, modname, target
        self.launcher = _printer().launcher_name(generated.kernel)
        self._plan = _argument_plan(generated.kernel, generated.spec)
        self._index_arguments = _index_arguments(generated.kernel, generated.spec)
        self._load_ms = load_ms
        self._precompiled = precompiled  # loaded from the precompiled package's image, not compiled here
        self._ran = False

    def __call__(self, out, *inputs) -> None:
        self.run(out, inputs, host.call_shapes(self.generated.spec, out, inputs))

    def run(self, out, inputs: Sequence[Any], shapes: Shapes) -> None:
        """The call, for a caller that knows the input and output ``shapes`` already."""
        args, copy_back = _marshal(self._plan, self._index_arguments, out, inputs, shapes)
        start = time.perf_counter()
        runtime().launch(self.modname, self.launcher, args, self.target.device)
        if not self._ran:
            self._ran = True
            host.record_first_run(self.generated, "module", ready_ms=self._load_ms,
                                  run_ms=(time.perf_counter() - start) * 1e3, warm=self._precompiled,
                                  ready_field="compile_ms")
        if copy_back is not None:
            out[...] = copy_back


def _store_workload(target: Target, cache: CompileCache, generated: host.GeneratedModule) -> None:
    """Next to a newly written CPU module: the arguments that precompile it (``workload_call``)."""
    workload = None
    if target.device == "cpu":
        workload = workload_call(generated.kernel, generated.spec,
                                 _printer().name_of_module(generated.source))
    cache.write_text(generated.key, WORKLOAD_FILE, json.dumps(workload))


def _load(target: Target, generated: host.GeneratedModule) -> JuliaHostKernel:
    """Load the module into Julia: from the precompiled package when it holds it, else from its source."""
    modname = _printer().name_of_module(generated.source)
    pkgdir = _package_with(modname) if target.device == "cpu" else None
    if pkgdir is not None:
        load_ms = runtime().load_from_package(modname, pkgdir)
    else:
        load_ms = runtime().load_source(modname, generated.source)
    return JuliaHostKernel(generated, modname, target, load_ms, precompiled=pkgdir is not None)


def _recipe(target: Target) -> host.ModuleRecipe:
    return host.ModuleRecipe(target.name, SOURCE_FILE, target.options, partial(kernel_module, target=target),
                             partial(_store_workload, target), partial(_load, target))


def device_schedule(spec: Spec, signature: Signature, shapes: Mapping[str, tuple[int, ...]]) -> LoopKernel | None:
    """The kernel the cuda backend launches for one call's shapes (``tullax.backends.cuda.launch``) where it is a
    schedule whose threads cooperate (block or window tiles, block or warp reductions), for ``julia-cuda``; None
    where it is the default lowering. Never a split sum (its launcher would have to start the output at zero):
    the tiles' split-K and the split sums are off here."""
    from tullax.backends.cuda.launch import device_lowering
    from tullax.compiler.split import SplitPolicy
    from tullax.compiler.tiles import TilePolicy

    kernel, _ = device_lowering(spec, signature, shapes, KERNEL_NAME, policy=SplitPolicy(below=0),
                                tiles=TilePolicy(min_blocks=0))
    if kernel.split or (kernel.tile is None and not kernel.cooperative):
        return None
    return kernel


def _scheduled_recipe(target: Target, kernel: LoopKernel) -> host.ModuleRecipe:
    """The recipe of a module holding ``kernel`` (``device_schedule``'s): its printed text is part of the key."""
    source = _printer().print_module([kernel], flavour=target.flavour)
    options = {**target.options, "schedule": hashlib.sha256(source.encode()).hexdigest()[:20]}
    return host.ModuleRecipe(target.name, SOURCE_FILE, options, lambda spec, signature: (kernel, source),
                             partial(_store_workload, target), partial(_load, target))


_BUILDER = host.HostBuilder()


def _package_with(modname: str) -> str | None:
    """The precompiled package directory when it holds ``modname``, else None."""
    cache = get_cache()
    key = package_key()
    listed = cache.read_text(key, PACKAGE_MODULES_FILE)
    if listed is None or modname not in json.loads(listed):
        return None
    path = cache.entry_dir(key) / PACKAGE_NAME
    return str(path) if (path / "Project.toml").is_file() else None


def cached_modules() -> list[tuple[str, str, dict | None]]:
    """(module name, source, workload) of every CPU Julia module in the compile cache."""
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
        name = _printer().name_of_module(source)
        found.setdefault(name, (name, source, workload))
    return sorted(found.values())


def warm_package() -> dict[str, Any]:
    """Write every cached CPU module into the precompiled package and precompile it (``tullax cache warm
    --backend julia`` calls this after warming the specs). Returns {"path", "modules", "precompile_ms"}."""
    modules = cached_modules()
    runtime().start(cpu_availability)
    cache = get_cache()
    key = package_key()
    with cache.lock(key):
        directory = cache.entry_dir(key)
        sources = tuple(source for _, source, _ in modules)
        workloads = tuple(bridge_workload(workload) for _, _, workload in modules if workload is not None)
        path, seconds = runtime().write_package(str(directory), PACKAGE_NAME, sources, workloads)
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
    capabilities = Capabilities(host_buffers=True, module_source=True, shaped_run=True, precompiled_package=True)

    def availability(self) -> tuple[bool, str]:
        return cpu_availability()

    def _start(self) -> None:
        runtime().start(cpu_availability)

    def build(self, spec: Spec, signature: Signature) -> JuliaHostKernel:
        """The host kernel of ``spec`` for ``signature``: from this process's table, else the module from the
        precompiled package or the cache (written when missing), loaded into Julia."""
        self._start()
        return _BUILDER.build(_recipe(self.target), spec, signature)

    def generate_source(self, spec: Spec, signature: Signature) -> str:
        return kernel_module(spec, signature.widened(), self.target)[1]

    def module_source(self, spec: Spec, dtype: str = "float32") -> str:
        return module_source(spec, dtype, target=self.target)

    def warm_package(self) -> dict[str, Any]:
        """See ``warm_package``: precompile every cached CPU kernel into Julia's package images."""
        return warm_package()


@dataclass(frozen=True)
class DevicePlan:
    """The launcher's arguments for one call on XLA's device buffers, worked out at trace time: each array as
    (input position, None for the output; Julia element type; Julia dims, the shape reversed), the array the
    output starts from (``+=``, ``=``: input 0) or None, each scalar as (input position, the buffer's element
    type, the type the kernel declares), and the size values."""

    arrays: tuple[tuple[int | None, str, tuple[int, ...]], ...]
    given: tuple[int, str, tuple[int, ...]] | None
    scalars: tuple[tuple[int, str, str], ...]
    sizes: tuple[int, ...]


def device_plan(kernel: LoopKernel, spec: Spec, shapes: Mapping[str, tuple[int, ...]]) -> DevicePlan:
    """The ``DevicePlan`` of ``kernel`` (lowered from ``spec`` for the call's dtypes) for one call's shapes (inputs
    by name plus ``spec.out``)."""
    names = spec.input_names
    julia_arrays = _julia_arrays(kernel, spec, shapes)
    arrays = tuple((None if array.role != "in" else names.index(array.source), eltype, dims)
                   for array, (eltype, dims) in zip(kernel.arrays, julia_arrays))
    given = None if spec.assign == ":=" else (0, *julia_arrays[0])  # the output's type and dims
    printer = _printer()
    scalars = tuple((names.index(s.source), printer.julia_type(s.dtype),
                     printer.julia_type(printer.arrival_dtype(s.dtype))) for s in kernel.scalars)
    sizes = tuple(int(size.size.eval(shapes)) for size in kernel.sizes)
    return DevicePlan(arrays, given, scalars, sizes)


class JuliaDeviceKernel:
    """``kernel(stream, out, buffers)``: the printed GPU launcher on XLA's device buffers, enqueued in order on
    XLA's ``stream`` (``JuliaRuntime.launch_device``); returns without waiting for the GPU."""

    def __init__(self, modname: str, launcher: str, plan: DevicePlan, device: int = 0):
        self.modname, self.launcher, self.plan, self.device = modname, launcher, plan, device

    def arguments(self, stream: int, out: Any, buffers: Sequence[Any]) -> tuple:
        """What ``run_launcher_cuda_device!`` receives after the module and launcher: plain ints, strings and
        tuples of them."""
        plan = self.plan
        arrays = tuple((device_pointer(out if source is None else buffers[source]), eltype, dims)
                       for source, eltype, dims in plan.arrays)
        given = () if plan.given is None else (device_pointer(buffers[plan.given[0]]),) + plan.given[1:]
        scalars = tuple((device_pointer(buffers[source]), eltype, kind) for source, eltype, kind in plan.scalars)
        return int(stream), self.device, given, arrays, scalars, plan.sizes

    def __call__(self, stream: int, out: Any, buffers: Sequence[Any]) -> None:
        runtime().launch_device(self.modname, self.launcher, *self.arguments(stream, out, buffers))


class JuliaCudaBackend(JuliaBackend):
    """KernelAbstractions on ``CUDABackend()`` (CUDA.jl). Inside jax on an NVIDIA GPU its kernels run on XLA's
    own buffers, ordered on XLA's stream (``platform``, ``device_kernel``)."""

    name = CUDA_NAME
    target = CUDA
    platform = "cuda"  # the jax platform whose device buffers its kernels take (tullax.calls.device)
    # CUDA kernels compile once per process: CUDA.jl compiles device code per session, package image or not.
    capabilities = Capabilities(host_buffers=True, module_source=True, shaped_run=True)

    def availability(self) -> tuple[bool, str]:
        return cuda_availability()

    def _start(self) -> None:
        runtime().start_cuda(cuda_availability)

    def device_kernel(self, spec: Spec, signature: Signature,
                      shapes: Mapping[str, tuple[int, ...]]) -> JuliaDeviceKernel:
        """At trace time: the module of ``spec`` built and loaded into Julia (a compile error is a TullaxError
        here, never in the callback) and the call's arguments planned. The kernel is the one the cuda backend
        picks for these shapes where its threads cooperate (``device_schedule``), else the default lowering.
        Device 0: jax's buffer_callback does not say which device a buffer is on, and one GPU per process is
        what tullax supports here."""
        scheduled = device_schedule(spec, signature, shapes)
        if scheduled is None:
            built = self.build(spec, signature)
        else:  # the tiles or cooperative reductions the cuda backend picks for these shapes
            self._start()
            built = _BUILDER.build(_scheduled_recipe(self.target, scheduled), spec, signature)
        plan = device_plan(built.generated.kernel, spec, shapes)
        return JuliaDeviceKernel(built.modname, built.launcher, plan)

    def warm_package(self) -> dict[str, Any]:
        raise TullaxError("precompiled kernel packages hold CPU kernels; CUDA kernels compile once per process "
                          "(use `tullax cache warm --backend julia`)")


__all__ = ["JuliaBackend", "JuliaCudaBackend", "JuliaDeviceKernel", "DevicePlan", "device_plan", "module_source",
           "kernel_module", "device_schedule", "launch_arguments", "index_view", "workload_call", "bridge_workload",
           "warm_package", "Target", "CPU", "CUDA"]
