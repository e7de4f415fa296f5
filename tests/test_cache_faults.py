"""Fault injection for the compile cache: kills at every write step, damaged files of every kind (Numba's
artefacts, the generated module, its bytecode, manifests, the index), concurrent clear/prune/load, a full disk,
layout faults, and a cache moved to another path. After each fault the kernel still computes the right result,
with a warning where something had to be discarded, and the next load is clean (the fault does not outlive its
cause).

Kernels are small and compiled once per module (``populated``); each test works on a copy of that cache, and
"a new process" is simulated in-process by building the kernel's module afresh (``fresh_kernel``: generated,
looked up, imported and loaded or compiled, as in a new process). Subprocesses run only where a kill or a
second process is the point.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")

from tullax.backends import host  # noqa: E402
from tullax.backends.base import Signature  # noqa: E402
from tullax.backends.numba import backend as numba_backend  # noqa: E402
from tullax.runtime.cache import CacheWarning, CompileCache, get_cache  # noqa: E402
from tullax.spec.analyze import analyze  # noqa: E402
from tullax.spec.parse import parse_spec  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SPEC = "h[ix[i]] += x[i]"  # a serial scatter: the quickest kernel Numba compiles here (about 0.5 s)
OTHER = "h[ix[i]] += 2 * x[i]"  # the same function names and lines: its artefact files fit SPEC's entry
SIGNATURE = Signature(("float64", "float64", "int64"), "float64")
X, IX = np.arange(1.0, 6.0), np.array([0, 1, 1, 3, 3])
EXPECTED = {SPEC: np.array([1.0, 5.0, 0.0, 9.0]), OTHER: np.array([2.0, 10.0, 0.0, 18.0])}


def fresh_kernel(text: str):
    """The kernel as a new process gets it: generated, looked up in the cache, imported, and (at its first
    call) loaded from Numba's artefacts or compiled. Not from this process's table of built kernels."""
    return host.build_module(numba_backend._RECIPE, analyze(parse_spec(text)), SIGNATURE)


def run(text: str) -> np.ndarray:
    """One new process's first call of the kernel, to its exit: the index updates it deferred are written."""
    h = np.zeros(4)
    out = h.copy()
    fresh_kernel(text)(out, h, X, IX)
    get_cache().flush()
    return out


def entry_of(cache: CompileCache, text: str) -> Path:
    key = host.module_key(analyze(parse_spec(text)), SIGNATURE, numba_backend.NAME, numba_backend.OPTIONS)
    return cache.entry_path(key)


def artefact(cache: CompileCache, text: str, suffix: str) -> Path:
    (path,) = entry_of(cache, text).glob(f"*{suffix}")
    return path


@contextlib.contextmanager
def counted():
    """Yields a dict that holds, after the block, how many kernels it compiled and loaded."""
    before = numba_backend.compile_stats()
    counts: dict[str, int] = {}
    yield counts
    after = numba_backend.compile_stats()
    counts.update(compiled=after["compiled"] - before["compiled"], loaded=after["loaded"] - before["loaded"])


@contextlib.contextmanager
def cache_warnings():
    """Yields the list of CacheWarning messages raised in the block."""
    messages: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield messages
    messages += [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]


def assert_loads_cleanly(text: str) -> None:
    """The next process: loads the kernel without compiling and without a warning."""
    with cache_warnings() as messages, counted() as counts:
        np.testing.assert_array_equal(run(text), EXPECTED[text])
    assert messages == [] and counts == {"compiled": 0, "loaded": 1}


@pytest.fixture(scope="module")
def populated(tmp_path_factory) -> Path:
    """A cache holding both kernels, compiled once for the module."""
    root = tmp_path_factory.mktemp("populated") / "cache"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TULLAX_CACHE_DIR", str(root))
        for text in (SPEC, OTHER):
            np.testing.assert_array_equal(run(text), EXPECTED[text])
    return root


@pytest.fixture
def cache(populated: Path, tmp_path: Path, monkeypatch) -> CompileCache:
    """A copy of ``populated`` as this test's cache."""
    root = tmp_path / "cache"
    shutil.copytree(populated, root)
    monkeypatch.setenv("TULLAX_CACHE_DIR", str(root))
    return get_cache()


def _env(root: Path) -> dict[str, str]:
    return {**os.environ, "TULLAX_CACHE_DIR": str(root), "PYTHONPATH": str(REPO)}


# ------------------------------------------------------------------------------------- a moved cache


@pytest.mark.parametrize("how", ["copied", "moved"])
def test_a_copied_or_moved_cache_loads_every_kernel_without_compiling(populated, tmp_path, monkeypatch, how):
    copy = tmp_path / "copy"
    shutil.copytree(populated, copy)
    root = copy.rename(tmp_path / "moved") if how == "moved" else copy
    monkeypatch.setenv("TULLAX_CACHE_DIR", str(root))
    for text in (SPEC, OTHER):
        assert_loads_cleanly(text)


# ----------------------------------------------------------------------------- damaged Numba artefacts

DAMAGES = {
    "truncated": lambda data, other: data[: len(data) // 2],
    "garbage": lambda data, other: bytes(range(256)) * (len(data) // 256 + 1),
    "empty": lambda data, other: b"",
    "swapped": lambda data, other: other,  # the same file of another entry: valid, but another spec's code
}


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("suffix", [".nbi", ".nbc"])
def test_a_damaged_numba_artefact_is_discarded_recompiled_and_warned_about_once(cache, suffix, damage):
    target, donor = artefact(cache, SPEC, suffix), artefact(cache, OTHER, suffix)
    assert target.name == donor.name
    target.write_bytes(DAMAGES[damage](target.read_bytes(), donor.read_bytes()))
    with cache_warnings() as messages, counted() as counts:
        np.testing.assert_array_equal(run(SPEC), EXPECTED[SPEC])
    assert len(messages) == 1 and "discarded" in messages[0] and target.name in messages[0], messages
    assert counts == {"compiled": 1, "loaded": 0}
    assert_loads_cleanly(SPEC)


def test_a_checked_artefact_that_numba_cannot_load_is_discarded(cache):
    """Damage the checksums cannot see (a manifest rewritten to match): loading fails, and is caught."""
    target = artefact(cache, SPEC, ".nbc")
    key = target.parent.name
    cache.write_bytes(key, target.name, b"\x80\x04 not a pickle")
    with cache_warnings() as messages, counted() as counts:
        np.testing.assert_array_equal(run(SPEC), EXPECTED[SPEC])
    assert len(messages) == 1 and "cannot be loaded" in messages[0] and counts["compiled"] == 1
    assert_loads_cleanly(SPEC)


def _truncate_keeping_header(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: 16 + (len(data) - 16) // 2])  # the header (magic, flags, source hash) still matches


OTHER_FILES = {
    # file -> (damage, what the warning says, whether the kernel compiles again)
    "kernels.py": (lambda p: p.write_text(p.read_text().replace("+=", "-=")), "does not match", True),
    "manifest.json": (lambda p: p.write_bytes(p.read_bytes()[:40]), "does not parse", True),
    "bytecode": (_truncate_keeping_header, "bytecode .* was damaged", False),
    "index.json": (lambda p: p.write_text('{"format": 1, "entr'), "index .* is corrupt", False),
}


@pytest.mark.parametrize("name", OTHER_FILES)
def test_every_other_damaged_file_is_detected_and_rebuilt(cache, name):
    import re

    damage, warning, compiles = OTHER_FILES[name]
    entry = entry_of(cache, SPEC)
    if name == "bytecode":
        (path,) = entry.glob("__pycache__/kernels.*.pyc")
    else:
        path = cache.index_path if name == "index.json" else entry / name
    damage(path)
    with cache_warnings() as messages, counted() as counts:
        np.testing.assert_array_equal(run(SPEC), EXPECTED[SPEC])
    assert len(messages) == 1 and re.search(warning, messages[0]), messages
    assert counts == ({"compiled": 1, "loaded": 0} if compiles else {"compiled": 0, "loaded": 1})
    assert_loads_cleanly(SPEC)


# ---------------------------------------------------------------------------------------- layout faults


def test_layout_faults_are_repaired_with_a_warning_each(cache):
    cache.index_path.unlink()
    cache.index_path.mkdir()
    spec_entry, other_entry = entry_of(cache, SPEC), entry_of(cache, OTHER)
    lock = cache.locks.path(f"key-{spec_entry.name}")
    lock.unlink()
    lock.mkdir()
    shutil.rmtree(other_entry)
    other_entry.write_text("a file where an entry belongs")
    with cache_warnings() as messages, counted() as counts:
        for text in (SPEC, OTHER):
            np.testing.assert_array_equal(run(text), EXPECTED[text])
    assert counts == {"compiled": 1, "loaded": 1}  # OTHER's entry was lost: compiled again
    assert len(messages) == 3, messages
    for fragment in ("index.json is not a file", f"key-{spec_entry.name}.lock was a directory",
                     f"{other_entry.name} was a file"):
        assert any(fragment in message for message in messages), (fragment, messages)
    for text in (SPEC, OTHER):
        assert_loads_cleanly(text)


# -------------------------------------------------------------------------------------------- full disk


def _disk_full(path, data):
    raise OSError(errno.ENOSPC, "No space left on device", str(path))


def test_a_full_disk_runs_kernels_from_memory_with_one_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("TULLAX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("tullax.runtime.cache.atomic_write", _disk_full)
    with cache_warnings() as messages, counted() as counts:
        np.testing.assert_array_equal(run(SPEC), EXPECTED[SPEC])
        np.testing.assert_array_equal(run(OTHER), EXPECTED[OTHER])
    assert len(messages) == 1 and "No space left on device" in messages[0]
    assert counts == {"compiled": 2, "loaded": 0}
    assert [p for p in (tmp_path / "cache" / "entries").rglob("*") if p.is_file()] == []


FILLS_WHILE_NUMBA_STORES = textwrap.dedent(
    """
    import errno, json, sys, warnings
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    from test_cache_faults import EXPECTED, SPEC, entry_of, run
    from tullax.runtime import cache as cache_module, cache_files
    from tullax.runtime.cache import CacheWarning, get_cache

    def full_for_artefacts(path, data):
        if path.suffix in (".nbi", ".nbc"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        cache_files.atomic_write(path, data)

    cache_module.atomic_write = full_for_artefacts
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run(SPEC)
    entry = entry_of(get_cache(), SPEC)
    print(json.dumps({"right": bool(np.array_equal(out, EXPECTED[SPEC])),
                      "messages": [str(w.message) for w in caught if issubclass(w.category, CacheWarning)],
                      "module": (entry / "kernels.py").is_file(), "artefacts": len(list(entry.glob("*.nb[ic]")))}))
    """
)


def test_a_disk_that_fills_up_while_numba_stores_its_code_keeps_the_code_in_memory(tmp_path):
    """In a process of its own: it is that process's first compile of the kernel that meets the full disk (in the
    suite's shared worker, what earlier tests left in the process could spare the store, and the warning)."""
    done = subprocess.run([sys.executable, "-c", FILLS_WHILE_NUMBA_STORES, str(REPO / "tests")],
                          env=_env(tmp_path / "cache"), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["right"]
    assert len(found["messages"]) == 1 and "No space left on device" in found["messages"][0], found
    assert found["module"] and found["artefacts"] == 0, found


# ------------------------------------------------------------------------------- kills at every write step

KILLED_WRITER = textwrap.dedent(
    """
    import json, os, signal, sys
    from tullax.runtime.cache import CompileCache

    def write_everything(root, kill_at):  # what a cold build writes, then a second signature, then a hit
        steps = 0

        def step():  # a kill point: every fsync, and before and after every rename
            nonlocal steps
            if steps == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            steps += 1

        real_replace = os.replace
        def replace(source, target):
            step()
            real_replace(source, target)
            step()
        os.fsync = lambda fd: step()  # a kill loses nothing the page cache holds: no need to wait for the disk
        os.replace = replace
        cache = CompileCache(root, lock_timeout=30)
        with cache.lock("k1"):
            cache.write_text("k1", "kernels.py", "def kernel():\\n    pass\\n")
            cache.write_bytes("k1", "kernels.kernel-9.py311.nbi", b"index" * 50)
            cache.write_bytes("k1", "kernels.kernel-9.py311.1.nbc", b"code" * 500)
        cache.record("k1", spec="y[i] := x[i]", backend="numba", compile_ms=1.0)
        cache.write_bytes("k1", "kernels.kernel-9.py311.nbi", b"index, two overloads" * 50)
        cache.hit("k1")
        return steps

    base = sys.argv[1]
    steps = write_everything(os.path.join(base, "dry"), -1)
    statuses = {}
    for kill_at in range(steps):  # one child per kill point, forked: this process imported everything once
        child = os.fork()
        if child == 0:
            write_everything(os.path.join(base, str(kill_at)), kill_at)
            os._exit(0)
        statuses[kill_at] = os.waitpid(child, 0)[1]
    print(json.dumps({"steps": steps, "killed": sum(os.WIFSIGNALED(s) for s in statuses.values())}))
    """
)
WRITTEN = {"kernels.py": b"def kernel():\n    pass\n", "kernels.kernel-9.py311.nbi": b"index, two overloads" * 50,
           "kernels.kernel-9.py311.1.nbc": b"code" * 500}
EARLIER = {"kernels.kernel-9.py311.nbi": b"index" * 50}  # what a file may hold when killed between its writes


def _write_all(cache: CompileCache) -> None:
    with cache.lock("k1"):
        for name, data in WRITTEN.items():
            if cache.read_checked("k1", name).data != data:
                cache.write_bytes("k1", name, data)
    cache.record("k1", spec="y[i] := x[i]", backend="numba", compile_ms=1.0)


def test_a_kill_at_any_write_step_leaves_a_cache_that_reads_consistently_and_heals(tmp_path, monkeypatch):
    done = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], env=_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    steps = report["steps"]
    assert steps >= 30 and report["killed"] == steps  # every write: fsyncs, renames (before and after each)
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # durability is not what is checked here
    for kill_at in range(steps):
        root = tmp_path / str(kill_at)
        with cache_warnings():  # damage a kill leaves may be reported (and repaired) here
            cache = CompileCache(root, lock_timeout=5)
            for name, data in WRITTEN.items():
                found, problem = cache.read_checked("k1", name)
                assert found in (None, data, EARLIER.get(name)), (kill_at, name)  # never half a file
                assert (found is None) or problem is None
            cache.entries()
            _write_all(cache)  # the next process rewrites whatever is missing or unverifiable
        with cache_warnings() as messages:  # and then everything is whole, silently
            assert {name: cache.read_checked("k1", name).data for name in WRITTEN} == WRITTEN
            [record] = cache.entries()
            assert record["key"] == "k1" and record["compile_ms"] == 1.0
        assert messages == [], (kill_at, messages)
        assert cache.clear() == 1
        assert list(cache.locks.directory.iterdir()) == [] and not list((root / "entries").iterdir())
        assert sorted(p.name for p in root.iterdir()) == ["entries", "index.json", "locks"], kill_at


KILLED_COMPILE = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    real_replace = os.replace
    def replace(source, target):  # killed right after Numba's index or data file is renamed into place
        real_replace(source, target)
        if str(target).endswith(sys.argv[1]):
            os.kill(os.getpid(), signal.SIGKILL)
    os.replace = replace
    import tullax
    h = np.zeros(4)
    tullax.Kernel(sys.argv[2], backend="numba")(h, np.arange(1.0, 6.0), np.array([0, 1, 1, 3, 3]))
    """
)


def test_a_kill_while_numba_stores_its_code_heals_in_the_next_process(tmp_path, monkeypatch):
    suffixes = (".nbi", ".nbc")
    killed = {suffix: subprocess.Popen([sys.executable, "-c", KILLED_COMPILE, suffix, SPEC],
                                       env=_env(tmp_path / suffix), stderr=subprocess.PIPE, text=True)
              for suffix in suffixes}
    for suffix, process in killed.items():
        process.communicate(timeout=120)
        assert process.returncode == -9, suffix
        monkeypatch.setenv("TULLAX_CACHE_DIR", str(tmp_path / suffix))
        with cache_warnings() as messages, counted() as counts:
            np.testing.assert_array_equal(run(SPEC), EXPECTED[SPEC])
        assert counts == {"compiled": 1, "loaded": 0}
        assert len(messages) <= 1 and all("discarded" in message for message in messages), messages
        assert_loads_cleanly(SPEC)


# ----------------------------------------------------------------------- concurrent clear, prune and load

LOADER = textwrap.dedent(
    """
    import sys, warnings
    import numpy as np
    warnings.simplefilter("error")  # no warning either: clearing is not damage
    sys.path.insert(0, sys.argv[1])
    from test_cache_faults import EXPECTED, SPEC, run
    for _ in range(int(sys.argv[2])):  # each round: a new process starting the kernel
        np.testing.assert_array_equal(run(SPEC), EXPECTED[SPEC])
    print("ok")
    """
)
CLEARER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tullax.cli import main
    stop = Path(sys.argv[1])
    rounds = 0
    while not stop.exists():
        assert main(["cache", "clear"]) == 0
        assert main(["cache", "prune", "--max-bytes", "0"]) == 0
        rounds += 1
        time.sleep(0.01)
    print(rounds)  # the last line
    """
)


def test_clearing_and_pruning_while_processes_start_kernels_never_breaks_them(populated, tmp_path):
    root = tmp_path / "cache"
    shutil.copytree(populated, root)
    stop = tmp_path / "stop"
    clearer = subprocess.Popen([sys.executable, "-c", CLEARER, str(stop)], env=_env(root),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    loaders = [subprocess.Popen([sys.executable, "-c", LOADER, str(REPO / "tests"), "4"], env=_env(root),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(*loader.communicate(timeout=300), loader.returncode) for loader in loaders]
    stop.touch()
    cleared, clear_errors = clearer.communicate(timeout=60)
    assert clearer.returncode == 0, clear_errors
    assert all(rc == 0 and out.split() == ["ok"] for out, _, rc in results), [err[-3000:] for _, err, _ in results]
    assert int(cleared.split()[-1]) >= 2  # the clearing really overlapped the loads


def test_index_records_survive_a_kill_of_a_process_holding_the_index_lock(tmp_path):
    """A killed holder's lock is released by the OS: the next process neither waits forever nor loses data."""
    root = tmp_path / "cache"
    cache = CompileCache(root, lock_timeout=10)
    cache.write_text("k1", "kernels.py", "pass\n")
    cache.record("k1", spec="y[i] := x[i]", backend="numba")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom tullax.runtime.cache import CompileCache\n"
         "c = CompileCache(sys.argv[1])\nwith c.locks.hold('index', 'index'):\n    print('held', flush=True)\n"
         "    time.sleep(60)\n", str(root)], env=_env(root), stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait(10)
    start = time.monotonic()
    cache.hit("k1")
    assert time.monotonic() - start < 5 and cache.entries()[0]["hits"] == 1
    assert json.loads(cache.index_path.read_text())["entries"]["k1"]["hits"] == 1


# ------------------------------------------------------------------------------------- bounded memory

HELPED = "h[ix[i]] += 3 * x[i]"  # compiled by no other test
EXPECTED[HELPED] = np.array([3.0, 15.0, 0.0, 27.0])


def test_past_its_share_of_compiles_a_process_has_the_helper_compile_into_the_cache(tmp_path, monkeypatch):
    """The helper process compiles the kernel into its cache entry, this process loads it from there (a
    compile leaves ~4 MiB in the compiling process for good; a load ~0.3 MiB): the result and the cache are
    as if it had compiled the kernel itself."""
    monkeypatch.setenv("TULLAX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TULLAX_NUMBA_INPROCESS_COMPILES", "0")
    monkeypatch.setattr("tullax.backends.numba.helper.HELPER_COMPILES", 1)
    helped_before = numba_backend._HELPER.helper_compiles
    with cache_warnings() as messages, counted() as counts:
        np.testing.assert_array_equal(run(HELPED), EXPECTED[HELPED])
    assert messages == [] and counts == {"compiled": 1, "loaded": 0}
    assert numba_backend._HELPER.helper_compiles == helped_before + 1
    assert numba_backend._HELPER._process is None  # it had done its HELPER_COMPILES: replaced at the next
    [record] = get_cache().entries()
    assert record["compile_ms"] > 0 and record["ttfk_cold_ms"] > 0
    entry = entry_of(get_cache(), HELPED)
    assert list(entry.glob("*.nbi")) and list(entry.glob("*.nbc"))
    assert_loads_cleanly(HELPED)


def test_a_helper_that_cannot_start_leaves_the_compile_to_the_process(tmp_path, monkeypatch):
    def cannot_start(*args, **kwargs):
        raise OSError(errno.ENOENT, "No such file or directory", sys.executable)

    numba_backend._HELPER.stop()  # a helper another test started
    monkeypatch.setenv("TULLAX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TULLAX_NUMBA_INPROCESS_COMPILES", "0")
    monkeypatch.setattr("tullax.backends.numba.helper.subprocess.Popen", cannot_start)
    monkeypatch.setattr(numba_backend._HELPER, "_unusable", False)  # restored afterwards, for other tests
    with cache_warnings() as messages, counted() as counts:
        np.testing.assert_array_equal(run(HELPED), EXPECTED[HELPED])
    assert messages == [] and counts == {"compiled": 1, "loaded": 0}
    assert not numba_backend._HELPER.wanted()  # one that cannot start is not tried again by this process
    assert_loads_cleanly(HELPED)


def test_the_share_of_in_process_compiles_is_a_setting(monkeypatch):
    from tullax.backends.numba.helper import DEFAULT_INPROCESS_COMPILES, inprocess_compiles
    from tullax.errors import TullaxError

    assert inprocess_compiles() == DEFAULT_INPROCESS_COMPILES
    monkeypatch.setenv("TULLAX_NUMBA_INPROCESS_COMPILES", "off")
    assert inprocess_compiles() is None
    monkeypatch.setenv("TULLAX_NUMBA_INPROCESS_COMPILES", "many")
    with pytest.raises(TullaxError, match="TULLAX_NUMBA_INPROCESS_COMPILES='many' is not a number"):
        inprocess_compiles()
