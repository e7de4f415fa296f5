"""The ``tullax`` command: the compile cache, explain, doctor, demo and bench.

Every TullaxError becomes ``tullax: error: <message>`` on stderr and exit status 2, without a traceback.
Heavy modules (jax, numba, the compiler) are imported only by the subcommands that need them.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from tullax._version import __version__
from tullax.errors import TullaxError

# Subcommands that own their whole argument list (their modules parse it).
_DELEGATED = {"demo": "tullax.cli.demo", "bench": "tullax.cli.bench"}
_SOURCE_LEXERS = {"numba": "python", "xla": "python", "julia": "julia"}
_LIST_COLUMNS = ("key", "backend", "spec", "dtypes", "compile", "TTFK cold / warm", "hits", "last used")
_SHOWN_KEY_CHARS = 12  # enough to tell entries apart; `tullax cache list --json` has the whole key
_PIPED_WIDTH = 160
_VERSIONED_DISTRIBUTIONS = ("numpy", "jax", "jaxlib", "numba", "llvmlite", "juliacall", "rich")


# ---------------------------------------------------------------------------------------------- helpers


def _console(stderr: bool = False):
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # Piped output has no terminal width; rich would wrap tables at 80 columns, too narrow for the cache list.
    piped = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(stderr=stderr, highlight=False, width=_PIPED_WIDTH if piped else None)


def _require(module_name: str, attribute: str) -> Callable[..., Any]:
    """A function from a tullax module imported on demand; a clear error if this install lacks it."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name != module_name and not module_name.startswith(f"{err.name}."):
            raise  # a dependency of that module is missing: a real bug, keep the traceback
        raise TullaxError(f"this tullax {__version__} has no {module_name} module") from None
    function = getattr(module, attribute, None)
    if function is None:
        raise TullaxError(f"this tullax {__version__} has no {module_name}.{attribute}()")
    return function


def _ms(value: Any) -> str:
    if not isinstance(value, int | float):
        return "-"
    return f"{value / 1000:.2f} s" if value >= 10_000 else f"{value:.1f} ms"


def _when(timestamp: Any) -> str:
    if not isinstance(timestamp, int | float):
        return "-"
    return datetime.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M")


def _size(n_bytes: int) -> str:
    size = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _dtypes(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return "-" if value is None else str(value)


# ---------------------------------------------------------------------------------------------- cache


def _cmd_cache_list(args: argparse.Namespace) -> int:
    from rich.table import Table
    from rich.text import Text

    from tullax.runtime.cache import get_cache

    cache = get_cache()
    rows = cache.entries()
    if args.json:
        print(json.dumps(rows, indent=1, sort_keys=True))
        return 0
    console = _console()
    if not rows:
        console.print(f"the cache at {cache.root} is empty", markup=False)
        return 0
    table = Table(title=Text(f"tullax cache: {cache.root}"))
    for column in _LIST_COLUMNS:
        justify = "right" if column in ("compile", "hits") else "left"
        table.add_column(column, justify=justify, overflow="fold", no_wrap=column == "key")
    for row in rows:
        cells = (
            row["key"][:_SHOWN_KEY_CHARS], str(row.get("backend")), str(row.get("spec")),
            _dtypes(row.get("dtypes")), _ms(row.get("compile_ms")),
            f"{_ms(row.get('ttfk_cold_ms'))} / {_ms(row.get('ttfk_warm_ms'))}",
            str(row.get("hits", 0)), _when(row.get("last_used")),
        )
        table.add_row(*(Text(cell) for cell in cells))  # Text: specs contain [brackets], not markup
    console.print(table)
    return 0


def _cmd_cache_stats(args: argparse.Namespace) -> int:
    from rich.table import Table
    from rich.text import Text

    from tullax.runtime.cache import get_cache

    stats = get_cache().stats()
    if args.json:
        print(json.dumps(stats, indent=1, sort_keys=True))
        return 0
    console = _console()
    state = "writable" if stats["writable"] else "NOT writable: a private temporary directory is used"
    console.print(f"cache directory: {stats['root']} ({state})", markup=False)
    console.print(f"{stats['entries']} entries, {_size(stats['size_bytes'])} on disk, {stats['hits']} hits")
    table = Table()
    for column in ("backend", "entries", "hits", "mean compile", "mean TTFK cold", "mean TTFK warm"):
        table.add_column(column, justify="left" if column == "backend" else "right")
    for name, group in [*stats["by_backend"].items(), ("all", stats)]:
        table.add_row(
            Text(name), str(group["entries"]), str(group["hits"]), _ms(group["mean_compile_ms"]),
            _ms(group["mean_ttfk_cold_ms"]), _ms(group["mean_ttfk_warm_ms"]),
        )
    console.print(table)
    return 0


def _cmd_cache_clear(args: argparse.Namespace) -> int:
    from tullax.runtime.cache import get_cache

    cache = get_cache()
    removed = cache.clear(backend=args.backend)
    which = f" {args.backend}" if args.backend else ""
    _console().print(f"removed {removed}{which} entries from {cache.root}", markup=False)
    return 0


def _cmd_cache_prune(args: argparse.Namespace) -> int:
    from tullax.runtime.cache import get_cache
    from tullax.runtime.cache_hygiene import Limits

    cache = get_cache()
    report = cache.prune(Limits.from_env(args.max_bytes, args.max_age_days))
    lines = [f"removed {len(report.removed)} entries ({_size(report.freed_bytes)}) from {cache.root}; "
             f"{report.kept} entries left ({_size(report.size_bytes)})"]
    if report.busy:
        lines.append(f"{len(report.busy)} entries beyond the limits are in use by another process: left for later")
    if report.swept:
        lines.append(f"removed {report.swept} leftover temporary or lock files")
    for line in lines:
        _console().print(line, markup=False)
    return 0


def _cmd_cache_warm(args: argparse.Namespace) -> int:
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    warm = _require("tullax", "warm")
    started = time.perf_counter()
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), console=_console(stderr=True),
    ) as progress:
        task = progress.add_task("compiling", total=len(args.specs))
        for spec in args.specs:
            progress.update(task, description=escape(f"compiling {spec}"))
            warm(spec, backend=args.backend, dtype=args.dtype)
            progress.advance(task)
    elapsed = time.perf_counter() - started
    summary = f"warmed {len(args.specs)} spec(s) for {args.backend} {args.dtype} in {elapsed:.1f} s"
    _console().print(summary, markup=False)
    from tullax import backends

    backend = backends.get(args.backend)
    if backends.capabilities(backend).precompiled_package:
        # e.g. Julia CPU kernels live on in a precompiled package: a new process loads them from package images.
        package = backend.warm_package()
        _console().print(f"precompiled {package.get('modules')} kernel module(s) into {package.get('path')} "
                         f"in {package.get('precompile_ms', 0) / 1e3:.1f} s", markup=False)
    return 0


def _cmd_julia_install_cuda(args: argparse.Namespace) -> int:
    install_cuda = _require("tullax.backends.julia.install", "install_cuda")
    install_cuda()
    _console().print("CUDA.jl is installed in tullax's Julia environment; backend='julia-cuda' can use it",
                     markup=False)
    return 0


# ------------------------------------------------------------------------------------ explain and doctor


def _cmd_explain(args: argparse.Namespace) -> int:
    explain = _require("tullax", "explain")
    console = _console()
    shapes = None
    if args.shape:
        from tullax.benchmarking.case import parse_shape_arg

        shapes = dict(parse_shape_arg(text) for text in args.shape)
    console.print(explain(args.spec, shapes=shapes, dtype=args.dtype, algebra=args.algebra), markup=False)
    if args.backend:
        from rich.markup import escape
        from rich.rule import Rule
        from rich.syntax import Syntax

        generate_source = _require("tullax", "generate_source")
        # cuda picks its kernels by shapes: with --shape, the kernels (and launches) it would run at them
        by_shapes = {"shapes": shapes} if shapes and args.backend == "cuda" else {}
        source = generate_source(args.spec, backend=args.backend, dtype=args.dtype, **by_shapes)
        console.print(Rule(escape(f"generated {args.backend} source ({args.dtype})")))
        console.print(Syntax(source, _SOURCE_LEXERS.get(args.backend, "text"), line_numbers=True))
    return 0


def _distribution_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cmd_doctor(args: argparse.Namespace) -> int:
    from rich.table import Table
    from rich.text import Text

    from tullax.runtime.cache import get_cache

    console = _console()
    console.print(f"tullax {__version__}, Python {platform.python_version()} ({sys.executable})")
    versions = ", ".join(f"{name} {_distribution_version(name)}" for name in _VERSIONED_DISTRIBUTIONS)
    console.print(versions, markup=False)
    cache = get_cache()
    if cache.writable:
        console.print(f"cache: {cache.root} (writable)", markup=False)
    else:
        console.print(
            f"cache: {cache.requested_root} is NOT writable; using {cache.root} for this process only",
            markup=False,
        )
    availability = _require("tullax.backends", "availability")
    table = Table(title="backends")
    for column in ("backend", "usable", "details / how to fix"):
        table.add_column(column, overflow="fold")
    told: dict[str, str] = {}  # a long reason (how to install Julia) -> the first backend it was given for
    for name, available, reason in availability():
        usable = Text("yes", style="green") if available else Text("no", style="red")
        table.add_row(Text(name), usable, Text(_said_once(reason, name, told)))
    console.print(table)
    console.print(_said_once(_require("tullax.backends.gpu_select", "gpu_report")(), "", told), markup=False)
    console.print(_julia_verification_layers(), markup=False)
    console.print(_xla_startup(), markup=False)
    console.print(_settings_table())
    return 0


def _settings_table():
    """The effective value of every ``TULLAX_*`` setting, and where it comes from."""
    from rich.table import Table
    from rich.text import Text

    from tullax.settings import effective

    table = Table(title="settings (docs/settings.md)")
    for column in ("variable", "value", "from"):
        table.add_column(column, overflow="fold")
    for setting, shown, source in effective():
        invalid = source not in ("default", "environment")
        table.add_row(Text(setting.name), Text(shown), Text(source, style="red" if invalid else ""))
    return table


def _cmd_settings(args: argparse.Namespace) -> int:
    from tullax.settings import markdown

    if args.markdown:
        sys.stdout.write(markdown())
    else:
        _console().print(_settings_table())
    return 0


_LONG_REASON = 80  # characters: a reason this long is printed once, later rows refer to it
_JAX_MIN_COMPILE_TIME_DEFAULT = 1.0  # jax's default for jax_persistent_cache_min_compile_time_secs


def _said_once(text: str, name: str, told: dict[str, str]) -> str:
    """``text`` with every long reason already printed replaced by a reference to the row that printed it (the
    Julia install text is the reason of julia, julia-cuda and the GPU choice); records ``text`` for ``name``."""
    for reason, first in sorted(told.items(), key=lambda item: -len(item[0])):
        text = text.replace(reason, f"see the {first} row above")
    if name and len(text) >= _LONG_REASON and text not in told:
        told[text] = name
    return text


def _xla_startup() -> str:
    """Whether XLA's programs are kept across processes: tullax's cache keeps its loop modules and the planner's
    decisions, but a new process compiles every XLA program again (the whole time to first kernel of a kernel
    the planner runs on XLA's forms) unless jax's own persistent compilation cache is on: a setting of the
    user's program, which tullax reports and never changes. In the doctor's own process jax's settings are
    its environment variables, read here without importing jax (a second or more of the doctor's time)."""
    jax = sys.modules.get("jax")
    if jax is not None:
        where = jax.config.jax_compilation_cache_dir
        least = jax.config.jax_persistent_cache_min_compile_time_secs
    else:
        where = os.environ.get("JAX_COMPILATION_CACHE_DIR") or None
        try:
            least = float(os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                                         _JAX_MIN_COMPILE_TIME_DEFAULT))
        except ValueError:
            least = _JAX_MIN_COMPILE_TIME_DEFAULT
    if not where:
        return ("XLA programs: compiled again in every new process (jax's persistent compilation cache is off); to "
                "keep them: jax.config.update('jax_compilation_cache_dir', <dir>) and "
                "jax.config.update('jax_persistent_cache_min_compile_time_secs', 0) "
                "(docs/troubleshooting.md: Time to first kernel)")
    kept = "every program" if least <= 0 else f"programs that took {least:g} s or more to compile"
    return f"XLA programs: jax's persistent compilation cache keeps {kept} in {where}"


def _julia_verification_layers() -> str:
    """Which of the four verification layers of the Julia backend apply on this machine."""
    from tullax.backends.julia.detect import find_julia

    found = find_julia()
    static = ("layers 1-3 (generated Julia parses with tree-sitter-julia, runs in the Julia-subset evaluator of "
              "the test suite, matches the golden files)")
    if found is None:
        return f"julia verification here: {static}; layer 4 (real Julia, tests marked `julia`) is skipped: no Julia"
    return f"julia verification here: {static} and layer 4 with {found.exe} (Julia {found.version})"


# ------------------------------------------------------------------------------------------------ parsing


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tullax", description="Index-notation kernels as fused loop nests, for JAX."
    )
    parser.add_argument("--version", action="version", version=f"tullax {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    cache = commands.add_parser("cache", help="inspect, warm or clear the compile cache")
    cache_commands = cache.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    listing = cache_commands.add_parser("list", help="one row per cached kernel")
    listing.add_argument("--json", action="store_true", help="print the entries as JSON")
    listing.set_defaults(handler=_cmd_cache_list)
    stats = cache_commands.add_parser("stats", help="size, hits and mean compile times")
    stats.add_argument("--json", action="store_true", help="print the statistics as JSON")
    stats.set_defaults(handler=_cmd_cache_stats)
    clear = cache_commands.add_parser("clear", help="delete cached kernels (and leftover temporary and lock files)")
    clear.add_argument("--backend", help="only this backend's entries (numba, julia, ...)")
    clear.set_defaults(handler=_cmd_cache_clear)
    prune = cache_commands.add_parser(
        "prune", help="delete the least recently used kernels beyond the size and age limits")
    prune.add_argument("--max-bytes", metavar="SIZE",
                       help="keep at most this much (500M, 2G, 'off'; default $TULLAX_CACHE_MAX_BYTES or 2G)")
    prune.add_argument("--max-age-days", metavar="DAYS",
                       help="delete kernels unused for longer ('off'; default $TULLAX_CACHE_MAX_AGE_DAYS or 90)")
    prune.set_defaults(handler=_cmd_cache_prune)
    warm = cache_commands.add_parser("warm", help="compile specs ahead of time")
    warm.add_argument("specs", nargs="+", metavar="SPEC")
    warm.add_argument("--backend", default="auto")
    warm.add_argument("--dtype", default="float32")
    warm.set_defaults(handler=_cmd_cache_warm)

    explain = commands.add_parser("explain", help="show what a spec means, its gradients and generated code")
    explain.add_argument("spec", metavar="SPEC")
    explain.add_argument("--backend", help="also print this backend's generated source, highlighted")
    explain.add_argument("--dtype", default="float32")
    explain.add_argument("--shape", action="append", default=[], metavar="NAME=AxB",
                         help="plan for these input shapes (repeat per array input): what backend='auto' runs "
                              "each kernel on, as decided or cached for them")
    explain.add_argument("--algebra", choices=["expand"], default=None,
                         help="the plan of a kernel made with einsum_kernel(algebra='expand'): polynomial bodies "
                              "raced multiplied out, as contractions")
    explain.set_defaults(handler=_cmd_explain)

    doctor = commands.add_parser("doctor", help="which backends work here, and how to fix those that don't")
    doctor.set_defaults(handler=_cmd_doctor)
    settings = commands.add_parser("settings", help="every TULLAX_* variable and its effective value")
    settings.add_argument("--markdown", action="store_true", help="print docs/settings.md (made from the registry)")
    settings.set_defaults(handler=_cmd_settings)

    julia = commands.add_parser("julia", help="manage the Julia side of the julia backends")
    julia_commands = julia.add_subparsers(dest="julia_command", required=True, metavar="ACTION")
    cuda = julia_commands.add_parser("install-cuda", help="add CUDA.jl to tullax's Julia environment (large)")
    cuda.set_defaults(handler=_cmd_julia_install_cuda)

    # Only for --help: these two are dispatched before parsing, their modules parse their arguments.
    commands.add_parser("demo", help="run a few kernels forward and backward, checked against XLA")
    commands.add_parser("bench", help="benchmark kernels against XLA (tullax bench --help)")
    return parser


def _delegate(command: str, argv: list[str]) -> int:
    entry = _require(_DELEGATED[command], "main")
    return int(entry(argv) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``tullax`` command; returns the exit status."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        if arguments and arguments[0] in _DELEGATED:
            return _delegate(arguments[0], arguments[1:])
        args = _build_parser().parse_args(arguments)
        return int(args.handler(args) or 0)
    except TullaxError as err:
        print(f"tullax: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
