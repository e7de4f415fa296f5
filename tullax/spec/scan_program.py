"""A scan whose step is several statements (issues 48 and 50: issue 7024's loop as one kernel).

```
local a[b,t,j] := sigmoid(softplus(W1[0,j])*y[b,t-1] + softplus(W1[i+1,j])*u[b,t,i])
y[b,t] := sigmoid(a[b,t,j]*softplus(W2[j]))   (t scan from y0)
```
The last statement is a ``(t scan)``; the locals before it read its result at earlier positions along ``t`` (as
the scan statement's own self-reads may), so they belong to the step: at each ``t`` every local is computed at that
``t`` (recomputed per step, never stored whole), then the scan statement, which reads them at its own ``t``.

Each local is analysed with its reads of the result hidden from range inference (as ``tullax.spec.scan.prepare``
hides a scan's self-reads) and kept in the unrolled form: a read of the trajectory input ``TRAJECTORY`` (the initial
state then the results, ``tullax.spec.scan.unrolled``). So, given the trajectory, the step statements are an
ordinary program, which the loop fusion and the ``lax.scan`` lowering take as they take one scan's unrolled spec.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Callable, Mapping

from tullax.errors import SpecError
from tullax.spec.ir import Access, Affine, Expr, ParsedSpec, Range, Spec, Wrapped, accesses, map_expr
from tullax.spec.scan import TRAJECTORY, Scan, scan_shapes, trajectory_position, unrolled
from tullax.spec.sizes import Sym


@dataclass(frozen=True)
class ScanStep:
    """The step of a scan program: the scan statement (the program's last, ``number`` 1-based) defines ``out``;
    ``scan`` is its clause, its depth the deepest read of ``out`` by any statement of the step."""

    number: int
    out: str
    scan: Scan


def scan_step_at(texts: list[str]) -> int | None:
    """The 0-based position of a scan statement whose result an earlier statement reads (a step of several
    statements), else None."""
    for k, text in enumerate(texts):
        found = re.match(r"^(\(\s*[^()\s]+\s*\)\s*)?([A-Za-z_]\w*)", text)
        if " scan" not in text or found is None or not re.search(r"\(\s*\w+\s+scan\b", text):
            continue
        if any(reads(other, found.group(2)) is not None for other in texts[:k]):
            return k
    return None


def reads(text: str, name: str) -> int | None:
    """The column of the first read of ``name`` on the right of ``:=`` (for a caret)."""
    start = text.find(":=")
    found = re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", text[start + 2:] if start >= 0 else text)
    if found is None:
        return None
    return found.start() + (start + 2 if start >= 0 else 0)


def analyze_step(texts: list[str], local: list[bool], at: int, ranges: Mapping | None, statement_ranges: Callable
                 ) -> tuple[list[tuple[str, Spec]], ScanStep]:
    """(canonical text, spec) per statement of a scan program whose scan is statement ``at`` (0-based) and the
    step's record; the locals' specs in the unrolled form (their reads of the result read ``TRAJECTORY``).
    ``statement_ranges(text, ranges)``: the ranges a statement takes (``tullax.spec.program``'s)."""
    from tullax.spec.analyze import analyze
    from tullax.spec.parse import parse_spec
    from tullax.spec.scan import finish, prepare, split_scan
    from tullax.spec.text import format_spec

    number = at + 1
    scan_text = texts[at]
    if at != len(texts) - 1:
        nxt = texts[at + 1]
        raise SpecError(f"statement {at + 2} of the program comes after the scan of statement {number}, whose step "
                        f"is several statements: a scan program ends with its scan statement; run this statement "
                        f"as a kernel of its own on the scan's result", nxt, 0)
    for k in range(at):
        if not local[k]:
            raise SpecError(f"statement {k + 1} of the program is part of the scan's step (statement {number}): "
                            f"write it 'local' (it is recomputed at every step; the scan program returns the "
                            f"scan's result only)", texts[k], 0)

    def wrapped(k: int, fn):
        try:
            return fn()
        except SpecError as err:
            if err.message.startswith("statement "):
                raise
            raise SpecError(f"statement {k + 1} of the program: {err.message}", err.spec or texts[k],
                            err.column) from None

    blanked, clause = split_scan(scan_text.strip())
    parsed_scan = wrapped(at, lambda: parse_spec(blanked))
    out, t = parsed_scan.out, clause.index
    if parsed_scan.lhs is None or not any(isinstance(i, Affine) and i.plain == t for i in parsed_scan.lhs):
        raise SpecError(f"statement {number} of the program: the scan index {t} must be an index of the result",
                        scan_text, clause.column)
    lhs_names = [i.plain if isinstance(i, Affine) else None for i in parsed_scan.lhs]
    axis = lhs_names.index(t)
    parsed = [wrapped(k, lambda k=k: parse_spec(texts[k])) for k in range(at)]
    step_outs: dict[str, int] = {}  # a local of the step -> the axis of t in it
    depth = 0
    for k, p in enumerate(parsed):
        where = [n for n, i in enumerate(p.lhs or ()) if isinstance(i, Affine) and i.plain == t]
        if not where:
            raise SpecError(f"statement {k + 1} of the program is part of the scan's step: it is indexed by the "
                            f"scan index {t} (plainly, on the left), as the scan's result is", texts[k], 0)
        _check_local_reads(p, texts[k], k + 1, step_outs, t)
        for acc in accesses(p.body):
            if acc.array == out:
                depth = max(depth, _step_offset(acc, texts[k], k + 1, lhs_names, axis, clause.reverse,
                                                {i.plain for i in p.lhs if isinstance(i, Affine)}))
        step_outs[p.out] = where[0]
    _check_local_reads(parsed_scan, scan_text, number, step_outs, t)

    def compile_scan() -> Spec:
        prepared, scan = prepare(parsed_scan, clause, step_depth=depth)
        return finish(analyze(prepared, dict(statement_ranges(scan_text, ranges) or {})), scan, blanked.strip())

    scan_spec = wrapped(at, compile_scan)
    scan: Scan = scan_spec.scan
    found = [(format_spec(p), wrapped(k, lambda k=k, p=p: _local_spec(
        p, texts[k], out, scan, statement_ranges(texts[k], ranges))))
             for k, p in enumerate(parsed)]
    found.append((format_spec(scan_spec), scan_spec))
    return found, ScanStep(number, out, scan)


def _step_offset(acc: Access, text: str, number: int, lhs_names: list, axis: int, reverse: bool,
                 own: set) -> int:
    """The offset k of a local's read of the scan's result (``t-k``; ``t+k`` reverse), after checking it."""
    pos = acc.idx[axis] if len(acc.idx) == len(lhs_names) else None
    t = lhs_names[axis]
    if pos is None:
        raise SpecError(f"statement {number} of the program: {acc.array} has {len(lhs_names)} axes, read with "
                        f"{len(acc.idx)}", text, acc.span[0])
    if not isinstance(pos, Affine) or pos.names() != (t,) or pos.coef(t) != 1 or pos.div != 1 \
            or not pos.const.is_const or (pos.const.const >= 0 if not reverse else pos.const.const <= 0):
        want = f"{t}+1, {t}+2" if reverse else f"{t}-1, {t}-2"
        raise SpecError(f"statement {number} of the program reads the scan's result {acc.array} inside its step: "
                        f"only at steps already computed, at constant offsets ({want}, ...)", text,
                        (pos.span if isinstance(pos, Affine) and pos.span != (0, 0) else acc.span)[0])
    for d, idx in enumerate(acc.idx):
        if d != axis and not (isinstance(idx, Affine) and idx.plain == lhs_names[d] and idx.plain in own):
            raise SpecError(f"statement {number} of the program reads {acc.array} inside the scan's step: on its "
                            f"other axes at the result's own indices ({', '.join(n for n in lhs_names if n != t)}), "
                            f"also indices of this statement's result (a step whose lanes mix is not supported "
                            f"yet)", text, (idx.span if getattr(idx, "span", (0, 0)) != (0, 0) else acc.span)[0])
    return abs(pos.const.const)


def _check_local_reads(parsed: ParsedSpec, text: str, number: int, step_outs: Mapping[str, int], t: str) -> None:
    """A statement of the step reads the step's locals at its own ``t`` (a local is never stored whole)."""
    for acc in accesses(parsed.body):
        if acc.array in step_outs:
            pos = acc.idx[step_outs[acc.array]] if len(acc.idx) > step_outs[acc.array] else None
            if not (isinstance(pos, Affine) and pos.plain == t):
                raise SpecError(f"statement {number} of the program reads the step's local {acc.array} at another "
                                f"position than the step's own {t}: a local of a scan's step exists for the current "
                                f"step only", text, acc.span[0])
    if parsed.finalizer is not None and any(a.array in step_outs for a in accesses(parsed.finalizer)):
        raise SpecError(f"statement {number} of the program reads a local of the step in its finaliser: read it "
                        f"before |>", text, 0)


def _local_spec(parsed: ParsedSpec, text: str, out: str, scan: Scan, ranges: Mapping | None) -> Spec:
    """A local of the step, analysed with its reads of ``out`` as reads of the trajectory (unrolled form)."""
    from tullax.spec.analyze import analyze

    def hide(node: Expr) -> Expr:
        if isinstance(node, Access) and node.array == out:
            idx = list(node.idx)
            idx[scan.axis] = Wrapped("pad", idx[scan.axis], span=idx[scan.axis].span)
            return Access(TRAJECTORY, tuple(idx), span=node.span)
        return node

    spec = analyze(replace(parsed, body=map_expr(parsed.body, hide)), dict(ranges or {}))
    found = dict(spec.ranges)
    for name, rng in spec.ranges:  # an index the trajectory bound takes its range from another array bound with it
        if TRAJECTORY in repr(rng):
            other = next((a.second for a in spec.agreements if a.index == name and a.first[0] == TRAJECTORY
                          and a.second[0] != TRAJECTORY), None)
            if other is None:
                raise SpecError(f"the range of index {name} can only come from the scan's result {out}: read an "
                                f"input at {name} too, or give ranges={{{name!r}: 10}}", text)
            found[name] = Range(Sym(0), Sym.extent(*other))
    spec = replace(spec, ranges=tuple(found.items()), out_shape=tuple(found[n].extent() for n in spec.free))
    if found[scan.index].lo != Sym(0):
        raise SpecError(f"a scan index runs from 0: {scan.index} has the range {found[scan.index].lo}:"
                        f"{found[scan.index].hi}", text)

    def unroll(node: Expr) -> Expr:
        if isinstance(node, Access) and node.array == TRAJECTORY:
            idx = list(node.idx)
            idx[scan.axis] = trajectory_position(scan, idx[scan.axis].inner)
            return replace(node, idx=tuple(idx))
        return node

    return replace(spec, body=map_expr(spec.body, unroll))


def step_specs(program) -> tuple[Spec, ...]:
    """The step's statements as ordinary specs over the trajectory ``TRAJECTORY``: the locals as analysed, the scan
    statement unrolled (``tullax.spec.scan.unrolled``)."""
    return tuple(st.spec if st.number != program.step.number else unrolled(st.spec) for st in program.statements)


def trajectory_shape(program, shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, ...]:
    """The trajectory's shape (the result with the initial state's ``depth`` positions along ``t``)."""
    scan_st = program.statements[program.step.number - 1]
    return scan_shapes(scan_st.spec, shapes)[0]


__all__ = ["ScanStep", "scan_step_at", "analyze_step", "step_specs", "trajectory_shape"]
