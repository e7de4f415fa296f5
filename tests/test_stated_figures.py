"""Every figure the README and docs/ mark is the value in the committed file it names (``tests/stated_figures.py``,
convention in ``docs/contributing-figures.md``), every measured figure in a measured block has a source, and every
row of a copied table is in its report; and the check itself fails on each kind of unbacked figure."""
from __future__ import annotations

import json

import pytest

from tests.stated_figures import ROOT, check, documents


@pytest.mark.parametrize("document", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_marked_figure_is_backed(document):
    problems = check(document.read_text(encoding="utf-8"), str(document.relative_to(ROOT)))
    assert not problems, "\n".join(map(str, problems))


@pytest.fixture
def root(tmp_path):
    """A repository with one results file, one report and one test."""
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    (results / "r.json").write_text(json.dumps({
        "padding": [{"shape": "a", "ratio": 6.0933}, {"shape": "b", "ratio": 1.0615}, {"shape": "c", "ratio": 1.3158},
                    {"shape": "d", "ratio": 0.9355}],
        "summary": {"3 ms x 5": {"wrong": 1, "races": 20}}, "seconds": 0.01234, "label": "x"}))
    (results / "r.md").write_text("| case | time |\n|---|---|\n| Linear | 2.56 ms |\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_t.py").write_text("def test_speed():\n    assert ratio < 1.5\n")
    return tmp_path


def problems(text: str, root) -> list[str]:
    return [p.why for p in check(text, "doc.md", root)]


@pytest.mark.parametrize("text", [
    "6.1x<!-- from: benchmarks/results/r.json:padding[0].ratio --> slower",
    "6.09x<!-- from: benchmarks/results/r.json:padding[0].ratio -->",
    "at 0.94<!-- from: benchmarks/results/r.json:min(padding[1:].ratio) -->-1.32x"
    "<!-- from: benchmarks/results/r.json:max(padding[1:].ratio) --> elsewhere",
    "1.06<!-- from: benchmarks/results/r.json:max(padding[1,3].ratio) -->",
    '1<!-- from: benchmarks/results/r.json:summary."3 ms x 5".wrong --> race of '
    '20<!-- from: benchmarks/results/r.json:summary."3 ms x 5".races -->',
    "12.3 ms<!-- from: benchmarks/results/r.json:seconds *1000 -->",
    "4 shapes<!-- from: benchmarks/results/r.json:len(padding[*]) -->",
    "2.56 ms<!-- from: benchmarks/results/r.md -->",
    "under 1.5x<!-- from: tests/test_t.py::test_speed -->",
    "no figures here, 16x64x56x56 and 2 ms, outside a measured block",
])
def test_backed_figures_pass(text, root):
    assert problems(text, root) == []


@pytest.mark.parametrize("text,why", [
    # the README's old conv padding range: the file's largest 'elsewhere' ratio is 1.32x
    ("0.94-1.06x<!-- from: benchmarks/results/r.json:max(padding[1:].ratio) --> elsewhere", "is 1.3158"),
    ("6.2x<!-- from: benchmarks/results/r.json:padding[0].ratio -->", "is 6.0933"),
    ("6 races of 67<!-- from: benchmarks/results/r.json:summary.\"3 ms x 5\".races -->", "is 20"),
    ("5<!-- from: benchmarks/results/missing.json:a -->", "does not exist"),
    ("5<!-- from: /etc/passwd -->", "not a committed file"),
    ("5<!-- from: benchmarks/results/r.json:padding[9].ratio -->", "does not name a number"),
    ("5<!-- from: benchmarks/results/r.json:label -->", "does not name a number"),
    ("5<!-- from: benchmarks/results/r.json:padding[*].ratio -->", "does not name a number"),
    ("3.1 ms<!-- from: benchmarks/results/r.md -->", "does not appear"),
    ("2x<!-- from: tests/test_t.py::test_missing -->", "has no test"),
    ("3x<!-- from: tests/test_t.py::test_speed -->", "does not hold 3"),
    ("<!-- from: benchmarks/results/r.json:seconds --> with no figure", "no figure"),
    ("<!-- measured -->\nthe loops took 3.2 ms here\n<!-- /measured -->", "without a 'from:' marker"),
    ("<!-- measured -->\n| a | 1.5x |\n<!-- /measured -->", "without a 'from:' marker"),
    ("<!-- table: benchmarks/results/r.md -->\n| Linear | 2.57 ms |\n<!-- /table -->",
     "not in benchmarks/results/r.md"),
    ("<!-- table: README.md -->\n| a |\n<!-- /table -->", "not a committed file"),
])
def test_unbacked_figures_fail(text, why, root):
    found = problems(text, root)
    assert found and why in found[0], found


def test_the_6x_case_is_a_pass_by_rounding(root):
    """A figure shown without decimals stands for its unit interval: 6x backs any value in [5.5, 6.5]."""
    assert problems("6x<!-- from: benchmarks/results/r.json:padding[0].ratio -->", root) == []


def test_measured_blocks_accept_sources_settings_code_and_tables(root):
    text = ("<!-- measured -->\n"
            "a call took 12.3 ms<!-- from: benchmarks/results/r.json:seconds *1000 -->, a candidate 10x "
            "<!-- given --> behind is dropped; `--rounds 5 ms` is code; shapes 16x64x56x56 and 3x3 are not "
            "measurements\n<!-- /measured -->\n"
            "<!-- table: benchmarks/results/r.md -->\n"
            "| case | time |\n|---|---|\n| Linear | 2.56 ms |\n<!-- /table -->\n")
    assert problems(text, root) == []
