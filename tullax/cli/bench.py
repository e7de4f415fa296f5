"""``tullax bench SPEC --shape NAME=AxB ...``: time a user's own kernel forward and backward on each backend
against XLA, each backend in its own process, with the time to first kernel cold and warm.

    tullax bench "D[i,j] := (W[k,i] - X[k,j])^2" --shape W=784x1024 --shape X=784x512 --plot dist.png
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from tullax.errors import TullaxError

EPILOG = """\
Every backend runs in a child process of its own (Numba and Julia each load an LLVM). XLA is the reference:
jax.jit of the plain jnp lowering of the spec, differentiated by jax. 'backward' is the jitted VJP w.r.t.
every float input with a random cotangent. TTFK (time to first kernel, forward plus gradients, tiny inputs)
is measured in a new process with an empty cache (cold) and again with the cache it filled (warm).
"""


def build_parser(prog: str = "tullax bench") -> argparse.ArgumentParser:
    from tullax.benchmarking.runner import DEFAULT_BACKENDS

    parser = argparse.ArgumentParser(prog=prog, description="Benchmark a kernel against XLA, forward and backward.",
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", metavar="SPEC", help='the kernel, e.g. "C[i,j] := W[k,i]*X[k,j]"')
    parser.add_argument("--shape", action="append", default=[], metavar="NAME=AxB",
                        help="the shape of an input array (repeat for each array input; w=31 for a vector)")
    parser.add_argument("--range", action="append", default=[], metavar="NAME=N|LO:HI",
                        help="an explicit index range, as ranges= of einsum_kernel")
    parser.add_argument("--backends", default=None, metavar="LIST",
                        help="comma-separated tullax backends to compare with XLA (default: every available "
                             f"one of {', '.join(DEFAULT_BACKENDS)}; cuda on request; add torch.compile where "
                             "torch is installed)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--repeat", type=int, default=3, metavar="N", help="best of at least N timed runs")
    parser.add_argument("--timing-processes", type=int, default=3, metavar="P",
                        help="time forward and backward in P processes per row, the median process kept "
                             "(default 3)")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="S", help="per backend, in seconds")
    parser.add_argument("--no-ttfk", action="store_true", help="skip the time-to-first-kernel processes")
    parser.add_argument("--no-check", action="store_true", help="skip the comparison with float64 XLA")
    parser.add_argument("--plot", metavar="OUT.png", help="write a chart of the timings")
    parser.add_argument("--json", metavar="OUT.json", help="write every number as JSON")
    parser.add_argument("--markdown", metavar="OUT.md", help="write the table as Markdown")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from tullax.benchmarking.case import BenchCase, parse_range_arg, parse_shape_arg
    from tullax.benchmarking.report import make_console, print_table
    from tullax.benchmarking.runner import (
        RunConfig,
        case_document,
        run_cases,
        select_backends,
    )

    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.repeat < 1:
        raise TullaxError("--repeat must be at least 1")
    if args.plot:
        from tullax.benchmarking.report import plotting_available

        ok, why = plotting_available()
        if not ok:  # before the run, not after it
            raise TullaxError(why)
    shapes = dict(parse_shape_arg(text) for text in args.shape)
    ranges = dict(parse_range_arg(text) for text in args.range) or None
    case = BenchCase(name=args.spec, spec=args.spec, shapes=shapes, ranges=ranges)
    case_document(case, args.dtype)  # a wrong spec or shape fails here, before any child process starts
    requested = None if args.backends is None else [b.strip() for b in args.backends.split(",") if b.strip()]
    backends, unavailable = select_backends(requested)
    console = make_console(stderr=True)
    if requested is None:  # absent optional backends are not worth a warning each, nor a line in the results
        if unavailable:
            console.print(f"not available here: {', '.join(unavailable)} (`tullax doctor` says why)", style="dim")
        unavailable = {}
    for name, why in unavailable.items():
        console.print(f"[yellow]skipping {name}:[/] {why}", highlight=False)
    config = RunConfig(backends=tuple(backends), dtype=args.dtype, repeat=args.repeat,
                       timing_processes=max(1, args.timing_processes), timeout_s=args.timeout,
                       ttfk_timeout_s=args.timeout, ttfk=not args.no_ttfk, check=not args.no_check)
    saved: list[dict] = []  # the document after the last step: what an interrupted run still writes

    def save(doc: dict) -> None:
        saved[:] = [doc]
        write_outputs(doc, args, final=False)

    try:
        doc = run_cases([case], config, show_progress=not args.quiet, unavailable=unavailable, on_update=save)
    except KeyboardInterrupt:
        if not saved:
            console.print("interrupted before any backend finished: nothing to save")
            return 130
        doc = saved[0]
        print_table(doc, make_console(), title="tullax bench (interrupted: partial results)")
        write_outputs(doc, args, final=True)
        console.print(_saved(args))
        return 130
    print_table(doc, make_console(), title="tullax bench")
    write_outputs(doc, args, final=True)
    failed = [row for row in doc["cases"][0]["results"].values() if row.get("status") != "ok"]
    return 1 if failed else 0


def write_outputs(doc: dict, args: argparse.Namespace, *, final: bool) -> None:
    """The JSON, Markdown and chart asked for; after every step of the run (``final=False``) and at its end."""
    from tullax.benchmarking.report import plot, to_markdown, write_json

    if args.json:
        write_json(doc, args.json)
    if args.markdown:
        title = "tullax bench" if doc.get("complete", True) else "tullax bench (partial results)"
        with open(args.markdown, "w") as out:
            out.write(to_markdown(doc, title=title))
    if args.plot and (final or len(doc["cases"][0]["results"]) > 1):  # a chart needs a row besides XLA's
        plot(doc, args.plot)


def _saved(args: argparse.Namespace) -> str:
    paths = [path for path in (args.json, args.markdown, args.plot) if path]
    if paths:
        return f"interrupted: the results so far are in {', '.join(paths)}"
    return "interrupted: the table above has the results so far (--json, --markdown, --plot save them as it runs)"
