"""The parent side: one child process per (case, backend), timeouts, a progress bar, the results document.

For every case and backend a main child runs ``ttfk`` (cold: it gets a fresh, empty ``TULLAX_CACHE_DIR``),
``fwd``, ``bwd`` and ``check``; for tullax backends more children then run ``ttfk`` alone: two more, each on
another empty cache (cold is the best of the three), and five against the cache the main child filled (warm:
best of five). XLA has no tullax cache, so it gets no warm measurement. Once every backend of a case has had
its main child, forward and backward are timed again (``RunConfig.timing_processes``) in new processes on each
main child's cache, in rounds over the backends, and each row keeps its median process. Last, the planner's
(``auto``) forward and backward are timed head to head with the best XLA formulation of each in one more process
(``head_to_head``): the targets on ``auto`` against the best XLA formulation count that ratio.
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from tullax.benchmarking.case import BenchCase, check_case_shapes
from tullax.benchmarking.comparators import COMPARATORS, IDIOMATIC, NAIVE_XLA, REFERENCE, TORCH
from tullax.benchmarking.worker import LINE_PREFIX

MAIN_PHASES = ("ttfk", "fwd", "bwd", "check")
TTFK_COLD_RUNS = 3  # cold time to first kernel: best of this many processes, each on an empty cache
TTFK_WARM_RUNS = 5  # warm: best of this many processes on the populated cache
STDERR_TAIL = 4000
# Backends the suite tries by default, besides the XLA reference; each is used only where it is available.
# "auto" is the planner (loops or an XLA form per kernel, tullax.planner.decide).
DEFAULT_BACKENDS = ("auto", "c", "numba", "julia", "julia-cuda")
PLANNER = "auto"


@dataclass(frozen=True)
class RunConfig:
    backends: tuple[str, ...]  # in display order; "xla" is the reference
    dtype: str = "float32"
    repeat: int = 3
    timeout_s: float = 600.0
    ttfk_timeout_s: float = 300.0
    ttfk: bool = True
    check: bool = True
    seed: int = 0
    extra_env: dict[str, str] = field(default_factory=dict)
    # forward and backward are timed in this many processes (the main child, then more on its warm cache), each
    # the best of its runs, and the median process is kept: processes differ more than the runs within one (row
    # max, one memory-bound reduction of 64 MB, took 2.26 ms on the xla row and 1.79 ms on xla-naive, both that
    # same reduction), and the best of two processes let one lucky process decide a ratio (the jnp row's
    # embedding gather: 0.47 and 0.80 ms; xla-naive's row norm gradient: 17.6 and 24.0 ms)
    timing_processes: int = 3


@dataclass(frozen=True)
class ChildResult:
    records: list[dict]
    returncode: int | None  # None: killed at the timeout
    stderr_tail: str
    wall_s: float


# ------------------------------------------------------------------------------------------- backends


def select_backends(requested: Sequence[str] | None) -> tuple[list[str], dict[str, str]]:
    """The usable backends (XLA first, always) and, for each requested one that is not usable, why.
    ``requested=None`` means every default backend that is available here."""
    from tullax import backends as registry
    from tullax.benchmarking.idiomatic import torch_available

    status = {name: (ok, why) for name, ok, why in registry.availability()}
    status[PLANNER] = (True, "")
    wanted = list(DEFAULT_BACKENDS) if requested is None else [b for b in requested if b not in COMPARATORS]
    usable, unavailable = [REFERENCE], {}
    if requested is None or NAIVE_XLA in requested:
        usable.append(NAIVE_XLA)
    usable.append(IDIOMATIC)  # what a user would write: always next to the reference (cases that have one)
    if requested is None or TORCH in requested:  # optional, never a dependency
        if torch_available():
            usable.append(TORCH)
        elif requested is not None:
            unavailable[TORCH] = "torch is not installed (pip install torch)"
    for name in dict.fromkeys(wanted):
        ok, why = status.get(name, (False, f"unknown backend {name!r}; known: {', '.join(status)}"))
        if ok:
            usable.append(name)
        else:
            unavailable[name] = why
    return usable, unavailable


# ------------------------------------------------------------------------------------------- children


def run_child(job: dict, cache_dir: str, timeout_s: float, extra_env: dict[str, str],
              on_record: Callable[[dict], None] = lambda record: None) -> ChildResult:
    """Run one worker; its records arrive as they are printed. At the timeout the child is killed and
    what it had reported so far is kept."""
    env = {**os.environ, **extra_env, "TULLAX_CACHE_DIR": cache_dir, "PYTHONUNBUFFERED": "1"}
    records: list[dict] = []

    def line(text: str) -> None:
        if text.startswith(LINE_PREFIX):  # anything else is a library talking on stdout
            record = json.loads(text[len(LINE_PREFIX):])
            on_record(record)
            if "phase" in record:
                records.append(record)

    child = run_process([sys.executable, "-m", "tullax.benchmarking.worker", json.dumps(job)], env, timeout_s, line)
    return ChildResult(records, child.returncode, child.stderr_tail, child.wall_s)


def run_process(command: Sequence[str], env: dict[str, str], timeout_s: float,
                on_line: Callable[[str], None] = lambda line: None, cwd: str | None = None) -> ChildResult:
    """Run ``command``, each line of its stdout handed to ``on_line`` as it is printed; at the timeout the process
    is killed (``returncode`` None). The result's ``records`` are empty: ``on_line`` collects what it needs."""
    started = time.perf_counter()
    with tempfile.TemporaryFile(mode="w+") as stderr:
        process = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=cwd)
        lines: queue.Queue[str | None] = queue.Queue()
        reader = threading.Thread(target=_pump, args=(process.stdout, lines), daemon=True)
        reader.start()
        try:
            finished = _collect(lines, started + timeout_s, on_line)
        except BaseException:  # Ctrl-C (or a failing on_line): no child left running on its own
            process.kill()
            process.wait()
            raise
        if not finished:
            process.kill()
        returncode = process.wait()
        reader.join(timeout=5)
        stderr.seek(0)
        tail = stderr.read()[-STDERR_TAIL:]
    return ChildResult([], returncode if finished else None, tail, time.perf_counter() - started)


def _pump(stream: Any, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def _collect(lines: queue.Queue, deadline: float, on_line: Callable[[str], None]) -> bool:
    """Hand each line to ``on_line`` until the stream ends (True) or the deadline passes (False)."""
    while True:
        try:
            line = lines.get(timeout=max(deadline - time.perf_counter(), 0.0))
        except queue.Empty:
            return False
        if line is None:
            return True
        on_line(line)


# ------------------------------------------------------------------------------------------- one case


def case_document(case: BenchCase, dtype: str) -> dict:
    """The case's description in the results, with the canonical spec; shapes checked before any child."""
    from tullax.errors import ShapeError
    from tullax.spec.frontend import compile_spec

    canonical, spec = compile_spec(case.spec, case.ranges)
    fields = case.job_fields()
    check_case_shapes(spec, case.shapes)
    if case.check_shapes is not None:
        check_case_shapes(spec, case.check_shapes)
    try:
        check_case_shapes(spec, fields["ttfk_shapes"])
    except ShapeError:  # capping every extent broke an agreement: time the first kernel at the check shapes
        if case.ttfk_shapes is not None:
            raise
        fields["ttfk_shapes"] = fields["check_shapes"]
    return {**fields, "name": case.name, "canonical": canonical, "dtype": dtype}


def backend_job(document: dict, backend: str, config: RunConfig) -> dict:
    """The main child's job for one case (``case_document``) on one backend."""
    phases = [p for p in MAIN_PHASES if (p != "ttfk" or config.ttfk) and (p != "check" or config.check)]
    return {**{k: document.get(k) for k in ("spec", "ranges", "shapes", "check_shapes", "ttfk_shapes", "idiomatic")},
            "backend": backend, "dtype": config.dtype, "repeat": config.repeat, "seed": config.seed,
            "phases": phases, "fingerprint": True}


def run_backend(document: dict, backend: str, config: RunConfig, cache_dir: str,
                progress: Callable[[str], None] = lambda what: None) -> tuple[dict, dict]:
    """The main child of one case on one backend, on the empty cache ``cache_dir`` (the caller's: the case's
    later timing children run on it), then its cold and warm TTFK children: (the row, the job)."""
    job = backend_job(document, backend, config)

    def report(record: dict) -> None:
        if "begin" in record:
            progress(record["begin"])

    main = run_child(job, cache_dir, config.timeout_s, config.extra_env, report)
    row = summarise_main(main, config.timeout_s)
    if config.ttfk and backend not in COMPARATORS and row.get("ttfk_cold_ms") is not None:
        row.update(repeat_cold_ttfk(job, config, row["ttfk_cold_ms"], progress))
        row.update(warm_ttfk(job, cache_dir, config, progress))
    return row, job


def timing_child(job: dict, cache_dir: str, config: RunConfig) -> dict[str, float]:
    """Forward and backward timed again in a new process on the main child's cache (nothing compiles that the
    main child compiled): {phase: ms}, each the best of its runs."""
    child = run_child({**job, "phases": ["fwd", "bwd"], "fingerprint": False}, cache_dir, config.timeout_s,
                      config.extra_env)
    return {record["phase"]: record[f"{record['phase']}_ms"] for record in child.records
            if record.get("phase") in ("fwd", "bwd") and record.get(f"{record['phase']}_ms") is not None}


def head_to_head(results: dict, job: dict, cache_dir: str, config: RunConfig) -> dict:
    """The planner's forward and backward against the best XLA formulation of each (the comparator rows' medians,
    ``report.best_xla``), head to head in one new process on the planner's cache (``worker.phase_h2h``):
    ``{"h2h": {phase: ...}}``, or the error in ``errors["h2h"]``; nothing when no comparator row has a time."""
    from tullax.benchmarking.report import best_xla

    picks = {which: best for which in ("fwd", "bwd") if (best := best_xla(results, which)) is not None}
    if not picks:
        return {}
    child = run_child({**job, "phases": ["h2h"], "h2h": picks, "fingerprint": False}, cache_dir, config.timeout_s,
                      config.extra_env)
    record = next((r for r in child.records if r.get("phase") == "h2h"), None)
    if record is not None and "error" not in record:
        return {"h2h": record["h2h"]}
    why = record["error"] if record is not None else _child_failure(child, config.timeout_s)
    return {"errors": {**(results[PLANNER].get("errors") or {}), "h2h": why}}


def median_of_processes(row: dict, later: Sequence[dict[str, float]]) -> dict:
    """The main child's forward and backward figures with those of the later timing processes: the median
    process kept, every one of them in ``<phase>_process_ms``."""
    update: dict[str, Any] = {}
    for which in ("fwd", "bwd"):
        if row.get(f"{which}_ms") is None:
            continue
        samples = [row[f"{which}_ms"]] + [found[which] for found in later if which in found]
        update[f"{which}_ms"], update[f"{which}_process_ms"] = statistics.median(samples), samples
    return update


def repeat_cold_ttfk(job: dict, config: RunConfig, first_ms: float, progress: Callable[[str], None]) -> dict:
    """Cold TTFK, best of the main child's and TTFK_COLD_RUNS - 1 more new processes, each on an empty cache
    (a process start on a busy 2-core machine varies by 100s of ms; best-of is what the timings use too)."""
    samples = [first_ms]
    for run in range(2, TTFK_COLD_RUNS + 1):
        progress(f"ttfk cold {run}/{TTFK_COLD_RUNS} (new process, empty cache)")
        empty = tempfile.mkdtemp(prefix="tullax-bench-cache-")
        try:
            child = ttfk_child(job, empty, config)
        finally:
            shutil.rmtree(empty, ignore_errors=True)
        measured = [r["ttfk_ms"] for r in child.records if r["phase"] == "ttfk" and "error" not in r]
        samples += measured  # a failed repeat leaves the first measurement standing
    return {"ttfk_cold_ms": min(samples), "ttfk_cold_samples_ms": samples}


def warm_ttfk(job: dict, cache_dir: str, config: RunConfig, progress: Callable[[str], None]) -> dict:
    """Warm TTFK: best of TTFK_WARM_RUNS new processes on the cache the main child filled."""
    runs = []
    for run in range(1, TTFK_WARM_RUNS + 1):
        progress(f"ttfk warm {run}/{TTFK_WARM_RUNS} (new process, populated cache)")
        summary = summarise_warm(ttfk_child(job, cache_dir, config), config.ttfk_timeout_s)
        if "ttfk_warm_error" in summary:
            return summary
        runs.append(summary)
    best = min(runs, key=lambda summary: summary["ttfk_warm_ms"])
    return {**best, "ttfk_warm_samples_ms": [summary["ttfk_warm_ms"] for summary in runs]}


def ttfk_child(job: dict, cache_dir: str, config: RunConfig) -> ChildResult:
    """A new process that only measures the time to first kernel, against the cache in ``cache_dir``."""
    return run_child({**job, "phases": ["ttfk"]}, cache_dir, config.ttfk_timeout_s, config.extra_env)


def summarise_main(child: ChildResult, timeout_s: float) -> dict:
    row: dict[str, Any] = {"errors": {}, "wall_s": round(child.wall_s, 2)}
    for record in child.records:
        phase = record["phase"]
        if "error" in record:
            row["errors"][phase] = record["error"]
            continue
        if phase == "ttfk":
            row.update(ttfk_cold_ms=record["ttfk_ms"], ttfk_cold_fwd_ms=record["ttfk_fwd_ms"],
                       ttfk_cold_load_ms=record["ttfk_load_ms"],
                       ttfk_shapes=record["ttfk_shapes"], cache_entries=record["cache_entries"])
        elif phase == "start":
            row["import_ms"] = record["import_ms"]
        elif phase == "end":
            row["llvm_runtimes"] = record["llvm_runtimes"]
            if len(record["llvm_runtimes"]) > 1:
                row["errors"]["process"] = "numba and juliacall were both loaded in one process"
        else:
            peak = max(row.get("peak_rss_mb") or 0.0, record.pop("peak_rss_mb", 0.0) or 0.0)
            record.pop("check_shapes", None)
            row.update(record, peak_rss_mb=peak or None)
    row.pop("phase", None)
    row["status"] = _status(child, row, timeout_s)
    if row["status"] != "ok":
        row["stderr_tail"] = child.stderr_tail
    return row


def summarise_warm(child: ChildResult, timeout_s: float) -> dict:
    for record in child.records:
        if record["phase"] == "ttfk":
            if "error" in record:
                return {"ttfk_warm_error": record["error"]}
            return {"ttfk_warm_ms": record["ttfk_ms"], "ttfk_warm_fwd_ms": record["ttfk_fwd_ms"],
                    "ttfk_warm_load_ms": record["ttfk_load_ms"],
                    "cache_entries_warm": record["cache_entries"]}
    return {"ttfk_warm_error": _child_failure(child, timeout_s)}


def _child_failure(child: ChildResult, timeout_s: float) -> str:
    """Why a child reported nothing for its phase: killed at its timeout, or exited with the tail of its stderr."""
    if child.returncode is None:
        return f"timed out after {timeout_s:g} s"
    return f"the child exited with status {child.returncode}: {child.stderr_tail[-500:]}"


def _status(child: ChildResult, row: dict, timeout_s: float) -> str:
    if child.returncode is None:
        return f"timeout after {timeout_s:g} s"
    if child.returncode != 0:
        return f"crashed (exit status {child.returncode})"
    return "errors" if row["errors"] else "ok"


# ------------------------------------------------------------------------------------------- the run


def run_cases(cases: Sequence[BenchCase], config: RunConfig, *, show_progress: bool = True,
              unavailable: dict[str, str] | None = None,
              on_update: Callable[[dict], None] | None = None) -> dict:
    """Run every case on every backend of ``config``; returns the results document (see report.py). With
    ``show_progress`` a line is printed as each backend of each case finishes (besides the bar, which a
    terminal alone shows); ``on_update`` gets the document so far (``"complete": False``) after every step, so a
    run stopped half-way leaves what it measured."""
    from rich.markup import escape

    from tullax.benchmarking.report import machine_info

    documents = [case_document(case, config.dtype) for case in cases]
    started = time.time()
    rounds = max(1, config.timing_processes)
    machine = machine_info()  # once: it runs git and reads /proc

    def update() -> None:
        if on_update is not None:
            on_update(results_document([d for d in documents if "results" in d], config, unavailable, started,
                                       machine, complete=False))

    with progress_display(show_progress) as progress:
        per_case = len(config.backends) * rounds + (PLANNER in config.backends)  # + auto's head to head

        def say(line: str) -> None:
            if show_progress:
                progress.console.print(line, markup=False, highlight=False)

        task = progress.add_task("starting", total=len(documents) * per_case)
        for number, document in enumerate(documents, 1):
            document["results"] = {}
            timed: dict[str, tuple[dict, str]] = {}  # backend -> (its job, its cache), for the timing rounds
            where = f"[{number}/{len(documents)}] {document['name']}" if len(documents) > 1 else document["name"]
            with tempfile.TemporaryDirectory(prefix="tullax-bench-case-", ignore_cleanup_errors=True) as caches:
                for backend in config.backends:
                    if backend in (IDIOMATIC, TORCH) and not document.get("idiomatic"):
                        progress.advance(task, rounds)  # no hand-written formulation of this case
                        continue
                    label = f"{document['name']} · {backend}"

                    def show(what: str, label: str = label) -> None:
                        progress.update(task, description=escape(f"{label} · {what}"))

                    show("starting")
                    cache_dir = os.path.join(caches, backend)
                    os.makedirs(cache_dir)
                    row, job = run_backend(document, backend, config, cache_dir, show)
                    document["results"][backend] = row
                    say(f"{where} · {backend}: {row_summary(row)}")
                    update()
                    progress.advance(task)
                    if row["status"] == "ok":  # every main child times fwd and bwd (MAIN_PHASES)
                        timed[backend] = (job, cache_dir)
                    else:
                        progress.advance(task, rounds - 1)
                # the later timing processes run in rounds over the backends, so that a slow spell of the
                # machine falls on every row of the case alike, not on the rows timed during it (timed row after
                # row, auto's row max forward read 0.90x of the xla row's, the very same XLA program)
                later: dict[str, list[dict[str, float]]] = {backend: [] for backend in timed}
                for run in range(2, rounds + 1):
                    for backend, (job, cache_dir) in timed.items():
                        progress.update(task, description=escape(
                            f"{document['name']} · {backend} · timings {run}/{rounds} (new process)"))
                        later[backend].append(timing_child(job, cache_dir, config))
                        progress.advance(task)
                    say(f"{where}: timings {run}/{rounds} done")
                for backend, samples in later.items():
                    row = document["results"][backend]
                    row.update(median_of_processes(row, samples))
                if later and rounds > 1:
                    update()
                if PLANNER in config.backends:
                    if PLANNER in timed:
                        progress.update(task, description=escape(
                            f"{document['name']} · {PLANNER} · head to head with the best XLA formulation"))
                        document["results"][PLANNER].update(head_to_head(document["results"], *timed[PLANNER], config))
                        say(f"{where} · {PLANNER}: head to head with the best XLA formulation done")
                        update()
                    progress.advance(task)
        progress.update(task, description="done")
    return results_document(documents, config, unavailable, started, machine, complete=True)


def results_document(documents: list[dict], config: RunConfig, unavailable: dict[str, str] | None,
                     started: float, machine: dict, *, complete: bool) -> dict:
    """The results document of the cases run so far (``complete``: all of them, every step)."""
    from tullax.benchmarking.report import derive

    doc = {
        "format": 1,
        "complete": complete,
        "machine": dict(machine),
        "config": {"dtype": config.dtype, "repeat": config.repeat, "timing_processes": config.timing_processes,
                   "timeout_s": config.timeout_s,
                   "backends": list(config.backends), "reference": REFERENCE, "ttfk": config.ttfk,
                   "check": config.check, "seed": config.seed},
        "unavailable": dict(unavailable or {}),
        "elapsed_s": round(time.time() - started, 1),
        "cases": documents,
    }
    return derive(doc)


def row_summary(row: dict) -> str:
    """One line for a finished row: its status, forward and backward times, cold and warm TTFK, wall time."""
    from tullax.benchmarking.report import fmt_ms

    parts = [row.get("status", "?")]
    for key, name in (("fwd_ms", "forward"), ("bwd_ms", "backward"), ("ttfk_cold_ms", "TTFK cold"),
                      ("ttfk_warm_ms", "warm")):
        if isinstance(row.get(key), int | float):
            parts.append(f"{name} {fmt_ms(row[key])}")
    if isinstance(row.get("wall_s"), int | float):
        parts.append(f"({row['wall_s']:.0f} s)")
    return ", ".join(parts)


def progress_display(show: bool) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True), disable=not show, transient=False)
