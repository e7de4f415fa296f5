"""The first call under ``auto`` against ``c`` (issue 45 item 3): each kernel's forward and gradient, first call
in a new process with an empty compile cache (construction, tracing, the races, compiles, the first runs), for
each tullax tree given (before and after in one run) and each backend. A race's compiles are bounded by
``tuning.RACE_COMPILE_RATIO`` times what the loops take to compile: the ``auto`` column should stay within a
small multiple of the ``c`` column, under load too (the load average is recorded with each measurement).

    .venv/bin/python benchmarks/race_budget.py [--tree before=/tmp/before] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
RESULTS = HERE.parent / "results" / "race_budget.json"
# (label, spec, input shapes)
KERNELS = [
    ("AvgPool 2x2", "y[n,c,h,w] := x[n,c,2h+p,2w+q] |> _ / 4 (p in 0:2) (q in 0:2)", {"x": (8, 32, 64, 64)}),
    ("Gaussian sum", "K[i,d] := exp(-(x[i,e]-y[j,e])^2)*b[j,d]", {"x": (2048, 3), "y": (2048, 3), "b": (2048, 4)}),
    ("RMSNorm", "r[b] := x[b,i]^2 |> 1 / sqrt(_ / size(x,1) + 1e-6)", {"x": (4096, 512)}),
]
CHILD = """
import sys, time, json
start = time.perf_counter()
import jax, jax.numpy as jnp, numpy as np
import tullax
text, shapes, backend = json.loads(sys.argv[1])
rng = np.random.default_rng(0)
args = [jnp.asarray(rng.standard_normal(s), jnp.float32) for s in shapes.values()]
kernel = tullax.einsum_kernel(text, backend=backend)
jax.block_until_ready(jax.jit(kernel)(*args))
forward = time.perf_counter() - start
grad = jax.jit(jax.grad(lambda *a: jnp.sum(jnp.sin(kernel(*a))), argnums=tuple(range(len(args)))))
jax.block_until_ready(grad(*args))
print(json.dumps({"forward_s": forward, "total_s": time.perf_counter() - start}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", action="append", default=[], help="LABEL=PATH of another tullax checkout")
    parser.add_argument("--backends", default="auto,c")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    trees = [t.split("=", 1) for t in args.tree] + [["this checkout", str(HERE.parent.parent)]]
    rows = []
    for label, text, shapes in KERNELS:
        for tree_label, tree in trees:
            for backend in args.backends.split(","):
                with tempfile.TemporaryDirectory() as cache:
                    # run in the tree: ``python -c`` puts the working directory before PYTHONPATH on sys.path
                    env = {**os.environ, "PYTHONPATH": tree, "TULLAX_CACHE_DIR": cache}
                    load = os.getloadavg()[0]
                    start = time.perf_counter()
                    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps([text, shapes, backend])],
                                          env=env, capture_output=True, text=True, cwd=tree)
                    wall = time.perf_counter() - start
                found = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {
                    "error": done.stderr[-400:]}
                row = {"kernel": label, "spec": text, "tree": tree_label, "backend": backend, "process_s": wall,
                       "load_before": load, **found}
                rows.append(row)
                print(f"{label:14s} {tree_label:18s} {backend:5s} first forward+gradient "
                      f"{found.get('total_s', float('nan')):6.1f} s (process {wall:.1f} s, load {load:.1f})",
                      flush=True)
    Path(args.out).write_text(json.dumps({"cpus": os.cpu_count(), "rows": rows}, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
