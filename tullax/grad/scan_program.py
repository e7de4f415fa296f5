"""The derived reverse-scan adjoint of a scan program (``tullax.spec.scan_program``, issue 50): its gradient as
tullax kernels, not JAX's derivative of the ``lax.scan`` lowering.

With the state read at the previous step as an input of its own, ``hp`` (``hp[b,t] = h[b,t-1]``, the initial
state at ``t = 0``), the step's statements are an ordinary program, the FLAT program::

    local a[b,t,j] := sigmoid(softplus(W1[0,j])*hp[b,t] + softplus(W1[i+1,j])*u[b,t,i])
    y[b,t] := sigmoid(a[b,t,j]*softplus(W2[j]))

Reverse accumulation over its statements, with the derivation rules of every kernel (``grad.derive``), gives the
cotangent of ``hp`` at step t from the cotangent ``g[t]`` of the step's result. Since ``hp[t+1]`` is ``h[t]``,
``g[t] = Δh[t] + c[t+1]`` where ``c[t]`` is that cotangent of ``hp[t]``: a recurrence running the other way,
written as a scan program of its own, the ADJOINT program (one loop kernel: the forward's locals recomputed per
step, then their cotangents, never arrays)::

    local a[b,t,j] := sigmoid(softplus(W1[0,j])*hp[b,t] + softplus(W1[i+1,j])*u[b,t,i])
    local gy[b,t] := Δy[b,t] + cy[b,t+1]
    local Δa[b,t,j] := gy[b,t]*(sigmoid(a[b,t,j]*softplus(W2[j]))*(1 - ...)*softplus(W2[j]))
    local cy1[b,t] := Δa[b,t,j]*(...)
    cy[b,t] := cy1[b,t]   (t scan reverse)

Then every input's gradient is the flat program's, with ``g`` as its cotangent: all steps at once (its gradient
tails over the scan's rows, ``tullax.api.scan_adjoint``, reading ``g`` and the stored trajectory), and the initial
state's is ``c[0]``. Steps that read their
state further back than one step (depth > 1) are not derived here (``NotDerived``): JAX differentiates their
``lax.scan`` lowering.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from tullax.errors import SpecError
from tullax.grad.names import fresh
from tullax.spec.ir import Access, Affine, Expr, Size, Spec, map_expr
from tullax.spec.text import format_access, format_spec


class NotDerived(SpecError):
    """The scan program's adjoint is not derived as tullax kernels (the reason); JAX's derivative of its
    ``lax.scan`` lowering runs instead."""


@dataclass(frozen=True)
class ScanAdjoint:
    """The derived gradient of a scan program: ``flat`` and ``adjoint`` are program texts (module docstring);
    ``previous`` names the previous-state input of both, ``seed`` the cotangent of the result the adjoint reads,
    ``state`` the adjoint's result (c); the scan's ``axis``, direction and initial state as in the forward."""

    flat: str
    adjoint: str
    previous: str
    seed: str
    state: str
    out: str
    axis: int
    reverse: bool
    init: str | None

    def statements(self) -> list[str]:
        """What ``explain`` prints: the adjoint's statements, then the flat program whose gradients run."""
        back = "one step on" if self.reverse else "one step back"
        first = f" ({self.init} at the first step)" if self.init else " (0 at the first step)"
        return [f"  {self.previous} is {self.out} {back}{first}; the reverse scan, one kernel, locals recomputed per "
                f"step:"] + [f"    {line}" for line in self.adjoint.split("\n")] + [
            f"  then every input's gradient at once: this flat program's gradient tails over the rows (one row "
            f"program, then a statement per partial; the weights' unary terms computed once) at the cotangent "
            f"{self.seed} + {self.state} one step {'back' if self.reverse else 'on'}:"] + [
            f"    {line}" for line in self.flat.split("\n")] + (
            [f"  Δ{self.init}: {self.state} at the first step"] if self.init else [])


def derive_scan_adjoint(program, ranges: Mapping | None = None) -> ScanAdjoint:
    """The ``ScanAdjoint`` of a scan program (``tullax.spec.program.Program`` with a ``step``), or
    ``NotDerived`` with the reason."""
    from tullax.grad.derive import gradients
    from tullax.grad.names import seed_name
    from tullax.spec.frontend import compile_spec
    from tullax.spec.parse import parse_spec
    from tullax.spec.scan import split_scan

    step = program.step
    scan = step.scan
    if scan.depth != 1:
        raise NotDerived(f"the step reads its state {scan.depth} steps back: the derived adjoint covers steps "
                         f"that read the previous step only")
    h, t = step.out, scan.index
    taken = set(program.inputs) | {st.out for st in program.statements} | {
        n for st in program.statements for n in st.spec.indices}
    previous = fresh(h + "prev", taken)
    taken.add(previous)

    def swap(node: Expr) -> Expr:
        if isinstance(node, Access) and node.array == h:
            idx = list(node.idx)
            idx[scan.axis] = Affine.index(t)
            return Access(previous, tuple(idx), span=node.span)
        return node

    texts: list[str] = []
    for st in program.statements:
        text = split_scan(st.text.strip())[0] if st.number == step.number else st.text
        parsed = parse_spec(text)
        texts.append(format_spec(replace(parsed, body=map_expr(parsed.body, swap), finalizer=None if
                                         parsed.finalizer is None else map_expr(parsed.finalizer, swap))))
    specs = [compile_spec(text, _statement_ranges(text, ranges))[1] for text in texts]
    outs = [s.out for s in specs]
    flat = "\n".join(("local " if st.local else "") + text for st, text in zip(program.statements, texts))

    seed = seed_name(specs[-1])
    state = fresh("c" + h, taken | {seed})
    g = fresh("g" + h, taken | {seed, state})
    taken |= {seed, state, g}
    total = {h: g}  # a statement's result -> the name of its cotangent in the adjoint
    contributions: dict[str, list[str]] = {name: [] for name in outs[:-1] + [previous]}
    derived: list[tuple[str, str]] = []  # (output, text) of every derived statement, in order
    for k in range(len(specs) - 1, -1, -1):
        spec = specs[k]
        if spec.out != h:  # a local: its cotangent, the sum of its readers' contributions
            parts = contributions[spec.out]
            if not parts:
                continue
            name = parts[0] if len(parts) == 1 else fresh("Δ" + spec.out, taken)
            if len(parts) > 1:
                taken.add(name)
                derived.append((name, f"{format_access(name, specs[k].lhs)} := " + " + ".join(
                    format_access(p, specs[k].lhs) for p in parts)))
            total[spec.out] = name
        for grad in gradients(spec):
            if grad.wrt not in contributions:
                continue
            names = {seed_name(spec): total[spec.out]}
            for one in grad.steps:
                if one.assign != ":=" or one.is_scatter:
                    raise NotDerived(f"the gradient of statement {k + 1} w.r.t. {grad.wrt} accumulates "
                                     f"({format_spec(one)}): the derived adjoint takes plain steps only")
                names[one.out] = fresh("Δ" + grad.wrt if one.out == grad.result else one.out, taken)
                taken.add(names[one.out])
                derived.append((names[one.out], format_spec(_renamed(one, names))))
            contributions[grad.wrt].append(names[grad.result])
    parts = contributions[previous]
    if not parts:
        raise NotDerived("no statement of the step reads the previous state")
    head = format_access(h, specs[-1].lhs)
    idx = head[len(h):]
    pos = [i.plain for i in specs[-1].lhs]
    pos[scan.axis] = f"{t}-1" if scan.reverse else f"{t}+1"
    clause = f"({t} scan)" if scan.reverse else f"({t} scan reverse)"
    lines = [f"{g}{idx} := {seed}{idx} + {state}[{','.join(pos)}]"] + [text for _, text in derived]
    body = " + ".join(format_access(p, specs[-1].lhs) for p in parts)
    lines.append(f"{state}{idx} := {body}   {clause}")
    # forward locals, then the derived ones: only those the adjoint's result reads
    forward = [("local " + text, spec.out) for text, spec in zip(texts[:-1], specs[:-1])]
    statements = _needed(forward + [("local " + line, name) for line, name in zip(lines[:-1], [g] + [
        n for n, _ in derived])] + [(lines[-1], state)])
    return ScanAdjoint(flat, "\n".join(statements), previous, seed, state, h, scan.axis, scan.reverse, scan.init)


def _renamed(spec: Spec, names: Mapping[str, str]) -> Spec:
    """``spec`` reading and writing ``names``' renamed arrays."""

    def fix(node: Expr) -> Expr:
        if isinstance(node, Access) and node.array in names:
            return replace(node, array=names[node.array])
        if isinstance(node, Size) and node.array in names:
            return replace(node, array=names[node.array])
        return node

    return replace(spec, out=names.get(spec.out, spec.out), body=map_expr(spec.body, fix),
                   finalizer=None if spec.finalizer is None else map_expr(spec.finalizer, fix))


def _needed(statements: list[tuple[str, str]]) -> list[str]:
    """The statements (text, output) the last one reads, directly or through others, in order."""
    import re

    keep = {statements[-1][1]}
    for text, out in reversed(statements):
        if out in keep:
            keep |= set(re.findall(r"[^\W\d]\w*", text.split(":=", 1)[1]))
    return [text for text, out in statements if out in keep]


def _statement_ranges(text: str, ranges: Mapping | None):
    from tullax.spec.program import statement_ranges

    return statement_ranges(text, ranges)


__all__ = ["ScanAdjoint", "NotDerived", "derive_scan_adjoint"]
