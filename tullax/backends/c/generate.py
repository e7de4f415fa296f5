"""The ``c`` backend's source: a spec's two modules (``FORWARD``: its forward kernel; ``STEPS``: every gradient
step, under the signature the JAX op builds it with) lowered and printed as C (``tullax.printers.c``), and the
fingerprint of the code that generates them, which enters the cache key."""
from __future__ import annotations

import functools
import hashlib
from typing import TYPE_CHECKING, Any

import numpy as np

from tullax import settings
from tullax.backends import host
from tullax.backends.base import Signature
from tullax.errors import TullaxError
from tullax.spec.ir import Spec

if TYPE_CHECKING:  # the loop IR only where a kernel is lowered: a warm process running XLA never imports it
    from tullax.compiler.loops import LoopKernel

LIBRARY_PREFIX = "kernels-"  # + the first 16 hex digits of the source's sha256 + ".so"


def library_file(source: str) -> str:
    """The library's file name in the entry: named by the source it was compiled from, so a source rewritten in
    the same entry (another tullax version printed it) never runs a library compiled from the old one."""
    return f"{LIBRARY_PREFIX}{hashlib.sha256(source.encode('utf-8')).hexdigest()[:16]}.so"


# The code whose output is the module's source: the spec front end and gradients, the lowering, the printers,
# and this backend's generating side. Its fingerprint is in the cache key, so an edited generator (a development
# checkout, an upgrade that keeps the version number) never loads a library printed by the old one.
_GENERATOR_PACKAGES = ("spec", "grad", "compiler", "printers")
_GENERATOR_MODULES = ("backends/c/generate.py", "backends/host.py", "backends/base.py")


@functools.cache
def generator_fingerprint() -> str:
    """The fingerprint of this installation's generating modules (~2 ms, once per process)."""
    from pathlib import Path

    return fingerprint_of(Path(__file__).resolve().parents[2])


def fingerprint_of(root: Any) -> str:
    """A sha256 of the generating modules' source files (names and contents) in the package tree ``root``."""
    files = [f for package in _GENERATOR_PACKAGES for f in sorted((root / package).rglob("*.py"))]
    digest = hashlib.sha256()
    for path in files + [root / name for name in _GENERATOR_MODULES]:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:24]


# =============================================================================================
# The module: forward and every gradient step
# =============================================================================================
def step_signature(step: Spec, signature: Signature, forward: Spec) -> Signature:
    """The signature a gradient step is called with: each input the forward spec has keeps its dtype there, the
    cotangent (and any intermediate) has the result's dtype, and so has the step's result."""
    dtypes = dict(zip(forward.input_names, signature.in_dtypes))
    return Signature(tuple(dtypes.get(name, signature.out_dtype) for name in step.input_names), signature.out_dtype)


FORWARD, STEPS = "forward", "steps"  # the two modules of a spec: its forward kernel, and its gradient steps


# Row streams (max/min reductions over long rows reading several rows at once) only where this is "1": they win on
# some CPUs and lose more on others, where several concurrent streams per core read slower (benchmarks/row_streams.py,
# benchmarks/results/row_streams.json and row_streams_zen5.json).
STREAMS_ENV = "TULLAX_C_STREAMS"


def streams() -> bool:
    """Whether max/min reductions read several long rows at once (``$TULLAX_C_STREAMS`` is "1")."""
    return settings.value(STREAMS_ENV)


def lowered(spec: Spec, signature: Signature, name: str, streams: bool = False) -> LoopKernel:
    """``spec`` lowered as the C printer wants it: strip-mined tiles (``tile``), and with ``streams`` max/min
    reductions that read several contiguous rows at once (its lanes take one accumulator per row), and register
    strips (``tullax.compiler.strips``: a strip-mined kernel's row segments in vector registers)."""
    from tullax.compiler.lower import lower

    return lower(spec, signature, name, tile=True, streams=streams, strips=True)


def part_kernels(spec: Spec, signature: Signature, part: str) -> tuple[tuple[LoopKernel, Spec, Signature], ...]:
    """The kernels of one module of ``spec``, with the spec and signature each serves: ``FORWARD``, the forward
    kernel; ``STEPS``, each gradient step that lowers (none for integer results, which have no gradient); row
    streams as ``streams()`` says now."""
    return _part_kernels(spec, signature, part, streams())


@functools.lru_cache(maxsize=256)  # generating and loading a module both need them: lower once
def _part_kernels(spec: Spec, signature: Signature, part: str,
                  streamed: bool) -> tuple[tuple[LoopKernel, Spec, Signature], ...]:
    if part == FORWARD:  # no gradient derived: the forward module is what a forward-only call waits for
        return ((lowered(spec, signature, host.FORWARD_KERNEL, streamed), spec, signature),)
    if not has_gradients(signature):
        return ()
    kernels = []
    for step in host.kernel_steps(spec, signature.out_dtype, signature.in_dtypes)[1:]:
        its_signature = step_signature(step.spec, signature, spec)
        try:
            kernels.append((lowered(step.spec, its_signature, step.name, streamed), step.spec, its_signature))
        except TullaxError:  # built on its own if it is ever called (and then it says why it fails)
            continue
    return tuple(kernels)


def module_kernels(spec: Spec, signature: Signature) -> tuple[tuple[LoopKernel, Spec, Signature], ...]:
    """Every kernel of ``spec``: the forward one, then each gradient step that lowers."""
    return part_kernels(spec, signature, FORWARD) + part_kernels(spec, signature, STEPS)


def has_gradients(signature: Signature) -> bool:
    """Whether a result of this signature has gradient steps: integers have none."""
    return np.dtype(signature.out_dtype).kind not in "iu"


def _printed(kernels: tuple[tuple[LoopKernel, Spec, Signature], ...], plain: bool = False) -> tuple[LoopKernel, str]:
    """The first of ``kernels`` and the translation unit of all of them (``plain``: without vector extensions)."""
    from tullax.printers.c import print_module

    return kernels[0][0], print_module([k for k, _, _ in kernels], plain)


def generate_part(spec: Spec, signature: Signature, part: str, plain: bool = False) -> tuple[LoopKernel, str]:
    """The first kernel of one module of ``spec`` and its translation unit; ``plain``: the fast tier's, which
    any C99 compiler builds (``tullax.backends.c.tiers``)."""
    return _printed(part_kernels(spec, signature, part), plain)


def generate(spec: Spec, signature: Signature) -> tuple[LoopKernel, str]:
    """The forward kernel of ``spec`` and one translation unit of every kernel (what ``module_source`` shows)."""
    return _printed(module_kernels(spec, signature))


def module_source(spec: Spec, dtype: str = "float32") -> str:
    """Every kernel, forward and gradient steps, as one source for display, data and scalars in ``dtype``, index
    arrays int64 (compiled, they are two modules: ``FORWARD`` and ``STEPS``)."""
    return generate(spec, Signature.for_dtype(spec, dtype))[1]
