"""What every backend provides. Backends are stateless objects registered by name."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from tullax.spec.ir import Spec


@dataclass(frozen=True)
class Signature:
    """Concrete element types of one call: ``in_dtypes`` follow ``spec.inputs`` (numpy dtype names;
    scalars too), ``out_dtype`` is the result's. Ranks are already in the Spec."""

    in_dtypes: tuple[str, ...]
    out_dtype: str


# A host kernel writes the result into ``out`` in place: ``kernel(out, *inputs)`` with NumPy arrays (or
# scalars) for ALL of ``spec.inputs``, in order. For '=' and '+=' the caller has put the existing values into
# ``out`` and input 0 is the original given array, a different buffer: a body that reads the output array
# reads input 0, so every backend sees the values from before the update (as the XLA lowering does).
# A host kernel may also have ``prepare(shapes)`` (the input and output shapes of a coming call by name): the
# JAX path calls it while tracing, so compiling happens, and fails, at trace time, not inside a callback.
HostKernel = Callable[..., None]


class Backend(Protocol):
    name: str

    def availability(self) -> tuple[bool, str]:
        """(usable here?, why not and how to fix it)."""

    def build(self, spec: Spec, signature: Signature) -> HostKernel:
        """Compile (or load from the cache) the kernel of ``spec`` for ``signature``."""

    def generate_source(self, spec: Spec, signature: Signature) -> str:
        """The generated source of the kernel of ``spec`` (empty for backends that generate none)."""
