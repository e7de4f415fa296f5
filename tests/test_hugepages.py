"""Huge pages for large host-kernel outputs (tullax.runtime.hugepages): the kernel's mode is read right, small
buffers are left alone, the switch turns it off, and where the kernel allows it a large buffer's mapping is
really marked (``hg`` in /proc/self/smaps)."""
from __future__ import annotations

import numpy as np
import pytest

from tullax.runtime import hugepages


@pytest.fixture
def fresh_switch(monkeypatch):
    """``hugepages`` reads its switch once per process: read it again under this test's environment, and again
    after it."""
    hugepages._madvise.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    hugepages._madvise.cache_clear()


@pytest.mark.parametrize("text, mode", [("always [madvise] never\n", "madvise"), ("[always] madvise never", "always"),
                                        ("always madvise [never]\n", "never"), ("", "")])
def test_the_transparent_huge_page_mode_is_the_bracketed_word(tmp_path, text, mode):
    path = tmp_path / "enabled"
    path.write_text(text)
    assert hugepages.thp_mode(str(path)) == mode


def test_a_system_without_the_file_has_no_mode(tmp_path):
    assert hugepages.thp_mode(str(tmp_path / "missing")) == ""


def test_small_buffers_are_left_alone():
    assert not hugepages.advise(np.empty(hugepages.MIN_BYTES // 4 - 1, np.float32))
    assert not hugepages.advise(np.float32(1.0))


def test_the_switch_turns_it_off(fresh_switch):
    fresh_switch.setenv(hugepages.ENV, "0")
    assert not hugepages.enabled()
    assert not hugepages.advise(np.empty(2 * hugepages.MIN_BYTES, np.uint8))


def test_never_mode_turns_it_off(fresh_switch):
    fresh_switch.delenv(hugepages.ENV, raising=False)
    fresh_switch.setattr(hugepages, "thp_mode", lambda path=hugepages.THP_MODE_FILE: "never")
    assert not hugepages.enabled()


def _vm_flags(address: int) -> set[str]:
    """The VmFlags of the mapping of this process that holds ``address``."""
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as f:
        inside = False
        for line in f:
            head = line.split()[0] if line.split() else ""
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("VmFlags:"):
                return set(line.split()[1:])
    return set()


def test_a_large_buffer_is_marked_for_huge_pages_before_its_first_write(fresh_switch):
    fresh_switch.delenv(hugepages.ENV, raising=False)
    if not hugepages.enabled():
        pytest.skip(f"no transparent huge pages to advise here (mode {hugepages.thp_mode()!r})")
    buffer = np.empty(4 * hugepages.MIN_BYTES, np.uint8)
    start = buffer.__array_interface__["data"][0]
    inside = (start + hugepages.HUGE_PAGE - 1) & ~(hugepages.HUGE_PAGE - 1)
    assert hugepages.advise(buffer)
    assert "hg" in _vm_flags(inside)
    buffer.fill(1)  # the advice changes no value
    assert int(buffer.sum(dtype=np.int64)) == buffer.size
