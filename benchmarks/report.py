"""The suite's results: latest.json / latest.md / latest.png, and the targets of issues 3 and 14 (the cases) and 48
and 50 (the suites, benchmarks/suites.py) checked as ratios.

    python benchmarks/report.py [RESULTS.json] [--check-targets]   # re-render (and check) a saved run
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

if __package__ in (None, ""):  # run as a script: make `benchmarks` and `tullax` importable from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.suites import SuiteTarget, suite_verdicts, suites_markdown  # noqa: E402
from tullax.benchmarking.comparators import COMPARATORS  # noqa: E402
from tullax.benchmarking.report import (  # noqa: E402
    counted_slowdown,
    counted_vs_best,
    fmt_err,
    make_console,
    plot,
    print_table,
    read_json,
    to_markdown,
    write_json,
)

RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Target:
    """One target of issues 3 and 14, per tullax backend: a ratio measured in one run (the TTFK targets alone are
    absolute times, as issue 14 states them)."""

    text: str
    cases: tuple[str, ...] | None  # None: every case, the worst one counts
    measure: Callable[[dict], float | None]
    bound: float
    at_least: bool
    show: Callable[[float], str]
    informational: bool = False  # shown next to the targets (status INFO), never passes or fails the run
    backends: tuple[str, ...] | None = None  # the tullax backends it is about (None: every one)

    def passes(self, value: float) -> bool:
        return value >= self.bound if self.at_least else value <= self.bound


def _get(field: str) -> Callable[[dict], float | None]:
    return lambda row: row.get(field)


def _slowdown(row: dict) -> float | None:
    return counted_slowdown(row, "fwd")


def _bwd_slowdown(row: dict) -> float | None:
    return counted_slowdown(row, "bwd")


def _times2(value: float) -> str:
    return f"{value:.2f}x"


def _times(value: float) -> str:
    return f"{value:.1f}x"


def _seconds(ms: float) -> str:
    return f"{ms / 1000:.2f} s"


def _percent(value: float) -> str:
    return f"{value * 100:.0f}%"


# The Dist forward target names its comparator: XLA materialising the K*I*J temporary. That is the
# broadcast-and-reduce written in the order the indices appear, `((W[:,:,None]-X[:,None,:])**2).sum(0)` (the
# "xla-naive" column, DESIGN's seed problem). tullax's own jnp lowering puts the free indices first, and XLA
# fuses THAT one without the temporary; the speed-up over it is shown too, as information: 30x over it would
# need the 411M subtract-square-adds in ~1 ms, several times faster than this CPU's arithmetic peak allows.
LEADS_BACKWARD = ("Dist", "conv1d", "conv2d", "embedding", "row max")
TARGETS = (
    Target("Dist forward >= 30x faster than XLA materialising K*I*J (naive XLA)", ("Dist",),
           _get("fwd_speedup_naive"), 30, True, _times),
    Target("Dist forward vs fused XLA (free indices first: no K*I*J temporary)", ("Dist",),
           _get("fwd_speedup"), 30, True, _times, informational=True),
    Target("Dist backward >= 5x faster than XLA", ("Dist",), _get("bwd_speedup"), 5, True, _times),
    Target("Linear grad/fwd <= 2.5", ("Linear",), _get("grad_fwd_ratio"), 2.5, False, _times),
    Target("Dist grad/fwd <= 2.5", ("Dist",), _get("grad_fwd_ratio"), 2.5, False, _times),
    Target("Linear forward within 3x of XLA (time / XLA time)", ("Linear",), _slowdown, 3, False, _times),
    Target("conv1d grad/fwd <= 3", ("conv1d",), _get("grad_fwd_ratio"), 3, False, _times),
    Target("warm TTFK <= 25% of cold, every case (worst)", None, _get("ttfk_warm_over_cold"), 0.25, False, _percent),
    Target("float32 max rel err <= 1e-4 vs float64 XLA, every case (worst)", None, _get("max_rel_err"), 1e-4,
           False, fmt_err),
    # issue 14: the planner is never slower than the best XLA formulation (tullax's lowering, naive, or the
    # hand-written jnp), allowing 5% noise, and runs Linear on BLAS both ways. A kernel that runs the best
    # formulation's very program counts as 1x (``counted_vs_best``): its measured ratio is noise. Otherwise the
    # ratio timed head to head in one process counts (the runner's ``head_to_head``), not the ratio of two rows
    # timed in processes of their own: conv2d's lax.conv varied 20% from one process to the next.
    Target("auto forward >= 0.95x the best XLA formulation (head to head), every case (worst)", None,
           lambda row: counted_vs_best(row, "fwd"), 0.95, True, _times2, backends=("auto",)),
    Target("auto backward >= 0.95x the best XLA formulation (head to head), every case (worst)", None,
           lambda row: counted_vs_best(row, "bwd"), 0.95, True, _times2, backends=("auto",)),
    # issue 14: where the loops led XLA when the issue was opened, auto keeps a lead (head to head, beyond the
    # 5% noise allowed above): Dist both ways, and the backward of conv1d, conv2d, the embedding and row max
    Target("auto forward leads the best XLA formulation by >= 1.1x (head to head): Dist", ("Dist",),
           lambda row: counted_vs_best(row, "fwd"), 1.1, True, _times2, backends=("auto",)),
    Target("auto backward leads the best XLA formulation by >= 1.1x (head to head): Dist, conv1d, conv2d, "
           "embedding, row max (worst)", LEADS_BACKWARD, lambda row: counted_vs_best(row, "bwd"), 1.1, True, _times2,
           backends=("auto",)),
    Target("auto Linear forward within 1.1x of XLA (time / XLA time)", ("Linear",), _slowdown, 1.1, False, _times2,
           backends=("auto",)),
    Target("auto Linear backward within 1.1x of XLA (time / XLA time)", ("Linear",), _bwd_slowdown, 1.1, False,
           _times2, backends=("auto",)),
    # issue 14's time to first kernel: absolute seconds on the bench machine, as the issue defines them
    Target("TTFK cold <= 1.0 s, every case (worst)", None, _get("ttfk_cold_ms"), 1000.0, False, _seconds),
    Target("TTFK warm <= 0.3 s, every case (worst)", None, _get("ttfk_warm_ms"), 300.0, False, _seconds),
)


@dataclass(frozen=True)
class Verdict:
    status: str  # PASS, FAIL, MISSING, or INFO for an informational row
    backend: str
    target: Target | SuiteTarget
    measured: str


def check_targets(doc: dict) -> list[Verdict]:
    """Every target for every tullax backend of the run, the cases' then the suites' (those of the suites that
    ran). A missing measurement is MISSING, not a pass."""
    verdicts = []
    if doc["cases"]:
        for backend in [b for b in doc["config"]["backends"] if b not in COMPARATORS]:
            for target in TARGETS:
                if target.backends is None or backend in target.backends:
                    verdicts.append(_verdict(doc, backend, target))
    verdicts += [Verdict(*found) for found in suite_verdicts(doc.get("suites", []))]
    return verdicts


def _issues(verdicts: list[Verdict]) -> str:
    numbers = ["3", "14"] + (["48", "50"] if any(isinstance(v.target, SuiteTarget) for v in verdicts) else [])
    return f"issues {', '.join(numbers[:-1])} and {numbers[-1]}"


def _verdict(doc: dict, backend: str, target: Target) -> Verdict:
    cases = [c for c in doc["cases"] if target.cases is None or c["name"] in target.cases]
    if target.cases is not None and len(cases) < len(target.cases):
        return Verdict("MISSING", backend, target, "case not run")
    measured = [(case["name"], target.measure(case["results"].get(backend, {}))) for case in cases]
    missing = [name for name, value in measured if not isinstance(value, int | float) or math.isnan(value)]
    if missing or not measured:
        return Verdict("MISSING", backend, target, f"no measurement for {', '.join(missing) or 'any case'}")
    pick = min if target.at_least else max
    worst_case, worst = pick(measured, key=lambda item: item[1])
    where = f" ({worst_case})" if target.cases is None or len(target.cases) > 1 else ""
    status = "INFO" if target.informational else "PASS" if target.passes(worst) else "FAIL"
    return Verdict(status, backend, target, target.show(worst) + where)


def targets_markdown(verdicts: list[Verdict], quick: bool) -> str:
    lines = [f"## Targets ({_issues(verdicts)})", ""]
    if quick:
        lines += ["Measured at --quick sizes; the targets are defined at the default sizes.", ""]
    lines += ["| result | backend | target | measured |", "|---|---|---|---|"]
    lines += [f"| {v.status} | {v.backend} | {v.target.text} | {v.measured} |" for v in verdicts]
    return "\n".join(lines)


def print_targets(verdicts: list[Verdict], console: Any, quick: bool) -> None:
    from rich.text import Text

    styles = {"PASS": "green", "FAIL": "red", "MISSING": "yellow", "INFO": "cyan"}
    quick_note = " (quick sizes; defined at default sizes)" if quick else ""
    console.print(Text(f"targets of {_issues(verdicts)}{quick_note}", style="bold"))
    if not verdicts:
        console.print(Text("no tullax backend was measured, so no target could be checked", style="red"))
    for verdict in verdicts:
        line = Text(f"{verdict.status:<8}", style=styles[verdict.status])
        line.append(f"{verdict.backend:<11}{verdict.target.text:<72}{verdict.measured}")
        console.print(line)


def save(doc: dict, out_dir: Path, name: str, chart: bool = True) -> list[Path]:
    """Write NAME.json, NAME.md (the cases, the suites' tables, the targets) and NAME.png (the cases' chart; none
    when ``chart`` is False or no case ran) under out_dir; returns the paths."""
    quick = bool(doc["config"].get("quick"))
    paths = [out_dir / f"{name}.{ext}" for ext in ("json", "md", "png")]
    write_json(doc, paths[0])
    verdicts = check_targets(doc)
    extra = [suites_markdown(doc.get("suites", []))]
    if len(doc["config"]["backends"]) > 1:
        extra.append(targets_markdown(verdicts, quick))
    title = "tullax benchmarks" + ("" if doc.get("complete", True) else " (partial results: the run was stopped)")
    paths[1].write_text(to_markdown(doc, title=title, extra="\n\n".join(e for e in extra if e)))
    if not chart or not doc["cases"]:
        return paths[:2]
    plot(doc, paths[2])
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Re-render a saved benchmark run and check the targets.")
    parser.add_argument("results", nargs="?", default=str(RESULTS_DIR / "latest.json"))
    parser.add_argument("--check-targets", action="store_true", help="exit 1 unless every target passes")
    parser.add_argument("--no-write", action="store_true", help="print only; do not rewrite .md and .png")
    args = parser.parse_args(argv)
    path = Path(args.results)
    doc = read_json(path)
    console = make_console()
    print_table(doc, console, title=f"tullax benchmarks ({path.name})")
    if not args.no_write:
        save(doc, path.parent, path.stem)
    verdicts = check_targets(doc)
    print_targets(verdicts, console, bool(doc["config"].get("quick")))
    return 1 if args.check_targets and not all_pass(verdicts) else 0


def all_pass(verdicts: list[Verdict]) -> bool:
    """At least one target checked, and every one passed (information rows aside)."""
    return bool(verdicts) and all(v.status in ("PASS", "INFO") for v in verdicts)


if __name__ == "__main__":
    sys.exit(main())
