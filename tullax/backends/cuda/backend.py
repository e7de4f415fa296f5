"""The ``cuda`` backend: kernels printed as CUDA C (``tullax.printers.cuda``), compiled by NVRTC to a cubin for
the device's architecture (``cuda_compile``), loaded once per process and launched on XLA's own stream over
XLA's own device buffers (``tullax.calls.device``): no copy, no synchronisation, no allocation per call.

It runs only inside JAX on an NVIDIA GPU: ``device_kernel`` prepares one kernel for one call's static shapes
at trace time (print, compile or load from the cache, load the cubin, plan the launch), so a compile error
is a TullaxError at trace time; the callback then only fills in the buffer addresses and enqueues the launch.
NumPy inputs need a host backend. The lowering keeps the default one element per thread (no CPU tiling), or
register tiles; a plain sum over few output elements is split over more threads (``tullax.compiler.split``).
"""
from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any, Mapping, Sequence

from tullax import settings
from tullax.backends import host
from tullax.backends.base import Capabilities, Signature, device_pointer
from tullax.backends.cuda.launch import (
    SCAN_CHUNKS_ENV,
    SPLIT_ENV,
    START_GIVEN,
    START_ZERO,
    TILES_ENV,
    VECTORS_ENV,
    LaunchPlan,
    ParamBlock,
    device_lowering,
)
from tullax.compiler.loops import LoopKernel
from tullax.compiler.lower import lower
from tullax.errors import BackendUnavailableError, TullaxError
from tullax.printers.cuda import print_module
from tullax.spec.ir import Spec

NAME = "cuda"
PLATFORM = "cuda"  # the jax platform whose device buffers the kernels take
KERNEL_NAME = "kernel"
DISPLAY_INDEX_BITS = 64  # generate_source knows no shapes: print the width that is always right


class DeviceKernel:
    """One compiled, loaded kernel and its launch for one call's shapes: ``kernel(stream, out, buffers)``
    enqueues the work on ``stream`` (the output's starting values, then the kernel) and returns at once."""

    def __init__(self, kernel: LoopKernel, plan: LaunchPlan, function: Any, driver: Any, zero_start: bool = False):
        self.kernel, self.plan = kernel, plan
        # a zero-start step is handed its inputs without the zeros (input 0), which it clears on the stream instead
        self.clears = zero_start
        self._skip = 1 if zero_start else 0
        self._function, self._driver = function, driver
        self._params = ParamBlock(kernel, plan)
        self._lock = threading.Lock()  # the parameter block is shared: devices may call back on several threads

    def __call__(self, stream: int, out: Any, buffers: Sequence[Any]) -> None:
        plan = self.plan
        target = device_pointer(out)
        if plan.start == START_GIVEN:
            given = device_pointer(buffers[0])
            if given != target:  # XLA aliased the given array to the output: already in place
                self._driver.copy(target, given, plan.out_bytes, stream)
        elif plan.start == START_ZERO:  # a split sum adds every thread's piece into the output
            self._driver.clear(target, plan.out_bytes, stream)
        if not plan.grid:
            return
        pointers = [target if source is None else device_pointer(buffers[source - self._skip])
                    for source in plan.pointers]
        with self._lock:  # cuLaunchKernel copies the parameters before it returns
            self._params.set_pointers(pointers)
            self._driver.launch(self._function, plan.grid, plan.block, stream, self._params.address)


_lock = threading.RLock()
_BUILT: dict[tuple, DeviceKernel] = {}
_LOADED: dict[str, Any] = {}  # cache key -> loaded kernel: each cubin is loaded once per process


def table_key(spec: Spec, signature: Signature, shapes: Mapping[str, tuple[int, ...]],
              zero_start: bool = False) -> tuple:
    """What a built kernel is kept under in this process: the call, and the settings that choose its schedule
    (a process that changes one, as benchmarks/scan_gpu.py does, gets the other kernel)."""
    return (spec, signature, tuple(sorted((name, tuple(shape)) for name, shape in shapes.items())),
            tuple(settings.value(name) for name in (SPLIT_ENV, TILES_ENV, SCAN_CHUNKS_ENV, VECTORS_ENV)), zero_start)


def device_kernel(spec: Spec, signature: Signature, shapes: Mapping[str, tuple[int, ...]],
                  zero_start: bool = False) -> DeviceKernel:
    """The kernel of ``spec`` for ``signature`` and the call's shapes (inputs by name plus ``spec.out``),
    compiled (or read from the cache) and loaded; TullaxError when it does not compile. ``zero_start``: a '+='
    step whose given array is zeros: the output is cleared on the stream (``cuMemsetD8Async``) before the launch,
    and the kernel is called without the zeros."""
    from tullax.backends.cuda.compile import cached_cubin
    from tullax.backends.cuda.driver import driver, target_arch
    from tullax.backends.cuda.tile_sizes import tile_policy

    zero_start = zero_start and spec.assign == "+="
    key = table_key(spec, signature, shapes, zero_start)
    with _lock:
        found = _BUILT.get(key)
        if found is not None:
            return found
        start = time.perf_counter()
        # the block tile of this device's architecture (tullax.backends.cuda.tile_sizes)
        kernel, plan = device_lowering(spec, signature, shapes, KERNEL_NAME, tiles=tile_policy(target_arch()))
        zero_start = zero_start and 0 not in plan.pointers  # a '+=' kernel reads its start through its output
        if zero_start:
            plan = replace(plan, start=START_ZERO)
        source = print_module([(kernel, plan.index_bits)])
        codegen_ms = (time.perf_counter() - start) * 1e3
        dtypes = [a.dtype for a in kernel.arrays]
        cubin = cached_cubin(source, target_arch(), spec_text=kernel.spec_text, dtypes=dtypes)
        cuda = driver()
        loaded = time.perf_counter()
        function = _LOADED.get(cubin.key)
        if function is None:
            function = _LOADED[cubin.key] = cuda.load(cubin.image, KERNEL_NAME)
        load_ms = (time.perf_counter() - loaded) * 1e3
        _record(cubin, kernel, codegen_ms, load_ms, time.perf_counter() - start)
        built = _BUILT[key] = DeviceKernel(kernel, plan, function, cuda, zero_start)
        return built


def _record(cubin: Any, kernel: LoopKernel, codegen_ms: float, load_ms: float, seconds: float) -> None:
    """Time to a launchable kernel in the cache index: cold when NVRTC compiled it, warm when it was cached."""
    from tullax.runtime.cache import get_cache

    ttfk = {"ttfk_cold_ms" if cubin.compile_ms is not None else "ttfk_warm_ms": seconds * 1e3}
    try:
        get_cache().record(cubin.key, spec=kernel.spec_text, backend=NAME, kind="cubin",
                           parse_codegen_ms=codegen_ms, load_ms=load_ms, **ttfk)
    except OSError:  # a read-only cache already warned; timings are a nicety
        pass


def module_source(spec: Spec, dtype: Signature | str = "float32") -> str:
    """The forward kernel and every gradient step kernel of ``spec`` as ONE CUDA module, for display: when the
    spec's ranges fix every input's shape, the kernels the backend launches at those shapes, with their
    launches (``tullax.backends.cuda.display``); else the default lowering, 64-bit indices."""
    from tullax.backends.cuda.display import shaped_module_source, shapes_from_ranges

    sig = Signature.for_dtype(spec, dtype) if isinstance(dtype, str) else dtype
    shapes = shapes_from_ranges(spec)
    if shapes is not None:
        return shaped_module_source(spec, sig, shapes)
    return host.module_source(spec, sig, lambda step, step_sig, name: lower(step, step_sig, name=name),
                              lambda kernels: print_module([(k, DISPLAY_INDEX_BITS) for k in kernels]))


class CudaBackend:
    name = NAME
    platform = PLATFORM
    capabilities = Capabilities(module_source=True, complex_numbers=False)
    clears_output = True  # device_kernel(zero_start=True): a zero-start step's output cleared on XLA's stream

    def availability(self) -> tuple[bool, str]:
        from tullax.backends.cuda.compile import nvrtc_usable
        from tullax.backends.cuda.driver import driver

        try:
            nvrtc_usable()
            driver()
        except BackendUnavailableError as err:
            return False, str(err)
        return True, ""

    def build(self, spec: Spec, signature: Signature) -> Any:
        raise BackendUnavailableError(
            "the cuda backend runs kernels on jax arrays on an NVIDIA GPU, launched by XLA; for NumPy inputs "
            "use a host backend (backend='auto', 'numba' or 'julia')")

    def device_kernel(self, spec: Spec, signature: Signature, shapes: Mapping[str, tuple[int, ...]],
                      zero_start: bool = False) -> DeviceKernel:
        if any(str(d).startswith("complex") for d in (*signature.in_dtypes, signature.out_dtype)):
            # the printed CUDA C has complex types (printers.cuda_complex, checked on the CPU); no GPU has run them
            raise TullaxError("the cuda backend does not launch complex kernels yet (its printed CUDA C has them, "
                              "tullax.generate_source shows it, but no GPU has run them): use backend='xla' on a GPU")
        return device_kernel(spec, signature, shapes, zero_start)

    def generate_source(self, spec: Spec, signature: Signature) -> str:
        return print_module([(lower(spec, signature.widened(), name=KERNEL_NAME), DISPLAY_INDEX_BITS)])

    def module_source(self, spec: Spec, dtype: Signature | str = "float32") -> str:
        return module_source(spec, dtype)

    def shaped_source(self, spec: Spec, dtype: str, shapes: Mapping[str, tuple[int, ...]]) -> str:
        """The module of the kernels launched for these input shapes, each with its launch."""
        from tullax.backends.cuda.display import shaped_module_source

        return shaped_module_source(spec, Signature.for_dtype(spec, dtype), shapes)


__all__ = ["CudaBackend", "DeviceKernel", "device_kernel", "device_pointer", "module_source"]
