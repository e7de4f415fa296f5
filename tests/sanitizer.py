"""Running the c backend under gcc's AddressSanitizer, in a child process: the environment, and whether it works
here.

The child preloads ``libasan`` and compiles every C module with ``-fsanitize=address`` (``TULLAX_CFLAGS``, part
of the compile-cache key, so no uninstrumented library is loaded). Every NumPy array and every buffer XLA
allocates comes from the intercepted ``malloc`` with poisoned bytes on both sides: a generated kernel that
reads or writes one element outside an array stops the child with a ``heap-buffer-overflow`` report.
``libstdc++`` is preloaded too: jaxlib throws (and catches) C++ exceptions while it starts, and ASan's
``__cxa_throw`` interceptor needs the real one loaded before it (else "CHECK failed: real___cxa_throw").
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ASAN_CFLAGS = "-fsanitize=address -fno-omit-frame-pointer"
OVERFLOW = "AddressSanitizer: heap-buffer-overflow"

_CONTROL_C = "double tx_read(const double* a, long n) { return a[n]; }\n"
_CONTROL_PY = """
import ctypes, sys
import numpy as np
lib = ctypes.CDLL(sys.argv[1])
lib.tx_read.restype = ctypes.c_double
a = np.ones(10)
lib.tx_read(a.ctypes.data_as(ctypes.c_void_p), ctypes.c_long(9))  # the last element: fine
print("READY", flush=True)
lib.tx_read(a.ctypes.data_as(ctypes.c_void_p), ctypes.c_long(10))  # one past the end: the report
"""


def _gcc_file(name: str) -> str | None:
    try:
        found = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return None
    return found if os.path.isabs(found) and os.path.exists(found) else None


def asan_env(cache_dir: Path | str) -> dict[str, str]:
    """The child's environment: the sanitizer preloaded, the modules instrumented, a cache of their own."""
    preload = " ".join(p for p in (_gcc_file("libasan.so"), _gcc_file("libstdc++.so.6")) if p)
    return dict(os.environ, LD_PRELOAD=preload, ASAN_OPTIONS="detect_leaks=0", TULLAX_CFLAGS=ASAN_CFLAGS,
                TULLAX_CACHE_DIR=str(cache_dir))


@functools.cache
def asan_unavailable() -> str:
    """Why the sanitizer cannot run here ("" when it can): it must build, start under Python, and catch the
    control, a read one element past a NumPy array."""
    if _gcc_file("libasan.so") is None:
        return "gcc's libasan is not installed"
    with tempfile.TemporaryDirectory(prefix="tullax-asan-") as tmp:
        source, library = Path(tmp, "control.c"), Path(tmp, "control.so")
        source.write_text(_CONTROL_C)
        built = subprocess.run(["gcc", "-O1", "-shared", "-fPIC", *ASAN_CFLAGS.split(), str(source), "-o",
                                str(library)], capture_output=True, text=True)
        if built.returncode != 0:
            return f"gcc cannot build with -fsanitize=address: {built.stderr.strip()[:200]}"
        ran = subprocess.run([sys.executable, "-c", _CONTROL_PY, str(library)], capture_output=True, text=True,
                             env=asan_env(Path(tmp, "cache")), timeout=120)
    if "READY" not in ran.stdout:
        return f"Python does not start under AddressSanitizer here: {ran.stderr.strip()[-300:]}"
    if OVERFLOW not in ran.stderr:  # it started, so it must have caught the control
        raise AssertionError(f"AddressSanitizer missed a read past a NumPy array:\n{ran.stderr[-2000:]}")
    return ""
