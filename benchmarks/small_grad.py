"""Per-call cost of a small layer's forward and gradient under jax.jit against the jnp code it replaces (issue 45
item 2): an MLP layer ``h[b,o] := x[b,i]*W[i,o] |> tanh(_ + c[o])`` and a plain matmul at 256x64 inputs with a
64x64 weight, on ``auto`` and ``c``; forward, gradient w.r.t. W, and five gradient steps in a ``fori_loop``.
Each (spec, backend) runs in several fresh processes; in each process tullax and jnp alternate round by round
on the same inputs, and the ratio is the median round's tullax time over jnp's (below 1: tullax is faster).

    .venv/bin/python benchmarks/small_grad.py [--processes 3] [--backends auto,c] [--cpu] [--label L] [--out FILE]

Timed once every optimised C build of the process has landed (the c backend's first calls of a module the cache
did not hold run its fast tier meanwhile). ``--cpu``: the process's CPU time per call (all its threads) instead of
wall time: on a machine shared with other work, wall time mostly measures how long the scheduler keeps a thread
waiting.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tullax` importable from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS = Path(__file__).resolve().parent / "results" / "small_grad.json"
SPECS = {
    "mlp_tanh": "h[b,o] := x[b,i]*W[i,o] |> tanh(_ + c[o])",
    "matmul": "h[b,o] := x[b,i]*W[i,o]",
}
BATCH, FEATURES = 256, 64
ROUNDS = 9
ROUND_S = 0.02  # calls per round: as many as take about this long (at least 3), so a slow row stays affordable


def measure(name: str, backend: str, cpu: bool = False) -> dict:
    """In this process: per-call microseconds of tullax and jnp, alternating, for forward, gradient and loop."""
    import time

    clock = time.process_time if cpu else time.perf_counter

    import jax
    import jax.numpy as jnp
    import numpy as np

    import tullax
    from tullax.backends.c.backend import finish_step_builds

    kernel = tullax.einsum_kernel(SPECS[name], backend=backend)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((BATCH, FEATURES)).astype(np.float32))
    W = jnp.asarray((rng.standard_normal((FEATURES, FEATURES)) / 8).astype(np.float32))
    c = jnp.asarray(rng.standard_normal(FEATURES).astype(np.float32))
    if name == "mlp_tanh":
        def ours(W, x):
            return kernel(x, W, c)

        def theirs(W, x):
            return jnp.tanh(x @ W + c)
    else:
        def ours(W, x):
            return kernel(x, W)

        def theirs(W, x):
            return x @ W

    def grad_of(layer):
        return jax.grad(lambda W, x: jnp.sum(layer(W, x) ** 2))

    def loop_of(layer):
        step = grad_of(layer)
        return lambda W, x: jax.lax.fori_loop(0, 5, lambda _, W: W - 1e-3 * step(W, x), W)

    pairs = {"forward": (ours, theirs), "gradient": (grad_of(ours), grad_of(theirs)),
             "fori_loop_5_steps": (loop_of(ours), loop_of(theirs))}
    out = {}
    for phase, (mine, ref) in pairs.items():
        mine, ref = jax.jit(mine), jax.jit(ref)
        np.testing.assert_allclose(np.asarray(mine(W, x)), np.asarray(ref(W, x)), rtol=2e-3, atol=2e-3)
        # the steady state: a module the cache did not hold first runs its fast tier until gcc's build lands
        finish_step_builds()
        times: dict[str, list[float]] = {"tullax": [], "jnp": []}
        start = time.perf_counter()
        mine(W, x).block_until_ready()
        calls = max(3, int(ROUND_S / max(time.perf_counter() - start, 1e-6)))
        for _ in range(ROUNDS):
            for label, fn in (("tullax", mine), ("jnp", ref)):
                fn(W, x).block_until_ready()
                start = clock()
                for _ in range(calls):
                    result = fn(W, x)
                result.block_until_ready()
                times[label].append((clock() - start) / calls * 1e6)
        ratios = [a / b for a, b in zip(times["tullax"], times["jnp"])]
        out[phase] = {"tullax_us": statistics.median(times["tullax"]), "jnp_us": statistics.median(times["jnp"]),
                      "ratio": statistics.median(ratios)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--backends", default="auto,c")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--label", default="", help="what this run measures (a branch, a setting)")
    parser.add_argument("--cpu", action="store_true", help="CPU time of the process per call, not wall time")
    parser.add_argument("--child", nargs=2, metavar=("SPEC", "BACKEND"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(*args.child, cpu=args.cpu)))
        return 0
    runs: dict[str, dict] = {}
    for name in SPECS:
        for backend in args.backends.split(","):
            samples = []
            for _ in range(args.processes):  # a fresh process each: its compile cache is shared, not its jit
                done = subprocess.run([sys.executable, __file__, "--child", name, backend, *(["--cpu"] * args.cpu)],
                                      capture_output=True,
                                      text=True, check=True, env={**os.environ})
                samples.append(json.loads(done.stdout.strip().splitlines()[-1]))
            summary = {phase: {key: statistics.median(s[phase][key] for s in samples)
                               for key in ("tullax_us", "jnp_us", "ratio")} for phase in samples[0]}
            summary["ratios_per_process"] = {phase: [round(s[phase]["ratio"], 3) for s in samples]
                                             for phase in samples[0]}
            runs[f"{name} / {backend}"] = summary
            print(f"{name:8s} {backend:5s} " + "  ".join(
                f"{phase} {v['tullax_us']:.0f}/{v['jnp_us']:.0f} us = {v['ratio']:.2f}x"
                for phase, v in summary.items() if phase != "ratios_per_process"), flush=True)
    document = {"label": args.label, "clock": "process CPU time" if args.cpu else "wall", "spec": SPECS,
                "shapes": {"x": [BATCH, FEATURES], "W": [FEATURES, FEATURES]},
                "processes": args.processes, "round_s": ROUND_S, "rounds": ROUNDS,
                "load_average": os.getloadavg(), "cpu_count": os.cpu_count(), "results": runs}
    previous = json.loads(args.out.read_text()) if args.out.exists() else {}
    previous[args.label or "run"] = document
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(previous, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
