"""Two processes on this machine joined by ``jax.distributed`` (2 host devices each, a mesh over all 4): a sharded
Dist (split along a free index, and along its summed index) and a row logsumexp split along its summed index, with
their gradients, equal NumPy's in every process (``tests/distributed_script.py``). The test starts the processes
itself and bounds their time."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.loop_backends import c_unavailable

ROOT = Path(__file__).resolve().parents[1]
PROCESSES = 2
LIMIT_S = 600  # bounds a hang; as test_sharding's subprocess (its 300 s was once hit on a loaded machine)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def test_two_processes_run_sharded_kernels_and_gradients() -> None:
    if c_unavailable():
        pytest.skip(f"c backend: {c_unavailable()}")
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TULLAX_PLAN_TIMING": "0"}
    script = str(ROOT / "tests" / "distributed_script.py")
    started = [subprocess.Popen([sys.executable, script, str(port), str(k), str(PROCESSES)], env=env, cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for k in range(PROCESSES)]
    outputs = []
    try:
        for process in started:
            outputs.append(process.communicate(timeout=LIMIT_S))
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()
    for k, (process, (out, err)) in enumerate(zip(started, outputs)):
        assert process.returncode == 0 and f"OK {k}" in out, err[-3000:]
