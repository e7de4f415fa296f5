"""What every backend provides. Backends are stateless objects registered by name."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol

from tullax.spec.ir import Spec
from tullax.spec.signature import INDEX_DTYPE, Signature

__all__ = ["INDEX_DTYPE", "NO_CAPABILITIES", "Backend", "Capabilities", "HostKernel", "Shapes", "Signature",
           "device_pointer"]

# The input and output shapes of one call, by name (the output under ``spec.out``).
Shapes = Mapping[str, tuple[int, ...]]


def device_pointer(buffer: Any) -> int:
    """The device address of a buffer_callback Buffer (or any ``__cuda_array_interface__`` array): what every GPU
    backend hands its launch."""
    return int(buffer.__cuda_array_interface__["data"][0])


class HostKernel(Protocol):
    """A compiled kernel that writes the result into ``out`` in place: ``kernel(out, *inputs)`` with NumPy
    arrays (or scalars) for ALL of ``spec.inputs``, in order. For '=' and '+=' the caller has put the existing
    values into ``out`` and input 0 is the original given array, a different buffer: a body that reads the
    output array reads input 0, so every backend sees the values from before the update (as the XLA lowering
    does).

    Two optional methods, present when the backend declares them in its ``Capabilities``:
    ``prepare(shapes, *, read_only=False)`` compiles now what a call with these shapes (and read-only inputs when
    ``read_only``) will run (the JAX path calls it while tracing, so compiling happens, and fails, at trace time,
    not inside a callback), and
    ``run(out, inputs, shapes)`` is the call itself for a caller that already knows the shapes."""

    def __call__(self, out: Any, *inputs: Any) -> None:
        ...


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do beyond ``availability``, ``build`` and ``generate_source``: declared, so callers
    read a flag instead of probing the backend or its kernels for methods."""

    # Inside a JAX computation it runs as a host callback on NumPy views of XLA's buffers (False: the backend
    # is lowered into the computation itself, as the XLA reference is).
    host_buffers: bool = False
    # ``module_source(spec, dtype)``: one module with the forward kernel and every gradient step kernel.
    module_source: bool = False
    # Its host kernels have ``prepare(shapes)``.
    prepare: bool = False
    # Its host kernels have ``run(out, inputs, shapes)``.
    shaped_run: bool = False
    # ``warm_package()``: it writes the cached kernels into an artefact a new process loads compiled (``tullax
    # cache warm`` calls it after warming the specs).
    precompiled_package: bool = False
    # It computes with complex64/complex128 (False: it refuses them, and ``auto`` passes such calls to the next
    # loop backend that takes them).
    complex_numbers: bool = True
    # ``build(spec)`` compiles the forward kernel and every gradient step together (host C: two modules at once,
    # so a gradient step of a spec built here costs nothing more), and a later process loads them compiled from
    # the compile cache in milliseconds. ``auto`` then sends a tiny call to these loops rather than to XLA, which
    # compiles its form again in every process, where ``ready(spec, signature, whole=False)`` says that the
    # kernel (``whole``: and its gradient steps) runs without a compile.
    whole_module_cached: bool = False
    # ``availability_now()``: its availability without waiting for a slow check (the C compiler's probe): False
    # where that is known to fail, else True; ``build`` waits for the check and raises where it fails. Resolving
    # the backend by name asks this, so the first trace runs beside the check instead of after it.
    availability_now: bool = False


# What a backend that declares nothing can do: what every backend can.
NO_CAPABILITIES = Capabilities()


class Backend(Protocol):
    name: str
    capabilities: Capabilities

    def availability(self) -> tuple[bool, str]:
        """(usable here?, why not and how to fix it)."""

    def build(self, spec: Spec, signature: Signature) -> HostKernel:
        """Compile (or load from the cache) the kernel of ``spec`` for ``signature``."""

    def generate_source(self, spec: Spec, signature: Signature) -> str:
        """The generated source of the kernel of ``spec`` (empty for backends that generate none)."""
