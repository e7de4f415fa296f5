"""Find an installed Julia without side effects.

``import juliacall`` resolves juliapkg's environment, and when it finds no Julia it downloads
one. tullax must be able to ask "is the Julia backend usable here?" (for ``backend="auto"``,
``tullax doctor`` and test skips) without ever triggering that, so this module only looks:
it reads environment variables and files and runs ``julia --version``. It never imports
juliacall, and it never calls juliapkg's resolver.

Places are searched in the order juliacall/juliapkg would use them, so that the Julia found
here is the one the backend will run on:

1. an explicit user choice decides alone, as it does for juliacall and juliapkg:
   ``PYTHON_JULIACALL_EXE`` or ``<PYTHON_JULIACALL_BINDIR>/julia`` (juliacall's own, only
   together with ``PYTHON_JULIACALL_PROJECT``: juliacall refuses one without the other, and
   with both it bypasses juliapkg, so that project must already hold tullax's Julia packages),
   else ``PYTHON_JULIAPKG_EXE`` (juliapkg's),
2. the Julia juliapkg installed for itself (``<project>/pyjuliapkg/install/bin/julia``, where
   the project is ``PYTHON_JULIAPKG_PROJECT``, ``<venv or conda prefix>/julia_env`` or
   ``<depot>/environments/pyjuliapkg``),
3. juliaup's installed versions (``~/.julia/juliaup/juliaup.json``), newest first, and its
   launcher,
4. ``julia`` on ``PATH``.

A Julia counts only inside the versions juliapkg resolves with this Python (``julia_compat``):
juliacall's ``^1.10.3``, and at most 1.11 when Python's OpenSSL is older than 3.5 (juliapkg pins
OpenSSL_jll to Python's OpenSSL, and Julia 1.12 ships OpenSSL 3.5).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import ssl
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

MIN_JULIA_VERSION = (1, 10, 3)
"""juliacall 0.9.x requires Julia ^1.10.3 (its own juliapkg.json)."""

OPENSSL_FOR_JULIA_1_12 = (3, 5)
"""Julia 1.12 ships OpenSSL 3.5; juliapkg (0.1.28, ``deps.openssl_compat``) then allows Julia
``1 - 1.11`` only when Python's OpenSSL is older."""

NEWEST_JULIA_BEFORE_1_12 = (1, 11)

PROJECT_PACKAGES = ("PythonCall", "TullaxBridge", "KernelAbstractions", "Atomix")
"""What a project given to juliacall directly must hold: juliacall's PythonCall, and what tullax
loads by name (``using TullaxBridge``; the printed modules' ``using KernelAbstractions, Atomix``)."""

BRIDGE_DIR = Path(__file__).resolve().parents[2] / "julia" / "TullaxBridge"

PROBE_TIMEOUT_S = 30.0
"""``julia --version`` normally answers in well under a second; a cold disk can take longer."""

# Release versions only: juliacall's compat (^1.10.3) does not admit prereleases such as 1.12.0-rc1.
_VERSION_RE = re.compile(r"julia version (\d+)\.(\d+)\.(\d+)(?:\s|$)")
_EXE_SUFFIX = ".exe" if os.name == "nt" else ""


@dataclass(frozen=True)
class JuliaCompat:
    """The Julia versions juliapkg resolves with this Python: ``^lowest`` (from ``lowest`` on, same major
    version), up to the minor version ``newest_minor`` included (None: no further bound)."""

    lowest: tuple[int, int, int]
    newest_minor: tuple[int, int] | None

    def __contains__(self, version: tuple[int, int, int]) -> bool:
        in_caret = version >= self.lowest and version[0] == self.lowest[0]
        return in_caret and (self.newest_minor is None or version[:2] <= self.newest_minor)

    @property
    def text(self) -> str:
        lowest = ".".join(map(str, self.lowest))
        return f"^{lowest}" if self.newest_minor is None else f"{lowest} - {'.'.join(map(str, self.newest_minor))}"


def julia_compat(openssl: tuple[int, ...] | None = None) -> JuliaCompat:
    """The Julia versions juliapkg accepts with Python's OpenSSL (``ssl.OPENSSL_VERSION_INFO`` unless given).
    Mirrors juliapkg's rule without importing juliapkg: its module reads its settings (``PYTHON_JULIAPKG_EXE``)
    once, when first imported, and tullax sets them just before juliacall imports it."""
    version = tuple(ssl.OPENSSL_VERSION_INFO if openssl is None else openssl)
    newest = NEWEST_JULIA_BEFORE_1_12 if version[:2] < OPENSSL_FOR_JULIA_1_12 else None
    return JuliaCompat(MIN_JULIA_VERSION, newest)


@dataclass(frozen=True)
class JuliaInstall:
    """A Julia executable that answered ``--version``.

    ``source`` says where it was found: ``PYTHON_JULIACALL_EXE``, ``PYTHON_JULIAPKG_EXE``,
    ``PYTHON_JULIACALL_BINDIR``, ``juliapkg``, ``juliaup`` or ``PATH``.
    """

    exe: str
    version: tuple[int, int, int]
    source: str

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))


def find_julia(environ: Mapping[str, str] | None = None, compat: JuliaCompat | None = None) -> JuliaInstall | None:
    """The Julia juliacall will run on (see the module docstring), or None. Pure lookups plus ``julia --version``."""
    return _first_usable(os.environ if environ is None else environ, compat or julia_compat(), rejected=[])


def availability(environ: Mapping[str, str] | None = None, compat: JuliaCompat | None = None) -> tuple[bool, str]:
    """(True, where Julia is) when the Julia backend can start, else (False, how to get one)."""
    env = os.environ if environ is None else environ
    settings = juliacall_settings_error(env)
    if settings is not None:
        return False, settings
    compat = compat or julia_compat()
    rejected: list[tuple[JuliaInstall, str]] = []
    found = _first_usable(env, compat, rejected)
    if found is not None:
        return True, f"Julia {found.version_text} at {found.exe} (found via {found.source})"
    return False, _not_found_message(env, compat, rejected)


def juliacall_settings_error(environ: Mapping[str, str]) -> str | None:
    """Why juliacall would not start with the user's PYTHON_JULIACALL_* settings, else None. juliacall (0.9.x,
    ``__init__.py``) takes its Julia from PYTHON_JULIACALL_EXE (or <PYTHON_JULIACALL_BINDIR>/julia) and its
    project from PYTHON_JULIACALL_PROJECT: both, or neither (juliapkg then chooses both); one without the other
    raises when juliacall is imported. With both, juliapkg is bypassed, so the project must already hold the
    packages tullax loads (PROJECT_PACKAGES)."""
    exe = environ.get("PYTHON_JULIACALL_EXE") or environ.get("PYTHON_JULIACALL_BINDIR")
    project = environ.get("PYTHON_JULIACALL_PROJECT")
    if not exe and not project:
        return None
    if not (exe and project):
        given = "PYTHON_JULIACALL_PROJECT" if project else "PYTHON_JULIACALL_EXE/PYTHON_JULIACALL_BINDIR"
        return (f"{given} is set alone: juliacall refuses to start unless PYTHON_JULIACALL_PROJECT and "
                "PYTHON_JULIACALL_EXE (or PYTHON_JULIACALL_BINDIR) are set together. Unset it and choose the Julia "
                "with PYTHON_JULIAPKG_EXE instead (juliapkg then installs tullax's Julia packages), or set both.")
    import tomllib  # only with both variables set: auto's search for a Julia asks on every new process

    try:
        deps = tomllib.loads((Path(project) / "Project.toml").read_text()).get("deps", {})
    except (OSError, ValueError):
        deps = {}
    missing = [name for name in PROJECT_PACKAGES if name not in deps]
    if not missing:
        return None
    return (f"PYTHON_JULIACALL_PROJECT={project} is used as it is (juliacall bypasses juliapkg), and its "
            f"Project.toml lacks {', '.join(missing)}. Add them there (TullaxBridge with "
            f'`Pkg.develop(path=raw"{BRIDGE_DIR}")`), or unset PYTHON_JULIACALL_PROJECT and '
            "PYTHON_JULIACALL_EXE/BINDIR to let juliapkg install them (PYTHON_JULIAPKG_EXE chooses the Julia).")


def julia_env_vars(
    threads: int | str,
    *,
    install: JuliaInstall | None = None,
    offline: bool = False,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Environment variables to set before tullax imports juliacall (which starts Julia).

    Only variables the user has not set already are returned; the caller applies them with
    ``os.environ.update(...)`` before the import.

    - ``PYTHON_JULIACALL_THREADS``: juliacall starts Julia with ``JULIA_NUM_THREADS`` or one
      thread, and KernelAbstractions' ``CPU()`` backend spreads work-groups over Julia's
      threads, so without this the Julia CPU backend runs serially. ``threads`` is a count
      or ``"auto"``.
    - ``PYTHON_JULIACALL_HANDLE_SIGNALS=yes``: by default juliacall passes
      ``--handle-signals=no``, and Julia's multi-threaded runtime (its GC stops threads with
      signals) is then unsafe; juliacall warns about exactly this when nthreads > 1. The cost:
      Ctrl-C no longer raises KeyboardInterrupt while Julia code runs.
    - ``PYTHON_JULIAPKG_EXE``: the Julia found by :func:`find_julia`, so that juliapkg's
      resolve uses it and never downloads one. (Not ``PYTHON_JULIACALL_EXE``: juliacall
      accepts that only together with ``PYTHON_JULIACALL_PROJECT`` and then bypasses juliapkg,
      so tullax's own Julia packages from ``tullax/juliapkg.json`` would never be installed.)
    - ``PYTHON_JULIAPKG_OFFLINE=yes`` when ``offline``: no Julia download and no ``Pkg``
      operations at all. Use it on machines without network once the environment has been
      resolved (``tullax cache warm`` or a first online run did that); otherwise juliapkg only
      resolves when a ``juliapkg.json`` changed.
    """
    env = os.environ if environ is None else environ
    wanted = {  # each declared, with why, in tullax.settings.WRITTEN
        "PYTHON_JULIACALL_THREADS": str(threads),
        "PYTHON_JULIACALL_HANDLE_SIGNALS": "yes",
    }
    if install is None:
        install = find_julia(env)
    if install is not None and not install.source.startswith("PYTHON_"):
        wanted["PYTHON_JULIAPKG_EXE"] = install.exe
    if offline:
        wanted["PYTHON_JULIAPKG_OFFLINE"] = "yes"
    return {key: value for key, value in wanted.items() if key not in env}


def juliapkg_project_dirs(environ: Mapping[str, str]) -> list[Path]:
    """Every juliapkg environment this Python could use, the one juliapkg picks first.

    juliapkg uses ``PYTHON_JULIAPKG_PROJECT`` if set, else ``<prefix>/julia_env`` inside a
    virtualenv or conda env, else ``<depot>/environments/pyjuliapkg``. The later entries are
    where an earlier juliacall run (another venv, the system Python) may have put a Julia.
    """
    dirs: list[Path] = []
    if environ.get("PYTHON_JULIAPKG_PROJECT"):
        dirs.append(Path(environ["PYTHON_JULIAPKG_PROJECT"]))
    if sys.prefix != sys.base_prefix:
        dirs.append(Path(sys.prefix) / "julia_env")
    if environ.get("CONDA_PREFIX"):
        dirs.append(Path(environ["CONDA_PREFIX"]) / "julia_env")
    dirs.append(_julia_depot(environ) / "environments" / "pyjuliapkg")
    return list(dict.fromkeys(dirs))


def _first_usable(environ: Mapping[str, str], compat: JuliaCompat,
                  rejected: list[tuple[JuliaInstall, str]]) -> JuliaInstall | None:
    """Probe candidates in order; collect the ones outside ``compat`` in ``rejected``, with the reason."""
    for source, exe in _candidates(environ):
        version = probe_version(exe)
        if version is None:
            continue
        install = JuliaInstall(exe=exe, version=version, source=source)
        if version in compat:
            return install
        rejected.append((install, "too old" if version < compat.lowest else _too_new(compat)))
    return None


def _too_new(compat: JuliaCompat) -> str:
    openssl = ".".join(map(str, ssl.OPENSSL_VERSION_INFO[:3]))
    return (f"too new for juliapkg with this Python (Julia {compat.text}: Python's OpenSSL {openssl} is older than "
            f"{'.'.join(map(str, OPENSSL_FOR_JULIA_1_12))}, which Julia 1.12 needs)")


def _candidates(environ: Mapping[str, str]) -> Iterator[tuple[str, str]]:
    """(source, executable path) pairs in search order, each path once, existing files only."""
    seen: set[str] = set()
    for source, path in _raw_candidates(environ):
        if path is None or not os.path.isfile(path):
            continue
        resolved = os.path.realpath(path)
        if resolved not in seen:
            seen.add(resolved)
            yield source, str(path)


def _raw_candidates(environ: Mapping[str, str]) -> Iterator[tuple[str, str | None]]:
    search_path = environ.get("PATH", "")
    explicit = _explicit_choice(environ)
    if explicit is not None:  # juliacall and juliapkg use it and nothing else
        source, path = explicit
        yield source, shutil.which(path, path=search_path) or path
        return
    for project in juliapkg_project_dirs(environ):
        yield "juliapkg", str(project / "pyjuliapkg" / "install" / "bin" / f"julia{_EXE_SUFFIX}")
    for exe in _juliaup_executables(environ):
        yield "juliaup", exe
    yield "PATH", shutil.which("julia", path=search_path)


def _explicit_choice(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(variable, executable) of the Julia the user chose for juliacall or juliapkg, in juliacall's order."""
    if environ.get("PYTHON_JULIACALL_EXE"):
        return "PYTHON_JULIACALL_EXE", environ["PYTHON_JULIACALL_EXE"]
    if environ.get("PYTHON_JULIACALL_BINDIR"):
        return "PYTHON_JULIACALL_BINDIR", str(Path(environ["PYTHON_JULIACALL_BINDIR"]) / f"julia{_EXE_SUFFIX}")
    if environ.get("PYTHON_JULIAPKG_EXE"):
        return "PYTHON_JULIAPKG_EXE", environ["PYTHON_JULIAPKG_EXE"]
    return None


def _julia_depot(environ: Mapping[str, str]) -> Path:
    """The first entry of JULIA_DEPOT_PATH, else ~/.julia (as juliapkg computes it)."""
    depot_path = environ.get("JULIA_DEPOT_PATH", "")
    first = depot_path.split(";" if os.name == "nt" else ":")[0]
    return Path(first) if first else _home(environ) / ".julia"


def _home(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("HOME") or environ.get("USERPROFILE") or Path.home())


def _juliaup_executables(environ: Mapping[str, str]) -> list[str]:
    """Julias installed by juliaup, newest first, then juliaup's ``julia`` launcher.

    juliaup ignores JULIA_DEPOT_PATH and uses JULIAUP_DEPOT_PATH or ~/.julia; the versions
    are listed in ``juliaup/juliaup.json`` with paths relative to that directory.
    """
    depot = Path(environ.get("JULIAUP_DEPOT_PATH") or _home(environ) / ".julia")
    juliaup_dir = depot / "juliaup"
    exes = [exe for _, exe in sorted(_juliaup_versions(juliaup_dir), reverse=True)]
    exes.append(str(_home(environ) / ".juliaup" / "bin" / f"julia{_EXE_SUFFIX}"))
    return exes


def _juliaup_versions(juliaup_dir: Path) -> list[tuple[tuple[int, ...], str]]:
    try:
        meta = json.loads((juliaup_dir / "juliaup.json").read_text())
    except (OSError, ValueError):
        return []
    found = []
    for version_text, info in meta.get("InstalledVersions", {}).items():
        if not isinstance(info, dict):
            continue
        numbers = re.match(r"(\d+)\.(\d+)\.(\d+)", version_text)
        key = tuple(int(n) for n in numbers.groups()) if numbers else (0,)
        if "BinaryPath" in info:
            found.append((key, str(juliaup_dir / info["BinaryPath"])))
        elif "Path" in info:
            found.append((key, str(juliaup_dir / info["Path"] / "bin" / f"julia{_EXE_SUFFIX}")))
    return found


def probe_version(exe: str) -> tuple[int, int, int] | None:
    """The version ``exe --startup-file=no --version`` reports, or None if it is not a Julia."""
    try:
        stat = os.stat(exe)
    except OSError:
        return None
    return _probe_cached(os.path.realpath(exe), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=64)
def _probe_cached(exe: str, mtime_ns: int, size: int) -> tuple[int, int, int] | None:
    """Memoized per file version: ``auto`` backend selection asks often, Julia starts slowly."""
    try:
        result = subprocess.run(
            [exe, "--startup-file=no", "--version"],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    match = _VERSION_RE.search(result.stdout)
    if result.returncode != 0 or match is None:
        return None
    major, minor, patch = (int(n) for n in match.groups())
    return major, minor, patch


def _not_found_message(environ: Mapping[str, str], compat: JuliaCompat,
                       rejected: list[tuple[JuliaInstall, str]]) -> str:
    minimum = ".".join(map(str, MIN_JULIA_VERSION))
    project = juliapkg_project_dirs(environ)[0] / "pyjuliapkg" / "install"
    explicit = _explicit_choice(environ)
    where = (f"{explicit[0]}, which decides alone" if explicit is not None else
             f"PYTHON_JULIACALL_EXE, PYTHON_JULIAPKG_EXE, juliapkg's own install ({project}), juliaup, and "
             "`julia` on PATH")
    lines = [f"No Julia >= {minimum} was found (juliapkg accepts Julia {compat.text} with this Python). tullax "
             f"looked at {where}."]
    lines += [f"Found Julia {j.version_text} at {j.exe} ({j.source}), which is {why}." for j, why in rejected]
    lines += [
        "To use the Julia backend, install Julia 1.10 or newer (juliaup is the easy way: "
        "https://julialang.org/install) and put `julia` on PATH, or set PYTHON_JULIAPKG_EXE to an "
        "existing julia executable (PYTHON_JULIACALL_EXE works too, together with "
        "PYTHON_JULIACALL_PROJECT).",
        "On a machine with internet access juliacall can also download Julia by itself the first time "
        "`import juliacall` runs; tullax never triggers that download on its own.",
    ]
    return "\n".join(lines)
