"""``tullax.explain``: everything the compiler decided about a spec, as text."""
from __future__ import annotations

from typing import Mapping

from tullax.errors import TullaxError
from tullax.spec.frontend import compile_spec, describe_range
from tullax.spec.ir import Spec
from tullax.spec.text import format_finalizer


def explain_spec(canonical: str, spec: Spec) -> str:
    from tullax.grad import gradient_texts

    lines = [f"spec:      {canonical}"]
    boolean = canonical.startswith(("(&)", "(|)"))  # all/any: run as min/max of 0/1 (spec.frontend)
    if boolean:
        lines.append(f"reduction: {canonical[1]} ({'all' if canonical[1] == '&' else 'any'}), run as {spec.redop} "
                     f"of the body as 0/1; the result is bool")
    elif spec.redop != "+" or spec.finalizer is not None:
        then = f", then |> {format_finalizer(spec.finalizer)}" if spec.finalizer is not None else ""
        lines.append(f"reduction: {spec.redop}{then}")
    lines.append(f"inputs:    {', '.join(f'{i.name} ({i.kind}, rank {i.rank})' for i in spec.inputs) or 'none'}")
    lines.append(f"free:      {', '.join(spec.free) or '(none: scalar or scatter result)'}")
    lines.append(f"reduced:   {', '.join(spec.reduced) or '(none)'}")
    lines.append("ranges:")
    for name, rng in spec.ranges:
        lines.append(f"  {name} in {describe_range(rng).replace('->', f'-> {name} =')}")
    if spec.agreements:
        lines.append("must agree:")
        for agr in spec.agreements:
            lines.append(f"  size({agr.first[0]},{agr.first[1]}) == size({agr.second[0]},{agr.second[1]})"
                         f"  (both bind {agr.index})")
    if spec.out_shape:
        lines.append(f"result:    {spec.out}[{', '.join(str(s) for s in spec.out_shape)}]")
    try:
        grads = () if boolean else gradient_texts(spec)
    except ValueError as err:  # e.g. (*) reductions: say why instead of failing the whole explanation
        grads = (f"(no gradients: {err})",)
    lines.append("gradients:")
    lines += [f"  {text}" for text in grads] or [f"  ({'a bool result' if boolean else 'no differentiable inputs'})"]
    if spec.scan is not None:
        lines.append("tangent (jvp, jacfwd):")
        lines.append(f"  {_tangent_text(spec)}")
    return "\n".join(lines)


def _tangent_text(spec: Spec) -> str:
    """The tangent recurrence of every differentiable input of the recurrence ``spec`` (real values)."""
    from tullax.grad.tangent import tangent_spec
    from tullax.spec.text import format_spec

    found = tangent_spec(spec, tuple(i.name for i in spec.inputs if i.kind in ("array", "scalar")))
    return format_spec(found.spec) if found is not None else "(none: the transpose of the gradient kernels)"


def explain(spec: str, ranges: Mapping | None = None, shapes: Mapping[str, tuple[int, ...]] | None = None,
            dtype: str = "float32", algebra: str | None = None) -> str:
    """The canonical spec, its free and reduced indices, every index range (symbolic in the input
    shapes), each gradient spec, and the plan of ``backend='auto'``: what each kernel (the forward one and
    every gradient step) runs on and why, by rule, or with ``shapes`` (input name -> shape) the decision for
    those shapes, as the compile cache holds it when it was timed. ``algebra``: the plan of a kernel made with
    that opt-in (``einsum_kernel(algebra="expand")``); without it, each kernel whose polynomial body would
    expand says what the expansion would do and gain."""
    from tullax.errors import with_spec_context
    from tullax.planner.explain import explain_lines
    from tullax.spec.program import is_program

    if is_program(spec):  # several statements: tullax.api.explain_program
        from tullax.api.explain_program import explain_program
        from tullax.errors import SpecError

        if algebra is not None:
            raise SpecError("algebra= applies to one statement: explain the statement to expand on its own")

        return explain_program(spec, ranges, shapes, dtype)
    canonical, analysed = compile_spec(spec, ranges)
    try:
        if algebra is not None:
            from tullax.api.options import check_algebra

            check_algebra(canonical, analysed, algebra, "auto")
        planned = explain_lines(analysed, shapes, dtype, algebra or "")
    except TullaxError as err:
        raise with_spec_context(err, spec) from None
    return explain_spec(canonical, analysed) + "\n" + "\n".join(planned)
