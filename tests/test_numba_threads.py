"""The host's chunk runner (tullax.backends.numba_threads): even, contiguous, complete splits, and chunks that
really run on different threads."""
from __future__ import annotations

import threading

import pytest

from tullax.backends.numba_threads import run_chunks, split


@pytest.mark.parametrize("start, stop, parts", [(0, 10, 3), (5, 6, 4), (0, 0, 2), (3, 1, 2), (-4, 9, 2), (0, 7, 7)])
def test_split_covers_the_range_once_in_even_contiguous_parts(start, stop, parts):
    ranges = split(start, stop, parts)
    covered = [i for lo, hi in ranges for i in range(lo, hi)]
    assert covered == list(range(start, stop))
    assert all(hi > lo for lo, hi in ranges) and len(ranges) <= parts
    lengths = [hi - lo for lo, hi in ranges]
    assert not lengths or max(lengths) - min(lengths) <= 1


def test_chunks_run_on_different_threads_and_all_before_returning():
    seen: list[tuple[int, int, int]] = []
    lock = threading.Lock()
    started = threading.Barrier(3, timeout=10)  # all three chunks run at the same time, or this times out

    def chunk(tag, lo, hi):
        started.wait()
        with lock:
            seen.append((lo, hi, threading.get_ident()))
        assert tag == "t"

    run_chunks(chunk, ("t",), 0, 10, 3)
    assert sorted((lo, hi) for lo, hi, _ in seen) == [(0, 4), (4, 7), (7, 10)]
    assert len({ident for *_, ident in seen}) == 3
    assert threading.get_ident() in {ident for *_, ident in seen}  # the caller runs a chunk itself


def test_an_exception_in_a_chunk_reaches_the_caller():
    def chunk(lo, hi):
        if lo:
            raise ValueError(f"chunk {lo}")

    with pytest.raises(ValueError, match="chunk"):
        run_chunks(chunk, (), 0, 4, 2)
