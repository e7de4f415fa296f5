"""Per-call cost of a tiny ``auto`` kernel on a new compile cache against the XLA reference in the same process
(issue 45 item 5): ``tiny_call_cost.py`` times each configuration in its own process, one after the other, which a
shared machine's load swings by 2x; here one process (a new empty cache: rule ``tiny`` runs ``auto`` on XLA) builds
both, the jitted forward and VJP of each, and times them in interleaved batches (process CPU time, best of 8
batches of 300 calls, microseconds). Reported: auto over the reference, per spec and per checkout.

    python benchmarks/tiny_call_interleaved.py [--specs ...] [CHECKOUT ...]   (default: this checkout)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r'''
import json, sys, time
sys.path.insert(0, "benchmarks")
from ttfk_tiers import HELD_OUT
from tullax.benchmarking.worker import Subject, block, device_inputs
from tullax.spec.frontend import compile_spec
text, tiny, _ = HELD_OUT[sys.argv[1]]
args, cot = device_inputs(compile_spec(text)[1], tiny, "float32", 0)
calls = {}
for name, backend in (("auto", "auto"), ("ref", "xla")):
    subject = Subject(text, None, backend)
    calls[name + " fwd"] = lambda s=subject: s.fwd(*args)
    calls[name + " bwd"] = lambda s=subject: s.bwd(cot, *args)
for call in calls.values():
    for _ in range(300):
        block(call())
best = dict.fromkeys(calls, float("inf"))
for _ in range(8):
    for name, call in calls.items():
        began = time.process_time()
        for _ in range(300):
            block(call())
        best[name] = min(best[name], (time.process_time() - began) / 300 * 1e6)
from tullax.planner import decide
print("@@" + json.dumps({"cpu_us": {k: round(v, 1) for k, v in best.items()},
                         "fwd auto/ref": round(best["auto fwd"] / best["ref fwd"], 2),
                         "bwd auto/ref": round(best["auto bwd"] / best["ref bwd"], 2),
                         "plans": sorted({p.backend for p in decide._MEMO.values()})}))
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkouts", nargs="*", default=[str(Path(__file__).resolve().parents[1])])
    parser.add_argument("--specs", nargs="*", default=["gaussian distance", "manhattan", "padded conv1d tanh", "Dist"])
    args = parser.parse_args()
    for name in args.specs:
        for code in args.checkouts:
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "TULLAX_CACHE_DIR": cache, "PYTHONPATH": code}
                done = subprocess.run([sys.executable, "-c", CHILD, name], env=env, capture_output=True, text=True,
                                      cwd=code)
            found = [line[2:] for line in done.stdout.splitlines() if line.startswith("@@")]
            print(json.dumps({"spec": name, "code": code, **(json.loads(found[0]) if found else
                                                             {"error": done.stderr[-500:]})}), flush=True)


if __name__ == "__main__":
    main()
