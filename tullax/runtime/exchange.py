"""Zero-copy array exchange between XLA and host kernels.

Inside ``jax.experimental.buffer_callback`` the callback receives XLA's own device buffers
(``jax.experimental.buffer_callback.Buffer``). On the CPU a Buffer exports its memory through ``__array__``
(which refuses to copy) and ``__dlpack__`` (contiguous, row-major, no strides), so a NumPy view over it reads
and writes XLA's memory directly: nothing is copied on the way in or out. The same functions accept the CPU
``jax.Array``s that ``jax.pure_callback`` hands its callback (zero-copy where jax can, a copy otherwise).

Input views are NOT made read-only: Numba types read-only arrays differently and would compile every kernel
twice (once for eager NumPy calls, once under jit). Host kernels only ever write their ``out`` argument.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from tullax.spec.ir import Spec


def host_view(buffer: Any):
    """A NumPy view of ``buffer``'s memory (a buffer_callback Buffer or a CPU array), without copying."""
    import numpy as np

    if hasattr(buffer, "__array__"):
        return np.asarray(buffer)
    return np.from_dlpack(buffer)  # read-only, still zero-copy


def kernel_inputs(spec: Spec, buffers: Sequence[Any]) -> list[Any]:
    """The host-kernel arguments for ``buffers`` (one per spec input): arrays as views, scalar parameters
    as NumPy scalars (the host-kernel contract of ``tullax.backends.base``)."""
    views = []
    for item, buffer in zip(spec.inputs, buffers):
        view = host_view(buffer)
        views.append(view[()] if item.kind == "scalar" else view)
    return views


def prepare_out(spec: Spec, out: Any, inputs: Sequence[Any]) -> None:
    """Put the values a kernel starts from into ``out``: for '=' and '+=' the given array (input 0); a
    ':=' kernel writes every element itself. Before the first write, a large ``out`` is advised huge pages
    (``runtime.hugepages``)."""
    import numpy as np

    from tullax.runtime import hugepages

    if spec.assign == ":=":
        hugepages.advise(out)
    elif not _same_memory(out, inputs[0]):  # aliased by XLA: already in place
        hugepages.advise(out)
        np.copyto(out, inputs[0], casting="unsafe")


def start_from_zeros(out: Any, clear_bytes: Callable[[int, int], None] | None = None) -> None:
    """Clear ``out``, a kernel's fresh output standing in for the zeros a '+=' step starts from: on huge pages
    where they can be had (``runtime.hugepages``: the faults of its first touch are most of the cost), with
    ``clear_bytes(address, nbytes)`` where the kernel brings one (the C module's parallel clear,
    ``tullax.printers.c_clear``), else with one ``memset`` (every dtype's zero is all bits zero)."""
    import ctypes

    from tullax.runtime import hugepages

    hugepages.advise(out)
    if not out.flags.c_contiguous:
        out.fill(0)
    elif clear_bytes is not None:
        clear_bytes(data_pointer(out), int(out.nbytes))
    else:
        ctypes.memset(data_pointer(out), 0, int(out.nbytes))


def _same_memory(a: Any, b: Any) -> bool:
    return (getattr(a, "shape", None) == getattr(b, "shape", None) and hasattr(b, "__array_interface__")
            and data_pointer(a) == data_pointer(b))


def data_pointer(array: Any) -> int:
    """The address of the first element of a NumPy array (or anything with ``__array_interface__``)."""
    return int(array.__array_interface__["data"][0])


__all__ = ["host_view", "kernel_inputs", "prepare_out", "start_from_zeros", "data_pointer"]
