"""The compile cache: atomic files, checksums, a self-healing index, degradation, and cross-process safety."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

from tullax._version import __version__
from tullax.errors import TullaxError
from tullax.runtime.cache import (
    CacheWarning,
    CompileCache,
    cache_key,
    get_cache,
)

REPO = Path(__file__).resolve().parents[1]
SOURCE = "def kernel(x):\n    return x + 1\n"


@pytest.fixture
def cache(tmp_path: Path) -> CompileCache:
    return CompileCache(tmp_path / "cache", lock_timeout=5)


@contextlib.contextmanager
def _no_warnings():
    """A context in which any warning fails the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# -------------------------------------------------------------------------------------------------- keys


def test_cache_key_is_stable_and_sensitive_to_every_part():
    key = cache_key(spec="C[i,j] := A[i,k]*B[k,j]", dtypes=("float32", "float32"), backend="numba")
    assert key == cache_key(backend="numba", dtypes=["float32", "float32"], spec="C[i,j] := A[i,k]*B[k,j]")
    assert len(key) == 24 and int(key, 16) >= 0
    assert key != cache_key(spec="C[i,j] := A[i,k]*B[k,j]", dtypes=("float64", "float32"), backend="numba")
    assert key != cache_key(spec="C[i,j] := A[i,k]*B[k,j]", dtypes=("float32", "float32"), backend="julia")


def test_cache_key_accepts_numpy_dtypes_and_rejects_opaque_objects():
    assert cache_key(dtypes=[np.dtype("float32"), np.float64]) == cache_key(dtypes=["float32", "float64"])
    assert cache_key(options={"threads": np.int64(4)}) == cache_key(options={"threads": 4})
    with pytest.raises(TypeError, match="cannot put a object"):
        cache_key(spec=object())


def test_cache_key_includes_the_tullax_version():
    import hashlib

    canonical = json.dumps({"spec": "y[i] := x[i]", "tullax_version": __version__}, separators=(",", ":"))
    assert cache_key(spec="y[i] := x[i]") == hashlib.sha256(canonical.encode()).hexdigest()[:24]


# ------------------------------------------------------------------------------------------------- files


def test_write_then_read_roundtrip_leaves_no_temporary_files(cache: CompileCache):
    path = cache.write_text("k1", "kernel.py", SOURCE)
    assert path == cache.entry_dir("k1") / "kernel.py"
    assert path.read_text() == SOURCE
    assert cache.read_text("k1", "kernel.py") == SOURCE
    cache.write_text("k1", "kernel.py", SOURCE + "# v2\n")  # overwriting replaces the file and its checksum
    assert cache.read_text("k1", "kernel.py") == SOURCE + "# v2\n"
    assert sorted(p.name for p in cache.entry_dir("k1").iterdir()) == ["kernel.py", "manifest.json"]


def test_missing_file_reads_as_none(cache: CompileCache):
    assert cache.read_text("nokey", "kernel.py") is None
    cache.write_text("k1", "kernel.py", SOURCE)
    assert cache.read_text("k1", "other.py") is None


def test_corrupted_source_is_detected_warned_and_rebuilt(cache: CompileCache):
    path = cache.write_text("k1", "kernel.py", SOURCE)
    cache.record("k1", spec="y[i] := x[i]", backend="numba", compile_ms=3.0)
    path.write_text(SOURCE.replace("+ 1", "+ 2"))  # same length, different bytes
    with pytest.warns(CacheWarning, match="k1 is corrupt.*kernel.py does not match its checksum"):
        assert cache.read_text("k1", "kernel.py") is None
    assert not path.exists()
    assert [e["key"] for e in cache.entries()] == []
    cache.write_text("k1", "kernel.py", SOURCE)  # the rebuild
    with _no_warnings():
        assert cache.read_text("k1", "kernel.py") == SOURCE


def test_file_without_checksum_and_garbage_manifest_are_corrupt(cache: CompileCache):
    cache.write_text("k1", "kernel.py", SOURCE)
    (cache.entry_dir("k1") / "foreign.py").write_text("x = 1\n")
    with pytest.warns(CacheWarning, match="foreign.py has no checksum"):
        assert cache.read_text("k1", "foreign.py") is None
    cache.write_text("k2", "kernel.py", SOURCE)
    (cache.entry_dir("k2") / "manifest.json").write_text('{"files": {"kern')
    with pytest.warns(CacheWarning, match="k2 is corrupt"):
        assert cache.read_text("k2", "kernel.py") is None


def test_names_that_are_not_plain_path_components_are_refused(cache: CompileCache):
    for bad in ("../escape", "a/b", "", ".hidden"):
        with pytest.raises(TullaxError, match="invalid cache"):
            cache.write_text("k1", bad, SOURCE)
        with pytest.raises(TullaxError, match="invalid cache"):
            cache.entry_dir(bad)
    with pytest.raises(TullaxError, match="reserved"):
        cache.write_text("k1", "manifest.json", "{}")


# ------------------------------------------------------------------------------------------------- index


def test_record_merges_fields_and_hit_counts(cache: CompileCache):
    cache.write_text("k1", "kernel.py", SOURCE)
    first = cache.record("k1", spec="y[i] := x[i]", backend="numba", dtypes=["float32"], compile_ms=10.0,
                         ttfk_cold_ms=50.0)
    cache.record("k1", spec="y[i] := x[i]", backend="numba", ttfk_warm_ms=5.0)
    cache.hit("k1")
    cache.hit("k1")
    cache.hit("unknown-key")  # nothing to count, nothing created
    [entry] = cache.entries()
    assert entry["key"] == "k1" and entry["hits"] == 2 and entry["created"] == first["created"]
    assert (entry["compile_ms"], entry["ttfk_cold_ms"], entry["ttfk_warm_ms"]) == (10.0, 50.0, 5.0)
    assert entry["dtypes"] == ["float32"] and entry["size_bytes"] > len(SOURCE)
    assert entry["last_used"] >= first["last_used"]


def test_record_rejects_unknown_fields(cache: CompileCache):
    with pytest.raises(TypeError, match="unknown field.*compile_time"):
        cache.record("k1", spec="s", backend="numba", compile_time=3)
    with pytest.raises(TypeError, match="compile_ms must be a number"):
        cache.record("k1", spec="s", backend="numba", compile_ms="fast")


def test_truncated_index_is_rebuilt_with_a_warning(cache: CompileCache):
    cache.write_text("k1", "kernel.py", SOURCE)
    cache.record("k1", spec="y[i] := x[i]", backend="numba", dtypes=["float32"], compile_ms=10.0)
    cache.record("k2", spec="z := x[i]", backend="julia")  # an index record without files is lost
    raw = cache.index_path.read_bytes()
    cache.index_path.write_bytes(raw[: len(raw) // 2])
    with pytest.warns(CacheWarning, match="index .* is corrupt"):
        entries = cache.entries()
    assert [(e["key"], e["spec"], e["backend"], e["dtypes"]) for e in entries] == [
        ("k1", "y[i] := x[i]", "numba", ["float32"])
    ]
    with _no_warnings():  # rebuilt on disk: the next reader is quiet, and writers work again
        cache.hit("k1")
        assert cache.entries()[0]["hits"] == 1
        json.loads(cache.index_path.read_text())


def test_foreign_index_is_rebuilt_not_trusted(cache: CompileCache):
    cache.index_path.write_text(json.dumps({"entries": {"k9": {"spec": "x"}}}))  # no format marker
    with pytest.warns(CacheWarning, match="not a tullax cache index"):
        assert cache.entries() == []
    cache.index_path.write_text(json.dumps({"format": 1, "entries": {"../up": {"spec": "x"}}}))
    with pytest.warns(CacheWarning, match="entries table is malformed"):
        assert cache.entries() == []


def test_stats_and_clear_by_backend(cache: CompileCache):
    for key, backend, ms in (("a1", "numba", 10.0), ("a2", "numba", 30.0), ("b1", "julia", 1000.0)):
        cache.write_text(key, "kernel.txt", key)
        cache.record(key, spec=f"spec {key}", backend=backend, compile_ms=ms, ttfk_cold_ms=2 * ms)
    cache.hit("b1")
    (cache.numba_cache_dir() / "kernel.nbi").write_bytes(b"\0" * 100)
    stats = cache.stats()
    assert stats["entries"] == 3 and stats["hits"] == 1 and stats["writable"] is True
    assert stats["size_bytes"] >= 100
    assert stats["by_backend"]["numba"]["mean_compile_ms"] == 20.0
    assert stats["by_backend"]["julia"]["mean_ttfk_cold_ms"] == 2000.0
    assert stats["by_backend"]["julia"]["mean_ttfk_warm_ms"] is None

    assert cache.clear(backend="numba") == 2
    assert [e["key"] for e in cache.entries()] == ["b1"]
    assert not (cache.root / "entries" / "a1").exists() and (cache.root / "entries" / "b1").exists()
    assert list(cache.numba_cache_dir().iterdir()) == []
    assert cache.clear() == 1
    assert cache.entries() == [] and cache.stats()["entries"] == 0


# ------------------------------------------------------------------------------------ locks and processes


def test_lock_timeout_is_a_clear_error(tmp_path: Path):
    holder = CompileCache(tmp_path, lock_timeout=5)
    waiter = CompileCache(tmp_path, lock_timeout=0.1)
    with holder.lock("k1"):
        with pytest.raises(TullaxError, match=r"waited 0.1 s for the lock on cache entry k1"):
            with waiter.lock("k1"):
                pass
    with waiter.lock("k1"):  # released: free again
        pass


WORKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tullax.runtime.cache import CompileCache
    root, key, me, sync = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
    cache = CompileCache(root, lock_timeout=30)
    text = "def kernel(x):\\n    return x + 1\\n" * 300
    def together(stage):  # a barrier: maximise the overlap of the four processes
        (sync / f"{stage}-{me}").touch()
        while len(list(sync.glob(f"{stage}-*"))) < 4:
            time.sleep(0.002)
    together("start")
    with cache.lock(key):  # look up, else "compile" and store: only one process may compile
        if cache.read_text(key, "kernel.py") is None:
            time.sleep(0.1)
            cache.write_text(key, "kernel.py", text)
            cache.record(key, spec="y[i] := x[i]", backend="numba", compile_ms=100.0)
            print("compiled")
    together("write")
    for i in range(10):  # concurrent writers of one entry: every file keeps a valid checksum
        cache.write_text(key, f"part-{me}.py", f"# {me} {i}\\n" * 100)
        cache.write_text(key, "kernel.py", text)
    together("hit")
    for _ in range(25):  # concurrent index updates: none may be lost
        cache.hit(key)
    assert cache.read_text(key, "kernel.py") == text
    """
)


def test_four_processes_on_one_key_leave_one_valid_entry(tmp_path: Path):
    root, sync = tmp_path / "cache", tmp_path / "sync"
    sync.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    workers = [
        subprocess.Popen(
            [sys.executable, "-W", "error", "-c", WORKER, str(root), "shared", str(n), str(sync)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for n in range(4)
    ]
    results = [(*w.communicate(timeout=60), w.returncode) for w in workers]
    assert all(rc == 0 for _, _, rc in results), results
    assert sum(out.split().count("compiled") for out, _, _ in results) == 1

    cache = CompileCache(root)
    with _no_warnings():
        [entry] = cache.entries()
        assert entry["key"] == "shared" and entry["hits"] == 100 and entry["compile_ms"] == 100.0
        assert cache.read_text("shared", "kernel.py") == "def kernel(x):\n    return x + 1\n" * 300
        for n in range(4):
            assert cache.read_text("shared", f"part-{n}.py") == f"# {n} 9\n" * 100
    names = sorted(p.name for p in cache.entry_dir("shared").iterdir())
    assert names == ["kernel.py", "manifest.json", "part-0.py", "part-1.py", "part-2.py", "part-3.py"]
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []  # no temporary files left


# ------------------------------------------------------------------------------- the directory and its env


def _caught_cache_warnings(make):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = make()
    return result, [w for w in caught if issubclass(w.category, CacheWarning)]


def _check_degraded_cache_still_works(cache: CompileCache, requested: Path):
    assert cache.writable is False and cache.root != requested and cache.root.is_dir()
    with _no_warnings():  # one warning at opening, none afterwards
        cache.write_text("k1", "kernel.py", SOURCE)
        cache.record("k1", spec="y[i] := x[i]", backend="numba")
        assert cache.read_text("k1", "kernel.py") == SOURCE
        assert cache.numba_cache_dir().is_dir()
        assert cache.stats()["writable"] is False


def test_uncreatable_directory_degrades_to_a_private_one(tmp_path: Path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    requested = blocker / "cache"  # cannot be created, not even by root
    monkeypatch.setenv("TULLAX_CACHE_DIR", str(requested))
    cache, caught = _caught_cache_warnings(get_cache)
    assert len(caught) == 1 and "cannot be written" in str(caught[0].message)
    _check_degraded_cache_still_works(cache, requested)
    assert get_cache() is cache  # the singleton does not warn twice


def test_read_only_directory_degrades_to_a_private_one(tmp_path: Path):
    requested = tmp_path / "ro"
    requested.mkdir()
    requested.chmod(0o500)
    try:
        if os.access(requested, os.W_OK):
            pytest.skip("running as root: chmod does not make a directory read-only")
        cache, caught = _caught_cache_warnings(lambda: CompileCache(requested))
        assert len(caught) == 1
        _check_degraded_cache_still_works(cache, requested)
    finally:
        requested.chmod(0o700)


def test_get_cache_follows_the_environment_variable(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("TULLAX_CACHE_DIR", str(tmp_path / "one"))
    one = get_cache()
    assert get_cache() is one and one.root == tmp_path / "one" and one.writable
    monkeypatch.setenv("TULLAX_CACHE_DIR", str(tmp_path / "two"))
    assert get_cache().root == tmp_path / "two"
    monkeypatch.setenv("TULLAX_CACHE_DIR", str(tmp_path / "one"))
    assert get_cache() is one


def test_lock_timeout_from_the_environment(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("TULLAX_LOCK_TIMEOUT", "2.5")
    assert CompileCache(tmp_path).lock_timeout == 2.5
    monkeypatch.setenv("TULLAX_LOCK_TIMEOUT", "soon")
    with pytest.raises(TullaxError, match="TULLAX_LOCK_TIMEOUT='soon' is not a number"):
        CompileCache(tmp_path)
