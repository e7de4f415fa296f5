"""The results document: machine information, derived ratios, and its JSON, Markdown, console and PNG forms.

Document layout (``format`` 1)::

    {"format": 1, "machine": {...}, "config": {...}, "unavailable": {backend: why}, "elapsed_s": ...,
     "cases": [{"name", "spec", "canonical", "shapes", "check_shapes", "ttfk_shapes", "dtype",
                "results": {backend: {"status", "fwd_ms", "bwd_ms", "first_fwd_ms", "first_bwd_ms",
                                      "ttfk_cold_ms", "ttfk_warm_ms", "peak_rss_mb", "rss_before_mb",
                                      "max_rel_err", "rel_err", "errors", "cache_entries",
                                      derived: "grad_fwd_ratio", "fwd_speedup", "bwd_speedup",
                                      "ttfk_warm_over_cold"}}}]}

Times are milliseconds; speed-ups are XLA's time over the backend's (above 1: faster than XLA).
"""
from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from tullax.benchmarking.comparators import COMPARATORS, NAIVE_XLA, REFERENCE, XLA_COMPARATORS

VERSIONED = ("tullax", "numpy", "jax", "jaxlib", "numba", "llvmlite", "juliacall", "matplotlib")
MARKDOWN_COLUMNS = ("case", "backend", "forward", "backward", "grad/fwd", "fwd vs XLA", "bwd vs XLA",
                    "fwd vs naive XLA", "bwd vs naive XLA", "fwd vs best XLA", "bwd vs best XLA", "TTFK cold",
                    "TTFK warm", "peak RSS", "max rel err")


# ------------------------------------------------------------------------------------------ machine


def machine_info() -> dict[str, Any]:
    """What the numbers depend on: CPU, cores, memory, versions, date, the repository's commit."""
    return {
        "cpu": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": _memory_gib(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "versions": {name: _version(name) for name in VERSIONED},
        "julia": _julia(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": _git_commit(),
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as meminfo:
            kib = int(next(line for line in meminfo if line.startswith("MemTotal")).split()[1])
    except (OSError, StopIteration, ValueError):
        return None
    return round(kib / 1024**2, 1)


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _julia() -> str | None:
    """The Julia found (never importing juliacall: without a Julia that import downloads one)."""
    try:
        from tullax.backends.julia.detect import find_julia
    except ImportError:
        return None
    found = find_julia()
    return f"{found.version_text} ({found.exe})" if found else None


def _git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=False, cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


# ------------------------------------------------------------------------------------------ derived


def _ratio(numerator: Any, denominator: Any) -> float | None:
    if isinstance(numerator, int | float) and isinstance(denominator, int | float) and denominator > 0:
        return numerator / denominator
    return None


def derive(doc: dict) -> dict:
    """Add the ratios every reader wants: grad/fwd, speed-ups over XLA, warm over cold TTFK (in place)."""
    for case in doc["cases"]:
        reference = case["results"].get(REFERENCE, {})
        naive = case["results"].get(NAIVE_XLA, {})
        for row in case["results"].values():
            row["fwd_speedup_naive"] = _ratio(naive.get("fwd_ms"), row.get("fwd_ms"))
            row["bwd_speedup_naive"] = _ratio(naive.get("bwd_ms"), row.get("bwd_ms"))
            row["grad_fwd_ratio"] = _ratio(row.get("bwd_ms"), row.get("fwd_ms"))
            row["fwd_speedup"] = _ratio(reference.get("fwd_ms"), row.get("fwd_ms"))
            row["bwd_speedup"] = _ratio(reference.get("bwd_ms"), row.get("bwd_ms"))
            row["ttfk_warm_over_cold"] = _ratio(row.get("ttfk_warm_ms"), row.get("ttfk_cold_ms"))
        for which in ("fwd", "bwd"):
            best = best_xla(case["results"], which)
            for name, row in case["results"].items():
                row[f"{which}_vs_best_xla"] = (_ratio(case["results"][best][f"{which}_ms"], row.get(f"{which}_ms"))
                                               if best else None)
                row[f"{which}_best_xla"] = best
                row[f"{which}_same_program"] = same_program(case, name, which)
    return doc


def best_xla(results: dict, which: str) -> str | None:
    """The best XLA formulation of a case's ``which`` phase ("fwd" or "bwd"): the XLA comparator row (tullax's
    lowering, naive, or hand-written jnp) with the shortest time, or None when none has one."""
    times = {c: results.get(c, {}).get(f"{which}_ms") for c in XLA_COMPARATORS}
    times = {c: t for c, t in times.items() if isinstance(t, int | float) and t > 0}
    return min(times, key=lambda c: times[c]) if times else None


def head_to_head(row: dict, which: str) -> dict | None:
    """The row's ``which`` phase timed head to head with the best XLA formulation in one process (the runner's
    ``h2h`` child: ``tullax.benchmarking.worker.phase_h2h``), or None where it was not (or against another
    comparator than the one that is best now)."""
    found = (row.get("h2h") or {}).get(which)
    return found if found and found.get("comparator") == row.get(f"{which}_best_xla") else None


def same_program(case: dict, backend: str, which: str) -> list[str]:
    """The XLA comparators whose ``which`` ("fwd" or "bwd") program is the very one ``backend`` ran (the same
    fingerprint: ``tullax.benchmarking.programs``)."""
    mine = case["results"].get(backend, {}).get(f"{which}_program")
    if not mine:
        return []
    return [c for c in XLA_COMPARATORS
            if c != backend and case["results"].get(c, {}).get(f"{which}_program") == mine]


def runs_program_of(row: dict, which: str, comparator: str | None) -> bool:
    """Whether the row's ``which`` program is the very one ``comparator`` ran (``derive``'s ``same_program``)."""
    return comparator is not None and comparator in row.get(f"{which}_same_program", ())


def counted_vs_best(row: dict, which: str, *, paired: bool = True) -> float | None:
    """The row's speed against the best XLA formulation as the targets count it: 1 where it runs that
    formulation's very program (what was measured is then the noise between processes); else the median ratio of
    the two timed head to head in one process, where they were (``head_to_head``; not with ``paired=False``, which
    the chart uses so that every bar is a ratio of rows timed alike); else the ratio of the rows."""
    if runs_program_of(row, which, row.get(f"{which}_best_xla")):
        return 1.0
    found = head_to_head(row, which) if paired else None
    if found is not None:
        return found["ratio"]
    return row.get(f"{which}_vs_best_xla")


def counted_slowdown(row: dict, which: str) -> float | None:
    """The row's time over the XLA reference's, as the targets count it (1 for the very same program)."""
    if runs_program_of(row, which, REFERENCE):
        return 1.0
    speedup = row.get(f"{which}_speedup")
    return 1 / speedup if speedup else None


def rows(doc: dict) -> list[tuple[dict, str, dict]]:
    """(case, backend, result) in display order."""
    return [(case, backend, case["results"][backend]) for case in doc["cases"]
            for backend in doc["config"]["backends"] if backend in case["results"]]


# ------------------------------------------------------------------------------------------ formatting


def fmt_ms(value: Any) -> str:
    if not isinstance(value, int | float):
        return "—"
    if value < 1:
        return f"{value * 1e3:.0f} µs"
    if value < 1000:
        return f"{value:.3g} ms" if value < 100 else f"{value:.0f} ms"
    return f"{value / 1e3:.2f} s"


def fmt_x(value: Any) -> str:
    if not isinstance(value, int | float):
        return "—"
    return f"{value:.2g}x" if value < 10 else f"{value:.0f}x"


def fmt_ratio(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, int | float) else "—"


def fmt_err(value: Any) -> str:
    return f"{value:.1e}" if isinstance(value, int | float) else "—"


def fmt_mb(value: Any) -> str:
    if not isinstance(value, int | float):
        return "—"
    return f"{value / 1024:.2f} GiB" if value >= 1024 else f"{value:.0f} MiB"


def fmt_against(row: dict, which: str, field: str, comparator: str | None) -> str:
    """A ratio against ``comparator``, marked ``≡`` where the row runs that comparator's very program."""
    measured = fmt_x(row.get(field))
    return f"≡ ({measured})" if runs_program_of(row, which, comparator) else measured


def cells(case: dict, backend: str, row: dict) -> list[str]:
    reference = backend == REFERENCE
    naive = backend == NAIVE_XLA
    return [
        case["name"], backend, fmt_ms(row.get("fwd_ms")), fmt_ms(row.get("bwd_ms")),
        fmt_ratio(row.get("grad_fwd_ratio")),
        "(reference)" if reference else fmt_against(row, "fwd", "fwd_speedup", REFERENCE),
        "(reference)" if reference else fmt_against(row, "bwd", "bwd_speedup", REFERENCE),
        "(reference)" if naive else fmt_against(row, "fwd", "fwd_speedup_naive", NAIVE_XLA),
        "(reference)" if naive else fmt_against(row, "bwd", "bwd_speedup_naive", NAIVE_XLA),
        fmt_against(row, "fwd", "fwd_vs_best_xla", row.get("fwd_best_xla")),
        fmt_against(row, "bwd", "bwd_vs_best_xla", row.get("bwd_best_xla")),
        fmt_ms(row.get("ttfk_cold_ms")), "n/a" if backend in COMPARATORS else fmt_ms(row.get("ttfk_warm_ms")),
        fmt_mb(row.get("peak_rss_mb")), fmt_err(row.get("max_rel_err")),
    ]


def problems(doc: dict) -> list[str]:
    """One line per failed, timed-out or crashed measurement."""
    lines = []
    for case, backend, row in rows(doc):
        where = f"{case['name']} · {backend}"
        if row.get("status", "ok") not in ("ok", "errors"):
            lines.append(f"{where}: {row['status']}")
        for phase, error in (row.get("errors") or {}).items():
            lines.append(f"{where}: {phase} failed: {error.splitlines()[0] if error else error}")
        if row.get("ttfk_warm_error"):
            lines.append(f"{where}: warm TTFK failed: {row['ttfk_warm_error'].splitlines()[0]}")
    lines += [f"{name}: not run ({why})" for name, why in doc.get("unavailable", {}).items()]
    return lines


def machine_line(doc: dict) -> str:
    machine, config = doc["machine"], doc["config"]
    versions = ", ".join(f"{k} {v}" for k, v in machine["versions"].items() if v and k != "matplotlib")
    julia = f", julia {machine['julia']}" if machine.get("julia") else ""
    return (f"{machine['cpu']}, {machine['usable_cores']} cores, {machine.get('memory_gib')} GiB; "
            f"Python {machine['python']}, {versions}{julia}; {machine['date']}"
            f"{', commit ' + machine['git_commit'] if machine.get('git_commit') else ''}. "
            f"{config['dtype']}, best of {config['repeat']}+ runs after a warm-up and any compile it started"
            f"{_processes(config.get('timing_processes', 1))}"
            f"{', quick sizes' if config.get('quick') else ''}.")


def _processes(count: int) -> str:
    return f" in each of {count} processes, the median process kept" if count > 1 else ""


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def to_markdown(doc: dict, title: str = "tullax benchmarks", extra: str = "") -> str:
    out = [f"# {title}", "", machine_line(doc), "",
           "forward: `jax.jit` of the kernel; backward: `jax.jit` of the VJP w.r.t. every float input with a "
           "random cotangent (it includes any forward work the gradient needs). XLA: `jax.jit` of the plain "
           "jnp lowering, differentiated by jax (free indices first, einsum for contractions: XLA fuses it well). "
           "naive XLA: the same broadcast-and-reduce with the axes in the order the indices appear, as it is "
           "usually written by hand (`((W[:,:,None]-X[:,None,:])**2).sum(0)` for Dist). "
           "TTFK: time to first kernel, forward plus gradients on tiny "
           "inputs in a new process, with an empty (cold, best of 3 processes) and a populated (warm, best of 5) "
           "tullax cache. max rel err: "
           "max |a - b| / max |b| of the forward result and every gradient against the float64 XLA lowering. "
           "peak RSS: high-water resident memory of the backend's own process. "
           "≡ (ratio): the row runs the very XLA program of the column's comparator (the same optimised HLO, up to "
           "names and source locations), so the ratio measured beside it is the noise between processes; the "
           "targets count it as 1x.", ""]
    out += ["| " + " | ".join(MARKDOWN_COLUMNS) + " |", "|" + "|".join("---" for _ in MARKDOWN_COLUMNS) + "|"]
    out += ["| " + " | ".join(_md_escape(c) for c in cells(case, backend, row)) + " |"
            for case, backend, row in rows(doc)]
    paired = head_to_head_lines(doc)
    if paired:
        out += ["", "auto against the best XLA formulation (the fastest of the XLA rows above), head to head: one more "
                "process on auto's cache runs the two alternately, round after round, on the same inputs; ratio: the "
                "median over the rounds of the XLA time over auto's in the same round (above 1: auto is faster). "
                "The targets on auto against the best XLA formulation count this ratio.", "",
                "| case | phase | best XLA formulation | auto | that formulation | ratio | rounds |",
                "|---|---|---|---|---|---|---|"]
        out += paired
    out += ["", "| case | spec | shapes |", "|---|---|---|"]
    for case in doc["cases"]:
        shapes = ", ".join(f"{name} {'x'.join(map(str, shape)) or 'scalar'}" for name, shape in case["shapes"].items())
        out.append(f"| {case['name']} | `{_md_escape(case['canonical'])}` | {shapes} |")
    issues = problems(doc)
    if issues:
        out += ["", "Problems:", ""] + [f"- {_md_escape(line)}" for line in issues]
    if extra:
        out += ["", extra.rstrip()]
    return "\n".join(out) + "\n"


def head_to_head_lines(doc: dict) -> list[str]:
    """Markdown rows of auto's head-to-head timings (``head_to_head``), one per case and phase."""
    lines = []
    for case in doc["cases"]:
        row = case["results"].get("auto", {})
        for which, phase in (("fwd", "forward"), ("bwd", "backward")):
            found = head_to_head(row, which)
            if found is not None:
                lines.append(f"| {case['name']} | {phase} | {found['comparator']} | {fmt_ms(found['subject_ms'])} | "
                             f"{fmt_ms(found['comparator_ms'])} | {fmt_ratio(found['ratio'])} | {found['rounds']} |")
    return lines


def print_table(doc: dict, console: Any, title: str = "tullax vs XLA") -> None:
    """The results as a console table. A run of one case (``tullax bench``) names its spec in the title rather
    than in a column of every row, where a spec wrapped over three lines; columns without a value in any row
    (naive XLA where it did not run, TTFK with --no-ttfk) are left out."""
    from rich.table import Table
    from rich.text import Text

    listed = rows(doc)
    body = [cells(case, backend, row) for case, backend, row in listed]
    columns = list(range(len(MARKDOWN_COLUMNS)))
    if len(doc["cases"]) == 1:
        title = f"{title}: {doc['cases'][0]['name']}"
        columns.remove(0)
    columns = [c for c in columns if c <= 1 or any(line[c] not in ("—", "n/a") for line in body)]
    table = Table(title=Text(title), caption=Text(machine_line(doc)))
    for c in columns:
        name = MARKDOWN_COLUMNS[c]
        table.add_column(name, justify="left" if name in ("case", "backend") else "right",
                         no_wrap=name in ("case", "backend"))
    for line in body:
        table.add_row(*(Text(line[c]) for c in columns))
    console.print(table)
    for line in problems(doc):
        console.print(Text(line, style="yellow"))


def make_console(stderr: bool = False) -> Any:
    """A rich console; piped output gets 160 columns instead of rich's 80, too narrow for the table."""
    import sys

    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    piped = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(stderr=stderr, highlight=False, width=160 if piped else None)


def write_json(doc: dict, path: str | os.PathLike[str]) -> None:
    """Written whole or not at all (a temporary file renamed over it): a run saves after every step and may be
    interrupted in the middle of a write."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(doc, indent=1, sort_keys=False, default=str) + "\n")
    os.replace(temporary, target)


def read_json(path: str | os.PathLike[str]) -> dict:
    return derive(json.loads(Path(path).read_text()))


# ------------------------------------------------------------------------------------------ the chart


def plotting_available() -> tuple[bool, str]:
    """Whether ``plot`` can run here, and what to install when it cannot: checked BEFORE a run, so a missing
    matplotlib never costs a whole benchmark run."""
    try:
        import matplotlib  # noqa: F401 - the import itself is the check
    except ImportError:
        return False, "--plot needs matplotlib, which is not installed: pip install matplotlib (or tullax[bench])"
    return True, ""


def plot(doc: dict, path: str | os.PathLike[str]) -> None:
    """Speed against the best XLA formulation of each case and phase (the fastest of the XLA comparator rows; 1
    where a row runs that formulation's very program), forward and backward, every bar a ratio of rows timed
    alike (the head-to-head ratios the targets count on ``auto`` are in the report's tables): linear horizontal
    bars, one per backend that is not an XLA comparator, the case named in full on the y axis, the value
    written at the end of each bar, a dashed line at 1 (that formulation), the legend below the panels. Against
    tullax's own jnp lowering alone, conv1d's forward read 107x where ``auto`` runs the very program of the
    hand-written shifted slices: the comparators' spread, not tullax's lead, filled the chart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cases = doc["cases"]
    names = [case["name"] for case in cases]
    backends = [b for b in doc["config"]["backends"] if b not in XLA_COMPARATORS]
    height = 0.8 / max(len(backends), 1)
    rows_y = np.arange(len(names))[::-1]  # the first case at the top
    figure, axes = plt.subplots(1, 2, figsize=(13, max(3.0, 1.2 + 0.32 * max(len(backends), 1) * len(names))),
                                sharey=True, squeeze=False, layout="constrained")
    colours = plt.get_cmap("tab10")
    for axis, (which, title) in zip(axes[0], (("fwd", "forward"), ("bwd", "backward (all gradients)"))):
        axis.set_xlabel("speed against the best XLA formulation (higher is faster)", fontsize=9)
        top = 1.0
        for number, backend in enumerate(backends):
            values = [counted_vs_best(case["results"].get(backend, {}), which, paired=False) for case in cases]
            widths = [v if isinstance(v, int | float) and v > 0 else 0.0 for v in values]
            top = max([top, *widths])
            ys = rows_y + (len(backends) - 1) / 2 * height - number * height
            axis.barh(ys, widths, height, color=colours(number % 10), label=backend)
            for y, value in zip(ys, values):
                if isinstance(value, int | float) and value > 0:
                    axis.text(value, y, f" {fmt_x(value)}", va="center", fontsize=7)
        axis.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
        axis.set_xlim(0, top * 1.18)  # room for the labels at the bar ends
        axis.set_title(title, fontsize=10)  # the long words go on the x axis: a long title was clipped
        axis.set_yticks(rows_y, names)
        axis.grid(axis="x", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        figure.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 6), fontsize=8,
                      frameon=False)
    else:  # a run of XLA comparators alone: nothing of tullax's to draw against them
        for axis in axes[0]:
            axis.text(0.5, 0.5, "no tullax backend in this run", transform=axis.transAxes, ha="center",
                      va="center", fontsize=10)
    machine = doc["machine"]
    partial = "" if doc.get("complete", True) else " (partial results: the run was stopped)"
    figure.suptitle(f"tullax vs XLA, {doc['config']['dtype']}: {machine['cpu']}, {machine['usable_cores']} cores"
                    f"{partial}\n(dashed line: the fastest of tullax's jnp lowering, the naive broadcast and "
                    "hand-written jnp)", fontsize=10)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
