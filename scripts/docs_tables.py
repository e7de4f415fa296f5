"""The benchmark tables of README.md and docs/benchmarks.md, and the chart docs/img/benchmarks.png, generated from
the committed results files (benchmarks/results/latest.json for the CPU, gpu-nvidia-h200.json for the GPU), so that
no figure in them is typed by hand.

A generated block sits between ``<!-- generated: NAME from benchmarks/results/FILE -->`` and
``<!-- end generated -->``; ``python scripts/docs_tables.py`` rewrites every block (and the chart with ``--chart``),
``--check`` exits 1 when a page differs from what the results give (tests/test_docs.py checks the same).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CPU_FILE = "latest.json"
GPU_FILE = "gpu-nvidia-h200.json"
PAGES = ("README.md", "docs/benchmarks.md", "docs/gpu.md")  # the pages with generated blocks
CHART = ROOT / "docs" / "img" / "benchmarks.png"
_BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) from benchmarks/results/(?P<file>[\w.-]+) -->\n)"
                    r"(?P<body>.*?)(<!-- end generated -->)", re.DOTALL)


def _report():
    sys.path.insert(0, str(ROOT))
    from tullax.benchmarking import report

    return report


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def cpu_summary(doc: dict) -> str:
    """One row per case: ``auto`` against the best XLA formulation (head to head where timed so), and its time to
    first kernel."""
    report = _report()
    machine = doc["machine"]
    lines = [f"float32 on {machine['usable_cores']} CPU cores, jax {machine['versions']['jax']}: "
             "`backend=\"auto\"` against the fastest of three XLA formulations of each case, timed head to head "
             "in one process (above 1x: tullax is faster). TTFK: time to the first forward and gradient results in "
             "a new process, with an empty "
             "(cold) and a populated (warm) compile cache.", "",
             "| case | forward | backward | forward vs best XLA | backward vs best XLA | TTFK cold | TTFK warm |",
             "|---|---|---|---|---|---|---|"]
    for case in doc["cases"]:
        row = case["results"]["auto"]
        lines.append(f"| {case['name']} | {report.fmt_ms(row.get('fwd_ms'))} | {report.fmt_ms(row.get('bwd_ms'))} | "
                     f"{_x(report.counted_vs_best(row, 'fwd'))} | {_x(report.counted_vs_best(row, 'bwd'))} | "
                     f"{report.fmt_ms(row.get('ttfk_cold_ms'))} | {report.fmt_ms(row.get('ttfk_warm_ms'))} |")
    return "\n".join(lines) + "\n"


def cpu_full(doc: dict) -> str:
    """Every backend of every case, the head-to-head table and the cases' specs and shapes."""
    report = _report()
    columns = report.MARKDOWN_COLUMNS
    lines = [f"{doc['machine']['usable_cores']} CPU cores, jax {doc['machine']['versions']['jax']}, "
             f"{doc['config']['dtype']}.", "",
             "| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in report.cells(case, backend, row)) + " |"
              for case, backend, row in report.rows(doc)]
    lines += ["", "`auto` against the best XLA formulation, head to head (one process runs the two alternately on the "
              "same inputs; ratio: the median over the rounds of that formulation's time over `auto`'s, above 1: "
              "`auto` is faster):", "",
              "| case | phase | best XLA formulation | auto | that formulation | ratio | rounds |",
              "|---|---|---|---|---|---|---|"]
    lines += report.head_to_head_lines(doc)
    lines += ["", "| case | spec | shapes |", "|---|---|---|"]
    for case in doc["cases"]:
        shapes = ", ".join(f"{name} {'x'.join(map(str, shape)) or 'scalar'}" for name, shape in case["shapes"].items())
        lines.append(f"| {case['name']} | `{case['canonical'].replace('|', chr(92) + '|')}` | {shapes} |")
    return "\n".join(lines) + "\n"


def _gpu_best_forward(row: dict) -> float:
    return min(t for t in (row.get("xla_forward_ms"), row.get("naive_forward_ms")) if t is not None)


def gpu_summary(doc: dict) -> str:
    """``auto`` on the GPU against XLA, one row per case."""
    versions = doc["versions"]
    lines = [f"{doc['dtype']} on one {doc['device']}, jax {versions['jax']}, NVRTC {versions['nvrtc']}: "
             "`backend=\"auto\"` against XLA (above 1x: tullax is faster).", "",
             "| case | forward (ms) | backward (ms) | forward vs best XLA | backward vs XLA |", "|---|---|---|---|---|"]
    for row in doc["timings"]:
        lines.append(f"| {row['case']} | {_ms(row['auto_forward_ms'])} | {_ms(row['auto_backward_ms'])} | "
                     f"{_x(_gpu_best_forward(row) / row['auto_forward_ms'])} | "
                     f"{_x(row['xla_backward_ms'] / row['auto_backward_ms'])} |")
    return "\n".join(lines) + "\n"


def gpu_full(doc: dict) -> str:
    """The cuda backend alone and ``auto``, against XLA, with the overhead and time to first kernel."""
    lines = [gpu_summary(doc), "The `cuda` backend alone (every kernel on the printed CUDA C):", "",
             "| case | forward (ms) | backward (ms) | XLA forward | XLA backward | forward vs XLA | backward vs XLA |",
             "|---|---|---|---|---|---|---|"]
    for row in doc["timings"]:
        lines.append(f"| {row['case']} | {_ms(row['cuda_forward_ms'])} | {_ms(row['cuda_backward_ms'])} | "
                     f"{_ms(row['xla_forward_ms'])} | {_ms(row['xla_backward_ms'])} | "
                     f"{_x(row['xla_forward_ms'] / row['cuda_forward_ms'])} | "
                     f"{_x(row['xla_backward_ms'] / row['cuda_backward_ms'])} |")
    lines += ["", "Long sums over few outputs split across thread blocks, against one thread per output "
              "(`TULLAX_CUDA_SPLIT=0`):", "",
              "| case | backward, split (ms) | backward, unsplit (ms) |", "|---|---|---|"]
    unsplit = {row["case"]: row for row in doc.get("unsplit", [])}
    split = {row["case"]: row for row in doc["timings"]}
    for case, row in unsplit.items():
        lines.append(f"| {case} | {_ms(split[case]['cuda_backward_ms'])} | {_ms(row['cuda_backward_ms'])} |")
    ttfk, overhead = doc["ttfk"], doc["overhead"]
    passed = {}
    for case in doc.get("corpus", []):
        counts = passed.setdefault(case["dtype"], [0, 0])
        counts[0] += bool(case["passed"])
        counts[1] += 1
    lines += ["", f"Per-call overhead under jit: {overhead['tullax_us']:.1f} µs against {overhead['jnp_us']:.1f} µs "
              "for "
              f"a jnp operation. Time to first kernel of Dist's forward and gradients in a new process: `cuda` "
              f"{ttfk['cold_s']:.2f} s cold and {ttfk['warm_s']:.2f} s warm, `auto` {ttfk['auto_cold_s']:.2f} s cold "
              f"and {ttfk['auto_warm_s']:.2f} s warm. Every corpus kernel, forward and gradients, against XLA on the "
              "GPU: " + ", ".join(f"{dtype} {ok}/{total}" for dtype, (ok, total) in passed.items()) + "."]
    return "\n".join(lines) + "\n"


GENERATORS: dict[str, Callable[[dict], str]] = {"cpu-summary": cpu_summary, "cpu-full": cpu_full,
                                                "gpu-summary": gpu_summary, "gpu-full": gpu_full}


def render(text: str) -> str:
    """``text`` with every generated block made again from its results file."""
    def block(match: re.Match) -> str:
        body = GENERATORS[match["name"]](_load(match["file"]))
        return f"{match.group(1)}{body}<!-- end generated -->"

    return _BLOCK.sub(block, text)


def chart(path: Path = CHART) -> None:
    _report().plot(_load(CPU_FILE), path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page differs from its results")
    parser.add_argument("--chart", action="store_true", help="draw docs/img/benchmarks.png too")
    args = parser.parse_args(argv)
    stale = []
    for page in PAGES:
        path = ROOT / page
        text = path.read_text(encoding="utf-8")
        made = render(text)
        if made != text:
            stale.append(page)
            if not args.check:
                path.write_text(made, encoding="utf-8")
    if args.chart and not args.check:
        chart()
    if args.check and stale:
        print("differs from benchmarks/results: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
