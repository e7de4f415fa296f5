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
  with (``step_signature``); a step asked for while its module builds waits for it, so the backward pass
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
import os
import pickle
import sys
import threading
import time
from typing import Any, Callable

from tullax.backends import host
from tullax.backends.base import Capabilities, Signature
from tullax.backends.c import compile as c_compile
from tullax.backends.c import tiers
from tullax.backends.c.generate import (
    FORWARD,
    LIBRARY_PREFIX,
    STEPS,
    generate,
    generate_part,
    generator_fingerprint,
    has_gradients,
    library_file,
    module_source,
    part_kernels,
    step_signature,
    streams,
)
from tullax.backends.c.kernel import CHostKernel
from tullax.backends.c.load import load_library
from tullax.compiler.interface import KernelInterface
from tullax.errors import BackendUnavailableError, TullaxError
from tullax.printers.c_clear import CLEAR_FUNCTION
from tullax.printers.c_packed import PACKED_SUFFIX
from tullax.runtime import forks, own_compiles
from tullax.runtime.cache import CompileCache, get_cache
from tullax.spec.ir import Spec

NAME = "c"
SOURCE_FILE = "kernels.c"
KERNELS_FILE = "kernels.pickle"  # {"library": its file name, "kernels": ((interface, spec, signature), ...),
#                                  "of": (spec, signature)}: each kernel of part_kernels(...) as its interface


# =============================================================================================
# Compiling and loading
# =============================================================================================
_COUNTS = {"compiled": 0, "loaded": 0}  # what this process compiled and loaded (``compile_stats``), under its lock
_COUNTS_LOCK = forks.lock()


def compile_stats() -> dict[str, int]:
    """How many modules this process compiled and how many it loaded compiled from the cache."""
    with _COUNTS_LOCK:
        return dict(_COUNTS, modules=len(_BUILDER) + len(_STEP_BUILDER))


def _count(what: str) -> None:
    with _COUNTS_LOCK:
        _COUNTS[what] += 1


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


def _compile_into_cache(cache: CompileCache, generated: host.GeneratedModule,
                        part: str = FORWARD, background: bool = False) -> tuple[str, float]:
    """After the source is written: compile its library into the entry (under the entry's lock). The library's
    path and the seconds it took, which ``build_module`` hands to ``_load`` (``GeneratedModule.made``)."""
    library, seconds, _ = _library(generated, cache, part, background)
    return library, seconds


def _library(generated: host.GeneratedModule, cache: CompileCache, part: str = FORWARD,
             background: bool = False) -> tuple[str, float, bool]:
    """The path of the module's library, compiling it when the entry holds none for this source that checks;
    with the seconds that took and whether it compiled. ``background``: a fast tier's optimised build (the
    compiler yields the cores to this process, ``compile_library``)."""
    import tempfile
    from pathlib import Path

    start = time.perf_counter()
    name = library_file(generated.source)
    if generated.path is None:  # the cache stores nothing: a private temporary directory
        directory = Path(tempfile.mkdtemp(prefix="tullax-c-"))
        (directory / SOURCE_FILE).write_text(generated.source)
        c_compile.compile_library(directory / SOURCE_FILE, directory / name, units=_units(part),
                                  room=_room(generated, part), background=background)
        _count("compiled")
        return str(directory / name), time.perf_counter() - start, True
    data, problem = cache.read_checked(generated.key, name)
    if data is not None and problem is None:
        return str(generated.path.with_name(name)), time.perf_counter() - start, False
    built = generated.path.with_name(f".{name}.{os.getpid()}.built")
    c_compile.compile_library(generated.path, built, units=_units(part), room=_room(generated, part),
                              background=background)
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


def _load(generated: host.GeneratedModule, part: str = FORWARD, background: bool = False) -> "CHostKernel":
    """dlopen the module's library (compiling it first when the entry has none) and make the host kernels of
    every kernel in it; the gradient steps' go into the step table. Stores the lowered kernels in the entry,
    for ``_load_cached``."""
    cache = get_cache()
    library, seconds, compiled = (*generated.made, True) if generated.made else \
        _library(generated, cache, part, background)
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


def _recipe(part: str = FORWARD, background: bool = False) -> host.ModuleRecipe:
    """The build steps of one module, with the compiler's identity in the cache key (read now: ``TULLAX_CC`` may
    change); ``background``: a fast tier's optimised build."""
    options = {"compiler": c_compile.identity(), "printer": 1, "generator": generator_fingerprint(), "part": part,
               "streams": streams()}
    return host.ModuleRecipe(NAME, SOURCE_FILE, options, functools.partial(generate_part, part=part),
                             functools.partial(_compile_into_cache, part=part, background=background),
                             functools.partial(_load, part=part, background=background),
                             functools.partial(_load_cached, part=part))


_STEPS: dict[tuple[Spec, Signature], "CHostKernel"] = {}  # gradient steps of the modules loaded here (a cache)
_STEPS_LOCK = forks.lock()


class _StepsBuild:
    """The steps module of one forward (spec, signature), building in a thread: which (step spec, signature) it
    holds once ``known`` is set, and ``done`` once it is loaded (or failed: each step then builds its own)."""

    def __init__(self) -> None:
        self.known = threading.Event()
        self.done = threading.Event()
        self.forward_built = threading.Event()  # the forward module beside it is built (or failed)
        self.keys: frozenset[tuple[Spec, Signature]] = frozenset()


# the steps module of each forward (spec, signature) this process started: a step asked for waits for its build
_STEP_BUILDS: dict[tuple[Spec, Signature], _StepsBuild] = {}


def _forget_unfinished_builds() -> None:
    """In a forked child: the steps modules its parent was building have no thread here to finish them;
    forgotten, so each is built again when asked for instead of waited for."""
    for key, build in list(_STEP_BUILDS.items()):
        if not build.done.is_set():
            del _STEP_BUILDS[key]
            build.known.set()
            build.done.set()
            build.forward_built.set()


forks.on_fork(_forget_unfinished_builds)


def _start_steps(spec: Spec, signature: Signature) -> "_StepsBuild | None":
    """Build (compile, or load from the cache) the steps module of ``spec`` in a thread, once per process, so it
    compiles beside the forward module instead of after it, and the forward kernel is ready as soon as its own
    module is. Returns that build (started now or before), None when the spec has no gradient steps."""
    if not has_gradients(signature):
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
    """Wait until every steps module building in this process is loaded (or has failed), and every optimised
    build of a fast tier (``tiers``) has landed."""
    with _STEPS_LOCK:
        builds = list(_STEP_BUILDS.values())
    for build in builds:
        build.done.wait()
    tiers.finish()


def _build_steps(spec: Spec, signature: Signature, build: _StepsBuild) -> None:
    try:
        if tiers.enabled():  # lowering holds the GIL: the forward kernel, wanted first, is lowered first
            build.forward_built.wait()
        try:
            build.keys = frozenset((step.spec, step_signature(step.spec, signature, spec))
                                   for step in host.kernel_steps(spec, signature.out_dtype, signature.in_dtypes)[1:])
        finally:
            build.known.set()
        if build.keys and _tiered(STEPS, spec, signature) is None:
            with own_compiles.compiling("C steps module"):  # a race of this process waits for it before timing
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


_FAST: dict[tuple[Spec, Signature], CHostKernel] = {}  # the fast tier's forward kernels made here
_FAST_LOCK = forks.lock()


def _make_fast(generated: host.GeneratedModule, interface: KernelInterface, spec: Spec, function: Any,
               ready_ms: float, clear: Any, packed: Any) -> CHostKernel:
    return CHostKernel(generated, interface, spec, function, ready_ms, True, clear, packed=packed, fast=True)


def _tiered(part: str, spec: Spec, signature: Signature) -> CHostKernel | None:
    """The first kernel of the module's fast tier, its optimised build started (``tiers``); the gradient steps'
    go into the step table. None where tiers are off, where the compile cache holds the module's library (a
    process loads it in milliseconds) or where tcc cannot compile it: the optimising build then, as before."""
    if not tiers.enabled():
        return None
    recipe = _recipe(part, background=True)
    if (get_cache().entry_path(host.module_key(spec, signature, NAME, recipe.options)) / KERNELS_FILE).is_file():
        return None
    try:
        made = tiers.fast_module(spec, signature, part, _make_fast)
    except TullaxError:
        if tiers.mode() == tiers.ONLY:  # a test of the fast tier: nothing else may run in its place
            raise
        return None
    builder = _BUILDER if part == FORWARD else _STEP_BUILDER
    # registered as a compile in flight before any other thread can find its kernels (a race waits for it)
    tiers.optimise([kernel for kernel, _, _ in made], lambda: builder.build(recipe, spec, signature))
    if part == STEPS:
        with _STEPS_LOCK:
            for kernel, step_spec, step_sig in made:
                _STEPS.setdefault((step_spec, step_sig), kernel)
    return made[0][0]


# =============================================================================================
# The backend object
# =============================================================================================
def _lower_ahead(spec: Spec, signature: Signature) -> None:
    """The forward kernel of ``spec`` lowered (``part_kernels`` remembers it), where a build would lower it."""
    try:
        part_kernels(spec, signature.widened(), FORWARD)
    except Exception:  # noqa: BLE001 - the build lowers it again and says why it fails
        pass


@functools.cache
def _start_ffi_handler() -> None:
    """Where jax is imported: build (or load) the XLA FFI handler in a thread, once per process, beside the
    compiler probe that the first plan waits for. The handler runs the C kernels and the layout changes of
    XLA's convolution form on the CPU, both needed within the first call; built on its own, with an empty
    compile cache, it was another compiler run on the first call's critical path."""
    if "jax" not in sys.modules:
        return
    from tullax.backends import ffi

    threading.Thread(target=ffi.available, name="tullax-ffi-handler", daemon=True).start()


class CBackend:
    name = NAME
    capabilities = Capabilities(host_buffers=True, module_source=True, prepare=True, shaped_run=True,
                                whole_module_cached=True, availability_now=True)

    def availability(self) -> tuple[bool, str]:
        _start_ffi_handler()
        return c_compile.probe()

    def availability_now(self) -> tuple[bool, str]:
        """``availability()`` where the compiler's probe has answered or there is no compiler, else True: ``build``
        waits for the probe (the first trace runs beside it)."""
        _start_ffi_handler()
        c_compile.start_probe()
        return c_compile.probe_answer() or (True, "")

    def build(self, spec: Spec, signature: Signature) -> Any:
        """The host kernel of ``spec`` for ``signature``: a gradient step of a module loaded here, else the
        forward kernel of its own module (from this process's table, the compile cache, or compiled now)."""
        if not c_compile.probe_known():  # lower the forward kernel (pure, remembered) while the probe compiles
            _lower_ahead(spec, signature)
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
        forward = _BUILDER.built(spec, signature, NAME) or _FAST.get((spec, signature))
        if forward is not None:
            return forward
        step = _built_step(spec, signature)
        if step is not None:
            return step
        steps = _start_steps(spec, signature)  # first: its compiler runs beside the forward's
        try:
            with _FAST_LOCK:
                fast = _FAST.get((spec, signature)) or _tiered(FORWARD, spec, signature)
                if fast is not None:
                    _FAST[(spec, signature)] = fast
                    return fast
            return _BUILDER.build(_recipe(FORWARD), spec, signature)
        finally:
            if steps is not None:  # the steps module's compiler may take this core now
                steps.forward_built.set()

    def ready(self, spec: Spec, signature: Signature, whole: bool = False) -> bool:
        """Whether ``build(spec, signature)`` compiles nothing: its kernel is built here (a forward module, or a
        gradient step of a steps module loaded or building here), or the compile cache holds its module
        compiled; ``whole``: the steps module of ``spec`` too. Never runs the compiler's probe."""
        wide = signature.widened()
        if _BUILDER.built(spec, wide, NAME) is not None or (spec, wide) in _FAST:
            if not whole or not has_gradients(wide):
                return True
            with _STEPS_LOCK:
                if (spec, wide) in _STEP_BUILDS:
                    return True
        elif not whole:
            with _STEPS_LOCK:
                builds = list(_STEP_BUILDS.values()) if (spec, wide) not in _STEPS else None
            if builds is None:
                return True
            for build in builds:  # its keys are known once the steps are derived (as ``_built_step`` waits)
                if build.known.wait() and (spec, wide) in build.keys:
                    return True
        answer = c_compile.probe_answer()
        if (answer is not None and not answer[0]) or not c_compile.probe_known():
            return False  # no usable compiler, or a compile cache no process probed it with: it holds no module
        parts = (FORWARD, STEPS) if whole and has_gradients(wide) else (FORWARD,)
        return all((get_cache().entry_path(host.module_key(spec, wide, NAME, _recipe(part).options))
                    / KERNELS_FILE).is_file() for part in parts)

    def generate_source(self, spec: Spec, signature: Signature) -> str:
        return generate(spec, signature.widened())[1]

    def module_source(self, spec: Spec, dtype: str = "float32") -> str:
        return module_source(spec, dtype)
