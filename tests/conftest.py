"""Shared test setup: a private compile cache, and the `julia` marker that needs a real Julia."""

from __future__ import annotations

import atexit
import functools
import importlib.util
import os
import shutil
import tempfile

import pytest

# Before anything imports the cache: tests must never touch the user's cache directory. `make test` sets a
# directory under the repository (shared by the xdist workers, which inherit this environment).
if not os.environ.get("TULLAX_CACHE_DIR"):
    _session_cache = tempfile.mkdtemp(prefix="tullax-test-cache-")
    os.environ["TULLAX_CACHE_DIR"] = _session_cache
    atexit.register(shutil.rmtree, _session_cache, ignore_errors=True)

NO_JULIA = "no Julia found (layer 4 of the Julia verification needs a real julia)"


@functools.cache
def _julia_found() -> bool:
    # Never import juliacall here: without a Julia it tries to download one.
    if importlib.util.find_spec("tullax.backends.julia_detect") is None:
        return False
    from tullax.backends.julia_detect import find_julia

    return bool(find_julia())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    julia_items = [item for item in items if item.get_closest_marker("julia")]
    if julia_items and not _julia_found():
        for item in julia_items:
            item.add_marker(pytest.mark.skip(reason=NO_JULIA))
