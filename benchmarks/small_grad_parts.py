"""Where one call of the small MLP gradient goes on the ``c`` backend (issue 45 item 2): each kernel the gradient
runs (the forward ``h``, the elementwise ``g = Δh*(1 - h^2)``, the weight gradient ``ΔW = g^T x``), each in a
``jax.jit`` of its own, against the jnp code XLA runs for it, and an empty jitted call (the dispatch every call
pays). Shapes as ``benchmarks/small_grad.py``: x 256x64, W 64x64.

    PYTHONPATH=$PWD python benchmarks/small_grad_parts.py [--rounds 7] [--calls 300]

Process CPU time per call (all threads; a shared machine makes wall time the scheduler's), median over rounds,
each round every part in turn. Writes ``benchmarks/results/small_grad_parts.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "small_grad_parts.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--backend", default="c")
    args = parser.parse_args()
    import jax
    import jax.numpy as jnp
    import numpy as np

    import tullax
    from tullax.backends.c.backend import finish_step_builds

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((256, 64)).astype(np.float32))
    W = jnp.asarray((rng.standard_normal((64, 64)) / 8).astype(np.float32))
    c = jnp.asarray(rng.standard_normal(64).astype(np.float32))
    h = jnp.tanh(x @ W + c)
    forward = tullax.einsum_kernel("h[b,o] := x[b,i]*W[i,o] |> tanh(_ + c[o])", backend=args.backend)
    slope = tullax.einsum_kernel("g[b,o] := d[b,o]*(1 - h[b,o]^2)", backend=args.backend)
    weight = tullax.einsum_kernel("dW[i,o] := g[b,o]*x[b,i]", backend=args.backend)
    layer = jax.grad(lambda W, x: jnp.sum(forward(x, W, c) ** 2))
    reference = jax.grad(lambda W, x: jnp.sum(jnp.tanh(x @ W + c) ** 2))
    parts = {
        "forward": ((lambda x, W, c: forward(x, W, c)), (lambda x, W, c: jnp.tanh(x @ W + c)), (x, W, c)),
        "g": ((lambda d, h: slope(d, h)), (lambda d, h: d * (1 - h * h)), (h, h)),
        "dW": ((lambda g, x: weight(g, x)), (lambda g, x: x.T @ g), (h, x)),
        "whole gradient": (layer, reference, (W, x)),
        "empty call": ((lambda x: x + 1), (lambda x: x + 1), (x,)),
    }
    calls = {}
    for name, (ours, theirs, values) in parts.items():
        for label, fn in (("tullax", ours), ("jnp", theirs)):
            jitted = jax.jit(fn)
            jitted(*values).block_until_ready()
            calls[(name, label)] = (jitted, values)
    finish_step_builds()
    times: dict[tuple[str, str], list[float]] = {key: [] for key in calls}
    for _ in range(args.rounds):
        for key, (jitted, values) in calls.items():
            jitted(*values).block_until_ready()
            start = time.process_time()
            for _ in range(args.calls):
                out = jitted(*values)
            out.block_until_ready()
            times[key].append((time.process_time() - start) / args.calls * 1e6)
    rows = {name: {label: statistics.median(times[(name, label)]) for label in ("tullax", "jnp")} for name in parts}
    print(f"| part | tullax ({args.backend}) CPU us | jnp CPU us |\n|---|---:|---:|")
    for name, row in rows.items():
        print(f"| {name} | {row['tullax']:.1f} | {row['jnp']:.1f} |")
    RESULTS.write_text(json.dumps({"backend": args.backend, "rounds": args.rounds, "calls": args.calls,
                                   "clock": "process CPU time per call", "load_average": os.getloadavg(),
                                   "us": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
