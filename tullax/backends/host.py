"""The host side that the loop backends (Numba, Julia) share: everything between "build the kernel of this spec
for this signature" and "run it on these NumPy arrays" that is not about Numba or Julia themselves.

* ``kernel_steps`` / ``module_source``: the forward kernel and every gradient step of a spec, named, and the
  whole module of them that ``tullax.generate_source`` shows.
* ``module_key``, ``ModuleRecipe``, ``HostBuilder``: the build sequence. The in-process table makes a second build
  of a kernel free; otherwise the module is generated (timed), compared with the compile cache's copy (a hit)
  or written there, and loaded, all under the cache entry's lock so that concurrent processes write and compile
  an entry once. A backend supplies only the steps that are its own in a ``ModuleRecipe``; one whose key
  determines its source (``load_cached``) loads a hit without generating it.
* ``call_shapes``, ``ArgumentPlan``, ``marshal``: a host call's arguments in the kernel's parameter order, with
  as few copies as possible.
* ``record_first_run``: what a kernel's first run cost, in the cache index.
* ``warn_if_other_llvm_loaded``: Numba and Julia each load an LLVM of their own.
"""
from __future__ import annotations

import sys
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Sequence

import numpy as np

from tullax import settings
from tullax.backends.base import HostKernel, Shapes, Signature
from tullax.errors import TullaxError
from tullax.runtime import forks
from tullax.spec.ir import Spec
from tullax.spec.sizes import Sym
from tullax.spec.text import format_spec

if TYPE_CHECKING:  # the loop IR only where a kernel is lowered: a warm process running XLA never imports it
    from tullax.compiler.interface import KernelInterface
    from tullax.compiler.loops import LoopKernel
    from tullax.runtime.cache import CompileCache  # the cache only where a module is built: not for kernel_steps

# =============================================================================================
# Two LLVMs in one process
# =============================================================================================
ALLOW_BOTH_ENV = "TULLAX_ALLOW_NUMBA_AND_JULIA"
# The runtimes that load an LLVM of their own, by the name a warning gives them, each with the Python module
# whose presence in sys.modules means it is loaded in this process.
_LLVM_RUNTIMES = {"numba": "numba", "Julia": "juliacall"}


def warn_if_other_llvm_loaded(starting: str) -> None:
    """Warn when ``starting`` ("numba" or "Julia") is about to load its LLVM into a process where the other one
    is loaded already: the two have crashed together in one process (numba issue 7857). tullax itself never
    loads both unless asked; ``TULLAX_ALLOW_NUMBA_AND_JULIA=1`` silences the warning."""
    loaded = [name for name, module in _LLVM_RUNTIMES.items() if name != starting and module in sys.modules]
    if not loaded or settings.value(ALLOW_BOTH_ENV):
        return
    warnings.warn(
        f"starting {starting} in a process that has already loaded {loaded[0]}: both load their own LLVM, and "
        "the two have crashed together in one process (numba issue 7857). Prefer one backend per process (run "
        f"comparisons in separate processes); set {ALLOW_BOTH_ENV}=1 to silence this warning.",
        RuntimeWarning, stacklevel=4)  # the frame that asked for the backend, not its start-up functions


# =============================================================================================
# The whole module of a spec
# =============================================================================================
@dataclass(frozen=True)
class KernelStep:
    """One kernel of a spec's whole module: the forward kernel, or one step of one input's gradient."""

    spec: Spec
    # Its function name in a generated module: ``forward``, ``grad<k>_step<n>`` with k the input's position
    # (from positions, never from user text, so it is always a valid name).
    name: str
    label: str  # how a listing titles it: "forward", "gradient wrt W", "gradient wrt W, step 2"


FORWARD_KERNEL = "forward"  # the forward kernel's function name in every generated module


def kernel_steps(spec: Spec, dtype: Any = None, in_dtypes: Sequence[Any] | None = None) -> tuple[KernelStep, ...]:
    """The forward kernel of ``spec`` and every step of every gradient, in order; a spec whose gradients
    cannot be derived has its forward kernel only. ``dtype``: the data inputs' dtype (a complex one derives
    the gradients of complex inputs); ``in_dtypes``, each input's (in order), says which are complex instead, as
    a call derives them (a complex lam beside a real x)."""
    from tullax.grad import gradients
    from tullax.spec.valuetype import complex_inputs

    steps = [KernelStep(spec, FORWARD_KERNEL, "forward")]
    complex_names: frozenset[str] = frozenset()
    if in_dtypes is not None:
        complex_names = complex_inputs(spec, dict(zip(spec.input_names, in_dtypes)))
    elif dtype is not None and np.dtype(dtype).kind == "c":
        complex_names = frozenset(i.name for i in spec.inputs if i.kind in ("array", "scalar"))
    try:
        grads = gradients(spec, complex_names)
    except TullaxError:
        grads = ()
    for grad in grads:
        position = spec.input_names.index(grad.wrt)
        for number, step in enumerate(grad.steps):
            label = f"gradient wrt {grad.wrt}" + (f", step {number + 1}" if len(grad.steps) > 1 else "")
            steps.append(KernelStep(step, f"grad{position}_step{number}", label))
    return tuple(steps)


def module_source(spec: Spec, signature: Signature, lower: Callable[[Spec, Signature, str], LoopKernel],
                  print_module: Callable[[list[LoopKernel]], str]) -> str:
    """The whole module of ``spec`` for display: every kernel of ``kernel_steps`` lowered by ``lower(spec,
    signature, name)``, printed together by ``print_module``. The forward kernel has ``signature``; the gradient
    steps compute in its result dtype (``Signature.for_dtype``)."""
    signature = signature.widened()  # what the kernels compute in (half precision in float32, integers in int64)
    forward, *grads = kernel_steps(spec, signature.out_dtype)
    kernels = [lower(forward.spec, signature, forward.name)]
    for step in grads if np.dtype(signature.out_dtype).kind not in "iu" else ():  # integers have no gradient
        kernels.append(lower(step.spec, Signature.for_dtype(step.spec, signature.out_dtype), step.name))
    return print_module(kernels)


# =============================================================================================
# The build sequence
# =============================================================================================
def module_key(spec: Spec, signature: Signature, backend: str, options: Mapping[str, Any]) -> str:
    """The compile-cache key of the module of ``spec`` for ``signature`` on ``backend`` (printed with
    ``options``)."""
    from tullax.runtime.cache import cache_key

    return cache_key(spec=format_spec(spec), ranges=[(n, str(r.lo), str(r.hi)) for n, r in spec.ranges],
                     inputs=[(i.name, i.kind, i.rank) for i in spec.inputs], in_dtypes=list(signature.in_dtypes),
                     out_dtype=signature.out_dtype, backend=backend, options=options)


@dataclass(frozen=True)
class GeneratedModule:
    """One generated module, stored in the compile cache, about to be loaded."""

    backend: str
    spec: Spec
    signature: Signature
    # the kernel the module holds (with its variants, for Numba); a module the c backend loads from the cache has
    # only its interface
    kernel: LoopKernel | KernelInterface
    source: str
    key: str  # its compile-cache entry
    path: Path | None  # the source file in that entry; None when the cache could not store it (run from memory)
    codegen_ms: float  # lowering and printing it
    made: Any = None  # what the recipe's ``store_extras`` made of it (host C: its library), handed to ``load``


@dataclass(frozen=True)
class ModuleRecipe:
    """What one loop backend contributes to ``build_module``, in the order it is called."""

    backend: str  # the backend's name: in cache keys, index records and the in-process table
    source_file: str  # the module's file name in its cache entry
    options: Mapping[str, Any]  # whatever else changes the generated module (printer options): part of the key
    generate: Callable[[Spec, Signature], tuple[LoopKernel, str]]  # lower and print: (the kernel, the module)
    # the backend's other files, after a write; what it returns (None: nothing) reaches ``load`` as ``made``
    store_extras: Callable[[CompileCache, GeneratedModule], Any]
    load: Callable[[GeneratedModule], HostKernel]  # load the stored module into the runtime
    # A backend whose key determines its source (it holds a fingerprint of the code generator) loads a cached
    # module without generating it: ``load_cached(cache, key, spec, signature)`` returns the kernel, or None
    # when the entry has no complete, checked module (then it is generated, written and loaded as usual).
    load_cached: Callable[[CompileCache, str, Spec, Signature], HostKernel | None] | None = None


def build_module(recipe: ModuleRecipe, spec: Spec, signature: Signature) -> HostKernel:
    """Generate the module of ``spec`` for ``signature``, keep the compile cache's copy when it holds the same
    text (a hit) or write it, and load it: all under the cache entry's lock, so that concurrent processes
    write and compile one entry once, and no process deletes the entry meanwhile. A module the cache cannot
    store (a full disk) has no path and is loaded from memory. A recipe with ``load_cached`` skips generating
    on a hit: its key alone determines the source."""
    key = module_key(spec, signature, recipe.backend, recipe.options)
    from tullax.runtime.cache import get_cache

    cache = get_cache()
    # the index record of the entry, made when it is written: a module used only under jit runs no first host
    # call (which notes its timings), and a hit on an entry without a record was not counted
    describe = dict(spec=format_spec(spec), backend=recipe.backend, kind=str(recipe.options.get("part", "module")),
                    dtypes=[*signature.in_dtypes, signature.out_dtype])
    with cache.lock(key):
        if recipe.load_cached is not None:
            found = recipe.load_cached(cache, key, spec, signature)
            if found is not None:
                cache.hit_later(key, **describe)
                return found
        start = time.perf_counter()
        kernel, source = recipe.generate(spec, signature)
        codegen_ms = (time.perf_counter() - start) * 1e3
        reused = cache.read_text(key, recipe.source_file) == source
        if reused:
            cache.hit_later(key, **describe)
            path = cache.entry_path(key) / recipe.source_file
        else:
            path = cache.write_text(key, recipe.source_file, source)
            if path is not None:
                cache.record_later(key, **describe)
        generated = GeneratedModule(recipe.backend, spec, signature, kernel, source, key, path, codegen_ms)
        if not reused and path is not None:
            generated = replace(generated, made=recipe.store_extras(cache, generated))
        return recipe.load(generated)


class HostBuilder:
    """The host kernels one backend has built in this process, by (spec, signature, backend name): a second
    build of the same kernel returns the first one without generating anything."""

    def __init__(self) -> None:
        self._lock = forks.rlock()  # one build at a time: two threads asking for one kernel build it once
        self._built: dict[tuple[Spec, Signature, str], HostKernel] = {}

    def __len__(self) -> int:
        return len(self._built)

    def built(self, spec: Spec, signature: Signature, backend: str) -> HostKernel | None:
        """The kernel built here for (``spec``, ``signature``) on ``backend``, without waiting for a build in
        progress (a dict read: atomic)."""
        return self._built.get((spec, signature, backend))

    def build(self, recipe: ModuleRecipe, spec: Spec, signature: Signature) -> HostKernel:
        wide = signature.widened()
        if wide != signature:  # half precision or a narrow integer result: the kernel of the wide signature
            return WidenedKernel(self.build(recipe, spec, wide), signature, wide)
        with self._lock:
            entry = (spec, signature, recipe.backend)
            found = self._built.get(entry)
            if found is None:
                found = self._built[entry] = build_module(recipe, spec, signature)
            return found


class WidenedKernel:
    """A loop kernel of the widened signature (``Signature.widened``) called with the narrow one: half precision
    inputs are converted to float32 (a copy: neither Numba nor Julia's host path reads bfloat16, and Numba has no
    float16 arithmetic), the kernel writes a float32/int64 result, which is rounded (or, for integers, wrapped
    modulo 2^bits, as the narrow type's own arithmetic would) into ``out``. Same methods as the kernel it wraps."""

    def __init__(self, inner: HostKernel, signature: Signature, wide: Signature):
        self.inner, self.signature, self.wide = inner, signature, wide
        self.generated = getattr(inner, "generated", None)

    def _inputs(self, inputs: Sequence[Any]) -> list[Any]:
        return [_widened(value, dtype) if dtype != narrow else value
                for value, narrow, dtype in zip(inputs, self.signature.in_dtypes, self.wide.in_dtypes)]

    def __call__(self, out: Any, *inputs: Any) -> None:
        wide_out = np.asarray(out).astype(self.wide.out_dtype)
        self.inner(wide_out, *self._inputs(inputs))
        out[...] = wide_out.astype(out.dtype)

    def run(self, out: Any, inputs: Sequence[Any], shapes: Shapes) -> None:
        wide_out = np.asarray(out).astype(self.wide.out_dtype)
        self.inner.run(wide_out, self._inputs(inputs), shapes)
        out[...] = wide_out.astype(out.dtype)

    def prepare(self, shapes: Shapes, *, read_only: bool = False) -> None:
        self.inner.prepare(shapes, read_only=read_only)

    def __getattr__(self, name: str) -> Any:  # anything else a caller reads (variants_run, ...) is the kernel's
        return getattr(self.inner, name)


def _widened(value: Any, dtype: str) -> Any:
    """``value`` converted to ``dtype``: a writable copy, made read-only again when the original was (a pure
    callback's inputs), so the kernel runs the specialisation prepared for the call (Numba types the two apart)."""
    original = np.asarray(value)
    copy = original.astype(dtype)
    if isinstance(copy, np.ndarray) and not original.flags.writeable:
        copy.flags.writeable = False
    return copy


# =============================================================================================
# Arguments of a host call
# =============================================================================================
def call_shapes(spec: Spec, out: Any, inputs: Sequence[Any]) -> dict[str, tuple[int, ...]]:
    """The shapes of one host call ``kernel(out, *inputs)`` by name, the result's under ``spec.out``: what the
    kernel's size parameters are computed from."""
    shapes = {name: np.shape(value) for name, value in zip(spec.input_names, inputs)}
    shapes[spec.out] = out.shape
    return shapes


@dataclass(frozen=True)
class ArgumentPlan:
    """Where each parameter of a generated kernel comes from in a host call ``kernel(out, *inputs)``, worked
    out once per kernel so that a call only gathers. Parameters come in ``LoopKernel.params`` order: the
    output, the input arrays, the scalars, the sizes."""

    arrays: tuple[int, ...]  # the input position of each array parameter after the output
    scalars: tuple[tuple[int, str], ...]  # (input position, declared dtype) of each scalar parameter
    sizes: tuple[Sym, ...]  # each size parameter, over the call's shapes
    scalar: Callable[[Any, str], Any]  # a scalar input as the kernel takes it, given its declared dtype
    rank0_as_vector: bool  # the output is rank 0 and goes over as shape (1,) (the kernel writes element 0)

    @classmethod
    def of(cls, kernel: LoopKernel | KernelInterface, spec: Spec, *, scalar: Callable[[Any, str], Any],
           rank0_as_vector: bool) -> "ArgumentPlan":
        names = spec.input_names
        return cls(tuple(names.index(a.source) for a in kernel.arrays if a.role == "in"),
                   tuple((names.index(s.source), s.dtype) for s in kernel.scalars),
                   tuple(s.size for s in kernel.sizes), scalar, rank0_as_vector and kernel.output.rank == 0)

    def size_values(self, shapes: Shapes) -> list[int]:
        return [int(size.eval(shapes)) for size in self.sizes]


def marshal(plan: ArgumentPlan, out: Any, inputs: Sequence[Any], shapes: Shapes) -> tuple[list[Any], Any]:
    """The kernel's arguments for one call and the copy of ``out`` the kernel writes instead of ``out`` (None
    when it writes ``out`` itself, the usual case; the caller copies it back after the call).

    Arrays go over as they are: only an output that is not C-contiguous, aligned and writeable, and an input
    that is not a C-contiguous, aligned NumPy array, are copied (once)."""
    copied = not (out.flags.c_contiguous and out.flags.aligned and out.flags.writeable)
    target = np.array(out, order="C") if copied else out
    args: list[Any] = [target.reshape(1) if plan.rank0_as_vector else target]
    for position in plan.arrays:
        array = inputs[position]
        if not (isinstance(array, np.ndarray) and array.flags.c_contiguous and array.flags.aligned):
            array = np.ascontiguousarray(array)
        args.append(array)
    args += [plan.scalar(inputs[position], dtype) for position, dtype in plan.scalars]
    args += plan.size_values(shapes)
    return args, (target if copied else None)


# =============================================================================================
# The cache index
# =============================================================================================
def record_first_run(generated: GeneratedModule, kind: str, *, ready_ms: float, run_ms: float, warm: bool,
                     ready_field: Literal["compile_ms", "load_ms"]) -> None:
    """Note in the cache index what the first run of one kernel of ``generated`` (``kind``: which one) cost:
    generating the module, getting it ready (``ready_field``: compiling it or loading a compiled artefact) and
    running it. Their sum is the time to first kernel, cold or ``warm`` (a compiled artefact was reused). Written
    with the process's other index updates (``CompileCache.record_later``), not during the first call."""
    ttfk_field = "ttfk_warm_ms" if warm else "ttfk_cold_ms"
    ttfk = generated.codegen_ms + ready_ms + run_ms
    try:
        from tullax.runtime.cache import get_cache

        get_cache().record_later(generated.key, spec=generated.kernel.spec_text, backend=generated.backend, kind=kind,
                           dtypes=[a.dtype for a in generated.kernel.arrays], parse_codegen_ms=generated.codegen_ms,
                           first_run_ms=run_ms, **{ready_field: ready_ms, ttfk_field: ttfk})
    except OSError:  # a read-only cache already warned; timings are a nicety
        pass
