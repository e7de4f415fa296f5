"""Transparent huge pages for the large output buffers of host kernels.

XLA hands a host kernel a fresh output buffer on every call, and a buffer of many megabytes comes straight from
the kernel (``mmap``): each of its 4 KiB pages faults on first touch, and the kernel clears it. On Linux with
transparent huge pages in ``madvise`` mode (the usual default), ``madvise(MADV_HUGEPAGE)`` on the buffer before
the first write turns 512 of those faults into one, on a 2 MiB page (``benchmarks/hugepages.py`` measures it).
The advice changes no value and nothing else about the memory, so it is given whatever the buffer's history
(a reused buffer whose pages are already there only has its mapping marked).

``TULLAX_HUGE_PAGES=0`` turns it off.
"""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable

from tullax import settings

HUGE_PAGE = 1 << 21
# Smaller buffers are left alone: below a few huge pages, the aligned part that can be advised is a small share
# of the buffer and the system call costs about as much as the faults it saves.
MIN_BYTES = 4 * HUGE_PAGE
ENV = "TULLAX_HUGE_PAGES"
THP_MODE_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"


def thp_mode(path: str = THP_MODE_FILE) -> str:
    """The kernel's transparent huge page mode (``always``, ``madvise`` or ``never``); '' where it has none."""
    try:
        with open(path, encoding="ascii") as f:
            text = f.read()
    except OSError:
        return ""
    chosen = [word.strip("[]") for word in text.split() if word.startswith("[")]
    return chosen[0] if chosen else ""


def enabled() -> bool:
    """Whether large output buffers are given huge pages here: Linux, transparent huge pages not ``never`` and
    ``TULLAX_HUGE_PAGES`` not turning it off."""
    return _madvise() is not None


@functools.cache
def _madvise() -> Callable[[int, int], int] | None:
    if not settings.value(ENV):
        return None
    if not sys.platform.startswith("linux") or thp_mode() not in ("always", "madvise"):
        return None
    import ctypes
    import mmap

    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.madvise
    except (OSError, AttributeError):
        return None
    if advice is None:
        return None
    call.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    call.restype = ctypes.c_int

    def madvise(start: int, length: int) -> int:
        return call(start, length, advice)

    return madvise


def advise(array: Any) -> bool:
    """Ask for huge pages under the whole 2 MiB pages inside ``array``'s memory (a NumPy array, before the
    kernel writes it); True when the advice was given. Small arrays are left alone (``MIN_BYTES``), and a
    refusal by the kernel changes nothing: the pages are then ordinary ones."""
    madvise = _madvise()
    nbytes = int(getattr(array, "nbytes", 0))
    if madvise is None or nbytes < MIN_BYTES:
        return False
    start = int(array.__array_interface__["data"][0])
    lo = (start + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
    hi = (start + nbytes) & ~(HUGE_PAGE - 1)
    return hi > lo and madvise(lo, hi - lo) == 0


__all__ = ["advise", "enabled", "thp_mode", "HUGE_PAGE", "MIN_BYTES", "ENV"]
