"""A forked child runs the kernels its parent called, and new ones, eagerly on NumPy arrays, on c, numba and auto.

libgomp's team threads do not survive a fork: a child whose parent ran an OpenMP team waited for ever in its
first parallel region (c), and Numba's 'omp' threading layer terminated it; a steps module still compiling in a
parent's thread at the fork left the child waiting for it. The parent here runs every kernel in teams (the serial
threshold off, two threads), eagerly and under jit, forks right after a fresh spec's first call (its steps module
compiling), and the child calls them all and builds a new spec, within a deadline: a child that hangs is killed
and the test fails, never hangs. (A child's jit calls are out of scope: jax itself is not fork-safe.)
"""
from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

from tests.loop_backends import c_param

SCRIPT = r'''
import multiprocessing, sys, warnings
import numpy as np
import jax, jax.numpy as jnp
import tullax

warnings.filterwarnings("ignore", message=".*fork.*")  # jax's warning that it is not fork-safe
backend, child_s, salt = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
x = rng.standard_normal((64, 48))
w = rng.standard_normal(48)
specs = {  # each with its NumPy value on (x, w)
    "y[i] := x[i,j] * w[j]": lambda x, w: x @ w,  # a parallel loop
    "s := x[i,j] * x[i,j]": lambda x, w: np.sum(x * x),  # a parallel reduction (Numba's prange)
}
kernels = {spec: tullax.einsum_kernel(spec, backend=backend) for spec in specs}
for spec, kernel in kernels.items():  # eagerly
    np.testing.assert_allclose(kernel(x, w) if "w[j]" in spec else kernel(x), specs[spec](x, w), rtol=1e-10)
jitted = jax.jit(kernels["y[i] := x[i,j] * w[j]"])(jnp.asarray(x, jnp.float32), jnp.asarray(w, jnp.float32))
np.testing.assert_allclose(np.asarray(jitted), x @ w, rtol=1e-3, atol=1e-3)  # and under jit
# a spec no cache holds (salted), first called just before the fork: its gradient steps compile in a thread
# (for c, slowly: the test's compiler waits on them)
fresh = tullax.einsum_kernel(f"z[i] := exp(x[i,j]) * w[j] + {salt}", backend=backend)
np.testing.assert_allclose(fresh(x, w), (np.exp(x) * w + salt).sum(1), rtol=1e-10)
try:
    from tullax.runtime import forks
    print("started before the fork:", sorted(forks._STARTED), flush=True)
except ImportError:  # a tullax without it: the child still has to run
    print("started before the fork: (unknown)", flush=True)


def child() -> None:  # a multiprocessing worker: it ends by joining its threads (a steps module's compile too)
    for spec, kernel in kernels.items():
        got = kernel(x, w) if "w[j]" in spec else kernel(x)
        np.testing.assert_allclose(got, specs[spec](x, w), rtol=1e-10)
    np.testing.assert_allclose(fresh(x, w), (np.exp(x) * w + salt).sum(1), rtol=1e-10)
    new = tullax.einsum_kernel(f"v[i] := x[i,j]^2 * w[j] - {salt}", backend=backend)  # compiled in the child
    np.testing.assert_allclose(new(x, w), (x ** 2 * w - salt).sum(1), rtol=1e-10)

    def grandchild_work() -> None:  # and a fork of the child
        np.testing.assert_allclose(new(x, w), (x ** 2 * w - salt).sum(1), rtol=1e-10)

    grandchild = fork.Process(target=grandchild_work)
    grandchild.start()
    grandchild.join(child_s)
    assert grandchild.exitcode == 0, f"the grandchild: {grandchild.exitcode}"


fork = multiprocessing.get_context("fork")
worker = fork.Process(target=child)
worker.start()
worker.join(child_s)
if worker.exitcode is None:
    worker.kill()
    worker.join()
    print("child hung", flush=True)
    sys.exit(2)
print("child exit code", worker.exitcode, flush=True)
sys.exit(0 if worker.exitcode == 0 else 1)
'''

CHILD_S = 40.0  # the child's deadline: compiling one spec, on a busy machine
# The C compiler, slow on gradient steps: a steps module is still compiling in the parent's thread at the fork
SLOW_STEPS_CC = """#!/bin/sh
for arg in "$@"; do
  case "$arg" in *.c) if grep -q _step "$arg"; then sleep 1; fi;; esac
done
exec cc "$@"
"""


@pytest.mark.parametrize("backend", [c_param(), "numba", "auto"])
def test_a_forked_child_runs_kernels_eagerly(backend, tmp_path):
    env = dict(os.environ, TULLAX_SERIAL_WORK="0", TULLAX_C_THREADS="2", NUMBA_NUM_THREADS="2")
    if backend != "numba":
        (tmp_path / "cc").write_text(SLOW_STEPS_CC)
        (tmp_path / "cc").chmod(0o755)
        env["TULLAX_CC"] = str(tmp_path / "cc")
    # c, auto: specs no cache holds, compiled in the parent (its steps module still compiling at the fork) and in
    # the child; Numba builds no steps module in a thread, and compiles slowly: its specs are cached ones
    salt = "0" if backend == "numba" else str(random.randrange(10**6, 10**7))
    try:
        done = subprocess.run([sys.executable, "-c", SCRIPT, backend, str(CHILD_S), salt], env=env,
                              capture_output=True, text=True, timeout=CHILD_S + 120)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the parent hung: {err.stdout}\n{err.stderr}")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    started = done.stdout.splitlines()[0]
    assert "openmp" in started or "numba" in started  # the parent did start a pool: the case is exercised
