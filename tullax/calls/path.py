"""How a loop backend's kernel runs inside a JAX computation, and the call that runs it: one choice, used by the
tullax primitive's lowering and by the planner's loop candidate, so the planner times the path a planned kernel
then takes.

* XLA's own forms (``path`` 'xla') are not loop kernels: nothing to choose.
* On the CPU: the host kernel through a callback, on the path the kernel was traced with (``callback_path()``:
  ``buffer``, or ``pure``'s copies).
* On a GPU, a backend whose kernels run on that platform: its device kernel on XLA's buffers (``device``); a host
  backend: ``pure_callback``'s copies, with a warning once (``tullax.calls.device.device_path``).
"""
from __future__ import annotations

from typing import Any, Sequence

from tullax.spec.ir import Spec

XLA_PATH = "xla"
CPU_PLATFORM = "cpu"


def lowered_path(path: str, backend_name: str, platform: str) -> str:
    """The path of a kernel traced with ``path`` on ``backend_name`` once it is lowered for ``platform`` (a jax
    lowering platform: 'cpu', 'cuda', 'rocm')."""
    if path == XLA_PATH or platform == CPU_PLATFORM:
        return path
    from tullax.calls.device import device_path

    return device_path(backend_name, platform)


def backend_path(backend_name: str) -> str:
    """The path a kernel of ``backend_name`` takes where that backend computes: on its own GPU platform for a
    device backend (its ``platform`` attribute), else on the CPU. What the planner's loop candidate runs: the
    planner picks a device backend only where jax computes on its GPU, and a host backend only on the CPU."""
    from tullax import backends
    from tullax.calls.host import callback_path

    platform = getattr(backends.get(backend_name), "platform", None) or CPU_PLATFORM
    return lowered_path(callback_path(), backend_name, platform)


def run_loops(spec: Spec, backend_name: str, args: Sequence[Any], out_dtype: Any, path: str,
              zero_start: bool = False, emit: Any = None) -> Any:
    """``spec`` on ``backend_name``'s kernel over the jax values ``args`` (tracers while lowering), on ``path``
    (``lowered_path``); the result as a jax value of dtype ``out_dtype``. ``emit``: how a buffer callback is
    called (``tullax.calls.host.Emit``; None: ``buffer_callback``)."""
    from tullax.calls.device import DEVICE_PATH

    if path == DEVICE_PATH:
        from tullax.calls.device import device_call

        return device_call(spec, backend_name, args, out_dtype, emit=emit, zero_start=zero_start)
    from tullax.calls.host import host_call

    return host_call(spec, backend_name, args, out_dtype, path, zero_start, emit=emit)
