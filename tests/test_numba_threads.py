"""The host's chunk runner (tullax.backends.numba.threads): even, contiguous, complete splits, and chunks that
really run on different threads, each once."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tullax.backends.numba.threads import CHUNKS_PER_THREAD, run_chunks, split


@pytest.mark.parametrize("start, stop, parts", [(0, 10, 3), (5, 6, 4), (0, 0, 2), (3, 1, 2), (-4, 9, 2), (0, 7, 7)])
def test_split_covers_the_range_once_in_even_contiguous_parts(start, stop, parts):
    ranges = split(start, stop, parts)
    covered = [i for lo, hi in ranges for i in range(lo, hi)]
    assert covered == list(range(start, stop))
    assert all(hi > lo for lo, hi in ranges) and len(ranges) <= parts
    lengths = [hi - lo for lo, hi in ranges]
    assert not lengths or max(lengths) - min(lengths) <= 1


def test_chunks_run_once_each_on_several_threads_and_all_before_returning():
    seen: list[tuple[int, int, int]] = []
    lock = threading.Lock()
    caller = threading.get_ident()
    helped, ran_in_caller = threading.Event(), threading.Event()

    def chunk(tag, lo, hi):  # each side waits (in its first chunk) until the other side runs one too
        assert tag == "t"
        with lock:
            seen.append((lo, hi, threading.get_ident()))
        mine, other = (ran_in_caller, helped) if threading.get_ident() == caller else (helped, ran_in_caller)
        mine.set()
        assert other.wait(10)

    run_chunks(chunk, ("t",), 0, 100, 3)
    assert sorted((lo, hi) for lo, hi, _ in seen) == split(0, 100, 3 * CHUNKS_PER_THREAD)
    assert len({ident for *_, ident in seen}) >= 2 and caller in {ident for *_, ident in seen}


def test_one_thread_runs_every_chunk_in_the_caller():
    seen = []
    run_chunks(lambda lo, hi: seen.append((lo, hi, threading.get_ident())), (), 0, 10, 1)
    assert [(lo, hi) for lo, hi, _ in seen] == split(0, 10, CHUNKS_PER_THREAD)
    assert {ident for *_, ident in seen} == {threading.get_ident()}


def test_an_exception_in_a_chunk_reaches_the_caller():
    def chunk(lo, hi):
        if lo:
            raise ValueError(f"chunk {lo}")

    with pytest.raises(ValueError, match="chunk"):
        run_chunks(chunk, (), 0, 4, 2)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_runs_chunks_on_threads_of_its_own():
    """A child forked after the parent ran chunks inherits the pool without its threads: it must start its own
    (before, work submitted in the child never ran and the call hung)."""
    run_chunks(lambda lo, hi: None, (), 0, 8, 2)  # the parent's pool exists
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only when every chunk ran
        seen = []
        run_chunks(lambda lo, hi: seen.append((lo, hi)), (), 0, 8, 2)
        os._exit(0 if sorted(seen) == split(0, 8, 2 * CHUNKS_PER_THREAD) else 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("the forked child's chunks never ran")
