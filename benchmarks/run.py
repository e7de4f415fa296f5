"""The benchmark suite (``make bench``): every case of cases.py on XLA and on every available tullax backend,
each backend in a process of its own; then the suites of issues 48 and 50 (suites.py: programs, scan, loop7024),
each script on every tullax backend of the run, in a process of its own. Writes
benchmarks/results/latest.{json,md,png} (latest-quick.* with --quick) after every step, so that an interrupted run
keeps what finished, and prints the tables.

    .venv/bin/python benchmarks/run.py --quick
    .venv/bin/python benchmarks/run.py --cases Dist,Linear --backends numba --suites none --check-targets
    .venv/bin/python benchmarks/run.py --cases none --suites scan --backends c
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` and `tullax` importable from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.cases import case_names, suite  # noqa: E402
from benchmarks.report import RESULTS_DIR, all_pass, check_targets, print_targets, save  # noqa: E402
from benchmarks.suites import SUITE_NAMES, parse_suites, run_suites, suites_markdown  # noqa: E402
from tullax.benchmarking.comparators import COMPARATORS  # noqa: E402

FULL_TIMEOUT_S = 900.0  # XLA's Dist materialises a K*I*J temporary: seconds per call on 2 cores
QUICK_TIMEOUT_S = 180.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="sizes shrunk 8-30x: the whole suite in minutes")
    parser.add_argument("--cases", metavar="LIST",
                        help=f"comma-separated subset of: {', '.join(case_names())} (none: the suites alone)")
    parser.add_argument("--suites", metavar="LIST", default="all",
                        help=f"the suites run after the cases, comma-separated: {', '.join(SUITE_NAMES)}; all "
                             "(the default) or none")
    parser.add_argument("--backends", metavar="LIST",
                        help="tullax backends to compare with XLA (default: every available one of numba, "
                             "julia, julia-cuda)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--repeat", type=int, default=3, metavar="N", help="best of at least N timed runs")
    parser.add_argument("--timing-processes", type=int, default=3, metavar="P",
                        help="time forward and backward in P processes per row, the median process kept "
                             "(default 3)")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help=f"per case and backend (default {FULL_TIMEOUT_S:g} s, {QUICK_TIMEOUT_S:g} s quick)")
    parser.add_argument("--no-ttfk", action="store_true", help="skip the time-to-first-kernel measurements")
    parser.add_argument("--out-dir", default=str(RESULTS_DIR), help="where NAME.json/.md/.png go")
    parser.add_argument("--name", help="file name stem (default latest, or latest-quick with --quick)")
    parser.add_argument("--check-targets", action="store_true",
                        help="print each target of issues 3, 14, 48 and 50 with PASS/FAIL; exit 1 unless all pass")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--no-plot", action="store_true", help="write no chart (NAME.png)")
    return parser


def main(argv: list[str] | None = None) -> int:
    from tullax.benchmarking.report import make_console, print_table
    from tullax.benchmarking.runner import RunConfig, run_cases, select_backends

    args = build_parser().parse_args(argv)
    if not args.no_plot:
        from tullax.benchmarking.report import plotting_available

        ok, why = plotting_available()
        if not ok:  # before the run: a missing matplotlib must not cost a whole run
            raise SystemExit(f"{why}; or pass --no-plot")
    names = [n.strip() for n in args.cases.split(",")] if args.cases else None
    cases = [] if names == ["none"] else suite(quick=args.quick, names=names)
    if not cases and names != ["none"]:
        raise SystemExit(f"no case matches --cases {args.cases!r}; the cases are {', '.join(case_names())}")
    suites = parse_suites(args.suites)
    requested = [b.strip() for b in args.backends.split(",") if b.strip()] if args.backends else None
    backends, unavailable = select_backends(requested)
    console = make_console()
    for name, why in unavailable.items():
        if requested is not None or name in ("c", "numba"):  # absent optional Julia backends: not worth a warning
            console.print(f"[yellow]skipping {name}:[/] {why}", highlight=False)
    if requested is None:
        unavailable = {name: why for name, why in unavailable.items() if name in ("c", "numba")}
    loop_backends = [b for b in backends if b not in COMPARATORS]
    if suites and not loop_backends:
        console.print(f"[yellow]skipping the suites ({', '.join(suites)}):[/] they time tullax backends and the run "
                      "has none", highlight=False)
        suites = []
    timeout = args.timeout or (QUICK_TIMEOUT_S if args.quick else FULL_TIMEOUT_S)
    config = RunConfig(backends=tuple(backends), dtype=args.dtype, repeat=args.repeat,
                       timing_processes=max(1, args.timing_processes), timeout_s=timeout,
                       ttfk=not args.no_ttfk)
    out_dir, name = Path(args.out_dir), args.name or ("latest-quick" if args.quick else "latest")
    saved: list[dict] = []  # the document after the last step: what an interrupted run still writes
    started = time.time()

    def keep(doc: dict, complete: bool = False) -> None:
        doc["config"].update(quick=args.quick, suites=suites)
        doc["elapsed_s"] = round(time.time() - started, 1)  # the cases' and the suites' so far
        doc.setdefault("suites", [])
        doc["complete"] = complete
        saved[:] = [doc]
        save(doc, out_dir, name, chart=False)

    try:
        doc = run_cases(cases, config, show_progress=not args.quiet, unavailable=unavailable, on_update=keep)
        doc["config"].update(quick=args.quick, suites=suites)
        doc["suites"] = []
        doc["cases_elapsed_s"] = doc["elapsed_s"]
        if suites:
            keep(doc)

            def add(entries: list[dict]) -> None:
                doc["suites"] = entries
                keep(doc, complete=len(entries) == len(suites) * len(loop_backends))

            run_suites(suites, loop_backends, args.quick, show_progress=not args.quiet, on_update=add)
    except KeyboardInterrupt:
        if not saved:
            console.print("interrupted before any step finished: nothing to save")
            return 130
        doc = saved[0]
        paths = save(doc, out_dir, name, chart=not args.no_plot)
        console.print(f"interrupted: the results so far are in {', '.join(str(p) for p in paths)}", highlight=False)
        return 130
    paths = save(doc, out_dir, name, chart=not args.no_plot)
    title = "tullax benchmarks" + (" (quick sizes)" if args.quick else "")
    if cases:
        print_table(doc, console, title=title)
    if doc["suites"]:
        console.print(suites_markdown(doc["suites"]), markup=False, highlight=False)
    console.print(f"wrote {', '.join(str(p) for p in paths)}", highlight=False)
    verdicts = check_targets(doc)
    if args.check_targets:
        print_targets(verdicts, console, args.quick)
        return 0 if all_pass(verdicts) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
