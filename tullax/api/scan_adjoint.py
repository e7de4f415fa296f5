"""A scan program's reverse mode through its derived adjoint (``tullax.grad.scan_program``): a ``custom_vjp``
whose backward runs the adjoint program (one reverse-scan kernel: the step's locals recomputed per step) and then
the gradients of the flat program with the adjoint's cotangent, over every step at once: its gradient tails over the
scan's rows (``tullax.api.fused_grad.gradient_tails``: one row program for the locals and their cotangents, a
statement per partial), the weights' unary terms hoisted (``tullax.api.hoist_terms``); JAX's VJP of the flat kernel
where the tails do not cover every input.

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

        self.program, self.make_kernel, self.skip, self.ranges = program, make_kernel, skip, ranges
        # the scan statement's indices: the rows of the flat gradient
        self.rows = program.statements[program.step.number - 1].spec.free
        try:
            self.adjoint = derive_scan_adjoint(program, ranges)
            self.reason = ""
        except TullaxError as why:  # NotDerived, or a derived statement the program analysis refuses
            self.adjoint, self.reason = None, str(why).split("\n")[0]
        self._kernels: tuple[Any, Any] | None = None
        self._tails: dict[tuple[str, ...], Any] = {}

    def kernels(self) -> tuple[Any, Any]:
        """(the adjoint program's kernel, the flat program's kernel)."""
        if self._kernels is None:
            self._kernels = (self.make_kernel(self.adjoint.adjoint), self.make_kernel(self.adjoint.flat))
        return self._kernels

    def tails(self, inputs: tuple[str, ...], shapes: Mapping[str, tuple[int, ...]]) -> Any:
        """The flat program's gradient tails of ``inputs`` over the scan's rows (``tullax.api.fused_grad``): one
        row program (the step's locals and their cotangents, computed once per row for every input) and each
        input's partials, one statement each; None where they do not cover every input (then JAX's VJP of the
        flat kernel runs). ``shapes``: every input's shape, which give a partial's own indices their ranges
        (``ΔW1[m,j]``, whose ``m`` no array is indexed by plainly)."""
        key = (inputs, tuple(sorted((n, tuple(shape)) for n, shape in shapes.items())))
        if key not in self._tails:
            from tullax.api.fused_grad import gradient_tails
            from tullax.api.hoist_terms import hoist_terms, unpad
            from tullax.spec.program import analyze_program

            flat = self.kernels()[1]
            found = None
            try:
                program = analyze_program(self.adjoint.flat, self.ranges)
                tails = gradient_tails(program, flat.grad_specs, self.rows, inputs)
                if tails is not None:
                    # a weight's softplus, the same at every step, computed once (``tullax.api.hoist_terms``)
                    order = [(name, k) for name, texts in tails.partials.items() for k in range(len(texts))]
                    # a weight read through pad where these shapes keep it inside (Δu's W1[pad(i+1),j]) read
                    # plainly, so that it is hoisted too
                    hoisted = hoist_terms([tails.rows] + [unpad(tails.partials[n][k], shapes) for n, k in order],
                                          self.rows, program.inputs)
                    rows, texts = hoisted.texts[0], dict(zip(order, hoisted.texts[1:]))
                    # the row program over the scan's rows: its outputs have an index more (``a[b,t,j]``)
                    found = ((self.make_kernel(rows, rows=self.rows) if rows else None, tails.outputs,
                              {name: [self.make_kernel(texts[name, k], _own_ranges(texts[name, k], shapes[name]))
                                      for k in range(len(ts))] for name, ts in tails.partials.items()}), hoisted)
            except TullaxError:  # a partial of another form, or one that does not analyse
                found = None
            self._tails[key] = found
        return self._tails[key]

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

        from tullax.api.fused_call import _tails

        tails = self.tails(tuple(wrt), {n: tuple(jnp.shape(v)) for n, v in env.items()}) if wrt else None
        try:
            found = _tails(tails[0], {**fixed, a.seed: g, **tails[1].values(env)}, wrt) if tails else {}
        except TullaxError:  # a tail's kernel refusing these shapes at trace time: the flat kernel's VJP instead
            found = {}
        if len(found) != len(wrt):  # no tails: the flat kernel's VJP, its statements' gradients one by one
            found = dict(zip(wrt, jax.vjp(run, *(fixed[n] for n in wrt))[1](g)))
        if a.init and a.init not in self.skip:
            first = out.shape[a.axis] - 1 if a.reverse else 0
            found[a.init] = jnp.take(state, first, axis=a.axis).astype(jnp.result_type(env[a.init]))
        return {n: found[n] if n in found else jnp.zeros_like(env[n]) for n in env}


def _own_ranges(text: str, shape: tuple[int, ...]) -> dict[str, int]:
    """A partial ``Δx[m,j] := ...``'s plain result indices -> the input's extents."""
    head = text.split(":=", 1)[0]
    index = head[head.index("[") + 1:head.rindex("]")].split(",") if "[" in head else []
    return {i.strip(): n for i, n in zip(index, shape) if i.strip().isidentifier()}


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
