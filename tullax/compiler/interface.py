"""A loop kernel's calling interface: its name and its array, scalar and size parameters, without its body.

The part of the loop IR a host needs to call a compiled kernel. A cached module stores these, so loading it
(every process after the first) unpickles a few small records and imports neither the loop IR's statement and
expression classes nor its loop bodies; ``LoopKernel.interface`` gives the same record for a kernel just lowered.
"""
from __future__ import annotations

from dataclasses import dataclass

from tullax.spec.sizes import Sym


@dataclass(frozen=True)
class ArrayArg:
    """An array parameter. ``source``: the spec input it comes from (for role ``out``/``inout`` the result,
    which the host passes as ``out``). ``role``: ``in`` (read only), ``out`` (written), ``inout`` (added to)."""

    name: str
    source: str
    rank: int
    dtype: str
    role: str


@dataclass(frozen=True)
class ScalarArg:
    """A scalar parameter: the spec input ``source``, passed by value as ``dtype``."""

    name: str
    source: str
    dtype: str


@dataclass(frozen=True)
class SizeArg:
    """An integer the host computes at call time: ``size.eval(shapes)`` over the input (and output) shapes."""

    name: str
    size: Sym


@dataclass(frozen=True)
class KernelInterface:
    """What calling a kernel takes: its function's name, the spec it computes (as text, for the compile cache's
    records) and its parameters, in call order arrays (output first), scalars, sizes."""

    name: str
    spec_text: str
    arrays: tuple[ArrayArg, ...]
    scalars: tuple[ScalarArg, ...]
    sizes: tuple[SizeArg, ...]

    @property
    def params(self) -> tuple[str, ...]:
        """Parameter names in call order: arrays (output first), scalars, sizes."""
        return tuple(a.name for a in self.arrays) + tuple(s.name for s in self.scalars) + tuple(
            s.name for s in self.sizes)

    @property
    def output(self) -> ArrayArg:
        return next(a for a in self.arrays if a.role != "in")
