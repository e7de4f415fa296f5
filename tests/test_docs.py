"""The README and the docs site (docs/, built by `mkdocs build --strict` in `make test`) cannot rot: every fenced
```python block runs, in order per page, in one namespace per page, and where a page shows what a block prints (a
```text block right after it, under an `<!-- output -->` line) the printed text must match; a line `...` in the
shown output stands for any number of lines (what depends on the machine: the loop backend, timings). A block
that must not run says why on the line before it: `<!-- no-run: reason -->`.

The benchmark tables are generated from benchmarks/results (scripts/docs_tables.py) and must be what the results
give; the code's design references name a section the design page has.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\s*$")
NO_RUN = re.compile(r"^<!-- no-run: \S.* -->$")
OUTPUT = "<!-- output -->"
MAX_README_LINES = 250


@dataclass(frozen=True)
class Block:
    line: int  # where the block's code starts (1-based)
    code: str
    runs: bool
    output: str | None  # what the page shows it prints


def blocks(text: str) -> list[Block]:
    """The page's ```python blocks, each with its no-run mark and shown output."""
    lines = text.splitlines()
    fences = []  # (language, first line of the body, the body, the line before the fence, the closing line)
    i = 0
    while i < len(lines):
        found = _FENCE.match(lines[i])
        if found is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        fences.append((found.group(1), i + 2, "\n".join(lines[i + 1:end]), before, end))
        i = end + 1
    found_blocks = []
    for n, (language, start, body, before, end) in enumerate(fences):
        if language != "python":
            continue
        output = None
        if n + 1 < len(fences) and fences[n + 1][0] == "text" and fences[n + 1][3] == OUTPUT:
            between = lines[end + 1:fences[n + 1][1] - 2]
            if all(not line.strip() or line.strip() == OUTPUT for line in between):
                output = fences[n + 1][2]
        found_blocks.append(Block(start, body, not NO_RUN.match(before), output))
    return found_blocks


def matches(shown: str, printed: str) -> bool:
    """Whether ``printed`` is the ``shown`` output, a line ``...`` in it standing for any lines."""
    pattern = "".join(r"(?:.*\n)*?" if line.strip() == "..." else re.escape(line.rstrip()) + r"\n"
                        for line in shown.strip("\n").splitlines())
    text = "\n".join(line.rstrip() for line in printed.strip("\n").splitlines()) + "\n"
    return re.fullmatch(pattern, text) is not None


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_python_example_of_the_page_runs_and_prints_what_it_shows(page: Path, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    for block in blocks(page.read_text(encoding="utf-8")):
        if not block.runs:
            continue
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            try:
                exec(compile(block.code, f"{page.name}:{block.line}", "exec"), namespace)
            except Exception as err:
                raise AssertionError(f"{page.relative_to(ROOT)}, the example at line {block.line} failed: "
                                     f"{type(err).__name__}: {err}") from err
        if block.output is not None:
            assert matches(block.output, printed.getvalue()), (
                f"{page.relative_to(ROOT)}, line {block.line} printed:\n{printed.getvalue()}\nthe page shows:\n"
                f"{block.output}")


def test_the_collector_finds_marks_and_outputs():
    page = ("text\n```python\nprint(1)\n```\n<!-- output -->\n```text\n1\n```\n\n<!-- no-run: needs a GPU -->\n"
            "```python\nraise SystemExit\n```\n```text\nnot an output\n```\n")
    found = blocks(page)
    assert [(b.line, b.code, b.runs, b.output) for b in found] == [(3, "print(1)", True, "1"),
                                                                 (12, "raise SystemExit", False, None)]
    assert matches("a\n...\nd", "a\nb\nc\nd\n") and not matches("a\nd", "a\nb\nd")


def test_a_no_run_mark_says_why():
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for line in text.splitlines():
            if line.startswith("<!-- no-run"):
                assert NO_RUN.match(line), f"{page.name}: a no-run mark says why: {line}"


def test_the_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES
    quick_start = "\n".join(lines[lines.index("## Quick start"):])
    commands = re.findall(r"^make \w+", quick_start.split("```")[1], re.MULTILINE)
    assert commands == ["make demo", "make test"]


def _docs_tables():
    spec = importlib.util.spec_from_file_location("docs_tables", ROOT / "scripts" / "docs_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_tables_are_the_results_files():
    tables = _docs_tables()
    for page in tables.PAGES:
        text = (ROOT / page).read_text(encoding="utf-8")
        assert "<!-- generated: " in text, f"{page} has no generated table"
        assert tables.render(text) == text, f"{page}: run `python scripts/docs_tables.py`"
    assert tables.CHART.is_file(), "run `python scripts/docs_tables.py --chart`"


def test_the_codes_design_references_name_a_section_of_the_design_page():
    design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    sections = set(re.findall(r"^## (\d+)\. ", design, re.MULTILINE))
    cited = []
    for folder in ("tullax", "tests", "benchmarks", "scripts"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            assert path == Path(__file__) or "DESIGN section" not in text, f"{path}: cite docs/design.md, section N"
            cited += re.findall(r"docs/design\.md, sections? (\d+)", text)
    assert len(cited) >= 12 and set(cited) <= sections
