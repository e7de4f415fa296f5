"""The loops' strided window gradient (issue 45 item 2): a MaxPool's gradient on ``c`` (``jax.grad`` of
``sum(sin(pool(x)))``, jitted, x 8x32x64x64 float32) and its input-gradient step alone
(``Δx[n,c,m,r] := share[n,c,pad((m-p)/2),pad((r-q)/2)]*(x[n,c,m,r] == y[...])``), before and after the lowering
computes the window index from ``m mod 2`` instead of looping over it with a divisibility test per term.

Each ``--tree`` (a tullax checkout, e.g. a ``git archive`` of the commit before) runs in a process of its own
with an empty compile cache; the trees alternate for ``--rounds`` rounds, each child timing ``--calls`` calls
after a warm-up; reported: the median over rounds of each child's median wall and process CPU ms.

    .venv/bin/python benchmarks/strided_loops.py --tree before=/tmp/before --tree after=$PWD [--rounds 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
MAXPOOL = "(max) y[n,c,h,w] := x[n,c,2h+p,2w+q] (p in 0:2) (q in 0:2)"
STEP = ("Δx[n,c,m,r] := share[n,c,pad((m-p)/2),pad((r-q)/2)]*(x[n,c,m,r] == y[n,c,pad((m-p)/2),pad((r-q)/2)]) "
        "(p in 0:2) (q in 0:2)")
MARK = "@@strided-loops "


def child(calls: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import tullax

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((8, 32, 64, 64)), jnp.float32)
    pool, step = tullax.einsum_kernel(MAXPOOL, backend="c"), tullax.einsum_kernel(STEP, backend="c")
    y = pool(x)
    share = jnp.asarray(rng.standard_normal(y.shape), jnp.float32)
    fns = {"MaxPool gradient": (jax.jit(jax.grad(lambda a: jnp.sum(jnp.sin(pool(a))))), (x,)),
           "Δx step": (jax.jit(step), (share, x, y))}
    out = {}
    for name, (fn, args) in fns.items():
        jax.block_until_ready(fn(*args))
        from tullax.backends.c.backend import finish_step_builds

        finish_step_builds()
        jax.block_until_ready(fn(*args))
        walls, cpus = [], []
        for _ in range(calls):
            wall, cpu = time.perf_counter(), time.process_time()
            jax.block_until_ready(fn(*args))
            walls.append((time.perf_counter() - wall) * 1e3)
            cpus.append((time.process_time() - cpu) * 1e3)
        out[name] = {"wall_ms": statistics.median(walls), "cpu_ms": statistics.median(cpus)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", action="append", default=[], help="LABEL=PATH of a tullax checkout")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out", default=str(HERE.parent / "results" / "strided_loops.json"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(MARK + json.dumps(child(args.calls)))
        return
    trees = dict(item.split("=", 1) for item in args.tree) or {"this": str(HERE.parents[1])}
    runs: dict[str, list[dict]] = {label: [] for label in trees}
    for _ in range(args.rounds):
        for label, path in trees.items():
            with tempfile.TemporaryDirectory(prefix="tullax-strided-loops-") as cache:
                env = {**os.environ, "TULLAX_CACHE_DIR": cache, "PYTHONPATH": path}
                done = subprocess.run([sys.executable, str(HERE), "--child", "--calls", str(args.calls)], env=env,
                                      capture_output=True, text=True, cwd=path, timeout=1800)
            line = [s for s in done.stdout.splitlines() if s.startswith(MARK)]
            if not line:
                raise SystemExit(done.stderr[-3000:])
            runs[label].append(json.loads(line[0][len(MARK):]))
    rows = []
    print("| case | tree | wall ms | CPU ms |\n|---|---|---:|---:|")
    for case in runs[next(iter(trees))][0]:
        for label in trees:
            wall = statistics.median(r[case]["wall_ms"] for r in runs[label])
            cpu = statistics.median(r[case]["cpu_ms"] for r in runs[label])
            rows.append({"case": case, "tree": label, "wall_ms": wall, "cpu_ms": cpu})
            print(f"| {case} | {label} | {wall:.2f} | {cpu:.2f} |")
    Path(args.out).write_text(json.dumps({"rounds": args.rounds, "calls": args.calls, "rows": rows,
                                          "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
