"""The figures the README and docs/ state, checked against the committed files they come from
(``docs/contributing-figures.md`` is the convention; ``tests/test_stated_figures.py`` runs the check).

* A figure followed by ``<!-- from: benchmarks/results/X.json:PATH -->`` must equal the value at PATH, rounded
  as the figure is shown (``6.1`` is any value in [6.05, 6.15]). PATH: keys separated by dots (``"a key"`` quoted
  where it has spaces or dots), ``[3]`` an index, ``[1,4,5]`` several, ``[*]`` all, ``[2:]`` a slice; it may be
  wrapped in ``min(...)``, ``max(...)``, ``sum(...)``, ``mean(...)`` or ``len(...)``, and followed by ``*1000``
  (a unit change: seconds shown in ms). A source that is not JSON (``X.md``) takes no PATH: the figure as shown
  (the number and its unit) must appear in that file. ``from: tests/test_x.py::test_name``: that test must
  exist and hold the number.
* Between ``<!-- measured -->`` and ``<!-- /measured -->`` every figure with a unit of measurement (``ms``,
  ``us``, ``µs``, ``s``, ``x``, ``%``, ``MiB``, ``GiB``, ...) must carry a ``from:`` marker, or ``<!-- given -->``
  when it is a setting, a threshold or a definition rather than a measurement.
* Between ``<!-- table: benchmarks/results/X.md -->`` and ``<!-- /table -->`` every table row must appear, as
  it is, in that committed file (a table copied from a report the benchmark script wrote).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ALLOWED_SOURCES = ("benchmarks/results/", "tests/")

MARKER = re.compile(r"<!--\s*from:\s*(?P<source>[^\s:]+(?:::\w+)?)(?::(?P<path>[^>]*?))?\s*-->")
GIVEN = re.compile(r"<!--\s*given\s*-->")
ANY_COMMENT = re.compile(r"<!--.*?-->", re.S)
NUMBER = re.compile(r"(?<![\w.])[-+]?(?P<int>\d+)(?:\.(?P<frac>\d+))?(?:e(?P<exp>[-+]?\d+))?")
UNITS = r"(?:ms|us|µs|ns|s|x|×|%|KiB|MiB|GiB|TiB|KB|MB|GB|GB/s|GiB/s|ulp|min|h)"
# a number followed by a unit of measurement, not by another digit or letter ("16x64" is a shape, "3x" a ratio)
MEASURED = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:e[-+]?\d+)?\s?" + UNITS + r"(?![\w/])")
BLOCK = re.compile(r"<!--\s*measured\s*-->(?P<body>.*?)<!--\s*/measured\s*-->", re.S)
TABLE = re.compile(r"<!--\s*table:\s*(?P<source>\S+)\s*-->(?P<body>.*?)<!--\s*/table\s*-->", re.S)


@dataclass(frozen=True)
class Problem:
    """One figure a document states that its source does not back, where and why."""

    document: str
    line: int
    text: str
    why: str

    def __str__(self) -> str:
        return f"{self.document}:{self.line}: {self.text!r}: {self.why}"


def documents(root: Path = ROOT) -> list[Path]:
    """The README and every Markdown file under docs/."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def check(text: str, name: str = "<text>", root: Path = ROOT) -> list[Problem]:
    """Every problem with the marked figures, measured blocks and copied tables of one document (code blocks and
    code spans are not read: they show markup, commands and examples)."""
    text = _without_code(text)
    return _markers(text, name, root) + _measured(text, name) + _tables(text, name, root)


def _without_code(text: str) -> str:
    """``text`` with fenced code blocks and inline code spans blanked (line numbers and positions kept)."""
    def blank(match: re.Match) -> str:
        return re.sub(r"[^\n]", " ", match.group())

    text = re.sub(r"^```.*?^```", blank, text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", blank, text)


def _line(text: str, position: int) -> int:
    return text.count("\n", 0, position) + 1


def _markers(text: str, name: str, root: Path) -> list[Problem]:
    problems = []
    for marker in MARKER.finditer(text):
        line_start = text.rfind("\n", 0, marker.start()) + 1
        before = ANY_COMMENT.sub(lambda m: " " * len(m.group()), text[line_start:marker.start()])
        numbers = list(NUMBER.finditer(before))
        where = _line(text, marker.start())
        if not numbers:
            problems.append(Problem(name, where, marker.group(), "no figure before the marker on its line"))
            continue
        shown = numbers[-1]
        shown_text = shown.group() + _unit_after(before, shown.end())
        why = _backs(shown, shown_text, marker.group("source"), (marker.group("path") or "").strip(), root)
        if why:
            problems.append(Problem(name, where, shown_text, why))
    return problems


def _unit_after(text: str, end: int) -> str:
    unit = re.match(r"\s?" + UNITS + r"(?![\w/])", text[end:])
    return unit.group() if unit else ""


def _backs(shown: re.Match, shown_text: str, source: str, path: str, root: Path) -> str:
    """Why the file ``source`` (at ``path``) does not back the figure ``shown``, or ""."""
    if not source.startswith(ALLOWED_SOURCES) or ".." in source:
        return f"{source} is not a committed file under {' or '.join(ALLOWED_SOURCES)}"
    test = None
    if "::" in source:
        source, test = source.split("::", 1)
    file = root / source
    if not file.is_file():
        return f"{source} does not exist"
    content = file.read_text(encoding="utf-8")
    if test is not None:
        if not re.search(rf"^\s*def {re.escape(test)}\(", content, re.M):
            return f"{source} has no test {test}"
        return "" if shown.group() in content else f"the test file {source} does not hold {shown.group()}"
    if not source.endswith(".json"):
        if path:
            return f"{source} is not JSON: a marker on it names no path"
        return "" if shown_text in content else f"{shown_text!r} does not appear in {source}"
    try:
        value = evaluate(json.loads(content), path)
    except (KeyError, IndexError, TypeError, ValueError) as err:
        return f"{source}:{path} does not name a number ({err})"
    return "" if agrees(shown, value) else f"{source}:{path} is {value!r}"


def agrees(shown: re.Match, value: float) -> bool:
    """Whether ``value`` rounds to the figure as shown (its decimals; a mantissa's with an exponent)."""
    decimals = len(shown.group("frac") or "")
    figure = float(shown.group())
    half = 0.5 * 10.0 ** -decimals * (10.0 ** int(shown.group("exp")) if shown.group("exp") else 1.0)
    return math.isfinite(value) and abs(abs(value) - abs(figure)) <= half * (1 + 1e-9) + 1e-12


_AGGREGATES = {"min": min, "max": max, "sum": sum, "len": len, "mean": lambda v: sum(v) / len(v)}
_STEP = re.compile(r'\s*(?:"(?P<quoted>[^"]*)"|(?P<name>[A-Za-z_][\w\-]*)|\[(?P<index>[^\]]*)\])\s*\.?')


def evaluate(data: Any, path: str) -> float:
    """The number at ``path`` in ``data`` (see the module docstring)."""
    path = path.strip()
    factor = 1.0
    scaled = re.fullmatch(r"(?P<path>.*?)\s*\*\s*(?P<factor>[\d.e+-]+)", path)
    if scaled:
        path, factor = scaled.group("path"), float(scaled.group("factor"))
    aggregate = re.fullmatch(r"(?P<fn>min|max|sum|len|mean)\((?P<inner>.*)\)", path)
    if aggregate:
        values = _walk([data], aggregate.group("inner"), many=False)
        return float(_AGGREGATES[aggregate.group("fn")](values)) * factor
    found = _walk([data], path, many=False)
    if len(found) != 1:
        raise ValueError(f"{len(found)} values: wrap the path in min/max/sum/len/mean")
    value = found[0]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{value!r} is not a number")
    return float(value) * factor


def _walk(values: list, path: str, many: bool) -> list:
    position = 0
    while position < len(path):
        step = _STEP.match(path, position)
        if step is None or step.end() == position:
            raise ValueError(f"cannot read the path at {path[position:]!r}")
        position = step.end()
        if step.group("index") is not None:
            values = [item for value in values for item in _select(value, step.group("index").strip())]
        else:
            key = step.group("quoted") if step.group("quoted") is not None else step.group("name")
            values = [value[key] for value in values]
    return values


def _select(value: list, index: str) -> list:
    if index == "*":
        return list(value.values()) if isinstance(value, dict) else list(value)
    if ":" in index:
        start, _, stop = index.partition(":")
        return list(value[int(start) if start else None:int(stop) if stop else None])
    return [value[int(part)] for part in index.split(",")]


def _measured(text: str, name: str) -> list[Problem]:
    problems = []
    for block in BLOCK.finditer(text):
        body, offset = block.group("body"), block.start("body")
        for figure in MEASURED.finditer(body):
            if _inside_comment(body, figure.start()):
                continue
            after = body[figure.end():]
            follows = re.match(r"[^\n<]{0,3}(<!--\s*(from:|given\b))", after)
            if follows is None:
                problems.append(Problem(name, _line(text, offset + figure.start()), figure.group(),
                                        "a measured figure without a 'from:' marker (or '<!-- given -->')"))
    return problems


def _inside_comment(text: str, position: int) -> bool:
    return text.rfind("<!--", 0, position) > text.rfind("-->", 0, position)


def _tables(text: str, name: str, root: Path) -> list[Problem]:
    problems = []
    for block in TABLE.finditer(text):
        source = block.group("source")
        file = root / source
        where = _line(text, block.start())
        if not source.startswith("benchmarks/results/") or not file.is_file():
            problems.append(Problem(name, where, source, "not a committed file under benchmarks/results/"))
            continue
        rows = {_row(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip().startswith("|")}
        for number, line in enumerate(block.group("body").splitlines()):
            if line.strip().startswith("|") and _row(line) not in rows:
                problems.append(Problem(name, where + number, line.strip(), f"this row is not in {source}"))
    return problems


def _row(line: str) -> tuple[str, ...]:
    return tuple(cell.strip() for cell in line.strip().strip("|").split("|"))
