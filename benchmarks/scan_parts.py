"""Where the time of issue 19498's recurrence goes (n=64, batch 16, float32, device-array inputs): tullax's
forward, each kernel of its gradient run alone (the reverse adjoint scan, Δlam, Δh0; Δx is the adjoint itself)
and the whole ``grad``, against ``lax.scan``'s forward and grad; medians of process CPU time and of wall time.
The team size is the c backend's (``TULLAX_C_THREADS`` to force one); results go to stdout.

    PYTHONPATH=$PWD python benchmarks/scan_parts.py [T] [--rounds 41]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("T", type=int, nargs="?", default=256)
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--complex", action="store_true",
                        help="a complex64 lam (the benchmark's --complex): the adjoint and Δlam are complex, Δx "
                             "and Δh0 take the real part")
    args = parser.parse_args()
    os.environ.setdefault("TULLAX_C_TIERS", "off")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import jax
    import jax.numpy as jnp
    import numpy as np

    import tullax

    rng = np.random.default_rng(0)
    lam = rng.uniform(0.9, 0.999, 64).astype(np.float32)
    if args.complex:
        lam = (lam * np.exp(1j * rng.uniform(0, 0.2, 64))).astype(np.complex64)
    lam = jnp.asarray(lam)
    x = jnp.asarray(rng.normal(size=(16, args.T, 64)).astype(np.float32))
    h0 = jnp.asarray(rng.normal(size=(16, 64)).astype(np.float32))
    w = jnp.asarray(rng.normal(size=(16, args.T, 64)).astype(np.float32))
    forward = tullax.einsum_kernel("h[b,t,n] := lam[n]*h[b,t-1,n] + x[b,t,n]  (t scan from h0)", backend="c")
    adjoint = tullax.einsum_kernel("g[b,t,n] := d[b,t,n] + lam[n]*g[b,t+1,n]  (t scan reverse)", backend="c")
    dlam = tullax.einsum_kernel("dl[n] := g[b,t,n]*ifelse(t >= 1, h[b,pad(t-1),n], h0[b,n])", backend="c")
    dh0 = tullax.einsum_kernel("dh[b,n] := g[b,0,n]*lam[n]", backend="c")
    dx = tullax.einsum_kernel("dx[b,t,n] := real(g[b,t,n])", backend="c")
    w_in = w.astype(lam.dtype)  # the cotangent of h has h's type
    h, g = forward(lam, x, h0), adjoint(w_in, lam)

    def scan(lam, x, h0):
        def step(h, xt):
            h = lam * h + xt
            return h, h
        h0 = h0.astype(jnp.result_type(lam, x))
        return jnp.moveaxis(jax.lax.scan(step, h0, jnp.moveaxis(x, 1, 0))[1], 0, 1)

    def grad(fn):
        return jax.jit(jax.grad(lambda a, b, c: jnp.sum(jnp.real(fn(a, b, c) * w)), (0, 1, 2)))

    calls = {"forward": (jax.jit(forward), (lam, x, h0)), "adjoint": (jax.jit(adjoint), (w_in, lam)),
             "dlam": (jax.jit(dlam), (g, h, h0)), "dh0": (jax.jit(dh0), (g, lam)),
             **({"dx": (jax.jit(dx), (g,))} if args.complex else {}),
             "grad": (grad(forward), (lam, x, h0)),
             "scan_forward": (jax.jit(scan), (lam, x, h0)), "scan_grad": (grad(scan), (lam, x, h0))}
    cpu: dict[str, list[float]] = {k: [] for k in calls}
    wall: dict[str, list[float]] = {k: [] for k in calls}
    for f, a in calls.values():
        jax.block_until_ready(f(*a))
    for _ in range(args.rounds):
        for key, (f, a) in calls.items():
            c, s = time.process_time(), time.perf_counter()
            jax.block_until_ready(f(*a))
            cpu[key].append(time.process_time() - c)
            wall[key].append(time.perf_counter() - s)
    threads = os.environ.get("TULLAX_C_THREADS", "default")
    for clock, times in (("cpu", cpu), ("wall", wall)):
        print(f"T={args.T} threads={threads} {clock:4s} " + "  ".join(
            f"{k} {statistics.median(v) * 1e3:.3f}" for k, v in times.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
