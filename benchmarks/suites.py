"""The suites of issues 48 and 50 in ``make bench``, after the cases: ``programs`` (benchmarks/programs.py: LayerNorm,
softmax and an attention block as one fused program, against jnp and against their statements as separate tullax
kernels), ``scan`` (benchmarks/scan.py: jax issue 19498's recurrence, real and complex lam, against ``lax.scan`` and
``lax.associative_scan``) and ``loop7024`` (benchmarks/loop7024.py: issue 7024's 8000-step loop as one scan program
against ``lax.scan``). Each script runs unchanged, once per tullax backend of the run, in a process of its own on an
empty tullax cache (``TULLAX_C_TIERS=off`` unless set: the optimised build is timed from the first round); what it
writes becomes one entry of the run's document:

    doc["suites"] = [{"suite": "scan", "backend": "c", "status": "ok", "wall_s": 312.4, "quick": false,
                      "commands": [["--rounds", "25", ..., "--backend", "c"], ...],
                      "records": {...the script's record(s) without their rows...},
                      "rows": [{"lam": "float32", "T": 64, "op": "forward", "tullax_ms": ..., ...}, ...]}, ...]

``status`` is ``ok``, ``timeout after N s`` or ``crashed (exit status N)`` (then ``stderr_tail`` too, and the rows
of the runs that finished); ``rows`` are the script's own rows, as its docstring describes them.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

BENCHMARKS = Path(__file__).resolve().parent
FULL_TIMEOUT_S = 2400.0  # per suite and backend, all its runs together (scan's full run: ~5 min on 2 cores)
QUICK_TIMEOUT_S = 900.0
LOOP_SUBJECTS = ("--subjects", "tullax", "tullax-xla", "lax.scan")  # the script's historical subjects left out


def _ms(row: dict, key: str) -> str:
    from tullax.benchmarking.report import fmt_ms

    return fmt_ms(row.get(key))


def _x(row: dict, key: str) -> str:
    value = row.get(key)
    return f"{value:.2f}x" if isinstance(value, int | float) else "—"


Column = tuple[str, Callable[[dict], str]]


@dataclass(frozen=True)
class Suite:
    name: str
    script: str
    title: str
    about: str  # what the table shows, for NAME.md
    full: tuple[tuple[str, ...], ...]  # each run's arguments (besides --backend and --out), default sizes
    quick: tuple[tuple[str, ...], ...]  # the same under --quick
    rows_key: str  # where the script's record keeps its rows
    columns: tuple[Column, ...]


SCAN_COLUMNS: tuple[Column, ...] = (
    ("lam", lambda r: str(r.get("lam"))), ("T", lambda r: str(r.get("T"))), ("op", lambda r: str(r.get("op"))),
    ("tullax", lambda r: _ms(r, "tullax_ms")), ("lax.scan", lambda r: _ms(r, "lax.scan_ms")),
    ("associative_scan", lambda r: _ms(r, "associative_scan_ms")),
    ("lax.scan / tullax", lambda r: _x(r, "vs_scan")), ("associative_scan / tullax", lambda r: _x(r, "vs_associative")))
PROGRAM_COLUMNS: tuple[Column, ...] = (
    ("program", lambda r: str(r.get("program"))), ("op", lambda r: str(r.get("op"))),
    ("fused", lambda r: _ms(r, "fused_ms")), ("jnp", lambda r: _ms(r, "jnp_ms")),
    ("separate kernels", lambda r: _ms(r, "unfused_ms")), ("jnp / fused", lambda r: _x(r, "jnp_over_fused")),
    ("separate / fused", lambda r: _x(r, "unfused_over_fused")),
    ("not fused because", lambda r: r.get("not_fused_because") or "-"))
LOOP_COLUMNS: tuple[Column, ...] = (
    ("op", lambda r: str(r.get("op"))), ("tullax", lambda r: _ms(r, "tullax ms")),
    ("lax.scan", lambda r: _ms(r, "lax.scan ms")), ("tullax (xla backend)", lambda r: _ms(r, "tullax-xla ms")),
    ("lax.scan / tullax", lambda r: _x(r, "lax.scan / tullax")),
    ("lax.scan / tullax (xla backend)", lambda r: _x(r, "lax.scan / tullax-xla")))

SUITES = {suite.name: suite for suite in (
    Suite("programs", "programs.py", "Programs (issue 50)",
          "One tullax program per layer, fused (`fuse=\"grad\"`), against jnp written by hand and against the same "
          "statements as separate tullax kernels (`fuse=False`); forward and `grad` of a weighted sum w.r.t. every "
          "input; median wall time of the rounds, the subjects alternating in one process (benchmarks/programs.py).",
          (("--rounds", "15"),), (("--rounds", "5", "--quick"),), "results", PROGRAM_COLUMNS),
    Suite("scan", "scan.py", "Recurrences (issue 48)",
          "jax issue 19498's `h[b,t,n] := lam[n]*h[b,t-1,n] + x[b,t,n]  (t scan from h0)`, batch 16, n 64, real and "
          "complex lam: forward, `grad`, and `jacrev`/`jacfwd` w.r.t. lam, against `lax.scan` and "
          "`lax.associative_scan`; median wall time, the subjects alternating in one process (benchmarks/scan.py).",
          (("--rounds", "25", "--jac-rounds", "5"), ("--complex", "--rounds", "25", "--jac-rounds", "5")),
          (("--lengths", "64", "256", "--rounds", "7", "--jac-rounds", "2"),
           ("--complex", "--lengths", "64", "256", "--rounds", "7", "--jac-rounds", "2")),
          "results", SCAN_COLUMNS),
    Suite("loop7024", "loop7024.py", "Issue 7024's loop (issues 48 and 50)",
          "A 4-12-1 MLP iterated over its own output, as one tullax scan program, against the loop as `lax.scan` by "
          "hand and the program on the xla backend; forward and `grad` w.r.t. W1, W2, y0; median process CPU time "
          "(benchmarks/loop7024.py; 8000 steps, 1000 under --quick).",
          (("--rounds", "15", *LOOP_SUBJECTS),), (("--rounds", "5", "--steps", "1000", *LOOP_SUBJECTS),),
          "rows", LOOP_COLUMNS),
)}
SUITE_NAMES = tuple(SUITES)


def parse_suites(text: str | None) -> list[str]:
    """``--suites``: a comma-separated list of SUITE_NAMES, ``all`` (the default) or ``none``."""
    if text is None or text.strip().lower() == "all":
        return list(SUITE_NAMES)
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if names == ["none"]:
        return []
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        raise SystemExit(f"unknown suite {', '.join(unknown)} in --suites; the suites are {', '.join(SUITE_NAMES)} "
                         "(or all, none)")
    return list(dict.fromkeys(names))


# ------------------------------------------------------------------------------------------ running them


def suite_commands(suite: Suite, backend: str, quick: bool) -> list[list[str]]:
    """The script arguments of each of the suite's runs on ``backend`` (without ``--out``)."""
    return [[*args, "--backend", backend] for args in (suite.quick if quick else suite.full)]


def read_rows(data: dict, rows_key: str) -> tuple[dict, list[dict]]:
    """(records, rows) of a script's results file: one record holding ``rows_key``, or (scan.py) a record per
    kind of lam, keyed by it."""
    records = {key: value for key, value in data.items() if key != rows_key}
    if rows_key in data:
        return records, list(data[rows_key])
    rows = [row for record in data.values() if isinstance(record, dict) for row in record.get(rows_key, [])]
    records = {key: {k: v for k, v in record.items() if k != rows_key} for key, record in data.items()
               if isinstance(record, dict)}
    return records, rows


def run_suite(suite: Suite, backend: str, quick: bool, timeout_s: float,
              on_line: Callable[[str], None] = lambda line: None) -> dict:
    """Run the suite's script(s) on ``backend``, each in a new process on an empty tullax cache: its entry in
    ``doc["suites"]`` (the module docstring)."""
    from tullax.benchmarking.runner import run_process

    started = time.perf_counter()
    deadline = started + timeout_s
    entry: dict[str, Any] = {"suite": suite.name, "backend": backend, "status": "ok", "quick": quick, "commands": []}
    with tempfile.TemporaryDirectory(prefix="tullax-bench-suite-", ignore_cleanup_errors=True) as scratch:
        out = Path(scratch) / "out.json"
        root = str(BENCHMARKS.parent)
        env = {**os.environ, "TULLAX_CACHE_DIR": str(Path(scratch) / "cache"), "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        env.setdefault("TULLAX_C_TIERS", "off")
        for args in suite_commands(suite, backend, quick):
            entry["commands"].append(args)
            child = run_process([sys.executable, str(BENCHMARKS / suite.script), *args, "--out", str(out)], env,
                                max(deadline - time.perf_counter(), 1.0), on_line, cwd=root)
            if child.returncode != 0:
                entry["status"] = (f"timeout after {timeout_s:g} s" if child.returncode is None
                                   else f"crashed (exit status {child.returncode})")
                entry["stderr_tail"] = child.stderr_tail
                break
        data = json.loads(out.read_text()) if out.exists() else {}
    entry["records"], entry["rows"] = read_rows(data, suite.rows_key)
    entry["wall_s"] = round(time.perf_counter() - started, 1)
    return entry


def run_suites(names: Sequence[str], backends: Sequence[str], quick: bool, *, show_progress: bool = True,
               timeout_s: float | None = None, on_update: Callable[[list[dict]], None] = lambda entries: None
               ) -> list[dict]:
    """Every named suite on every backend, one after the other, with the cases' progress display (a line per line
    the script prints, and one as each finishes); ``on_update`` gets the entries so far after each, so a run
    stopped half-way keeps what finished."""
    from rich.markup import escape

    from tullax.benchmarking.runner import progress_display

    timeout = timeout_s or (QUICK_TIMEOUT_S if quick else FULL_TIMEOUT_S)
    jobs = [(SUITES[name], backend) for name in names for backend in backends]
    entries: list[dict] = []
    with progress_display(show_progress) as progress:
        task = progress.add_task("suites", total=len(jobs))

        def say(line: str) -> None:
            if show_progress:
                progress.console.print(line, markup=False, highlight=False)

        for number, (suite, backend) in enumerate(jobs, 1):
            label = f"[{number}/{len(jobs)}] {suite.name} · {backend}"
            progress.update(task, description=escape(f"{suite.name} · {backend} · starting"))

            def line(text: str, label: str = label, suite: Suite = suite, backend: str = backend) -> None:
                text = text.rstrip()
                if text:
                    progress.update(task, description=escape(f"{suite.name} · {backend} · {text[:60]}"))
                    say(f"{label}: {text}")

            entry = run_suite(suite, backend, quick, timeout, line)
            entries.append(entry)
            say(f"{label}: {entry['status']}, {len(entry['rows'])} rows ({entry['wall_s']:.0f} s)")
            on_update(list(entries))
            progress.advance(task)
        progress.update(task, description="suites done")
    return entries


# ------------------------------------------------------------------------------------------ report


def suites_markdown(entries: Sequence[dict]) -> str:
    """A table per suite (every backend's rows), for NAME.md; empty when no suite ran."""
    out: list[str] = []
    for suite in SUITES.values():
        mine = [entry for entry in entries if entry["suite"] == suite.name]
        if not mine:
            continue
        heads = ["backend", *(head for head, _ in suite.columns)]
        out += [f"## {suite.title}", "", suite.about, "", "| " + " | ".join(heads) + " |",
                "|" + "|".join("---" for _ in heads) + "|"]
        for entry in mine:
            out += ["| " + " | ".join([entry["backend"], *(cell(row).replace("|", "\\|") for _, cell in suite.columns)])
                    + " |" for row in entry["rows"]]
        problems = [f"- {e['backend']}: {e['status']}" for e in mine if e["status"] != "ok"]
        if problems:
            out += ["", "Problems:", "", *problems]
        out.append("")
    return "\n".join(out).rstrip()


# ------------------------------------------------------------------------------------------ targets


def _worst_of_two(row: dict) -> float | None:
    """The speed-up over the faster of lax.scan and associative_scan."""
    found = [row.get(key) for key in ("vs_scan", "vs_associative")]
    return min(found) if all(isinstance(v, int | float) for v in found) else None


@dataclass(frozen=True)
class SuiteTarget:
    """A target of issue 48 or 50 over a suite's rows on one backend: the worst row counts."""

    text: str
    suite: str
    op: str
    value: Callable[[dict], float | None]
    where: Callable[[dict], str]
    bound: float
    strict: bool = False  # "faster than": above the bound, not at it
    informational: bool = False

    def passes(self, value: float) -> bool:
        return value > self.bound if self.strict else value >= self.bound


def _scan_where(row: dict) -> str:
    return f"T={row.get('T')} {row.get('lam')}"


def _program_where(row: dict) -> str:
    return str(row.get("program"))


SUITE_TARGETS = (
    SuiteTarget("scan forward >= 2x the faster of lax.scan and associative_scan, every T and lam (worst)", "scan",
                "forward", _worst_of_two, _scan_where, 2.0),
    SuiteTarget("scan grad >= 2x the faster of lax.scan and associative_scan (worst)", "scan", "grad",
                _worst_of_two, _scan_where, 2.0),
    SuiteTarget("scan jacfwd w.r.t. lam >= 5x the faster of lax.scan and associative_scan (worst)", "scan",
                "jacfwd_lam", _worst_of_two, _scan_where, 5.0),
    SuiteTarget("scan jacrev w.r.t. lam >= 1.5x the faster of lax.scan and associative_scan (worst)", "scan",
                "jacrev_lam", _worst_of_two, _scan_where, 1.5),
    SuiteTarget("programs forward >= 1x jnp, every program (worst)", "programs", "forward",
                lambda row: row.get("jnp_over_fused"), _program_where, 1.0),
    SuiteTarget("programs backward >= 1x jnp, every program (worst)", "programs", "grad",
                lambda row: row.get("jnp_over_fused"), _program_where, 1.0),
    SuiteTarget("programs forward faster than their statements as separate kernels (worst)", "programs", "forward",
                lambda row: row.get("unfused_over_fused"), _program_where, 1.0, strict=True),
    SuiteTarget("programs backward faster than their statements as separate kernels (worst)", "programs", "grad",
                lambda row: row.get("unfused_over_fused"), _program_where, 1.0, strict=True),
    SuiteTarget("issue 7024's loop forward against lax.scan (lax.scan / tullax)", "loop7024", "forward",
                lambda row: row.get("lax.scan / tullax"), lambda row: "", 1.0, informational=True),
    SuiteTarget("issue 7024's loop gradient against lax.scan (lax.scan / tullax)", "loop7024", "grad",
                lambda row: row.get("lax.scan / tullax"), lambda row: "", 1.0, informational=True),
)


def suite_verdicts(entries: Sequence[dict]) -> list[tuple[str, str, SuiteTarget, str]]:
    """(status, backend, target, measured) for every target of every suite entry: PASS, FAIL, INFO, or MISSING
    (the suite did not finish, or wrote no row for the target)."""
    verdicts = []
    for entry in entries:
        for target in (t for t in SUITE_TARGETS if t.suite == entry["suite"]):
            rows = [row for row in entry["rows"] if row.get("op") == target.op]
            measured = [(target.where(row), target.value(row)) for row in rows]
            measured = [(where, value) for where, value in measured if isinstance(value, int | float)]
            if entry["status"] != "ok" or not measured:
                why = entry["status"] if entry["status"] != "ok" else f"no {target.op} row"
                verdicts.append(("MISSING", entry["backend"], target, why))
                continue
            where, worst = min(measured, key=lambda item: item[1])
            status = "INFO" if target.informational else "PASS" if target.passes(worst) else "FAIL"
            verdicts.append((status, entry["backend"], target, f"{worst:.2f}x" + (f" ({where})" if where else "")))
    return verdicts
