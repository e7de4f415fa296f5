"""Where the compile cache lives (``TULLAX_CACHE_DIR``, else the platform's user cache directory), and whether it
holds any entry: asked before the cache itself (``tullax.runtime.cache``) is imported, so that a process whose
first calls find a new, empty cache imports nothing of it."""
from __future__ import annotations

import os
from pathlib import Path

from tullax import settings

CACHE_DIR_ENV = "TULLAX_CACHE_DIR"
ENTRIES = "entries"  # the directory of the entries under the root, one directory per key


def default_cache_dir() -> Path:
    """``TULLAX_CACHE_DIR`` when set, else the platform's user cache directory."""
    configured = settings.value(CACHE_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("tullax"))


def holds_entries() -> bool:
    """Whether the compile cache's directory holds any entry (a compiled module, a probe's answer); False for a
    new cache, or one that cannot be read."""
    try:
        with os.scandir(default_cache_dir() / ENTRIES) as found:
            return next(found, None) is not None
    except OSError:
        return False


__all__ = ["CACHE_DIR_ENV", "ENTRIES", "default_cache_dir", "holds_entries"]
