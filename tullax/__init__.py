"""tullax: compute kernels in index notation, with fast forward AND backward kernels, as JAX operations.

    dist = tullax.einsum_kernel("D[i,j] := (W[k,i] - X[k,j])^2")
    D = jax.jit(dist)(W, X)

Importing tullax loads neither numba, nor juliacall, nor jax: each is imported when first needed.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from tullax._version import __version__
from tullax.api.explain import explain
from tullax.api.kernel import Kernel
from tullax.api.program import ProgramKernel
from tullax.errors import (
    BackendUnavailableError,
    ShapeError,
    SpecError,
    TullaxError,
)
from tullax.spec.program import is_program

__all__ = [
    "__version__", "einsum_kernel", "explain", "generate_source", "warm", "Kernel", "ProgramKernel", "TullaxError",
    "SpecError", "ShapeError", "BackendUnavailableError",
]


def einsum_kernel(spec: str, *, backend: str = "auto", ranges: Mapping | None = None, init: Any = None,
                  nograd: str | Iterable[str] = (), algebra: str | None = None,
                  fuse: bool | str = True) -> "Kernel | ProgramKernel":
    """Compile ``spec`` (docs/design.md, section 1) into a Kernel running on ``backend``: 'auto' (the planner: loops or
    an XLA form per kernel), 'c' (host C/OpenMP, the CPU default), 'numba', 'julia', 'julia-cuda', 'cuda'
    (CUDA C through NVRTC) or 'xla' (plain jnp, the oracle). ``ranges`` gives index ranges explicitly:
    ``{"i": 10}`` or ``{"i": (2, 12)}``; ``init`` is the starting value of the reduction (Tullio's ``init=``);
    ``nograd`` names inputs that get no gradient (``jax.grad`` gives zeros for them). See ``tullax.api.options``.
    ``algebra="expand"`` (an opt-in, as Tullio's ``fastmath``) lets a polynomial body summed over an index run
    multiplied out, as contractions: ``(W[k,i] - X[k,j])^2`` as row norms and one GEMM, on 'auto' (raced against
    the loops, for the forward kernel and each gradient step) or 'xla' (always); it rounds differently, with
    cancellation when points are close (docs/backends.md, "Expanding polynomial bodies").
    Several statements (one per line or separated by ';', ``local`` before an intermediate) make a program:
    ``tullax.api.program.ProgramKernel``; ``fuse`` (programs only): True runs a row-wise program as one fused
    kernel, "grad" fuses its reverse-mode gradients too, False runs each statement as its own kernel."""
    if is_program(spec):
        if init is not None:
            raise SpecError("init= applies to one statement: inside a program write the starting value into the "
                            "statement that needs it")
        if algebra is not None:
            raise SpecError("algebra= applies to one statement: write the statement to expand as a kernel of its own")
        return ProgramKernel(spec, backend=backend, ranges=ranges, nograd=nograd, fuse=fuse)
    if fuse is not True:
        raise SpecError("fuse= applies to programs (several statements); one statement is one kernel already")
    return Kernel(spec, backend=backend, ranges=ranges, init=init, nograd=nograd, algebra=algebra)


def generate_source(spec: str, backend: str = "numba", dtype: str = "float32",
                    ranges: Mapping | None = None, shapes: Mapping | None = None) -> str:
    """The whole generated module (forward and every gradient kernel) of ``spec`` for ``backend``; for
    ``backend="cuda"`` with ``shapes`` (input name -> shape), the kernels launched at those shapes."""
    from tullax.api.source import generate_source as _generate

    return _generate(spec, backend=backend, dtype=dtype, ranges=ranges, shapes=shapes)


def warm(spec: str, backend: str = "auto", dtype: str = "float32", ranges: Mapping | None = None) -> dict:
    """Compile the forward and every gradient kernel of ``spec`` ahead of time into the persistent cache;
    returns the timings recorded."""
    from tullax.api.source import warm as _warm

    return _warm(spec, backend=backend, dtype=dtype, ranges=ranges)


def prepare_exported() -> None:
    """Make this process able to run ``jax.export`` artefacts holding tullax's c kernels (exported elsewhere, with
    ``disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("tullax_c_kernel")]``): registers tullax's XLA
    custom call and builds each kernel an artefact names from the spec its call carries (or the compile cache)."""
    from tullax.backends.c.exported import prepare

    prepare()


__all__ += ["prepare_exported"]
