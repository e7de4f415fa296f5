"""The compile cache: atomic files, checksums, a self-healing index, degradation, and cross-process safety."""

from __future__ import annotations

import contextlib
import errno
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
from tullax.runtime.cache_hygiene import Limits, parse_size, prune

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


def test_deferred_updates_wait_for_flush_and_apply_in_order(cache: CompileCache):
    """A kernel's first call defers its index updates (record_later, hit_later): nothing is written until a
    flush, which applies them in order in one update; reading the index through the cache flushes first."""
    cache.record("k1", spec="y[i] := x[i]", backend="c", kind="module", compile_ms=10.0)
    before = cache.index_path.read_bytes()
    cache.hit_later("k1")
    cache.record_later("k1", spec="y[i] := x[i]", backend="c", kind="forward", ttfk_warm_ms=5.0)
    cache.record_later("k2", spec="z[i] := x[i]", backend="c", first_run_ms=1.0)
    cache.hit_later("k2")  # after its record: counted
    assert cache.index_path.read_bytes() == before
    entries = {e["key"]: e for e in cache.entries()}
    assert entries["k1"]["hits"] == 1 and entries["k1"]["compile_ms"] == 10.0
    assert entries["k1"]["ttfk_warm_ms"] == 5.0 and entries["k1"]["kind"] == "forward"
    assert entries["k2"]["hits"] == 1 and entries["k2"]["first_run_ms"] == 1.0
    with pytest.raises(TypeError, match="unknown field"):  # checked when deferred, not at the flush
        cache.record_later("k1", spec="s", backend="c", compile_time=3)


def test_deferred_updates_are_written_by_a_timer_and_at_exit(cache: CompileCache, monkeypatch, tmp_path: Path):
    import time

    from tullax.runtime import cache_later

    monkeypatch.setattr(cache_later, "FLUSH_DELAY_S", 0.05)
    cache.record_later("k1", spec="y[i] := x[i]", backend="c", first_run_ms=2.0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not cache.index_path.exists():
        time.sleep(0.02)
    assert json.loads(cache.index_path.read_text())["entries"]["k1"]["first_run_ms"] == 2.0
    script = textwrap.dedent(f"""
        from tullax.runtime.cache import CompileCache
        CompileCache({str(tmp_path / "other")!r}).record_later("k9", spec="s", backend="c", first_run_ms=3.0)
    """)  # exits long before the timer fires
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120,
                   env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert json.loads((tmp_path / "other" / "index.json").read_text())["entries"]["k9"]["first_run_ms"] == 3.0


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
    cache.write_bytes("a1", "kernel.nbi", b"\0" * 100)  # Numba's artefacts live in their entry
    stats = cache.stats()
    assert stats["entries"] == 3 and stats["hits"] == 1 and stats["writable"] is True
    assert stats["size_bytes"] >= 100
    assert stats["by_backend"]["numba"]["mean_compile_ms"] == 20.0
    assert stats["by_backend"]["julia"]["mean_ttfk_cold_ms"] == 2000.0
    assert stats["by_backend"]["julia"]["mean_ttfk_warm_ms"] is None

    assert cache.clear(backend="numba") == 2
    assert [e["key"] for e in cache.entries()] == ["b1"]
    assert not (cache.root / "entries" / "a1").exists() and (cache.root / "entries" / "b1").exists()
    assert not list((cache.root / "entries").rglob("*.nbi"))
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
        assert cache.write_bytes("k1", "kernel.nbi", b"\0") == cache.entry_path("k1") / "kernel.nbi"
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


# ---------------------------------------------------------------------------------- full disk (simulated)


def _disk_full(path, data):
    raise OSError(errno.ENOSPC, "No space left on device", str(path))


def test_a_full_disk_stops_storing_with_one_warning_and_everything_else_works(cache: CompileCache, monkeypatch):
    cache.write_text("k1", "kernel.py", SOURCE)
    cache.record("k1", spec="y[i] := x[i]", backend="numba")
    monkeypatch.setattr("tullax.runtime.cache.atomic_write", _disk_full)
    with pytest.warns(CacheWarning, match=r"cannot write to the tullax cache .* \(No space left on device\)") as caught:
        assert cache.write_text("k2", "kernel.py", SOURCE) is None
    assert len([w for w in caught if issubclass(w.category, CacheWarning)]) == 1
    with _no_warnings():  # from now on nothing is written, nothing fails, nothing warns again
        assert cache.write_bytes("k2", "kernel.nbc", b"code") is None
        cache.record("k2", spec="z := x[i]", backend="numba")
        cache.hit("k1")
        assert cache.read_text("k1", "kernel.py") == SOURCE  # reading goes on
        assert [e["key"] for e in cache.entries()] == ["k1"]
    assert not cache.storing.is_set() and not (cache.entry_path("k2") / "kernel.py").exists()


# ---------------------------------------------------------------------------------------- layout faults


def _write_index(cache: CompileCache, entries: dict) -> None:
    cache.index_path.write_text(json.dumps({"format": 1, "entries": entries}))


def test_a_malformed_field_in_the_index_is_dropped_with_a_warning(cache: CompileCache):
    cache.write_text("k1", "kernel.py", SOURCE)
    cache.record("k1", spec="y[i] := x[i]", backend="numba", compile_ms=4.0)
    record = json.loads(cache.index_path.read_text())["entries"]["k1"]
    _write_index(cache, {"k1": {**record, "hits": "many", "last_used": "yesterday", "first_run_ms": [1]}})
    with pytest.warns(CacheWarning, match="malformed fields.*hits='many'.*last_used='yesterday'"):
        cache.hit("k1")
    with _no_warnings():
        [entry] = cache.entries()
        assert entry["hits"] == 1 and entry["compile_ms"] == 4.0 and isinstance(entry["last_used"], float)
        assert "first_run_ms" not in entry and cache.stats()["hits"] == 1


def test_an_index_that_is_a_directory_is_replaced(cache: CompileCache):
    cache.write_text("k1", "kernel.py", SOURCE)
    cache.record("k1", spec="y[i] := x[i]", backend="numba")
    cache.index_path.unlink()
    cache.index_path.mkdir()
    (cache.index_path / "junk").write_text("x")
    with pytest.warns(CacheWarning, match="index.json is not a file"):
        assert [e["key"] for e in cache.entries()] == ["k1"]
    assert cache.index_path.is_file()
    with _no_warnings():
        cache.hit("k1")
        assert cache.entries()[0]["hits"] == 1


def test_an_entry_that_is_a_file_is_replaced(cache: CompileCache):
    cache.entry_path("k1").write_text("not a directory")
    assert cache.read_text("k1", "kernel.py") is None
    with pytest.warns(CacheWarning, match="entry k1 was a file"):
        cache.write_text("k1", "kernel.py", SOURCE)
    with _no_warnings():
        assert cache.read_text("k1", "kernel.py") == SOURCE
        cache.record("k1", spec="y[i] := x[i]", backend="numba")
        assert cache.clear() == 1


def test_a_lock_file_that_is_a_directory_is_replaced(cache: CompileCache):
    cache.locks.path("key-k1").mkdir()
    cache.locks.path("index").mkdir()
    with pytest.warns(CacheWarning, match="lock .*key-k1.lock was a directory"):
        with cache.lock("k1"):
            cache.write_text("k1", "kernel.py", SOURCE)
    with pytest.warns(CacheWarning, match="lock .*index.lock was a directory"):
        cache.record("k1", spec="y[i] := x[i]", backend="numba")
    with _no_warnings():
        with cache.lock("k1"):
            assert cache.read_text("k1", "kernel.py") == SOURCE


def test_a_manifest_that_is_a_directory_makes_the_entry_corrupt(cache: CompileCache):
    cache.write_text("k1", "kernel.py", SOURCE)
    manifest = cache.entry_path("k1") / "manifest.json"
    manifest.unlink()
    manifest.mkdir()
    with pytest.warns(CacheWarning, match="k1 is corrupt"):
        assert cache.read_text("k1", "kernel.py") is None
    with _no_warnings():
        cache.write_text("k1", "kernel.py", SOURCE)
        assert cache.read_text("k1", "kernel.py") == SOURCE


def test_cache_subdirectories_that_are_files_are_replaced(tmp_path: Path):
    root = tmp_path / "cache"
    root.mkdir()
    (root / "entries").write_text("x")
    (root / "locks").write_text("x")
    cache, caught = _caught_cache_warnings(lambda: CompileCache(root))
    assert cache.writable and cache.root == root and len(caught) == 2
    with _no_warnings():
        cache.write_text("k1", "kernel.py", SOURCE)
        with cache.lock("k1"):
            assert cache.read_text("k1", "kernel.py") == SOURCE


def test_a_lock_that_cannot_be_taken_is_bypassed_with_one_warning(cache: CompileCache, monkeypatch):
    real_open = os.open

    def no_lock_files(path, *args, **kwargs):
        if str(path).endswith(".lock"):
            raise OSError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("tullax.runtime.cache_locks.os.open", no_lock_files)
    with pytest.warns(CacheWarning, match="going on without cache locks") as caught:
        with cache.lock("k1"):
            cache.write_text("k1", "kernel.py", SOURCE)
        cache.record("k1", spec="y[i] := x[i]", backend="numba")
    assert len([w for w in caught if issubclass(w.category, CacheWarning)]) == 1
    assert cache.read_text("k1", "kernel.py") == SOURCE and cache.entries()[0]["key"] == "k1"


# -------------------------------------------------------------------------------------- locks are deletable


def test_a_lock_file_deleted_by_its_holder_still_excludes(cache: CompileCache):
    """clear/prune delete a lock file while holding it: a waiter that had opened the deleted file must not
    hold the lock at the same time as a newcomer that creates a new file."""
    import threading
    import time

    inside: list[str] = []
    overlaps: list[str] = []

    def critical(name: str) -> None:
        with cache.lock("k1"):
            if inside:
                overlaps.append(f"{name} with {inside}")
            inside.append(name)
            time.sleep(0.05)
            inside.remove(name)

    with cache.lock("k1", remove=True):
        waiter = threading.Thread(target=critical, args=("waiter",))
        waiter.start()
        time.sleep(0.05)  # the waiter has opened the lock file that is about to be deleted
    newcomers = [threading.Thread(target=critical, args=(f"newcomer{n}",)) for n in range(3)]
    for thread in newcomers:
        thread.start()
    for thread in [waiter, *newcomers]:
        thread.join(10)
    assert overlaps == []


# -------------------------------------------------------------------------------------------- hygiene

DAY = 86_400.0


def _entry(cache: CompileCache, key: str, size: int) -> None:
    cache.write_bytes(key, "kernel.nbc", b"\0" * size)
    cache.record(key, spec=f"spec {key}", backend="numba")


def test_prune_removes_the_least_recently_used_entries_beyond_the_size_limit(cache: CompileCache):
    for key in ("old", "middle", "new"):
        _entry(cache, key, 10_000)
    cache.hit("old")  # now the most recently used
    size = {e["key"]: e["size_bytes"] for e in cache.entries()}
    report = cache.prune(Limits(max_bytes=size["old"] + size["new"] + 100, max_age_s=None))
    assert report.removed == ("middle",) and report.freed_bytes == size["middle"] and report.busy == ()
    assert report.kept == 2 and report.size_bytes == size["old"] + size["new"]
    assert sorted(e["key"] for e in cache.entries()) == ["new", "old"]
    assert not cache.entry_path("middle").exists() and not cache.locks.path("key-middle").exists()
    assert cache.prune(Limits(max_bytes=0, max_age_s=None)).removed == ("old", "new")
    assert cache.entries() == [] and list((cache.root / "entries").iterdir()) == []


def test_prune_removes_entries_unused_for_longer_than_the_age_limit(cache: CompileCache):
    import time

    _entry(cache, "k1", 100)
    _entry(cache, "k2", 100)
    assert cache.prune(Limits(max_bytes=None, max_age_s=30 * DAY)).removed == ()
    later = time.time() + 40 * DAY
    cache.hit("k2")
    assert prune(cache, Limits(max_bytes=None, max_age_s=30 * DAY), now=later).removed == ("k2", "k1")


def test_prune_counts_entries_without_an_index_record_by_their_age_on_disk(cache: CompileCache):
    _entry(cache, "k1", 100)
    cache.write_bytes("orphan", "kernel.nbc", b"\0" * 100)  # no record: its directory's mtime counts
    os.utime(cache.entry_path("orphan"), (0, 0))
    assert cache.prune(Limits(max_bytes=None, max_age_s=DAY)).removed == ("orphan",)


def test_prune_leaves_an_entry_that_another_process_holds(cache: CompileCache):
    _entry(cache, "busy", 100)
    _entry(cache, "free", 100)
    with cache.lock("busy"):  # a compile or a load in progress
        report = cache.prune(Limits(max_bytes=0, max_age_s=None))
    assert report.removed == ("free",) and report.busy == ("busy",) and cache.entry_path("busy").is_dir()
    assert cache.prune(Limits(max_bytes=0, max_age_s=None)).removed == ("busy",)


def test_clear_and_prune_remove_leftover_temporary_and_lock_files(cache: CompileCache):
    import time

    _entry(cache, "k1", 100)
    leftovers = [cache.entry_path("k1") / ".kernels.py.abc123.tmp", cache.entry_path("k1") / "__pycache__" /
                 "kernels.cpython-311.pyc.140234", cache.root / ".index.json.xyz.tmp"]
    for path in leftovers:
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"half")
    probe = cache.root / ".probe-abc"
    probe.write_bytes(b"")  # a probe of a live process: left alone while it is young
    for name in ("key-gone", "manifest-gone"):
        cache.locks.path(name).touch()
    report = cache.prune(Limits(max_bytes=None, max_age_s=None))
    assert report.removed == () and report.swept >= 6
    assert not any(path.exists() for path in leftovers) and probe.exists()
    assert sorted(p.name for p in cache.locks.directory.iterdir()) == ["key-k1.lock", "manifest-k1.lock"]
    old = time.time() - 3600
    os.utime(probe, (old, old))
    assert cache.clear() == 1
    assert not probe.exists() and list(cache.locks.directory.iterdir()) == []
    assert sorted(p.name for p in cache.root.iterdir()) == ["entries", "index.json", "locks"]


def test_clear_removes_the_numba_directory_of_the_old_layout(cache: CompileCache):
    (cache.root / "numba" / "kernels_0123").mkdir(parents=True)
    (cache.root / "numba" / "kernels_0123" / "kernel.nbi").write_bytes(b"\0")
    assert cache.clear() == 0 and not (cache.root / "numba").exists()


def test_a_new_entry_prunes_the_cache_to_the_limits_of_the_environment(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("TULLAX_CACHE_MAX_BYTES", "25K")
    cache = CompileCache(tmp_path / "cache")
    for key in ("k1", "k2", "k3"):
        _entry(cache, key, 10_000)
        cache._next_auto_prune = 0.0  # as in a process that last checked long ago
    assert sorted(e["key"] for e in cache.entries()) == ["k2", "k3"]


def test_the_limits_come_from_the_environment_or_the_command_line(monkeypatch):
    assert Limits.from_env() == Limits(2 * 2**30, 90 * DAY)
    monkeypatch.setenv("TULLAX_CACHE_MAX_BYTES", "1.5G")
    monkeypatch.setenv("TULLAX_CACHE_MAX_AGE_DAYS", "off")
    assert Limits.from_env() == Limits(int(1.5 * 2**30), None)
    assert Limits.from_env("500M", "7") == Limits(500 * 2**20, 7 * DAY)
    assert Limits.from_env("off", None).max_bytes is None and parse_size("2000") == 2000
    monkeypatch.setenv("TULLAX_CACHE_MAX_BYTES", "lots")
    with pytest.raises(TullaxError, match="TULLAX_CACHE_MAX_BYTES='lots' is not a size"):
        Limits.from_env()
    with pytest.raises(TullaxError, match="the limit 'soon' is not a number of days"):
        Limits.from_env("1G", "soon")


def test_clear_waits_for_an_entry_that_is_being_loaded(cache: CompileCache):
    import threading
    import time

    _entry(cache, "k1", 100)
    holding, released = threading.Event(), []

    def load():  # another process compiling or loading k1
        with cache.lock("k1"):
            holding.set()
            time.sleep(0.3)
            released.append(time.monotonic())

    loader = threading.Thread(target=load)
    loader.start()
    holding.wait(5)
    assert cache.clear() == 1
    cleared = time.monotonic()
    loader.join(5)
    assert released and cleared >= released[0] and not cache.entry_path("k1").exists()


HIT_PROCESS = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np, tullax
    k = tullax.einsum_kernel("y[i] := x[i,j]*w[j]", backend="c")
    x, w = jnp.ones((8, 5)), jnp.ones(5)
    jax.block_until_ready(jax.jit(lambda x, w: jax.grad(lambda x: k(x, w).sum())(x))(x, w))  # only under jit
    k(np.ones((8, 5)), np.ones(5))  # and eagerly
""")


def test_every_reused_entry_counts_one_hit_per_process(tmp_path: Path):
    """Issue 45: `cache stats` showed 13 hits across 105 entries after many processes. A module used only under
    jit ran no first host call, so it had no index record and its hits were dropped; a reused XLA FFI handler
    counted none. After three processes every entry has been reused by two."""
    env = {**os.environ, "TULLAX_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", HIT_PROCESS], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
    records = json.loads((tmp_path / "cache" / "index.json").read_text())["entries"]
    kernels = [key for key, record in records.items() if record.get("kind") != "ffi handler"]
    assert len(kernels) >= 3  # the eager forward, its speculative gradient module, the jit-only gradient module
    stored = {path.name for path in (tmp_path / "cache" / "entries").iterdir()
              if (path / "kernels.c").exists() or (path / "handler.so").exists()}
    assert stored == set(records)  # every module has its record
    assert {key: record["hits"] for key, record in records.items()} == dict.fromkeys(records, 2)


def test_a_reused_plan_counts_a_hit(cache: CompileCache, monkeypatch):
    from tullax.planner import store
    from tullax.runtime import cache as cache_module

    monkeypatch.setattr(cache_module, "get_cache", lambda: cache)
    cache.write_text("feed0001", store.PLAN_FILE, json.dumps({"choice": "loops"}))
    cache.record("feed0001", spec="y[i] := x[i]", backend="auto", kind="plan")
    assert store.load("feed0001") == {"choice": "loops"}
    cache.flush()
    assert cache.index.read()["feed0001"]["hits"] == 1
