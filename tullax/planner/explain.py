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


def explain_lines(spec: Spec, shapes: Shapes | None = None, dtype: str = "float32", algebra: str = "") -> list[str]:
    """What ``auto`` runs each kernel of ``spec`` on, and why: by rule without ``shapes``; with them, the
    decision for those shapes when the compile cache holds one (close calls are not timed here). Where a
    kernel's polynomial body expands into contractions, what ``algebra="expand"`` would do (``expansion``)."""
    from tullax.backends.host import kernel_steps
    from tullax.backends.workload import serial_threshold

    loops = loop_backend((dtype,))
    where = "a GPU" if on_gpu() else "the CPU"
    lines = [f"plan (backend='auto' on {where}; loop backend: {loops or 'none'}):"]
    tiny_on = ("its rule's default, untimed, where the loops' module is compiled already (else XLA)"
               if rules.whole_module_cached(loops) else "XLA")
    lines.append(f"  (a call below {serial_threshold()} estimated operations runs on {tiny_on}: rule 'tiny')")
    if shapes is None:
        for step in kernel_steps(spec):
            rule = rule_for(step.spec, loops)
            chosen = as_plan(rule.default, loops, rule)
            raced = rule.close + ((rules.EXPANDED,) if algebra and expansion_line(step.spec, algebra) else ())
            close = f"; close call, timed on first use where cheap: {', '.join(raced)}" if len(raced) > 1 else ""
            lines.append(f"  {step.label}: {text(step.spec)}")
            lines.append(f"    -> {chosen.label}: {rule.name}: {rule.reason}{close}")
            lines += expansion_line(step.spec, algebra)
        return lines + gradient_line(spec, dtype)
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
        found = decide.plan(step, step_shapes, dtypes, timing=False, zero_start=step in from_zeros, algebra=algebra)
        lines.append(f"    -> {describe(found)}")
        lines += expansion_line(step, algebra, step_shapes)
    forward_dtypes = {item.name: (index_dtype if item.kind == "index" else dtype) for item in spec.inputs}
    wrt = [item.name for item in spec.inputs if item.kind in ("array", "scalar")]
    joined = decide.joint_plans(spec, shapes, forward_dtypes, dtype, wrt, timing=False, algebra=algebra)
    if joined:
        moved = ", ".join(text(k) for k, p in joined.items() if decide.JOINED in p.reason)
        lines.append(f"  differentiated w.r.t. every input: one XLA program (each kernel runs on XLA or its loops won "
                     f"by less than {tuning.JOINT_MARGIN}x); moved to XLA: {moved}")
    return lines + gradient_line(spec, dtype, shapes, forward_dtypes, wrt)


def gradient_line(spec: Spec, dtype: str, shapes: Shapes | None = None, dtypes: dict | None = None,
                  wrt: list | None = None) -> list[str]:
    """How a differentiated call computes its gradient (``planner.autodiff``): the derived steps above, or JAX's
    autodiff of the forward's XLA form; with ``shapes``, the decision known for them."""
    from tullax.planner import autodiff

    if dtypes is None or shapes is None:
        dtypes = {item.name: dtype for item in spec.inputs}
        why = autodiff.refusal(spec, dtypes)
        if why is not None:
            return [f"  gradient (differentiated): the derived steps above: {why}"]
        from tullax.planner.call import analyse

        return [f"  gradient (differentiated): the derived steps above, or JAX's autodiff of the forward's XLA form "
                f"(autodiff:{analyse(spec).forms[0]}), keeping its residuals: raced on first use where timed"]
    found = autodiff.known_gradient_plan(spec, shapes, dtypes, dtype, wrt or [])
    return [f"  gradient (differentiated w.r.t. every input): {describe(found)}"]


def expansion_line(spec: Spec, algebra: str, shapes: Shapes | None = None) -> list[str]:
    """What the expansion of a polynomial body (``xla.expand``) does to ``spec`` and, with ``shapes``, the work it
    would save; that it needs the opt-in where ``algebra`` is not "expand". [] where it does not apply."""
    from tullax.backends.xla.expand import expansion, summary

    said = summary(spec)
    if said is None:
        return []
    if algebra == "expand":
        head = "algebra='expand': raced as xla:expanded where the call is timed"
    else:
        head = "not raced: einsum_kernel(..., algebra='expand') would race xla:expanded"
    lines = [f"    {head}: {said}"]
    if shapes is not None:
        from tullax.backends.xla.recognise import factor_indices, points, product_terms
        from tullax.planner.call import Call

        call = Call.of(spec, shapes, {n: "float32" for n in spec.input_names}, None)
        found = expansion(spec)
        assert found is not None
        madds = sum(points(call.ranges, frozenset().union(*(factor_indices(f) for f in fs)))
                    for _, fs in product_terms(found.body) or ())
        lines.append(f"      the loops: {call.work:.3g} estimated operations; expanded: at most {madds:.3g} "
                     f"multiply-adds ({call.work / max(madds, 1):.2g}x fewer or better), in BLAS kernels (vectorised "
                     f"FMA) and row norms; it rounds differently: close points lose digits to cancellation "
                     f"(docs/backends.md)")
    return lines


def text(spec: Spec) -> str:
    from tullax.spec.text import format_spec

    return format_spec(spec)
