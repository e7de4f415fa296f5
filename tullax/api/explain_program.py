"""``tullax.explain`` of a program: its statements, how they run (the fusion groups), and every derived
gradient statement in the order reverse accumulation runs them."""
from __future__ import annotations

from typing import Mapping

from tullax.errors import TullaxError
from tullax.spec.program import Program, analyze_program
from tullax.spec.text import format_spec


def explain_program(source: str, ranges: Mapping | None = None, shapes: Mapping | None = None,
                    dtype: str = "float32") -> str:
    program = analyze_program(source, ranges)
    lines = [f"program:   {len(program.statements)} statements; inputs {', '.join(program.inputs) or 'none'}; "
             f"returns {', '.join(program.outputs)}"]
    for st in program.statements:
        came = [f"{n} (statement {program.producer(n).number})" for n in st.reads if program.producer(n)]
        flow = f"   reads {', '.join(came)}" if came else ""
        lines.append(f"  {st.number}. {'local ' if st.local else ''}{st.canonical}{flow}")
    if program.step is not None:
        return "\n".join(lines + _scan_step_lines(program, dtype))
    lines += _fusion_lines(program, dtype)
    lines += _gradient_lines(program)
    lines += _plan_lines(program, shapes, dtype)
    return "\n".join(lines)


def _scan_step_lines(program: Program, dtype: str) -> list[str]:
    """A scan whose step is the program's statements (``tullax.compiler.scan_program``)."""
    from tullax.compiler.fuse import NotFusable
    from tullax.compiler.scan_program import fuse_scan_program

    step = program.statements[program.step.number - 1]
    lanes = [n for n in step.spec.free if n != program.step.scan.index]
    try:
        fused = fuse_scan_program(program, dtype)
        hoisted = sum(1 for s in fused.kernel.body[0].body if type(s).__name__ == "Buffer") - sum(
            1 for st in program.statements if st.local and len(st.spec.free) > len(step.spec.free))
        how = (f"one kernel on c and numba: a parallel loop over {', '.join(lanes) or 'nothing'}, then ONE sequential "
               f"loop over {program.step.scan.index} running statements 1-{step.number} at every step (locals "
               f"recomputed per step, never arrays); {max(hoisted, 0)} terms every step would recompute computed "
               f"once before it")
    except NotFusable as why:
        how = f"not fused ({why}): the program's lax.scan lowering runs"
    return [f"scan step:  statements 1-{step.number}, {step.spec.scan.clause()} (depth {program.step.scan.depth})",
            f"  {how}", "  xla: one lax.scan whose step runs the statements in order",
            ] + _scan_gradient_lines(program)


def _scan_gradient_lines(program: Program) -> list[str]:
    """The derived reverse-scan adjoint's statements (``tullax.grad.scan_program``), or why JAX differentiates."""
    from tullax.grad.scan_program import derive_scan_adjoint

    try:
        adjoint = derive_scan_adjoint(program)
    except TullaxError as why:
        return [f"gradients: JAX's derivative of that lax.scan ({str(why).splitlines()[0]})"]
    return ["gradients: reverse mode runs the derived adjoint on c and auto (with fuse='grad' on numba and xla too; "
            "fuse=False, and forward mode, differentiate the lax.scan):"
            ] + adjoint.statements()


def _fusion_lines(program: Program, dtype: str) -> list[str]:
    """One fused kernel over the rows (``tullax.compiler.fuse``) on the host backends, or one kernel per statement
    and why; with ``fuse='grad'``, the gradient programs that fuse."""
    from tullax.compiler.fuse import NotFusable, fuse_program

    try:
        fused = fuse_program(program, dtype)
    except NotFusable as why:
        return ["fusion groups: one kernel per statement, in program order (not fused: " + str(why) + ")"] + [
            f"  [{st.number}] {st.out}" for st in program.statements]
    numbers = ", ".join(str(st.number) for st in program.statements)
    stitched = fused.program or program  # a repeated term may be a local of its own (``fuse_terms``)
    rows = [st.out for st in stitched.statements if st.local and len(st.spec.free) == len(fused.rows)]
    buffers = [st.out for st in stitched.statements if st.local and len(st.spec.free) > len(fused.rows)]
    lines = ["fusion groups: one fused kernel on c and numba (the xla backend runs the statements as jnp)",
             f"  [{numbers}] one parallel loop over the rows {', '.join(fused.rows)}"
             + (f"; locals {', '.join(rows)} per-row variables" if rows else "")
             + (f"; {', '.join(buffers)} row buffers" if buffers else "") + ", never arrays"]
    if stitched is not program:
        lines += ["  terms shared (each computed once per element):"] + [
            f"    {'local ' if st.local else ''}{st.canonical}" for st in stitched.statements]
    if len(program.outputs) > 1:
        lines.append(f"  outputs {', '.join(program.outputs)} written by the one kernel; their gradients run "
                     "unfused")
        return lines
    try:
        from tullax.api.fused_grad import analyzed_gradients
        from tullax.api.kernel import Kernel

        specs = tuple(Kernel(st.text, backend="xla").grad_specs for st in program.statements)
        grads = analyzed_gradients(program, specs, fused.rows)
        for name, grad in grads.items():
            lines.append(f"  fuse='grad': Δ{name} is one fused kernel over the same rows:")
            lines += [f"    {'local ' if st.local else ''}{st.canonical}" for st in grad.statements]
        lines += _tail_lines(program, specs, fused.rows, tuple(n for n in program.inputs if n not in grads))
    except TullaxError as err:  # a statement without gradients: the call's gradients run unfused
        lines.append(f"  fuse='grad': the gradients run unfused ({err})")
    return lines


def _tail_lines(program: Program, specs: tuple, rows: tuple[str, ...], rest: tuple[str, ...]) -> list[str]:
    """The gradient tails of the inputs no gradient program covers (``tullax.api.fused_grad.gradient_tails``)."""
    from tullax.api.fused_grad import gradient_tails

    tails = gradient_tails(program, specs, rows, rest) if rest else None
    if tails is None:
        return [f"  fuse='grad': Δ{', Δ'.join(rest)} run the unfused statements' gradients"] if rest else []
    lines = []
    if tails.rows:
        lines.append(f"  fuse='grad': one row program returns {', '.join(tails.outputs)} for the tails:")
        lines += [f"    {line}" for line in tails.rows.splitlines()]
    lines.append("  fuse='grad': then each partial one statement (an input's partials added):")
    lines += [f"    {text}" for texts in tails.partials.values() for text in texts]
    return lines


def _gradient_lines(program: Program) -> list[str]:
    from tullax.grad import gradients

    lines = ["gradients (reverse accumulation, last statement first):"]
    for st in reversed(program.statements):
        sources = [f"statement {c.number}" for c in program.consumers(st.out)]
        if not st.local:
            sources.insert(0, "the caller")
        lines.append(f"  Δ{st.out} = sum of the cotangents from {', '.join(sources)}")
        try:
            found = gradients(st.spec)
        except ValueError as err:
            lines.append(f"    (no gradients: {err})")
            continue
        for grad in found:
            steps = "; ".join(format_spec(step) for step in grad.steps)
            lines.append(f"    -> Δ{grad.wrt}: {steps}")
    return lines


def _plan_lines(program: Program, shapes: Mapping | None, dtype: str) -> list[str]:
    from tullax.planner.explain import explain_lines

    lines = []
    for st in program.statements:
        own = None
        if shapes is not None and all(n in shapes for n in st.spec.input_names if st.spec.input(n).kind != "scalar"):
            own = {n: shapes[n] for n in st.spec.input_names if n in shapes}
        lines.append(f"statement {st.number}, " + "\n".join(explain_lines(st.spec, own, dtype)))
    return lines
