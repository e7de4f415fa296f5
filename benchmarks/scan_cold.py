"""The complex LRU gradient (``benchmarks/scan.py --complex``'s, T=1024 by default) timed in two rotations: tullax
and lax.scan alone, and with associative_scan's gradient between them (``scan.py``'s rotation), which moves
hundreds of MB and leaves the caches cold for the next call. Process CPU time, its system part (``getrusage``)
and context switches, medians; then the gradient's kernels alone (forward, the adjoint scan, Δx) in the cold
rotation. Results go to stdout (``--out``: a JSON line appended to a file).

    PYTHONPATH=$PWD python benchmarks/scan_cold.py [--T 1024] [--rounds 31] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    os.environ.setdefault("TULLAX_CACHE_DIR", tempfile.mkdtemp(prefix="tullax-scan-bench-"))
    os.environ.setdefault("TULLAX_C_TIERS", "off")
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.dirname(here)]
    import jax
    import jax.numpy as jnp
    import numpy as np
    from scan import operations, subjects

    import tullax

    batch, n = 16, 64
    rng = np.random.default_rng(0)
    lam = rng.uniform(0.9, 0.999, n).astype(np.float32)
    lam = (lam * np.exp(1j * rng.uniform(0, 0.2, n))).astype(np.complex64)
    x = rng.normal(size=(batch, args.T, n)).astype(np.float32)
    h0 = rng.normal(size=(batch, n)).astype(np.float32)
    weight = rng.normal(size=(batch, args.T, n)).astype(np.float32)
    lam, x, h0 = (jax.device_put(a) for a in (lam, x, h0))
    grads = {name: operations(fn, weight, True)["grad"] for name, fn in subjects("c").items()}
    for f in grads.values():
        jax.block_until_ready(f(lam, x, h0))
    record = {"T": args.T, "threads": os.environ.get("TULLAX_C_THREADS") or "default", "rotations": {}}
    for rotation in (("tullax", "lax.scan"), ("tullax", "lax.scan", "associative_scan")):
        times: dict = {name: [] for name in rotation}
        for _ in range(args.rounds):
            for name in rotation:
                before, start = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
                jax.block_until_ready(grads[name](lam, x, h0))
                cpu, after = time.process_time() - start, resource.getrusage(resource.RUSAGE_SELF)
                times[name].append((cpu, after.ru_stime - before.ru_stime,
                                    after.ru_nvcsw + after.ru_nivcsw - before.ru_nvcsw - before.ru_nivcsw))
        key = " + ".join(rotation)
        record["rotations"][key] = {name: {"cpu_ms": 1e3 * statistics.median(t[0] for t in v),
                                           "sys_ms": 1e3 * statistics.median(t[1] for t in v),
                                           "switches": statistics.median(t[2] for t in v)}
                                    for name, v in times.items()}
        row = record["rotations"][key]
        print(f"T={args.T} threads={record['threads']} [{key}] " + "  ".join(
            f"{name} {r['cpu_ms']:.3f} ms (sys {r['sys_ms']:.3f})" for name, r in row.items()) +
            f"  lax.scan/tullax x{row['lax.scan']['cpu_ms'] / row['tullax']['cpu_ms']:.2f}")
    forward = tullax.einsum_kernel("h[b,t,n] := lam[n]*h[b,t-1,n] + x[b,t,n]  (t scan from h0)", backend="c")
    adjoint = tullax.einsum_kernel("g[b,t,n] := d[b,t,n] + lam[n]*g[b,t+1,n]  (t scan reverse)", backend="c")
    dx = tullax.einsum_kernel("dx[b,t,n] := real(g[b,t,n])", backend="c")
    cotangent = jnp.asarray(weight.astype(lam.dtype))
    parts = {"forward": (jax.jit(forward), (lam, x, h0)), "adjoint": (jax.jit(adjoint), (cotangent, lam)),
             "dx": (jax.jit(dx), (adjoint(cotangent, lam),)),
             "associative_scan": (grads["associative_scan"], (lam, x, h0))}
    times = {name: [] for name in parts}
    for f, a in parts.values():
        jax.block_until_ready(f(*a))
    for _ in range(args.rounds):
        for name, (f, a) in parts.items():
            before, start = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
            jax.block_until_ready(f(*a))
            cpu, after = time.process_time() - start, resource.getrusage(resource.RUSAGE_SELF)
            times[name].append((cpu, after.ru_stime - before.ru_stime))
    record["parts_cold"] = {name: {"cpu_ms": 1e3 * statistics.median(t[0] for t in v),
                                   "sys_ms": 1e3 * statistics.median(t[1] for t in v)} for name, v in times.items()}
    record["GOMP_SPINCOUNT"] = os.environ.get("GOMP_SPINCOUNT", "")
    print(f"T={args.T} threads={record['threads']} parts, cold: " + "  ".join(
        f"{name} {r['cpu_ms']:.3f} ms (sys {r['sys_ms']:.3f})" for name, r in record["parts_cold"].items()))
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
