"""Kernels inside a JAX computation on a GPU platform.

* A backend whose kernels run on the platform (its ``platform`` attribute: ``cuda`` for the cuda backend) takes
  the ``device`` path: ``jax.experimental.buffer_callback`` hands the callback XLA's device buffers
  (``__cuda_array_interface__``) and ``ctx.stream``, XLA's stream; the kernel is enqueued there and the callback
  returns: no copy, no synchronisation (XLA orders its buffer reuse on that stream), no allocation.
* A host backend on a GPU platform goes through ``pure_callback``, which copies every input to the host and
  the result back; tullax warns once per process and backend.

Everything that can fail (compiling, shapes) happens at trace time, in ``device_call``.

``TULLAX_CUDA_COMMAND_BUFFER=1`` marks the callback ``command_buffer_compatible`` (XLA may then capture its
launches into a CUDA graph and replay them without calling Python). Off by default: whether it is faster AND
correct when XLA replays a capture over other buffers is what ``benchmarks/gpu.py`` measures (its
"command buffers" part); per-call launch counts in ``tullax.runtime.stats`` count captures, not replays.
"""
from __future__ import annotations

import threading
import warnings
from typing import Any, Sequence

from tullax import settings
from tullax.spec.ir import Spec

DEVICE_PATH = "device"
HOST_COPY_PATH = "pure"
COMMAND_BUFFER_ENV = "TULLAX_CUDA_COMMAND_BUFFER"

_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


class HostCopyWarning(UserWarning):
    """A host backend runs inside a GPU computation: every call copies its inputs and result."""


def device_path(backend_name: str, platform: str) -> str:
    """The path of a kernel lowered for the non-CPU ``platform`` on ``backend_name``."""
    from tullax import backends

    if getattr(backends.get(backend_name), "platform", None) == platform:
        return DEVICE_PATH
    with _warned_lock:
        first = (backend_name, platform) not in _warned
        _warned.add((backend_name, platform))
    if first:
        warnings.warn(
            f"tullax backend {backend_name!r} runs on the host: inside a {platform} computation every call copies "
            f"its inputs to the host and its result back (pure_callback). Use backend='cuda' (pip install "
            "'tullax[cuda]') or 'julia-cuda' to run on the GPU.", HostCopyWarning, stacklevel=2)
    return HOST_COPY_PATH


def device_call(spec: Spec, backend_name: str, args: Sequence[Any], out_dtype: Any, emit: Any = None,
                zero_start: bool = False) -> Any:
    """Run ``spec`` on the device buffers of ``args`` (jax values) on ``backend_name``'s device kernel; the
    result as a jax value of dtype ``out_dtype``. Called while lowering, with tracers. ``emit``: as
    ``tullax.calls.host.host_call``'s. ``zero_start``: ``spec`` is a '+=' step whose given array (``args[0]``) is
    zeros: a backend that clears its output on XLA's stream (``clears_output``) is not handed them, and XLA drops
    the zeros it would otherwise write (and copy, where it could not alias them)."""
    import jax
    import numpy as np
    from jax.experimental.buffer_callback import buffer_callback

    from tullax import backends
    from tullax.backends.base import Signature
    from tullax.calls.host import updates_in_place
    from tullax.runtime import stats
    from tullax.spec.text import format_spec

    shapes = {name: tuple(a.shape) for name, a in zip(spec.input_names, args)}
    result = jax.ShapeDtypeStruct(tuple(s.eval(shapes) for s in spec.out_shape), np.dtype(out_dtype))
    args = list(args)
    if spec.assign != ":=" and args[0].dtype != result.dtype:  # the kernel starts from it in the result dtype
        args[0] = args[0].astype(result.dtype)
    signature = Signature(tuple(np.dtype(a.dtype).name for a in args), result.dtype.name)
    wide = signature.widened()
    if wide != signature:  # half precision in float32, integer results in int64: converted by XLA, on the device
        if wide.out_dtype == "int64" and not jax.config.jax_enable_x64:
            from tullax.errors import TullaxError

            raise TullaxError(f"the {backend_name} backend computes integer results in int64, which jax has only "
                              f"with jax_enable_x64: enable it, or use backend='xla' for a {result.dtype.name} "
                              "result")
        wide_args = [a.astype(d) for a, d in zip(args, wide.in_dtypes)]
        return device_call(spec, backend_name, wide_args, wide.out_dtype, emit, zero_start).astype(result.dtype)
    backend = backends.resolve(backend_name)
    found_shapes = {**shapes, spec.out: result.shape}
    kernel = backend.device_kernel(spec, signature, found_shapes, zero_start=True) \
        if zero_start and spec.assign == "+=" and getattr(backend, "clears_output", False) else \
        backend.device_kernel(spec, signature, found_shapes)
    clears = getattr(kernel, "clears", False)
    aliases = {0: 0} if not clears and updates_in_place(spec, args, result) else None
    operands = args[1:] if clears else args  # the kernel clears its output; it never reads the zeros
    text = format_spec(spec)

    def run(ctx, out, *buffers):
        kernel(ctx.stream, out, buffers)
        stats.record_launch(text, backend_name, DEVICE_PATH)

    if emit is not None:
        return emit(run, result, aliases, operands)
    return buffer_callback(run, result, input_output_aliases=aliases,
                           command_buffer_compatible=settings.value(COMMAND_BUFFER_ENV))(*operands)


__all__ = ["COMMAND_BUFFER_ENV", "DEVICE_PATH", "HostCopyWarning", "device_call", "device_path"]
