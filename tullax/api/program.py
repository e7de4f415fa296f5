"""The public ``ProgramKernel``: a program (``tullax.spec.program``) run as its statements in order.

Each statement is an ordinary ``Kernel`` on the program's backend (its forward and gradient kernels, its
planning under ``auto``); locals are temporaries passed from statement to statement. Under ``jax.grad`` the
composition is reverse accumulation over the statements: each statement's VJP runs its derived gradient specs,
and the cotangent of a local read by several later statements is the sum of theirs (JAX adds them).
"""
from __future__ import annotations

from functools import cached_property
from typing import Any, Iterable, Mapping

from tullax.api.kernel import Kernel
from tullax.errors import ShapeError
from tullax.spec.program import Program, analyze_program, statement_ranges

DEFAULT_ADJOINT_BACKENDS = ("c", "auto")  # a scan program's derived adjoint without fuse='grad'


class ProgramKernel:
    """A compiled program. Call it with its external inputs positionally (in order of first appearance) or by
    name; it returns the non-local outputs (one output: the array, several: a tuple). ``rows``: the indices the
    fused kernel runs in parallel over, where its locals do not say (a scan adjoint's row program)."""

    def __init__(self, source: str, *, backend: str = "auto", ranges: Mapping | None = None,
                 nograd: str | Iterable[str] = (), fuse: bool | str = True, rows: tuple[str, ...] | None = None):
        self.source = source
        self.program: Program = analyze_program(source, ranges)
        skip = {nograd} if isinstance(nograd, str) else set(nograd)
        unknown = skip - set(self.program.inputs)
        if unknown:
            raise ShapeError(f"nograd names {sorted(unknown)}, which are not inputs of the program "
                             f"(inputs: {', '.join(self.program.inputs)})")
        # a scan whose step is several statements has no statement-by-statement form: its unfused form is its
        # lax.scan lowering (``tullax.backends.xla.scan_program``: every derivative and batch runs through it)
        self._scan = None if self.program.step is None else _scan_lowering(self.program, skip)
        self.kernels = () if self._scan is not None else tuple(
            Kernel(st.text, backend=backend, ranges=statement_ranges(st.text, ranges),
                   nograd=tuple(n for n in st.reads if n in skip))
            for st in self.program.statements)
        self.backend_name = backend
        # a row-wise program runs as one fused kernel on the host backends (tullax.api.fused_call: imported here,
        # as it brings the loop IR, which `import tullax` and resolving a backend do not need)
        from tullax.api.fused_call import FUSED_BACKENDS, FusedProgram

        fused_on = "c" if backend == "auto" else backend
        if fuse not in (True, False, "grad"):
            raise ShapeError(f"fuse= takes True (the forward fused), 'grad' (reverse-mode gradients fused too) or "
                             f"False, not {fuse!r}")
        self.fusion = (FusedProgram(self.program, fused_on, gradients=fuse == "grad" and not skip
                                    and self.program.step is None, ranges=ranges,
                                    make_kernel=lambda text: ProgramKernel(text, backend=fused_on, ranges=ranges),
                                    rows=rows)
                       if fuse and fused_on in FUSED_BACKENDS else None)
        # under auto the program is planned as one unit: the fused kernel against the program's XLA lowering
        self._xla = ProgramKernel(source, backend="xla", ranges=ranges, nograd=nograd) if (
            backend == "auto" and self.fusion is not None) else None
        self.plans: dict[tuple, tuple[str, list]] = {}  # call shapes and dtypes -> (winner, timings)
        # a scan program's reverse mode: its derived adjoint's kernels (``tullax.api.scan_adjoint``), by default on
        # c and auto (where it was measured faster than JAX's derivative of the lax.scan lowering), with
        # fuse='grad' on numba and xla too (measured slower there: benchmarks/results/loop7024-adjoint-numba-xla.json)
        self.gradient = _scan_gradient(self.program, backend, ranges, frozenset(skip)) if (
            fuse == "grad" or (fuse and backend in DEFAULT_ADJOINT_BACKENDS)) else None

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.program.inputs

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.program.outputs

    @property
    def spec(self) -> str:
        """The canonical program: one canonical statement per line, ``local`` where written."""
        return "\n".join(("local " if st.local else "") + st.canonical for st in self.program.statements)

    @cached_property
    def grad_specs(self) -> tuple[tuple[str, ...], ...]:
        """Per statement (in program order), the gradient specs its VJP runs."""
        return tuple(k.grad_specs for k in self.kernels)

    def __repr__(self) -> str:
        return f"tullax.ProgramKernel({self.spec!r}, backend={self.backend_name!r})"

    def __call__(self, *args: Any, **named: Any) -> Any:
        env = _bind(self.program, args, named)
        if self.gradient is not None and self.gradient.adjoint is not None:
            from tullax.api.fused_call import _forward_mode

            names = self.program.inputs
            values = [env[n] for n in names]
            if not _forward_mode(values):
                return self.gradient.call(lambda *given: self._forward(dict(zip(names, given))), values)
        return self._forward(env)

    def _forward(self, env: dict[str, Any]) -> Any:
        if self.fusion is not None and self._planned(env) != "xla":
            found = self.fusion.call(env, self._unfused, self.grad_specs if self.fusion.gradients else None)
            if found is not None:
                return found
        if self._xla is not None:
            return self._xla(**env)
        return self._run(env)

    def _planned(self, env: dict[str, Any]) -> str:
        """Under auto: which of the fused kernel and the XLA lowering runs calls like this one (timed once)."""
        if self._xla is None or self.fusion is None:
            return "fused"
        from tullax.api.program_plan import decide, plan_key

        names = self.program.inputs
        key = plan_key(names, env)
        if key not in self.plans:
            fusion, xla = self.fusion, self._xla

            def fused(*values: Any) -> Any:
                found = fusion.call(dict(zip(names, values)), self._unfused)
                return xla(*values) if found is None else found
            self.plans[key] = decide(names, env, fused, xla)
        return self.plans[key][0]

    def _unfused(self, *values: Any) -> Any:
        return self._run(dict(zip(self.program.inputs, values)))

    def _run(self, env: dict[str, Any]) -> Any:
        if self._scan is not None:
            return self._scan(*(env[name] for name in self.program.inputs))
        for st, kernel in zip(self.program.statements, self.kernels):
            env[st.out] = kernel(*(env[name] for name in st.reads))
        found = tuple(env[name] for name in self.program.outputs)
        return found[0] if len(found) == 1 else found


def _scan_gradient(program: Program, backend: str, ranges: Mapping | None, skip: frozenset[str]) -> Any:
    """A scan program's derived reverse mode on the host backends and xla (None elsewhere: JAX differentiates
    the lax.scan lowering); its kernels run on ``backend`` (auto: c)."""
    from tullax.api.scan_adjoint import ADJOINT_BACKENDS, ScanProgramGradient

    if program.step is None or backend not in ADJOINT_BACKENDS:
        return None
    on = "c" if backend == "auto" else backend
    return ScanProgramGradient(program, lambda text, more=None, rows=None: ProgramKernel(
        text, backend=on, ranges={**(ranges or {}), **(more or {})} or None, rows=rows), ranges, skip)


def _scan_lowering(program: Program, skip: set[str]) -> Any:
    """A scan program's lax.scan lowering, its ``nograd`` inputs held constant."""
    from tullax.backends.xla.scan_program import lower_scan_program

    run = lower_scan_program(program)
    if not skip:
        return run
    import jax

    held = [name in skip for name in program.inputs]
    return lambda *values: run(*(jax.lax.stop_gradient(v) if h else v for v, h in zip(values, held)))


def _bind(program: Program, args: tuple, named: dict) -> dict[str, Any]:
    names = program.inputs
    if len(args) > len(names):
        raise ShapeError(f"the program takes {len(names)} inputs ({', '.join(names)}), got {len(args)} positional")
    env = dict(zip(names, args))
    for name, value in named.items():
        if name not in names:
            raise ShapeError(f"the program has no input {name!r} (inputs: {', '.join(names)})")
        if name in env:
            raise ShapeError(f"input {name!r} given twice (positionally and by name)")
        env[name] = value
    missing = [n for n in names if n not in env]
    if missing:
        raise ShapeError(f"missing input(s) {', '.join(missing)}: the program's inputs are {', '.join(names)}")
    return env

