"""The `tullax` command's cache subcommands and its error reporting, run in-process through main()."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tullax.cli import main
from tullax.runtime.cache import CompileCache, get_cache

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> CompileCache:
    monkeypatch.setenv("TULLAX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps tables to the terminal width
    return get_cache()


def _populate(cache: CompileCache) -> None:
    cache.write_text("aaaa1111", "kernel.py", "def f():\n    pass\n")
    cache.record("aaaa1111", spec="D[i,j] := (W[k,i] - X[k,j])^2", backend="numba", dtypes=["float32"],
                 compile_ms=250.0, ttfk_cold_ms=900.0, ttfk_warm_ms=40.0)
    cache.hit("aaaa1111")
    cache.write_text("bbbb2222", "kernel.jl", "f() = nothing\n")
    cache.record("bbbb2222", spec="y[i] := x[i+k]*w[k]", backend="julia", dtypes=["float64"],
                 compile_ms=12_500.0)


def test_cache_list_shows_every_entry(cache: CompileCache, capsys):
    assert main(["cache", "list"]) == 0
    assert "is empty" in capsys.readouterr().out
    _populate(cache)
    assert main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    for text in ("aaaa1111", "bbbb2222", "numba", "julia", "D[i,j] := (W[k,i] - X[k,j])^2", "float32",
                 "250.0 ms", "900.0 ms / 40.0 ms", "12.50 s"):
        assert text in out, text


def test_cache_list_json(cache: CompileCache, capsys):
    _populate(cache)
    assert main(["cache", "list", "--json"]) == 0
    rows = {row["key"]: row for row in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"aaaa1111", "bbbb2222"}
    assert rows["aaaa1111"]["hits"] == 1 and rows["bbbb2222"]["compile_ms"] == 12_500.0


def test_cache_stats(cache: CompileCache, capsys):
    _populate(cache)
    assert main(["cache", "stats"]) == 0
    out = capsys.readouterr().out
    assert str(cache.root) in out and "(writable)" in out and "2 entries" in out
    assert "numba" in out and "julia" in out and "12.50 s" in out
    assert main(["cache", "stats", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["entries"] == 2 and stats["by_backend"]["numba"]["mean_ttfk_warm_ms"] == 40.0


def test_cache_clear_by_backend_then_all(cache: CompileCache, capsys):
    _populate(cache)
    assert main(["cache", "clear", "--backend", "julia"]) == 0
    assert "removed 1 julia entries" in capsys.readouterr().out
    assert [row["key"] for row in cache.entries()] == ["aaaa1111"]
    assert main(["cache", "clear"]) == 0
    assert "removed 1 entries" in capsys.readouterr().out
    assert cache.entries() == []


def test_cache_prune_to_limits(cache: CompileCache, capsys):
    _populate(cache)
    assert main(["cache", "prune"]) == 0  # the default limits keep both
    assert "removed 0 entries" in capsys.readouterr().out and len(cache.entries()) == 2
    assert main(["cache", "prune", "--max-bytes", "0", "--max-age-days", "off"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("removed 2 entries (") and "0 entries left (0 B)" in out
    assert cache.entries() == [] and list(cache.locks.directory.iterdir()) == []
    assert main(["cache", "prune", "--max-bytes", "lots"]) == 2
    assert "tullax: error: the limit 'lots' is not a size" in capsys.readouterr().err


def test_tullax_error_is_one_line_on_stderr_with_status_2(cache: CompileCache, monkeypatch, capsys):
    monkeypatch.setenv("TULLAX_LOCK_TIMEOUT", "0.1")
    monkeypatch.setenv("TULLAX_CACHE_DIR", str(cache.root / "other"))  # a fresh cache reads the timeout
    holder = CompileCache(cache.root / "other")
    with holder.locks.hold("index", "the cache index"):  # another process is busy with the index
        assert main(["cache", "clear"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("tullax: error: waited 0.1 s for the lock on the cache index")
    assert "Traceback" not in captured.err and captured.out == ""


def test_usage_errors_are_argparse_exits(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["no-such-command"])
    assert exit_info.value.code == 2 and "invalid choice" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["cache"])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("tullax ")


def test_cache_commands_import_no_compiler_runtime(tmp_path: Path):
    """`tullax cache ...` must stay instant: no jax, numba or juliacall behind it."""
    code = (
        "import sys\nfrom tullax.cli import main\n"
        "assert main(['cache', 'stats', '--json']) == 0\n"
        "heavy = {'jax', 'numba', 'juliacall'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    env = {**os.environ, "TULLAX_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["root"] == str(tmp_path)


@pytest.mark.parametrize("cache_dir, min_secs, says", [
    (None, None, "compiled again in every new process"),
    ("{tmp}", "0", "keeps every program in {tmp}"),
    ("{tmp}", "1.5", "keeps programs that took 1.5 s or more to compile in {tmp}"),
])
def test_doctor_says_whether_xla_programs_are_kept_across_processes(tmp_path: Path, cache_dir, min_secs, says):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    if cache_dir:
        env["JAX_COMPILATION_CACHE_DIR"] = cache_dir.format(tmp=tmp_path)
    if min_secs:
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = min_secs
    report = subprocess.run([sys.executable, "-c", "from tullax.cli.main import main; main(['doctor'])"],
                            capture_output=True, text=True, env=env, check=True).stdout
    line = next(line for line in report.splitlines() if line.startswith("XLA programs:"))
    assert says.format(tmp=tmp_path) in " ".join(report[report.index(line):].split())


def test_doctor_imports_no_compiler_runtime_and_says_each_reason_once(tmp_path: Path):
    """`tullax doctor` reports without importing jax (whose import, and the XLA FFI handler's compile it set off
    beside the C backend's probe, were most of its time) and prints each long reason once (the Julia install
    text was the reason of julia, julia-cuda and the GPU choice, printed three times)."""
    code = (
        "import sys, json\nfrom tullax.cli.main import main\nfrom tullax import backends\n"
        "assert main(['doctor']) == 0\n"
        "heavy = {'jax', 'numba', 'juliacall'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
        "print('REASONS=' + json.dumps([why for _, ok, why in backends.availability()]))\n"
    )
    env = {**os.environ, "TULLAX_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO), "COLUMNS": "100000"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report, reasons = done.stdout.split("REASONS=")
    flat = " ".join(re.sub("[\u2500-\u257f]", " ", report).split())  # the table's rules and borders out
    for reason in {" ".join(r.split()) for r in json.loads(reasons) if len(r) >= 80}:
        assert flat.count(reason) == 1, reason


def test_said_once_refers_back_to_the_first_row():
    from tullax.cli.main import _said_once

    told: dict[str, str] = {}
    long = "No Julia was found. " * 5
    assert _said_once(long, "julia", told) == long
    assert _said_once(long, "julia-cuda", told) == "see the julia row above"
    assert _said_once(f"GPU: none usable ({long})", "", told) == "GPU: none usable (see the julia row above)"
    assert _said_once("short", "c", told) == "short" and len(told) == 1
