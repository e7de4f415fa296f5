"""The gradient of a row-wise program as a program of its own (issue 50), which ``tullax.compiler.fuse`` fuses
like the forward: one kernel per row-wise input (LayerNorm's ``Δx``), over the same rows.

Reverse accumulation written out as statements: the forward's locals recomputed per row; then, statement by
statement from the last, the gradient specs tullax derives for it (``Kernel.grad_specs``), each cotangent of a
local a new local per contribution (``Δmu_3[b]``: statement 3's share of ``Δmu``), read as their sum by the
earlier statements' gradients; a row-wise input's partials (elementwise: no reduction of their own) summed in
one final statement.

An input with a partial that reduces (over the rows: LayerNorm's ``Δg[j]``, attention's ``Δk``; or over another
index: attention's ``Δq[b,i,d] := Δs[b,i,j]*k[b,j,d]``) is a *tail* instead (``gradient_tails``): ONE row program
computes, as its returned outputs, what the tails read of the rows (the cotangent of a local, its shares summed:
attention's ``Δs``; a forward local: ``p``), fused like any other; each partial then runs as one statement of its
own (a contraction, which tullax tiles as such), and an input's partials are added. Attention's gradient is then
one fused row kernel and three contractions, instead of the statements' gradients one by one.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from tullax.compiler.fuse import NotFusable
from tullax.errors import TullaxError
from tullax.spec.program import Program, analyze_program

_TARGET = re.compile(r"^\s*(\(\s*\w+\s*\)\s*)?([^\s\[:+]+)(\[[^\]]*\])?\s*(:=|\+=)\s*(.*)$")


def cotangent_name(name: str) -> str:
    return f"Δ{name}"


@dataclass(frozen=True)
class _Partial:
    """One gradient statement of an input: its index text, its value (a local's cotangent read as the sum of its
    shares), the value reading ``Δ<local>`` itself (``raw``), and whether it is elementwise over the rows."""

    index: str
    value: str
    raw: str
    local: str  # the local whose cotangent ``raw`` reads ("" where none)
    rowwise: bool


def _reverse(program: Program, grad_specs: Sequence[Sequence[str]], rows: tuple[str, ...]
             ) -> tuple[list[str], dict[str, list[str]], dict[str, list[_Partial]]]:
    """Reverse accumulation over the statements: the gradient locals' lines (last statement first), each local's
    cotangent shares, and every input's partials."""
    from tullax.spec.frontend import compile_spec

    contributions: dict[str, list[str]] = {}  # local -> names of its cotangent's shares
    partials: dict[str, list[_Partial]] = {}
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
                raw = value
                value = _summed(value, st.out, contributions, st.local)
                for helper, renamed in helpers.items():
                    value = re.sub(rf"(?<![\w.]){re.escape(helper)}(?=\[)", renamed, value)
                    raw = re.sub(rf"(?<![\w.]){re.escape(helper)}(?=\[)", renamed, raw)
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
                    rowwise = set(rows) <= set(spec.free) and not spec.reduced and "|>" not in value
                    partials.setdefault(name, []).append(
                        _Partial(index, value, raw, st.out if st.local else "", rowwise))
    return lines, contributions, partials


def gradient_programs(program: Program, grad_specs: Sequence[Sequence[str]],
                      rows: tuple[str, ...]) -> dict[str, str]:
    """Input name -> the text of its gradient program (its one output ``Δ<input>``), for every input whose
    partials are all elementwise over the rows; the cotangent of the program's output is the input ``Δ<output>``."""
    lines, _, partials = _reverse(program, grad_specs, rows)
    programs = {}
    for name, terms in partials.items():
        indices = {t.index for t in terms}
        if len(indices) != 1 or not all(t.rowwise for t in terms):
            continue  # partials under different index names, or one that reduces: not summed here
        total = " + ".join(f"({t.value})" for t in terms)
        body = lines + [f"Δ{name}{indices.pop()} := {total}"]
        programs[name] = "\n".join(_forward_locals(program, body) + body)
    return programs


@dataclass(frozen=True)
class Tails:
    """The gradients of the inputs no gradient program covers: ``rows`` (a program whose returned outputs are
    what the tails read of the rows; "" where they read none of it) and each input's partials, one statement
    each (their results added)."""

    rows: str
    outputs: tuple[str, ...]
    partials: dict[str, tuple[str, ...]]


def gradient_tails(program: Program, grad_specs: Sequence[Sequence[str]], rows: tuple[str, ...],
                   inputs: Sequence[str]) -> Tails | None:
    """The tails (``Tails``) of ``inputs``, or None where one of them has no partial of the form taken."""
    lines, contributions, partials = _reverse(program, grad_specs, rows)
    defined = {_defined(line): line for line in lines}
    forward = {st.out: st for st in program.statements if st.local}
    outputs: dict[str, str] = {}  # a name the tails read -> its statement in the row program (returned)
    found: dict[str, tuple[str, ...]] = {}
    for name in inputs:
        if not partials.get(name):
            return None
        texts = []
        for t in partials[name]:
            value = t.raw
            if t.local:  # the local's cotangent: one returned output, the sum of its shares
                st = forward[t.local]
                free = ",".join(st.spec.free)
                outputs[f"Δ{t.local}"] = f"Δ{t.local}[{free}] := " + " + ".join(
                    f"{share}[{free}]" for share in contributions[t.local])
            for read in set(re.findall(r"(?<![\w.])([^\W\d][\w]*)(?=\[)", value)):
                if read in forward and read not in outputs:
                    outputs[read] = forward[read].canonical
                elif read in defined and read not in outputs:
                    outputs[read] = defined[read].replace("local ", "", 1)
            texts.append(f"Δ{name}{t.index} := {value}")
        found[name] = tuple(texts)
    if not outputs:
        return Tails("", (), found)
    lines = _single_shares(lines, outputs, contributions)
    returned = list(outputs.values())
    body = _needed([line for line in lines if _defined(line) not in outputs], returned)
    head = [line for line in _forward_locals(program, body + returned) if _defined(line) not in outputs]
    order = [st.out for st in program.statements]  # forward statements first, in program order
    forward_outputs = sorted((n for n in outputs if n in order), key=order.index)
    text = head + [outputs[n] for n in forward_outputs] + body + [outputs[n] for n in outputs
                                                                    if n not in forward_outputs]
    names = tuple(_defined(line) for line in text if not line.startswith("local "))
    return Tails("\n".join(text), names, found)


def _single_shares(lines: list[str], outputs: dict[str, str], contributions: dict[str, list[str]]) -> list[str]:
    """``lines`` without each local's only cotangent share that nothing else reads, ``outputs`` (changed in place)
    computing that cotangent itself where it copied the share (``Δa[b,t,j] := Δa_2_0[b,t,j]``: a kernel of its
    own wherever the row program does not fuse)."""
    kept = list(lines)
    for name in list(outputs):
        local = name[1:]
        if not name.startswith("Δ") or len(contributions.get(local, ())) != 1:
            continue
        share = contributions[local][0]
        if share in outputs:
            continue
        (line,) = [line for line in kept if _defined(line) == share]
        reads = re.compile(rf"(?<![\w.]){re.escape(share)}\[")
        if any(reads.search(other.split(":=", 1)[1]) for other in kept if other is not line) or any(
                reads.search(text.split(":=", 1)[1]) for key, text in outputs.items() if key != name):
            continue
        outputs[name] = name + line.replace("local ", "", 1).split(share, 1)[1]
        kept.remove(line)
    return kept


def _defined(line: str) -> str:
    """The name a statement line defines."""
    found = _TARGET.match(line.replace("local ", "", 1))
    assert found is not None, line
    return found.group(2)


def _needed(lines: list[str], roots: list[str]) -> list[str]:
    """The gradient locals ``roots`` read, directly or through each other (in their order)."""
    text = "\n".join(roots)
    kept: list[str] = []
    for line in reversed(lines):
        if re.search(rf"(?<![\w.]){re.escape(_defined(line))}\[", text):
            kept.insert(0, line)
            text += "\n" + line.split(":=", 1)[1]
    return kept


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
