"""Every way the host C compiler can fail is a tullax error on ``backend="c"`` and a fallback on ``auto`` (to
Numba, with the right results): a "compiler" that exits 0 and writes nothing, one that exits non-zero, one that
hangs (stopped after ``$TULLAX_CC_TIMEOUT`` seconds), and one that writes a library that does not load."""
from __future__ import annotations

import time

import numpy as np
import pytest

import tullax
from tullax.errors import BackendUnavailableError, TullaxError

# each a /bin/sh script standing in for the compiler; "$@" is what tullax passes (flags, -o OUT, sources)
FAKE_COMPILERS = {
    "writes-nothing": "exit 0\n",
    "exits-non-zero": "echo 'fakecc: internal compiler error' >&2\nexit 1\n",
    "hangs": "exec sleep 60\n",
    # writes text where the library should be: the compile "succeeds", dlopen fails
    "broken-library": 'while [ $# -gt 0 ]; do\n  if [ "$1" = "-o" ]; then echo "not a library" > "$2"; fi\n'
                      "  shift\ndone\nexit 0\n",
}
EXPECTED_WORDS = {"writes-nothing": "wrote no library", "exits-non-zero": "internal compiler error",
                  "hangs": "ran for more than", "broken-library": "does not load"}


@pytest.fixture(params=sorted(FAKE_COMPILERS))
def fake_compiler(request, tmp_path, monkeypatch) -> str:
    """A fake compiler set as ``$TULLAX_CC`` (with a one-second time limit), a fresh compile cache; its mode."""
    mode = request.param
    script = tmp_path / f"fakecc-{mode}"
    script.write_text("#!/bin/sh\n" + FAKE_COMPILERS[mode])
    script.chmod(0o755)
    monkeypatch.setenv("TULLAX_CC", str(script))
    monkeypatch.setenv("TULLAX_CC_TIMEOUT", "1")
    monkeypatch.setenv("TULLAX_CACHE_DIR", str(tmp_path / "cache"))
    return mode


def test_c_says_why_the_compiler_failed(fake_compiler):
    k = tullax.einsum_kernel(f"y_{fake_compiler.replace('-', '_')}[i] := x[i]*2 + 1", backend="c")
    with pytest.raises(BackendUnavailableError, match=EXPECTED_WORDS[fake_compiler]):
        k(np.arange(4.0))


def test_auto_falls_back_to_numba(fake_compiler):
    from tullax.planner.decide import loop_backend

    assert loop_backend(["float64"]) not in ("c", None)  # numba (or Julia, first where it is installed)
    # a spec of its own per mode, so no kernel built by an earlier test with a working compiler can serve it
    k = tullax.einsum_kernel(f"y_{fake_compiler.replace('-', '_')}[i] := exp(x[i]) * (x[i] > 1) + 3", backend="auto")
    x = np.linspace(-2.0, 2.0, 7)
    np.testing.assert_allclose(np.asarray(k(x)), np.exp(x) * (x > 1) + 3, rtol=1e-12)


def test_the_time_limit_is_a_setting(monkeypatch):
    from tullax.backends.c.compile import DEFAULT_TIMEOUT_S, TIMEOUT_ENV, timeout_s

    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    assert timeout_s() == DEFAULT_TIMEOUT_S
    monkeypatch.setenv(TIMEOUT_ENV, "2.5")
    assert timeout_s() == 2.5
    for invalid in ("soon", "0", "-1"):
        monkeypatch.setenv(TIMEOUT_ENV, invalid)
        with pytest.raises(TullaxError, match=TIMEOUT_ENV):
            timeout_s()


def test_a_hung_compiler_and_its_children_are_stopped(tmp_path, monkeypatch):
    """The time limit stops the compiler's whole process group: a driver that forked its cc1 leaves no orphan
    running after the error."""
    from tullax.backends.c.compile import compile_library
    from tullax.errors import TullaxError

    marker = tmp_path / "child.pid"
    script = tmp_path / "fakecc-forks"
    script.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {marker}\nwait\n")
    script.chmod(0o755)
    monkeypatch.setenv("TULLAX_CC", str(script))
    source = tmp_path / "x.c"
    source.write_text("int f(void) { return 1; }\n")
    with pytest.raises(TullaxError, match="ran for more than"):
        compile_library(source, tmp_path / "x.so", timeout=0.5)

    child = int(marker.read_text())
    for _ in range(250):  # the kill is sent with the error; the zombie is reaped by init shortly after
        try:
            with open(f"/proc/{child}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.02)
    else:
        pytest.fail("the compiler's child still runs after the time limit")
