"""Per-call cost of a tiny ``auto`` kernel under jit (issue 45 item 5): forward and VJP of a held-out spec of
``ttfk_tiers.py`` at its tiny shapes, after the first call, in a new process per configuration: ``new`` (an
empty compile cache: since the tiny rule takes the loops only where their module is compiled, this runs on
XLA), ``warm`` (a ``backend="c"`` process compiled the module into the cache first: the loops) and ``ref`` (the
XLA reference, jax.jit of the jnp lowering differentiated by jax). Best of 5 batches of 500 calls, process CPU
time and wall time per call, in microseconds.

    PYTHONPATH=$PWD python benchmarks/tiny_call_cost.py SPEC [CHECKOUT ...]

Each CHECKOUT (default: this one) is a tree whose tullax runs the calls (``/work/main`` for the code before).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r'''
import json, sys, time
sys.path.insert(0, "benchmarks")
import jax
from ttfk_tiers import HELD_OUT
from tullax.benchmarking.worker import Subject, block, device_inputs
from tullax.spec.frontend import compile_spec
text, tiny, _ = HELD_OUT[sys.argv[1]]
args, cot = device_inputs(compile_spec(text)[1], tiny, "float32", 0)
subject = Subject(text, None, sys.argv[2])
block(subject.fwd(*args)); block(subject.bwd(cot, *args))
if "tullax.backends.c.backend" in sys.modules:
    from tullax.backends.c.backend import finish_step_builds
    finish_step_builds()
out = {}
for name, call in (("fwd", lambda: subject.fwd(*args)), ("bwd", lambda: subject.bwd(cot, *args))):
    for _ in range(200):
        block(call())
    cpu, wall = [], []
    for _ in range(5):
        c, w = time.process_time(), time.perf_counter()
        for _ in range(500):
            block(call())
        cpu.append((time.process_time() - c) / 500 * 1e6)
        wall.append((time.perf_counter() - w) / 500 * 1e6)
    out[name] = {"cpu_us": round(min(cpu), 1), "wall_us": round(min(wall), 1)}
from tullax.planner import decide
out["plans"] = sorted({p.backend for p in decide._MEMO.values()})
print("@@" + json.dumps(out))
'''


def main() -> None:
    name = sys.argv[1]
    for code in sys.argv[2:] or [str(Path(__file__).resolve().parents[1])]:
        for state, backend in (("new", "auto"), ("warm", "auto"), ("ref", "xla")):
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "TULLAX_CACHE_DIR": cache, "PYTHONPATH": code}
                if state == "warm":
                    subprocess.run([sys.executable, "-c", CHILD, name, "c"], env=env, capture_output=True, cwd=code)
                done = subprocess.run([sys.executable, "-c", CHILD, name, backend], env=env, capture_output=True,
                                      text=True, cwd=code)
            found = [line[2:] for line in done.stdout.splitlines() if line.startswith("@@")]
            print(json.dumps({"spec": name, "code": code, "state": state, **(json.loads(found[0]) if found else
                                                                                 {"error": done.stderr[-500:]})}))


if __name__ == "__main__":
    main()
