"""A process's first ``c`` kernel with an empty compile cache (issue 45, item 5): the C compiler's probe runs in
the background from the moment the kernel is made, beside a thread that imports the modules that lower and print
the module (``tullax.backends.c.warm``); resolving the backend by name does not wait for the probe (the first
trace runs beside it), the first build does, and says why where it fails. Each case is a new process (its imports
and its probe are the point) with a compiler that sleeps before it runs, so the probe is still running when the
kernel's backend resolves."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.loop_backends import c_unavailable

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(bool(c_unavailable()), reason=f"c backend: {c_unavailable()}")

SCRIPT = r'''
import os, sys, threading
import numpy as np
import tullax

def probed():  # the slow compiler leaves this file when it has slept (the probe is its first run)
    return os.path.exists(os.environ["SLOWCC_MARK"])

kernel = tullax.einsum_kernel("y_warm[i] := x[i]*2 + 1", backend="c")
kernel.backend  # resolved without waiting for the probe's compiler (it sleeps first)
print("probe done when resolved:", probed())
for thread in threading.enumerate():
    if thread.name == "tullax-c-warm-up":
        thread.join(120)
lowering = ("tullax.compiler.lower", "tullax.printers.c")
print("lowering imported beside the probe:", all(name in sys.modules for name in lowering))
print("probe done after the warm-up:", probed())
try:
    out = kernel(np.arange(4.0))
    print("values:", np.asarray(out).tolist())
except tullax.BackendUnavailableError as err:
    print("unavailable:", " ".join(str(err).split()))
'''


def _run(tmp_path: Path, compiler: str) -> str:
    script = tmp_path / "slowcc"
    script.write_text(f"#!/bin/sh\nsleep 3\ntouch {tmp_path / 'slept'}\n{compiler}\n")
    script.chmod(0o755)
    env = dict(os.environ, TULLAX_CC=str(script), TULLAX_CACHE_DIR=str(tmp_path / "cache"),
               SLOWCC_MARK=str(tmp_path / "slept"),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300,
                          cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return done.stdout


def test_the_backend_resolves_beside_the_probe_and_the_first_build_waits_for_it(tmp_path):
    out = _run(tmp_path, 'exec gcc "$@"')
    assert "probe done when resolved: False" in out
    assert "lowering imported beside the probe: True" in out and "probe done after the warm-up: False" in out
    assert "values: [1.0, 3.0, 5.0, 7.0]" in out


def test_a_compiler_that_fails_is_still_reported_by_the_first_build(tmp_path):
    out = _run(tmp_path, "echo 'slowcc: internal compiler error' >&2\nexit 1")
    assert "probe done when resolved: False" in out
    assert "unavailable:" in out and "internal compiler error" in out, out


AUTO_SCRIPT = r'''
import os, sys, threading
import jax, jax.numpy as jnp
import tullax

started = []
_start = threading.Thread.start
threading.Thread.start = lambda self: (started.append(self.name), _start(self))[1]
kernel = tullax.einsum_kernel(sys.argv[1], backend="auto")
b, i, j = map(int, sys.argv[2].split(","))
x, w, y = jnp.ones((b, i)) / i, jnp.ones((i, j)) / j, jnp.ones((b, j))
jax.jit(kernel)(x, w, y).block_until_ready()
jax.jit(jax.grad(lambda *a: kernel(*a).sum(), argnums=(0, 1, 2)))(x, w, y)[0].block_until_ready()
print("threads:", sorted(n for n in started if n.startswith("tullax-c")))
print("c imported:", "tullax.backends.c" in sys.modules)
print("compiler ran:", os.path.exists(os.environ["SLOWCC_MARK"]))
print("gradient derived:", "tullax.grad" in sys.modules)
from tullax.planner import decide
print("plans:", sorted({(p.backend, p.rule, "not compiled" in p.reason) for p in decide._MEMO.values()}))
if "tullax.backends.c.backend" in sys.modules:
    from tullax.backends.c.backend import compile_stats, finish_step_builds
    finish_step_builds()
    print("c modules:", {k: v for k, v in compile_stats().items() if k != "modules"})
'''

TINY, LARGE = "8,6,5", "64,64,64"  # below the serial work threshold (rule 'tiny'), and above it


def _run_auto(tmp_path: Path, spec: str, sizes: str = TINY) -> str:
    script = tmp_path / "markcc"
    if not script.exists():  # written once: the compiler's identity (its mtime) is in every cache key
        script.write_text(f'#!/bin/sh\ntouch {tmp_path / "ran"}\nexec gcc "$@"\n')
        script.chmod(0o755)
    env = dict(os.environ, TULLAX_CC=str(script), TULLAX_CACHE_DIR=str(tmp_path / "cache"),
               SLOWCC_MARK=str(tmp_path / "ran"),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", AUTO_SCRIPT, spec, sizes], env=env, capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return done.stdout


def test_an_auto_contraction_starts_nothing_of_the_c_backend(tmp_path):
    # the rules give a pure contraction and its gradient steps to XLA's einsum: no probe, warm-up or C import
    # competes with jax's first compile (issue 45 item 5: bilinear's cold auto call at 1.62x xla's)
    out = _run_auto(tmp_path, "s[b] := x[b,i]*W[i,j]*y[b,j]")
    assert "threads: []" in out and "c imported: False" in out and "compiler ran: False" in out, out


def test_an_auto_call_that_may_run_on_the_loops_starts_the_probe(tmp_path):
    out = _run_auto(tmp_path, "s[b] := exp(x[b,i]*W[i,j]*y[b,j])", LARGE)
    assert "'tullax-c-probe'" in out and "c imported: True" in out and "compiler ran: True" in out, out


def test_a_tiny_auto_call_on_a_new_cache_runs_on_xla_and_starts_nothing_of_the_c_backend(tmp_path):
    # issue 45 item 5: the rule 'tiny' sent such a call to the loops, whose first module cost the probe's gcc run,
    # lowering and a compile (manhattan distance: 2.8x the XLA reference's cold first call); XLA compiles its form
    # for less, and a call this small gains nothing on the loops
    spec = "s[b] := exp(x[b,i]*W[i,j]*y[b,j])"
    out = _run_auto(tmp_path, spec)
    assert "threads: []" in out and "c imported: False" in out and "compiler ran: False" in out, out
    assert "plans: [('xla', 'tiny', True)]" in out, out
    # its gradient is JAX's autodiff of that XLA form (as the XLA reference's): no gradient step derived or traced
    assert "gradient derived: False" in out, out
    assert not (tmp_path / "cache" / "entries").exists()  # nothing stored: the next process is as new
    # once a call that runs on the loops has compiled the module (forward and steps) into the cache, a new
    # process's tiny call loads it, compiling nothing
    _run_auto(tmp_path, spec, LARGE)
    (tmp_path / "ran").unlink()
    out = _run_auto(tmp_path, spec)
    assert "plans: [('c', 'tiny', False)]" in out and "'compiled': 0" in out and "compiler ran: False" in out, out
