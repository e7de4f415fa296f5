"""The ``c`` backend: loop kernels printed as C with OpenMP (``tullax.printers.c``), compiled by the host C
compiler (``tullax.backends.c.compile``) into shared libraries, loaded with ctypes. Its point is the time to
first kernel: two compiles at once build the forward kernel and every gradient step of a spec, and a later
process only dlopens the libraries from the compile cache (milliseconds), where Numba's parallel pipeline takes
0.5-2.4 s per kernel.

* Two modules per (spec, signature), each ONE library: ``FORWARD``, the forward kernel, and ``STEPS``, every
  gradient step (``host.kernel_steps``). The first build of a forward kernel starts its steps module in a thread
  (``_start_steps``), then builds the forward module: the two compilers run at once, and the forward kernel is
  ready (a forward-only call, or the planner's race of the forward) as soon as its own library is, without
  waiting for the gradients' (conv2d's three kernels: one compiler run each of 0.4-0.5 s). Each gradient step's
  host kernel is registered when the steps module loads, under the (step spec, signature) the JAX op builds it
  with (``_step_signature``); a step asked for while its module builds waits for it, so the backward pass
  compiles nothing more. A step built with another signature gets a module of its own.
* Caching: ``tullax.backends.host``'s build sequence, one entry per module; the source is ``kernels.c`` in it, the
  library ``kernels-<hash>.so`` next to it and each kernel's interface (``tullax.compiler.interface``: its name
  and parameters, what a call needs to marshal its arguments) pickled in ``kernels.pickle`` (each with its
  checksum in the entry's manifest); the key holds the compiler's identity and flags and the CPU
  (``c_compile.identity``) and a fingerprint of the code that generates the C (``generator_fingerprint``), so
  it determines the source: a hit dlopens the library without lowering or printing anything, and without
  importing the compiler, the loop IR or the printer (a warm first call).
* Calls: arrays go over as pointers to NumPy's buffers (``host.marshal``: no copies), then the sizes, the
  extents of every array's axes 1.. and the team size. ctypes releases the GIL for the call.
* Threads: ``TULLAX_C_THREADS``, else ``OMP_NUM_THREADS``, else ``NUMBA_NUM_THREADS`` (so a benchmark that
  pins Numba pins this backend the same way), else the CPUs this process may run on. A call below the serial
  work threshold (``tullax.backends.workload``) runs with a team of 1: OpenMP's ``if`` clause skips the team.
  Idle team threads spin for a bounded time only (``c_load.bound_openmp_spin``), so the XLA ops after a kernel get
  every core.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import pickle
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from tullax.backends import host, workload
from tullax.backends.base import Capabilities, Shapes, Signature
from tullax.backends.c import compile as c_compile
from tullax.backends.c.load import load_library, threads
from tullax.compiler.interface import KernelInterface
from tullax.errors import BackendUnavailableError, TullaxError
from tullax.printers.c_clear import CLEAR_BLOCK, CLEAR_FUNCTION
from tullax.printers.c_packed import PACKED_SUFFIX
from tullax.runtime.cache import CompileCache, get_cache
from tullax.spec.ir import Spec

if TYPE_CHECKING:  # the loop IR only where a kernel is lowered: a warm process running XLA never imports it
    from tullax.compiler.loops import LoopKernel

NAME = "c"
SOURCE_FILE = "kernels.c"
KERNELS_FILE = "kernels.pickle"  # {"library": its file name, "kernels": ((interface, spec, signature), ...),
#                                  "of": (spec, signature)}: each kernel of part_kernels(...) as its interface
LIBRARY_PREFIX = "kernels-"  # + the first 16 hex digits of the source's sha256 + ".so"


def library_file(source: str) -> str:
    """The library's file name in the entry: named by the source it was compiled from, so a source rewritten in
    the same entry (another tullax version printed it) never runs a library compiled from the old one."""
    return f"{LIBRARY_PREFIX}{hashlib.sha256(source.encode('utf-8')).hexdigest()[:16]}.so"


# The code whose output is the module's source: the spec front end and gradients, the lowering, the printers,
# and this backend's host side. Its fingerprint is in the cache key, so an edited generator (a development
# checkout, an upgrade that keeps the version number) never loads a library printed by the old one.
_GENERATOR_PACKAGES = ("spec", "grad", "compiler", "printers")
_GENERATOR_MODULES = ("backends/c/backend.py", "backends/host.py", "backends/base.py")


@functools.cache
def generator_fingerprint() -> str:
    """The fingerprint of this installation's generating modules (~2 ms, once per process)."""
    from pathlib import Path

    return fingerprint_of(Path(__file__).resolve().parents[2])


def fingerprint_of(root: Any) -> str:
    """A sha256 of the generating modules' source files (names and contents) in the package tree ``root``."""
    files = [f for package in _GENERATOR_PACKAGES for f in sorted((root / package).rglob("*.py"))]
    digest = hashlib.sha256()
    for path in files + [root / name for name in _GENERATOR_MODULES]:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:24]


_CTYPES = {"float32": ctypes.c_float, "float64": ctypes.c_double, "bool": ctypes.c_bool, "int8": ctypes.c_int8,
           "int16": ctypes.c_int16, "int32": ctypes.c_int32, "int64": ctypes.c_int64, "uint8": ctypes.c_uint8,
           "uint16": ctypes.c_uint16, "uint32": ctypes.c_uint32, "uint64": ctypes.c_uint64}


# =============================================================================================
# The module: forward and every gradient step
# =============================================================================================
def _step_signature(step: Spec, signature: Signature, forward: Spec) -> Signature:
    """The signature a gradient step is called with: each input the forward spec has keeps its dtype there, the
    cotangent (and any intermediate) has the result's dtype, and so has the step's result."""
    dtypes = dict(zip(forward.input_names, signature.in_dtypes))
    return Signature(tuple(dtypes.get(name, signature.out_dtype) for name in step.input_names), signature.out_dtype)


FORWARD, STEPS = "forward", "steps"  # the two modules of a spec: its forward kernel, and its gradient steps


# Row streams (max/min reductions over long rows reading STREAM_ROWS rows at once) only where this is "1". They
# won on a Zen 3 EPYC (a 4096x4096 row max 1.09x) and lost on a Zen 5 one (0.63x on two threads, 0.66-0.91x on
# one, at every row length of 2048 floats or more: several concurrent streams per core read slower there); the
# loser's loss being the larger, one row at a time is the default (benchmarks/row_streams.py measures both).
STREAMS_ENV = "TULLAX_C_STREAMS"


def streams() -> bool:
    """Whether max/min reductions read several long rows at once (``$TULLAX_C_STREAMS`` is "1")."""
    return os.environ.get(STREAMS_ENV, "").strip() == "1"


def lowered(spec: Spec, signature: Signature, name: str, streams: bool = False) -> LoopKernel:
    """``spec`` lowered as the C printer wants it: strip-mined tiles (``tile``), and with ``streams`` max/min
    reductions that read several contiguous rows at once (its lanes take one accumulator per row)."""
    from tullax.compiler.lower import lower

    return lower(spec, signature, name, tile=True, streams=streams)


def part_kernels(spec: Spec, signature: Signature, part: str) -> tuple[tuple[LoopKernel, Spec, Signature], ...]:
    """The kernels of one module of ``spec``, with the spec and signature each serves: ``FORWARD``, the forward
    kernel; ``STEPS``, each gradient step that lowers (none for integer results, which have no gradient); row
    streams as ``streams()`` says now."""
    return _part_kernels(spec, signature, part, streams())


@functools.lru_cache(maxsize=256)  # generating and loading a module both need them: lower once
def _part_kernels(spec: Spec, signature: Signature, part: str,
                  streamed: bool) -> tuple[tuple[LoopKernel, Spec, Signature], ...]:
    if part == FORWARD:  # no gradient derived: the forward module is what a forward-only call waits for
        return ((lowered(spec, signature, host.FORWARD_KERNEL, streamed), spec, signature),)
    if not _has_gradients(signature):
        return ()
    kernels = []
    for step in host.kernel_steps(spec, signature.out_dtype)[1:]:
        step_signature = _step_signature(step.spec, signature, spec)
        try:
            kernels.append((lowered(step.spec, step_signature, step.name, streamed), step.spec, step_signature))
        except TullaxError:  # built on its own if it is ever called (and then it says why it fails)
            continue
    return tuple(kernels)


def module_kernels(spec: Spec, signature: Signature) -> tuple[tuple[LoopKernel, Spec, Signature], ...]:
    """Every kernel of ``spec``: the forward one, then each gradient step that lowers."""
    return part_kernels(spec, signature, FORWARD) + part_kernels(spec, signature, STEPS)


def _has_gradients(signature: Signature) -> bool:
    """Whether a result of this signature has gradient steps: integers have none; complex is refused anyway."""
    return np.dtype(signature.out_dtype).kind not in "iuc"


def _printed(kernels: tuple[tuple[LoopKernel, Spec, Signature], ...]) -> tuple[LoopKernel, str]:
    """The first of ``kernels`` and the translation unit of all of them."""
    from tullax.printers.c import print_module

    return kernels[0][0], print_module([k for k, _, _ in kernels])


def generate_part(spec: Spec, signature: Signature, part: str) -> tuple[LoopKernel, str]:
    """The first kernel of one module of ``spec`` and its translation unit."""
    return _printed(part_kernels(spec, signature, part))


def generate(spec: Spec, signature: Signature) -> tuple[LoopKernel, str]:
    """The forward kernel of ``spec`` and one translation unit of every kernel (what ``module_source`` shows)."""
    return _printed(module_kernels(spec, signature))


def module_source(spec: Spec, dtype: str = "float32") -> str:
    """Every kernel, forward and gradient steps, as one source for display, data and scalars in ``dtype``, index
    arrays int64 (compiled, they are two modules: ``FORWARD`` and ``STEPS``)."""
    return generate(spec, Signature.for_dtype(spec, dtype))[1]


# =============================================================================================
# Compiling and loading
# =============================================================================================
_COUNTS = {"compiled": 0, "loaded": 0}
_COUNTS_LOCK = threading.Lock()


def compile_stats() -> dict[str, int]:
    """How many modules this process compiled and how many it loaded compiled from the cache."""
    with _COUNTS_LOCK:
        return dict(_COUNTS, modules=len(_BUILDER) + len(_STEP_BUILDER))


def _count(what: str) -> None:
    with _COUNTS_LOCK:
        _COUNTS[what] += 1


_JUST_COMPILED: dict[str, tuple[str, float]] = {}  # key -> (library, seconds) compiled by _compile_into_cache


def _units(part: str) -> int:
    """Translation units to compile a module in: the forward kernel is one (a call waits for it alone); the
    steps module one per core but one, which it leaves to this process (its tracing, XLA's compiles and the
    planner's races: on 2 cores a second unit slowed the first forward call as much as it sped up the steps)."""
    return 1 if part == FORWARD else max(1, c_compile.cores() - 1)


def _room(generated: host.GeneratedModule, part: str) -> Callable[[], int] | None:
    """How many of a steps module's units may compile at once: ``_units``, less one while the forward module
    of its spec is still being built beside it (``CBackend.build``; a call waits for that one)."""
    if part != STEPS:
        return None
    with _STEPS_LOCK:
        build = _STEP_BUILDS.get((generated.spec, generated.signature))
    if build is None:
        return None
    return lambda: _units(STEPS) - (not build.forward_built.is_set())


def _compile_into_cache(cache: CompileCache, generated: host.GeneratedModule, part: str = FORWARD) -> None:
    """After the source is written: compile its library into the entry (under the entry's lock); ``_load``
    follows at once and takes the result."""
    library, seconds, _ = _library(generated, cache, part)
    _JUST_COMPILED[generated.key] = (library, seconds)


def _library(generated: host.GeneratedModule, cache: CompileCache, part: str = FORWARD) -> tuple[str, float, bool]:
    """The path of the module's library, compiling it when the entry holds none for this source that checks;
    with the seconds that took and whether it compiled."""
    import tempfile
    from pathlib import Path

    start = time.perf_counter()
    name = library_file(generated.source)
    if generated.path is None:  # the cache stores nothing: a private temporary directory
        directory = Path(tempfile.mkdtemp(prefix="tullax-c-"))
        (directory / SOURCE_FILE).write_text(generated.source)
        c_compile.compile_library(directory / SOURCE_FILE, directory / name, units=_units(part),
                                  room=_room(generated, part))
        _count("compiled")
        return str(directory / name), time.perf_counter() - start, True
    data, problem = cache.read_checked(generated.key, name)
    if data is not None and problem is None:
        return str(generated.path.with_name(name)), time.perf_counter() - start, False
    built = generated.path.with_name(f".{name}.{os.getpid()}.built")
    c_compile.compile_library(generated.path, built, units=_units(part), room=_room(generated, part))
    data = built.read_bytes()
    built.unlink(missing_ok=True)
    stale = [p.name for p in generated.path.parent.glob(f"{LIBRARY_PREFIX}*.so") if p.name != name]
    if stale:  # libraries of an older source of this entry
        cache.discard_files(generated.key, stale)
    stored = cache.write_bytes(generated.key, name, data)
    if stored is None:  # could not store it after all: keep a private copy
        stored = c_compile.private_library(data, "tullax-c-")
    _count("compiled")
    return str(stored), time.perf_counter() - start, True


def _load(generated: host.GeneratedModule, part: str = FORWARD) -> "CHostKernel":
    """dlopen the module's library (compiling it first when the entry has none) and make the host kernels of
    every kernel in it; the gradient steps' go into the step table. Stores the lowered kernels in the entry,
    for ``_load_cached``."""
    just = _JUST_COMPILED.pop(generated.key, None)
    cache = get_cache()
    library, seconds, compiled = (*just, True) if just else _library(generated, cache, part)
    # what a call needs of each kernel: its interface (a later process unpickles these without the loop IR)
    kernels = tuple((kernel.interface, spec, signature)
                    for kernel, spec, signature in part_kernels(generated.spec, generated.signature, part))
    if generated.path is not None:
        try:
            data = pickle.dumps({"library": os.path.basename(library), "kernels": kernels,
                                 "of": (generated.spec, generated.signature)}, protocol=4)
        except (pickle.PicklingError, TypeError, AttributeError):  # then every process generates it (correct)
            data = None
        if data is not None and cache.read_checked(generated.key, KERNELS_FILE).data != data:
            cache.write_bytes(generated.key, KERNELS_FILE, data)
    return _open(generated, library, kernels, seconds, compiled, part)


def _load_cached(cache: CompileCache, key: str, spec: Spec, signature: Signature,
                 part: str = FORWARD) -> "CHostKernel | None":
    """The module of a cache hit, without lowering or printing it: its kernels from ``kernels.pickle``, its
    library named there, both checked against the manifest, and the source in the entry the one the library
    was compiled from (its hash is in the library's name). None, so the module is generated, when anything
    is missing, corrupt or inconsistent."""
    start = time.perf_counter()
    data, problem = cache.read_checked(key, KERNELS_FILE)
    if data is None or problem is not None:
        return None
    try:  # the manifest's checksum vouches for the bytes; the key (version + fingerprint) for the classes
        stored = pickle.loads(data)
        name, kernels, (of_spec, of_signature) = stored["library"], stored["kernels"], stored["of"]
        first = kernels[0][0]
    except Exception:  # noqa: BLE001 - any unpickling failure only means "generate it again"
        return None
    if of_spec != spec or of_signature != signature:
        return None
    source, problem = cache.read_checked(key, SOURCE_FILE)
    if source is None or problem is not None or library_file(source.decode("utf-8")) != name:
        return None
    library, problem = cache.read_checked(key, name)
    if library is None or problem is not None:
        return None
    path = cache.entry_path(key) / SOURCE_FILE
    generated = host.GeneratedModule(NAME, spec, signature, first, source.decode("utf-8"), key, path, 0.0)
    return _open(generated, str(path.with_name(name)), kernels, time.perf_counter() - start, False, part)


def _open(generated: host.GeneratedModule, library: str,
          kernels: tuple[tuple[KernelInterface, Spec, Signature], ...],
          seconds: float, compiled: bool, part: str) -> "CHostKernel":
    start = time.perf_counter()
    try:
        lib = load_library(library)
    except OSError as err:
        raise TullaxError(f"the c backend could not load the library compiled from {generated.path}: {err}") \
            from None
    ready_ms = (seconds + time.perf_counter() - start) * 1e3
    if not compiled:
        _count("loaded")
    clear = getattr(lib, CLEAR_FUNCTION, None)  # (a missing symbol is an AttributeError: the module has none)
    if clear is not None:
        clear.argtypes, clear.restype = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int], None
    first = None
    for kernel, spec, signature in kernels:
        packed = getattr(lib, kernel.name + PACKED_SUFFIX, None)  # (a library of an older printer has none)
        host_kernel = CHostKernel(generated, kernel, spec, getattr(lib, kernel.name), ready_ms, compiled, clear,
                                  packed=packed, library=library)
        first = first or host_kernel
        if part == STEPS:
            with _STEPS_LOCK:
                _STEPS.setdefault((spec, signature), host_kernel)
    assert first is not None
    return first


_BUILDER = host.HostBuilder()  # forward modules
_STEP_BUILDER = host.HostBuilder()  # steps modules: built in a thread of their own, beside the forward's


def _recipe(part: str = FORWARD) -> host.ModuleRecipe:
    """The build steps of one module, with the compiler's identity in the cache key (read now: ``TULLAX_CC`` may
    change)."""
    options = {"compiler": c_compile.identity(), "printer": 1, "generator": generator_fingerprint(), "part": part,
               "streams": streams()}
    return host.ModuleRecipe(NAME, SOURCE_FILE, options, functools.partial(generate_part, part=part),
                             functools.partial(_compile_into_cache, part=part), functools.partial(_load, part=part),
                             functools.partial(_load_cached, part=part))


_STEPS: dict[tuple[Spec, Signature], "CHostKernel"] = {}  # gradient steps of the modules loaded here
_STEPS_LOCK = threading.Lock()


class _StepsBuild:
    """The steps module of one forward (spec, signature), building in a thread: which (step spec, signature) it
    holds once ``known`` is set, and ``done`` once it is loaded (or failed: each step then builds its own)."""

    def __init__(self) -> None:
        self.known = threading.Event()
        self.done = threading.Event()
        self.forward_built = threading.Event()  # the forward module beside it is built (or failed)
        self.keys: frozenset[tuple[Spec, Signature]] = frozenset()


_STEP_BUILDS: dict[tuple[Spec, Signature], _StepsBuild] = {}


def _start_steps(spec: Spec, signature: Signature) -> "_StepsBuild | None":
    """Build (compile, or load from the cache) the steps module of ``spec`` in a thread, once per process, so it
    compiles beside the forward module instead of after it, and the forward kernel is ready as soon as its own
    module is. Returns that build (started now or before), None when the spec has no gradient steps."""
    if not _has_gradients(signature):
        return None
    with _STEPS_LOCK:
        if (spec, signature) in _STEP_BUILDS:
            return _STEP_BUILDS[(spec, signature)]
        build = _STEP_BUILDS[(spec, signature)] = _StepsBuild()
    # not a daemon: a process that ends meanwhile (a forward-only script) waits for the compile, which it stores,
    # instead of leaving every later process to compile it again
    threading.Thread(target=_build_steps, args=(spec, signature, build), name="tullax-c-steps").start()
    return build


def finish_step_builds() -> None:
    """Wait until every steps module building in this process is loaded (or has failed)."""
    with _STEPS_LOCK:
        builds = list(_STEP_BUILDS.values())
    for build in builds:
        build.done.wait()


def _build_steps(spec: Spec, signature: Signature, build: _StepsBuild) -> None:
    try:
        try:
            build.keys = frozenset((step.spec, _step_signature(step.spec, signature, spec))
                                   for step in host.kernel_steps(spec, signature.out_dtype)[1:])
        finally:
            build.known.set()
        if build.keys:
            _STEP_BUILDER.build(_recipe(STEPS), spec, signature)
    except Exception:  # noqa: BLE001 - a step this module does not hold builds its own, and says why it fails
        pass
    finally:
        build.done.set()


def _built_step(spec: Spec, signature: Signature) -> "CHostKernel | None":
    """The host kernel of a gradient step not loaded yet, once the steps module that holds it has built; None
    when no steps module holds it."""
    with _STEPS_LOCK:
        builds = list(_STEP_BUILDS.values())
    for build in builds:
        build.known.wait()
        if (spec, signature) in build.keys:
            build.done.wait()
            with _STEPS_LOCK:
                return _STEPS.get((spec, signature))
    return None


# =============================================================================================
# The host kernel
# =============================================================================================
def _numpy_scalar(value: Any, dtype: str) -> Any:
    return np.dtype(dtype).type(value)


class CHostKernel:
    """``kernel(out, *inputs)``: one C function of a loaded module, called with pointers to the NumPy
    buffers (``host.marshal``), the sizes, the extents and the team size."""

    def __init__(self, generated: host.GeneratedModule, kernel: KernelInterface, spec: Spec, function: Any,
                 ready_ms: float, compiled: bool, clear: Any = None, packed: Any = None, library: str = ""):
        self.generated, self.kernel, self.spec = generated, kernel, spec
        self._clear = clear  # the module's parallel clear (``tullax.printers.c_clear``), if it has one
        # its packed entry (``tullax.printers.c_packed``), which XLA's FFI handler calls (``ffi_call``)
        self._packed, self._library = packed, library
        self._plan = host.ArgumentPlan.of(kernel, spec, scalar=_numpy_scalar, rank0_as_vector=True)
        arrays = len(kernel.arrays)
        self._arrays = arrays
        self._extents = tuple((k, axis) for k, a in enumerate(kernel.arrays) for axis in range(1, a.rank))
        function.argtypes = ([ctypes.c_void_p] * arrays + [_CTYPES[s.dtype] for s in kernel.scalars]
                             + [ctypes.c_int64] * (len(kernel.sizes) + len(self._extents)) + [ctypes.c_int])
        function.restype = None
        self._function = function
        self._threads: dict[tuple[int, ...], int] = {}  # size arguments -> team size
        self._ready_ms, self._compiled = ready_ms, compiled
        self._ran = False
        self._lock = threading.Lock()
        self.teams_run: set[int] = set()  # the team sizes calls have run with (1: the serial variant)

    def __call__(self, out, *inputs) -> None:
        self.run(out, inputs, host.call_shapes(self.spec, out, inputs))

    def run(self, out, inputs: Sequence[Any], shapes: Shapes) -> None:
        args, copy_back = host.marshal(self._plan, out, inputs, shapes)
        arrays = args[:self._arrays]
        sizes = args[self._arrays + len(self.kernel.scalars):]
        team = self._team(sizes, shapes)
        call = ([a.ctypes.data for a in arrays] + args[self._arrays:]
                + [arrays[k].shape[axis] for k, axis in self._extents] + [team])
        if self._ran:
            self._function(*call)
        else:
            start = time.perf_counter()
            self._function(*call)
            self._first_run((time.perf_counter() - start) * 1e3)
        if copy_back is not None:
            out[...] = copy_back

    def ffi_call(self, operands: Sequence[Any], result: Any, shapes: Shapes,
                 aliases: dict[int, int] | None) -> tuple[Any, int] | None:
        """The kernel as a custom call inside XLA's program (``tullax.backends.c.ffi``), on jax values
        ``operands`` (one per spec input, traced) for the ``result`` (a ShapeDtypeStruct) of ``shapes``: its
        value and the handler's slot (which counts its launches). None where it cannot run so (no handler here,
        a library without the packed entry, a full table): the caller takes the buffer callback. Everything the
        call needs is worked out now, at trace time: the sizes and extents are static under jit."""
        from tullax.backends.c import ffi as c_ffi

        plan = self._plan
        pointers = 1 + len(plan.arrays) + len(plan.scalars)
        if self._packed is None or pointers > c_ffi.MAX_POINTERS or not c_ffi.available()[0]:
            return None
        # XLA's buffers must hold exactly the element types the kernel reads and writes (a narrow integer result,
        # say, is computed by a kernel of int64: its buffers are not this one's)
        given = [np.dtype(result.dtype)] + [np.dtype(operands[position].dtype) for position in plan.arrays]
        if [np.dtype(a.dtype) for a in self.kernel.arrays] != given:
            return None
        payload = c_ffi.kernel_payload(self.spec, [np.dtype(o.dtype).name for o in operands],
                                       np.dtype(result.dtype).name, generator_fingerprint())
        identity = c_ffi.content_identity(payload)
        slot = c_ffi.register(ctypes.cast(self._packed, ctypes.c_void_p).value, identity)
        if slot is None:
            return None
        sizes = plan.size_values(shapes)
        names = self.spec.input_names
        array_shapes = [(1,) if plan.rank0_as_vector else tuple(result.shape)]
        array_shapes += [tuple(shapes[names[position]]) for position in plan.arrays]
        extents = [array_shapes[k][axis] for k, axis in self._extents]
        values = list(operands)
        for position, dtype in plan.scalars:  # passed by address: in the type the kernel reads
            if values[position].dtype != np.dtype(dtype):
                values[position] = values[position].astype(dtype)
        sources = [0] + [position + 1 for position in plan.arrays] + [position + 1 for position, _ in plan.scalars]
        meta = c_ffi.meta(slot, identity, self._team(sizes, shapes), sources, [*sizes, *extents])
        return c_ffi.call(meta, values, result, aliases, payload), slot

    def prepare(self, shapes: Shapes, *, read_only: bool = False) -> None:
        """Nothing to do: the module was compiled (or loaded) when it was built."""

    def clear_bytes(self, address: int, nbytes: int) -> None:
        """Zero ``nbytes`` from ``address`` (a '+=' step's fresh output, ``runtime.exchange.start_from_zeros``):
        in parallel on the kernel's team where the module has its clear and the output spans several of its
        blocks, else with one memset."""
        if self._clear is None or nbytes < 2 * CLEAR_BLOCK:
            ctypes.memset(address, 0, nbytes)
        else:
            self._clear(address, nbytes, threads())

    def _team(self, sizes: Sequence[int], shapes: Shapes) -> int:
        key = tuple(sizes)
        found = self._threads.get(key)
        if found is None:
            found = self._threads[key] = 1 if workload.runs_serially(self.spec, shapes) else threads()
            self.teams_run.add(found)
        return found

    def _first_run(self, run_ms: float) -> None:
        with self._lock:
            if self._ran:
                return
            self._ran = True
        host.record_first_run(self.generated, self.kernel.name, ready_ms=self._ready_ms, run_ms=run_ms,
                              warm=not self._compiled, ready_field="compile_ms" if self._compiled else "load_ms")


# =============================================================================================
# The backend object
# =============================================================================================
@functools.cache
def _start_ffi_handler() -> None:
    """Where jax is imported: build (or load) the XLA FFI handler in a thread, once per process, beside the
    compiler probe that the first plan waits for. The handler runs the C kernels and the layout changes of
    XLA's convolution form on the CPU, both needed within the first call; built on its own, with an empty
    compile cache, it was another compiler run on the first call's critical path."""
    if "jax" not in sys.modules:
        return
    from tullax.backends.c import ffi as c_ffi

    threading.Thread(target=c_ffi.available, name="tullax-ffi-handler", daemon=True).start()


class CBackend:
    name = NAME
    capabilities = Capabilities(host_buffers=True, module_source=True, prepare=True, shaped_run=True,
                                complex_numbers=False, whole_module_cached=True)

    def availability(self) -> tuple[bool, str]:
        _start_ffi_handler()
        return c_compile.probe()

    def build(self, spec: Spec, signature: Signature) -> Any:
        """The host kernel of ``spec`` for ``signature``: a gradient step of a module loaded here, else the
        forward kernel of its own module (from this process's table, the compile cache, or compiled now)."""
        ok, why = self.availability()
        if not ok:
            raise BackendUnavailableError(why)
        wide = signature.widened()
        if wide != signature:
            return host.WidenedKernel(self.build(spec, wide), signature, wide)
        with _STEPS_LOCK:
            step = _STEPS.get((spec, signature))
        if step is not None:
            return step
        forward = _BUILDER.built(spec, signature, NAME)
        if forward is not None:
            return forward
        step = _built_step(spec, signature)
        if step is not None:
            return step
        steps = _start_steps(spec, signature)  # first: its compiler runs beside the forward's
        try:
            return _BUILDER.build(_recipe(FORWARD), spec, signature)
        finally:
            if steps is not None:  # the steps module's compiler may take this core now
                steps.forward_built.set()

    def generate_source(self, spec: Spec, signature: Signature) -> str:
        return generate(spec, signature.widened())[1]

    def module_source(self, spec: Spec, dtype: str = "float32") -> str:
        return module_source(spec, dtype)
