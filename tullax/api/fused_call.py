"""A program run fused (``tullax.compiler.fuse``): its one loop kernel on the host backend, inside JAX.

The forward is a ``pure_callback`` into the fused kernel (``tullax.backends.program_host``), wrapped in a
``custom_jvp`` whose rule is the JVP of the unfused program (its statements' kernels, which JAX linearises and
transposes): a forward call runs the one fused kernel; ``jax.grad``, ``jacfwd`` and higher orders run the
statements' derived gradient kernels by reverse accumulation, exactly as unfused (the gradient program is not
fused yet).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tullax.backends.program_host import size_values
from tullax.compiler.fuse import Fused, NotFusable, fuse_program
from tullax.spec.program import Program

FUSED_BACKENDS = ("c", "numba")


class FusedProgram:
    """The fused forms of one program on ``backend``, one per data dtype (or the reason it does not fuse)."""

    def __init__(self, program: Program, backend: str, gradients: bool = False, ranges: Any = None,
                 make_kernel: Callable[[str], Any] | None = None, rows: tuple[str, ...] | None = None):
        self.program, self.backend, self.gradients = program, backend, gradients
        self.rows = rows  # the rows of the parallel nest, where the locals do not say (``fuse_program``'s)
        self.ranges = ranges
        self.make_kernel = make_kernel  # program text -> its kernel (the gradient programs' ProgramKernel)
        self._fused: dict[str, Fused | str] = {}
        self._gradient_kernels: dict[str, Any] | None = None
        self._tails: dict[tuple[str, ...], Any] = {}
        self.tails = True  # False: the inputs no gradient program covers run the unfused statements' gradients

    def fused(self, dtype: str) -> Fused | None:
        found = self._fused.get(dtype)
        if found is None:
            try:
                if self.program.step is not None:  # a scan whose step is several statements
                    from tullax.compiler.scan_program import fuse_scan_program

                    found = fuse_scan_program(self.program, dtype, "program")
                else:
                    # Numba compiles a row tile's copies for long (a gradient's row program: tens of seconds);
                    # the row tile is the c backend's
                    found = fuse_program(self.program, dtype, "program", ranges=self.ranges,
                                         row_tile=None if self.backend == "c" else 1, rows=self.rows)
            except NotFusable as why:
                found = str(why)
            self._fused[dtype] = found
        return found if isinstance(found, Fused) else None

    def reason(self, dtype: str) -> str:
        """Why the program does not fuse for ``dtype`` ("" where it does)."""
        self.fused(dtype)
        found = self._fused[dtype]
        return found if isinstance(found, str) else ""

    def gradient_kernels(self, grad_specs: Any) -> dict[str, Any]:
        """Row-wise input -> its gradient program as a (fused) ``ProgramKernel`` (``tullax.api.fused_grad``)."""
        if self._gradient_kernels is None:
            from tullax.api.fused_grad import analyzed_gradients
            from tullax.compiler.fuse import row_indices

            found = {}
            try:
                rows = row_indices(self.program)
                programs = analyzed_gradients(self.program, grad_specs, rows, self.ranges)
            except NotFusable:
                programs = {}
            for name, program in programs.items():
                if self.make_kernel is not None:
                    found[name] = self.make_kernel(program.source)
            self._gradient_kernels = found
        return self._gradient_kernels

    def gradient_tails(self, grad_specs: Any, inputs: tuple[str, ...]) -> tuple[Any, tuple[str, ...], dict] | None:
        """The kernels of ``inputs``' gradient tails (``tullax.api.fused_grad.gradient_tails``): the row program's
        (None where the tails read nothing of the rows), its outputs' names, and input -> its partials' kernels;
        None where the tails do not cover them all."""
        if inputs not in self._tails:
            from tullax.api.fused_grad import gradient_tails
            from tullax.compiler.fuse import row_indices
            from tullax.errors import TullaxError

            found = None
            try:
                tails = gradient_tails(self.program, grad_specs, row_indices(self.program), inputs)
                if tails is not None and self.make_kernel is not None:
                    found = (self.make_kernel(tails.rows) if tails.rows else None, tails.outputs,
                             {name: [self.make_kernel(text) for text in texts]
                              for name, texts in tails.partials.items()})
            except TullaxError:  # NotFusable, or a tail that does not analyse: those inputs run unfused
                found = None
            self._tails[inputs] = found
        return self._tails[inputs]

    def call(self, env: dict[str, Any], unfused: Callable[..., Any], grad_specs: Any = None) -> Any | None:
        """The program's output on the values of ``env`` (input name -> value), or None where it does not fuse
        (mixed or non-float dtypes, or a program of another shape): the caller runs it unfused."""
        import jax
        import jax.numpy as jnp

        from tullax.backends.program_host import host_program

        names = self.program.inputs
        kinds = {i.name: i.kind for st in self.program.statements for i in st.spec.inputs}
        arrays = [n for n in names if kinds.get(n) != "scalar"]
        dtypes = {np.dtype(getattr(env[n], "dtype", np.float64)).name for n in arrays}
        if len(dtypes) != 1 or not dtypes <= {"float32", "float64"}:
            return None
        dtype = dtypes.pop()
        fused = self.fused(dtype)
        if fused is None:
            return None
        kernel = fused.kernel
        host = host_program(self.backend, kernel)
        values = [jnp.asarray(env[n], dtype) for n in names]
        shapes = fused.shapes({n: tuple(np.shape(v)) for n, v in zip(names, values)})
        if fused.check(dict(zip((s.name for s in kernel.sizes), size_values(kernel, shapes)))):
            return None  # the unfused statements say what is wrong with the shapes
        several = len(fused.outputs) > 1  # several returned outputs: one fused call returns them all, a tuple
        structs = tuple(jax.ShapeDtypeStruct(shapes[name], dtype) for name in fused.outputs)
        result = structs if several else structs[0]

        def run(*given: Any) -> Any:
            outs = tuple(np.empty(s.shape, dtype) for s in structs)
            host(outs if several else outs[0], dict(zip(names, given)), shapes)
            return outs if several else outs[0]

        @jax.custom_batching.custom_vmap
        def one_call(*given: Any) -> Any:
            if self.backend == "c":  # XLA's custom call into the kernel, as a c kernel's own
                found = host.ffi_call(names, given, shapes, result)
                if found is not None:
                    return found
            return jax.pure_callback(run, result, *given, vmap_method="sequential")

        @one_call.def_vmap
        def _batched(size: int, batched: list[bool], *given: Any) -> tuple[Any, bool]:
            # a batch of programs runs as the unfused statements, which batch as kernels do
            axes = [0 if b else None for b in batched]
            found = jax.vmap(unfused, in_axes=axes, axis_size=size)(*given)
            return found, jax.tree_util.tree_map(lambda _: True, found)

        if self.gradients and grad_specs is not None and not several and not _forward_mode(values):
            return self._with_fused_gradients(one_call, unfused, grad_specs, values)

        @jax.custom_jvp
        def program(*given: Any) -> Any:
            return one_call(*given)

        @program.defjvp
        def _jvp(primals: tuple, tangents: tuple) -> tuple[Any, Any]:
            return jax.jvp(unfused, primals, tangents)

        return program(*values)

    def _with_fused_gradients(self, one_call: Callable[..., Any], unfused: Callable[..., Any], grad_specs: Any,
                              values: list[Any]) -> Any:
        """Reverse mode through the fused gradient programs: each row-wise input's cotangent is one fused kernel;
        the others (reducing over the rows: a gain, a bias, a scalar) run as the unfused statements' gradients
        with the row-wise inputs held constant. A ``custom_vjp``, which JAX cannot differentiate forwards: a call
        whose inputs carry forward-mode tangents (jvp, jacfwd, a Hessian's outer jacfwd) takes the custom_jvp
        path instead (``_forward_mode``); one reached through a jit traced first without them still cannot."""
        import jax

        names = self.program.inputs
        grads = self.gradient_kernels(grad_specs)
        cotangent = f"Δ{self.program.outputs[0]}"

        @jax.custom_vjp
        def program(*given: Any) -> Any:
            return one_call(*given)

        def forward(*given: Any) -> tuple[Any, tuple]:
            return one_call(*given), given

        def backward(given: tuple, ct: Any) -> tuple:
            env = dict(zip(names, given))
            found = {name: kernel(**{n: ct if n == cotangent else env[n] for n in kernel.inputs})
                     for name, kernel in grads.items()}
            rest = [n for n in names if n not in found]
            if rest:
                if self.tails:
                    found.update(_tails(self.gradient_tails(grad_specs, tuple(rest)), {**env, cotangent: ct}, rest))
                rest = [n for n in names if n not in found]
            if rest:
                def part(*others: Any) -> Any:
                    full = {**env, **dict(zip(rest, others))}
                    return unfused(*(full[n] for n in names))
                found.update(zip(rest, jax.vjp(part, *(env[n] for n in rest))[1](ct)))
            return tuple(found[n] for n in names)

        program.defvjp(forward, backward)
        return program(*values)


def _tails(tails: Any, env: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The cotangents of ``names`` through their gradient tails (``FusedProgram.gradient_tails``), or {} where
    there are none, or a partial's result has another shape or dtype than its input."""
    import jax.numpy as jnp

    if tails is None:
        return {}
    rows, outputs, partials = tails
    env = dict(env)
    if rows is not None:
        found = rows(**{n: env[n] for n in rows.inputs})
        env.update(zip(outputs, found if len(outputs) > 1 else (found,)))
    result = {}
    for name in names:
        terms = [kernel(**{n: env[n] for n in kernel.inputs}) for kernel in partials[name]]
        want = jnp.shape(env[name]), jnp.result_type(env[name])
        if any((jnp.shape(t), jnp.result_type(t)) != want for t in terms):
            return {}
        total = terms[0]
        for term in terms[1:]:
            total = total + term
        result[name] = total
    return result


def _forward_mode(values: list[Any]) -> bool:
    """Whether the program is called under forward-mode differentiation (an input is a JVP tracer: ``jax.jvp``,
    ``jacfwd``; reverse mode traces through linearize tracers instead)."""
    from jax.interpreters import ad

    return any(isinstance(v, ad.JVPTracer) for v in values)
