"""``tullax.explain`` of a program: its statements, how they run (the fusion groups), and every derived
gradient statement in the order reverse accumulation runs them."""
from __future__ import annotations

from typing import Mapping

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
    lines.append("fusion groups:")
    lines += [f"  [{st.number}] {st.out}: its own kernel (forward and gradients), run in program order"
              for st in program.statements]
    lines += _gradient_lines(program)
    lines += _plan_lines(program, shapes, dtype)
    return "\n".join(lines)


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
