"""The gradient of a row-wise program as a program of its own (issue 50), which ``tullax.compiler.fuse`` fuses
like the forward: one kernel per row-wise input (LayerNorm's ``Δx``), over the same rows.

Reverse accumulation written out as statements: the forward's locals recomputed per row; then, statement by
statement from the last, the gradient specs tullax derives for it (``Kernel.grad_specs``), each cotangent of a
local a new local per contribution (``Δmu_3[b]``: statement 3's share of ``Δmu``), read as their sum by the
earlier statements' gradients; a row-wise input's partials (elementwise: no reduction of their own) summed in
one final statement. Inputs whose cotangents reduce over the rows (``Δg[j]``, ``Δeps``) are not in it: they run
as the unfused statements' gradients.
"""
from __future__ import annotations

import re
from typing import Sequence

from tullax.compiler.fuse import NotFusable
from tullax.errors import TullaxError
from tullax.spec.program import Program, analyze_program

_TARGET = re.compile(r"^\s*(\(\s*\w+\s*\)\s*)?([^\s\[:+]+)(\[[^\]]*\])?\s*(:=|\+=)\s*(.*)$")


def cotangent_name(name: str) -> str:
    return f"Δ{name}"


def gradient_programs(program: Program, grad_specs: Sequence[Sequence[str]],
                      rows: tuple[str, ...]) -> dict[str, str]:
    """Input name -> the text of its gradient program (its one output ``Δ<input>``), for every input whose
    cotangent runs over the rows; the cotangent of the program's output is the input ``Δ<output>``."""
    from tullax.spec.frontend import compile_spec

    contributions: dict[str, list[str]] = {}  # local -> names of its cotangent's shares
    partials: dict[str, list[tuple[str, str]]] = {}  # row-wise input -> (index text, elementwise value)
    lines: list[str] = []
    locals_ = {st.out for st in program.statements if st.local}
    for st in reversed(program.statements):
        if st.local and not contributions.get(st.out):
            continue  # nothing after it reads this local in a way that has a gradient
        helpers: dict[str, str] = {}
        for text in grad_specs[st.number - 1]:
            for part in (p.strip() for p in text.split(";") if p.strip()):
                found = _TARGET.match(part)
                if found is None:
                    raise NotFusable(f"statement {st.number}: a gradient statement of another form: {part}")
                prefix, target, index, _, value = found.groups()
                index = index or ""
                value = _summed(value, st.out, contributions, st.local)
                for helper, renamed in helpers.items():
                    value = re.sub(rf"(?<![\w.]){re.escape(helper)}(?=\[)", renamed, value)
                if not target.startswith("Δ"):  # a helper array of this gradient (count, pre)
                    renamed = helpers.setdefault(target, f"{target}_{st.number}")
                    line = f"local {prefix or ''}{renamed}{index} := {value}"
                    if line not in lines:
                        lines.append(line)
                    continue
                if prefix:
                    raise NotFusable(f"statement {st.number}: a reduction prefix on a cotangent: {part}")
                name = target[1:]
                if name in locals_:
                    share = f"Δ{name}_{st.number}_{len(contributions.get(name, []))}"
                    contributions.setdefault(name, []).append(share)
                    lines.append(f"local {share}{index} := {value}")
                elif name in program.inputs:
                    names = [i.strip() for i in index.strip("[]").split(",") if i.strip()]
                    try:  # ranges named for the indices only another partial may read
                        spec = compile_spec(f"{target}{index} := {value}", {i: 1 for i in names})[1]
                    except TullaxError as err:
                        raise NotFusable(f"statement {st.number}: {err}") from None
                    if set(rows) <= set(spec.free) and not spec.reduced and "|>" not in value:
                        partials.setdefault(name, []).append((index, value))
    programs = {}
    for name, terms in partials.items():
        indices = {index for index, _ in terms}
        if len(indices) != 1:
            continue  # partials under different index names: not summed here
        total = " + ".join(f"({value})" for _, value in terms)
        body = lines + [f"Δ{name}{indices.pop()} := {total}"]
        programs[name] = "\n".join(_forward_locals(program, body) + body)
    return programs


def _summed(value: str, local: str, contributions: dict[str, list[str]], is_local: bool) -> str:
    """``value`` with each read of ``Δ<local>[..]`` replaced by the sum of that local's shares."""
    if not is_local:
        return value
    shares = contributions[local]

    def total(found: re.Match) -> str:
        return "(" + " + ".join(f"{share}[{found.group(1)}]" for share in shares) + ")"
    return re.sub(rf"Δ{re.escape(local)}\[([^\]]*)\]", total, value)


def _forward_locals(program: Program, body: list[str]) -> list[str]:
    """The forward's local statements the gradient statements read (directly or through each other)."""
    text = "\n".join(body)
    needed: list[str] = []
    for st in reversed(program.statements):
        if st.local and (re.search(rf"(?<![\wΔ.]){re.escape(st.out)}\[", text)):
            needed.insert(0, "local " + st.canonical)
            text += "\n" + st.canonical.split(":=", 1)[1]
    return needed


def analyzed_gradients(program: Program, grad_specs: Sequence[Sequence[str]], rows: tuple[str, ...],
                       ranges=None) -> dict[str, Program]:
    """``gradient_programs`` analysed (a text that does not analyse is left out: that input runs unfused)."""
    found = {}
    for name, text in gradient_programs(program, grad_specs, rows).items():
        try:
            found[name] = analyze_program(text, ranges)
        except TullaxError:
            continue
    return found
