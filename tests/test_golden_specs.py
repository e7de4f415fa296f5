"""Golden files: what the compiler says about ~10 canonical specs, one file per spec in tests/golden/spec/.

A golden file is a list of sections ``## name`` followed by text. ``## spec`` (and ``## explicit_ranges``, JSON,
when the spec needs them) is the input; every other section is the output of one ASPECT below, checked by
``test_golden``. ``TULLAX_UPDATE_GOLDEN=1 pytest tests/test_golden_specs.py`` rewrites the aspect sections
(review the diff!). Sections no aspect here knows about are kept as they are, so other modules' aspects (the
gradient specs: register ``"gradients"`` in ASPECTS) live in the same files.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from tullax.errors import TullaxError
from tullax.spec.analyze import analyze
from tullax.spec.ir import ParsedSpec, Spec
from tullax.spec.parse import parse_spec
from tullax.spec.text import format_idx, format_spec

GOLDEN_DIR = Path(__file__).parent / "golden" / "spec"
UPDATE = os.environ.get("TULLAX_UPDATE_GOLDEN") == "1"
INPUT_SECTIONS = ("spec", "explicit_ranges")


@dataclass(frozen=True)
class Golden:
    """What an aspect renders from: the spec as written, parsed, and analysed (with its explicit ranges)."""

    text: str
    parsed: ParsedSpec
    spec: Spec


def render_inputs(spec: Spec) -> str:
    return "\n".join(f"{i.name}: {i.kind}, rank {i.rank}" for i in spec.inputs)


def render_indices(spec: Spec) -> str:
    return f"free: {' '.join(spec.free) or '-'}\nreduced: {' '.join(spec.reduced) or '-'}"


def render_ranges(spec: Spec) -> str:
    return "\n".join(f"{name}: {rng.lo} <= {name} < {rng.hi}" for name, rng in spec.ranges)


def render_agreements(spec: Spec) -> str:
    rows = [f"{a.index}: axis {a.first[1]} of {a.first[0]} == axis {a.second[1]} of {a.second[0]}"
            for a in spec.agreements]
    return "\n".join(rows) or "-"


def render_out_shape(spec: Spec) -> str:
    return "(" + ", ".join(str(s) for s in spec.out_shape) + ")"


def render_lhs(spec: Spec) -> str:
    if spec.lhs is None:
        return "scalar"
    kind = "scatter" if spec.is_scatter else "plain"
    return f"{kind}: " + ", ".join(format_idx(i) for i in spec.lhs)


# aspect name -> renderer of a Golden; the order here is the order of the sections in the files.
ASPECTS: dict[str, Callable[[Golden], str]] = {
    "canonical": lambda g: format_spec(g.parsed),  # the canonical text of what the user wrote
    "analysed": lambda g: format_spec(g.spec),  # after analysis: free indices shifted to start at 0
    "inputs": lambda g: render_inputs(g.spec),
    "indices": lambda g: render_indices(g.spec),
    "ranges": lambda g: render_ranges(g.spec),
    "agreements": lambda g: render_agreements(g.spec),
    "out_shape": lambda g: render_out_shape(g.spec),
    "lhs": lambda g: render_lhs(g.spec),
    "gradients": lambda g: render_gradients(g.spec),
}


def render_gradients(spec) -> str:
    """One line per gradient (its steps joined by '; '), or why there are none."""
    from tullax.grad import gradient_texts

    try:
        return "\n".join(gradient_texts(spec)) or "(no differentiable inputs)"
    except TullaxError as err:
        return f"(no gradients: {err})"


def read_golden(path: Path) -> dict[str, str]:
    """Sections of a golden file, in file order."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return {name: "\n".join(lines).strip("\n") for name, lines in sections.items()}


def write_golden(path: Path, sections: dict[str, str]) -> None:
    """Inputs first, then the known aspects in ASPECTS order, then any other section as found."""
    order = list(INPUT_SECTIONS) + list(ASPECTS) + [s for s in sections if s not in INPUT_SECTIONS + tuple(ASPECTS)]
    text = "".join(f"## {name}\n{sections[name]}\n\n" for name in order if name in sections)
    path.write_text(text.rstrip("\n") + "\n", encoding="utf-8")


def load_golden(sections: dict[str, str]) -> Golden:
    """The Golden of a file's input sections (``explicit_ranges``: JSON, pairs as lists)."""
    given = json.loads(sections["explicit_ranges"]) if sections.get("explicit_ranges") else None
    ranges = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items()} if given else None
    parsed = parse_spec(sections["spec"])
    return Golden(sections["spec"], parsed, analyze(parsed, ranges))


GOLDEN_FILES = sorted(GOLDEN_DIR.glob("*.txt"))


def test_there_are_about_ten_golden_specs():
    assert len(GOLDEN_FILES) >= 10


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=lambda p: p.stem)
def test_golden(path: Path):
    sections = read_golden(path)
    golden = load_golden(sections)
    fresh = {name: render(golden) for name, render in ASPECTS.items()}
    if UPDATE:
        write_golden(path, {**sections, **fresh})
        return
    for name, text in fresh.items():
        assert name in sections, f"{path.name} has no '## {name}' section: run with TULLAX_UPDATE_GOLDEN=1"
        assert sections[name] == text, f"{path.name}, section {name}"


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=lambda p: p.stem)
def test_canonical_text_is_a_fixed_point(path: Path):
    """Printing, parsing and printing again changes nothing: the canonical text is canonical."""
    sections = read_golden(path)
    canonical = sections["canonical"]
    assert format_spec(parse_spec(canonical)) == canonical
