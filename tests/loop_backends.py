"""The host loop backends a test runs on, as pytest params: ``numba`` always, ``c`` skipped with the reason when
no C compiler builds OpenMP shared libraries here."""
from __future__ import annotations

import functools

import pytest


@functools.cache
def c_unavailable() -> str:
    """Why the c backend cannot run here ("" when it can)."""
    from tullax.backends.c_compile import probe

    ok, why = probe()
    return "" if ok else why


def c_param() -> object:
    """``"c"`` as a pytest param, skipped with the reason where no C compiler works."""
    why = c_unavailable()
    return pytest.param("c", marks=pytest.mark.skipif(bool(why), reason=f"c backend: {why}"))
