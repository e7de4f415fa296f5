"""``tullax explain``'s view of the planner: a ``Plan`` in words (``describe``), and the plan of every kernel of a
spec (``explain_lines``): by rule without shapes; with them, the decision the compile cache holds for those shapes
(close calls are not timed here)."""
from __future__ import annotations

from tullax.backends.gpu_select import on_gpu
from tullax.planner import decide, rules, tuning
from tullax.planner.call import Shapes, kernel_shapes
from tullax.planner.rules import Plan, as_plan, loop_backend, rule_for
from tullax.spec.ir import Spec


def describe(found: Plan) -> str:
    """One line: where the kernel runs, by which rule, why, what was timed and where the decision came from."""
    timed = ""
    if found.timings_ms:
        timed = "; timed: " + ", ".join(f"{c} {ms:.3g} ms" for c, ms in found.timings_ms)
    where = {"cache": " (decision from the compile cache)", "timed": " (timed on first use)"}.get(found.source, "")
    return f"{found.label}: {found.rule}: {found.reason}{timed}{where}"


def explain_lines(spec: Spec, shapes: Shapes | None = None, dtype: str = "float32") -> list[str]:
    """What ``auto`` runs each kernel of ``spec`` on, and why: by rule without ``shapes``; with them, the
    decision for those shapes when the compile cache holds one (close calls are not timed here)."""
    from tullax.backends.host import kernel_steps
    from tullax.backends.workload import serial_threshold

    loops = loop_backend((dtype,))
    where = "a GPU" if on_gpu() else "the CPU"
    lines = [f"plan (backend='auto' on {where}; loop backend: {loops or 'none'}):"]
    tiny_on = "its rule's default, untimed" if rules.whole_module_cached(loops) else "XLA"
    lines.append(f"  (a call below {serial_threshold()} estimated operations runs on {tiny_on}: rule 'tiny')")
    if shapes is None:
        for step in kernel_steps(spec):
            rule = rule_for(step.spec, loops)
            chosen = as_plan(rule.default, loops, rule)
            close = f"; close call, timed on first use where cheap: {', '.join(rule.close)}" if rule.close else ""
            lines.append(f"  {step.label}: {text(step.spec)}")
            lines.append(f"    -> {chosen.label}: {rule.name}: {rule.reason}{close}")
        return lines
    # the dtype jax gives an integer index array (int32 unless x64 is on): the key a real call's decision is
    # stored under
    import jax
    import numpy as np

    from tullax.grad.run import zero_start_steps

    index_dtype = np.dtype(jax.dtypes.canonicalize_dtype(np.int64)).name
    from_zeros = zero_start_steps(spec)
    for label, step, step_shapes in kernel_shapes(spec, shapes):
        dtypes = {item.name: (index_dtype if item.kind == "index" else dtype) for item in step.inputs}
        listed = ", ".join(f"{n} {'x'.join(map(str, s)) or 'scalar'}" for n, s in step_shapes.items())
        zeros = ", from zeros" if step in from_zeros else ""
        lines.append(f"  {label}: {text(step)}  [{listed}{zeros}]")
        found = decide.plan(step, step_shapes, dtypes, timing=False, zero_start=step in from_zeros)
        lines.append(f"    -> {describe(found)}")
    forward_dtypes = {item.name: (index_dtype if item.kind == "index" else dtype) for item in spec.inputs}
    wrt = [item.name for item in spec.inputs if item.kind in ("array", "scalar")]
    joined = decide.joint_plans(spec, shapes, forward_dtypes, dtype, wrt, timing=False)
    if joined:
        moved = ", ".join(text(k) for k, p in joined.items() if decide.JOINED in p.reason)
        lines.append(f"  differentiated w.r.t. every input: one XLA program (each kernel runs on XLA or its loops won "
                     f"by less than {tuning.JOINT_MARGIN}x); moved to XLA: {moved}")
    return lines


def text(spec: Spec) -> str:
    from tullax.spec.text import format_spec

    return format_spec(spec)
