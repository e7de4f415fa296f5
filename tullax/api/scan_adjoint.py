"""A scan program's reverse mode through its derived adjoint (``tullax.grad.scan_program``): a ``custom_vjp``
whose backward runs the adjoint program (one reverse-scan kernel: the step's locals recomputed per step) and then
the gradients of the flat program with the adjoint's cotangent (parallel kernels over every step at once).

Forward mode (``jvp``, ``jacfwd``, a Hessian's outer ``jacfwd``), whose tracers a ``custom_vjp`` cannot take,
and the programs whose adjoint is not derived run the forward unwrapped: JAX differentiates its ``lax.scan``
lowering (or the fused kernel's ``custom_jvp``, which is that lowering's). Higher orders of reverse mode
differentiate the backward's own kernels.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from tullax.errors import TullaxError
from tullax.spec.program import Program

ADJOINT_BACKENDS = ("c", "numba", "xla", "auto")


class ScanProgramGradient:
    """The derived reverse mode of one scan program; its kernels built by ``make_kernel(text)`` on first use."""

    def __init__(self, program: Program, make_kernel: Callable[[str], Any], ranges: Mapping | None = None,
                 skip: frozenset[str] = frozenset()):
        from tullax.grad.scan_program import derive_scan_adjoint

        self.program, self.make_kernel, self.skip = program, make_kernel, skip
        try:
            self.adjoint = derive_scan_adjoint(program, ranges)
            self.reason = ""
        except TullaxError as why:  # NotDerived, or a derived statement the program analysis refuses
            self.adjoint, self.reason = None, str(why).split("\n")[0]
        self._kernels: tuple[Any, Any] | None = None

    def kernels(self) -> tuple[Any, Any]:
        """(the adjoint program's kernel, the flat program's kernel)."""
        if self._kernels is None:
            self._kernels = (self.make_kernel(self.adjoint.adjoint), self.make_kernel(self.adjoint.flat))
        return self._kernels

    def call(self, forward: Callable[..., Any], values: list[Any]) -> Any:
        """``forward(*values)`` with the derived adjoint as its reverse mode."""
        import jax

        names = self.program.inputs

        @jax.custom_vjp
        def program(*given: Any) -> Any:
            return forward(*given)

        def fwd(*given: Any) -> tuple[Any, tuple]:
            out = forward(*given)
            return out, (given, out)

        def bwd(saved: tuple, ct: Any) -> tuple:
            given, out = saved
            found = self.backward(dict(zip(names, given)), out, ct)
            return tuple(found[n] for n in names)

        program.defvjp(fwd, bwd)
        return program(*values)

    def backward(self, env: dict[str, Any], out: Any, ct: Any) -> dict[str, Any]:
        """Every input's cotangent, given the inputs, the forward's result and its cotangent."""
        import jax
        import jax.numpy as jnp

        a = self.adjoint
        adjoint, flat = self.kernels()
        ct = jnp.asarray(ct, out.dtype)
        init = env[a.init] if a.init else jnp.zeros(_without(out.shape, a.axis), out.dtype)
        previous = _shift(out, jnp.asarray(init, out.dtype), a.axis, a.reverse)
        given = {**env, a.previous: previous, a.seed: ct, a.out: out}
        state = adjoint(**{n: given[n] for n in adjoint.inputs})
        g = ct + _shift(state, jnp.zeros(_without(out.shape, a.axis), out.dtype), a.axis, not a.reverse)
        wrt = [n for n in flat.inputs if n in env and n not in self.skip]
        fixed = {n: given[n] for n in flat.inputs}

        def run(*values: Any) -> Any:
            return flat(**{**fixed, **dict(zip(wrt, values))})

        found = dict(zip(wrt, jax.vjp(run, *(fixed[n] for n in wrt))[1](g)))
        if a.init and a.init not in self.skip:
            first = out.shape[a.axis] - 1 if a.reverse else 0
            found[a.init] = jnp.take(state, first, axis=a.axis).astype(jnp.result_type(env[a.init]))
        return {n: found[n] if n in found else jnp.zeros_like(env[n]) for n in env}


def _without(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return shape[:axis] + shape[axis + 1:]


def _shift(x: Any, edge: Any, axis: int, reverse: bool) -> Any:
    """``x`` one step along ``axis`` later (``reverse``: earlier), ``edge`` at the position that opens."""
    import jax
    import jax.numpy as jnp

    edge = jnp.expand_dims(edge, axis)
    n = x.shape[axis]
    if reverse:
        return jnp.concatenate([jax.lax.slice_in_dim(x, 1, n, axis=axis), edge], axis=axis)
    return jnp.concatenate([edge, jax.lax.slice_in_dim(x, 0, n - 1, axis=axis)], axis=axis)


__all__ = ["ScanProgramGradient", "ADJOINT_BACKENDS"]
