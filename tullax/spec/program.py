"""Programs (issue 50): several statements in one string, analysed as one unit.

Statements are separated by newlines or ``;`` (a line ending in an operator, a comma or an open bracket continues
on the next, and so does a line starting with an operator or a range clause); ``#`` starts a comment. Each
statement is a ``:=`` spec as today; it may read the outputs of the statements before it. ``local`` before a
statement's output (or before its ``(op)`` prefix) marks an intermediate that is not returned. The program
returns the other outputs, in order.

Analysis here is pure text and ``Spec`` work: it splits, compiles every statement with the ordinary frontend and
checks the flow of names between them; errors point at the offending statement with a caret.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from tullax.errors import SpecError, TullaxError
from tullax.spec.ir import Spec
from tullax.spec.scan_program import ScanStep, analyze_step, scan_step_at

_LOCAL = re.compile(r"^(\(\s*[^()\s]+\s*\)\s*)?local\s+")
_LEADS = re.compile(r"^([-+*/^,)\]]|\|>|\(\s*\w+\s+(in|scan)\b)")  # a line that continues the one before
_CONTINUES = ("+", "-", "*", "/", "^", ",", "(", "[", ":=", "|>", "=", "<", ">", "&", "|")


@dataclass(frozen=True)
class Statement:
    """One statement: its text as written (without ``local``), the canonical text and the analysed spec."""

    text: str
    canonical: str
    spec: Spec
    local: bool
    number: int  # 1-based, in program order

    @property
    def out(self) -> str:
        return self.spec.out

    @property
    def reads(self) -> tuple[str, ...]:
        from tullax.spec.scan import TRAJECTORY  # a step's read of the scan's result (``tullax.spec.scan_program``)

        return tuple(n for n in self.spec.input_names if n != TRAJECTORY)


@dataclass(frozen=True)
class Program:
    """An analysed program: statements in order, external inputs in order of first appearance, outputs."""

    source: str
    statements: tuple[Statement, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]  # the non-local outputs, in statement order
    step: ScanStep | None = None  # a scan whose step is the program's statements (``tullax.spec.scan_program``)

    def producer(self, name: str) -> Statement | None:
        for st in self.statements:
            if st.out == name:
                return st
        return None

    def consumers(self, name: str) -> tuple[Statement, ...]:
        return tuple(st for st in self.statements if name in st.reads)


def split_statements(source: str) -> list[str]:
    """The statements of ``source`` as text, comments and blank ones dropped."""
    out: list[str] = []
    pending = ""
    for raw in source.split("\n"):
        line = raw.split("#", 1)[0].strip()
        parts = [p.strip() for p in line.split(";")]
        for k, part in enumerate(parts):
            if not part:
                continue
            if out and not pending and k == 0 and _LEADS.match(part):
                pending = out.pop()
            pending = f"{pending} {part}".strip() if pending else part
            last_on_line = k == len(parts) - 1
            if last_on_line and (pending.endswith(_CONTINUES) or _open_brackets(pending)):
                continue
            out.append(pending)
            pending = ""
    if pending:
        out.append(pending)
    return out


def _open_brackets(text: str) -> bool:
    return text.count("(") > text.count(")") or text.count("[") > text.count("]")


def is_program(source: object) -> bool:
    """True when ``source`` holds more than one statement or a ``local`` one (else it is an ordinary spec)."""
    if not isinstance(source, str) or not ("\n" in source or ";" in source or "local" in source
                                           or "#" in source):
        return False
    try:
        parts = split_statements(source)
    except TullaxError:
        return False
    return len(parts) > 1 or any(_LOCAL.match(p) for p in parts)


def _strip_local(text: str) -> tuple[str, bool]:
    found = _LOCAL.match(text)
    if found is None:
        return text, False
    return (found.group(1) or "") + text[found.end():], True


def _column(text: str, name: str) -> int | None:
    """The column of the first read of ``name`` on the right of ``:=`` (for a caret)."""
    start = text.find(":=")
    found = re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", text[start + 2:] if start >= 0 else text)
    if found is None:
        return None
    return found.start() + (start + 2 if start >= 0 else 0)


def _lhs_column(text: str, name: str) -> int | None:
    found = re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", text)
    return None if found is None else found.start()


def analyze_program(source: str, ranges: Mapping | None = None) -> Program:
    """Split, compile each statement and check the flow of names (see the module docstring)."""
    from tullax.spec.frontend import compile_spec

    texts = split_statements(source)
    if not texts:
        raise SpecError("empty program: write one statement per line, like  y[i] := x[i,j]", source, 0)
    stripped = [_strip_local(raw)[0] for raw in texts]
    at = scan_step_at(stripped)
    statements: list[Statement] = []
    step = None
    if at is not None:  # a scan whose step is several statements: analysed together
        found, step = analyze_step(stripped, [_strip_local(raw)[1] for raw in texts], at, ranges,
                                   statement_ranges)
        statements = [Statement(text, canonical, spec, _strip_local(raw)[1], number)
                      for number, (raw, text, (canonical, spec)) in enumerate(zip(texts, stripped, found), 1)]
    for number, raw in enumerate(texts if at is None else (), 1):
        text, local = _strip_local(raw)
        try:
            canonical, spec = compile_spec(text, statement_ranges(text, ranges))
        except SpecError as err:
            raise SpecError(f"statement {number} of the program: {err.message}", err.spec or text,
                            err.column) from None
        if spec.assign != ":=":
            raise SpecError(f"statement {number} of the program: inside a program every statement defines a new "
                            f"array with ':=' (got {spec.assign!r}); write {spec.out}2[..] := {spec.out}[..] + ... "
                            f"and read {spec.out}2 from then on", text, text.find(spec.assign))
        statements.append(Statement(text, canonical, spec, local, number))
    _check_flow(statements)
    inputs: list[str] = []
    defined: set[str] = set()
    for st in statements:
        for name in st.reads:
            if name not in defined and name not in inputs:
                inputs.append(name)
        defined.add(st.out)
    outputs = tuple(st.out for st in statements if not st.local)
    return Program(source, tuple(statements), tuple(inputs), outputs, step)


def statement_ranges(text: str, ranges: Mapping | None) -> Mapping | None:
    """``ranges=`` of a program names indices of any statement: each statement gets those it writes."""
    if not ranges:
        return None
    own = {name: value for name, value in ranges.items()
           if re.search(rf"(?<![\w.]){re.escape(str(name))}(?!\w)", text)}
    return own or None


def _check_flow(statements: list[Statement]) -> None:
    where = {st.out: st for st in statements}
    for st in statements:
        first = where[st.out]
        if first is not st:
            raise SpecError(f"statement {st.number} of the program defines {st.out}, which statement {first.number} "
                            f"already defines: give it a new name", st.text, _lhs_column(st.text, st.out))
    for st in statements:
        for name in st.reads:
            other = where.get(name)
            if other is None or other.number < st.number:
                continue
            if other is st:  # only a scan statement may read its own result, and analyze refuses it elsewhere
                continue
            cycle = _reaches(other, st.out, where)
            what = (f"a cycle: {name} (statement {other.number}) reads {st.out}, directly or through other "
                    f"statements, and statement {st.number} reads {name}; only a (t scan) statement may read its own "
                    f"result, at earlier steps" if cycle else
                    f"statement {st.number} reads {name}, the output of statement {other.number}, which comes later: "
                    f"move statement {other.number} before it")
            raise SpecError(f"statement {st.number} of the program: {what}", st.text, _column(st.text, name))
    for st in statements:
        if st.local and not any(st.out in later.reads for later in statements if later.number > st.number):
            raise SpecError(f"statement {st.number} of the program: local {st.out} is never read by a later statement; "
                            f"drop 'local' to return it, or drop the statement", st.text,
                            _lhs_column(st.text, st.out))


def _reaches(start: Statement, target: str, where: dict[str, Statement]) -> bool:
    seen: set[str] = set()
    todo = list(start.reads)
    while todo:
        name = todo.pop()
        if name == target:
            return True
        if name in seen or name not in where:
            continue
        seen.add(name)
        todo.extend(where[name].reads)
    return False


def program_shapes(program: Program, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The shapes of the program's inputs (``shapes``) and of every statement's result, in program order."""
    found = dict(shapes)
    for st in program.statements:
        found[st.out] = tuple(int(size.eval(found)) for size in st.spec.out_shape)
    if program.step is not None:  # the trajectory the step's statements read (the fused kernel's sizes may)
        from tullax.spec.scan import TRAJECTORY
        from tullax.spec.scan_program import trajectory_shape

        found[TRAJECTORY] = trajectory_shape(program, found)
    return found
