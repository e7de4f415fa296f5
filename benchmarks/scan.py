"""Recurrences (issue 48) on jax issue 19498's program: ``h_t = lam * h_{t-1} + x_t`` (a diagonal S5/LRU state,
n=64, batch 16, T = 64, 256, 1024), a tullax ``(t scan from h0)`` kernel against ``lax.scan`` and
``lax.associative_scan``, all jitted, in ONE process with the subjects alternating each round (a burst of load on a
shared machine slows every subject alike). Operations: forward; ``grad`` of a weighted sum w.r.t. lam, x and h0;
``jacrev`` and ``jacfwd`` w.r.t. lam of the batch-mean final state (n outputs). Prints medians and the ratios
(other / tullax: > 1 means tullax is faster) and writes them to benchmarks/results/scan.json.

    PYTHONPATH=$PWD python benchmarks/scan.py [--rounds 7] [--backend c] [--lengths 64 256 1024] [--complex] [--cpu]

``--cpu`` times each call by the process's CPU time (user + system, every thread) instead of the wall clock: on
a machine shared with other jobs the wall clock measures their load; CPU time counts a parallel kernel's
threads (and their spinning at the end of a parallel loop) in full, so it favours single-threaded subjects.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

SPEC = "h[b,t,n] := lam[n]*h[b,t-1,n] + x[b,t,n]  (t scan from h0)"


def subjects(backend: str):
    import jax
    import jax.numpy as jnp

    import tullax

    kernel = tullax.einsum_kernel(SPEC, backend=backend)

    def scan(lam, x, h0):
        def step(h, xt):
            h = lam * h + xt
            return h, h
        _, hs = jax.lax.scan(step, h0.astype(jnp.result_type(lam, x)), jnp.moveaxis(x, 1, 0))
        return jnp.moveaxis(hs, 0, 1)

    def associative(lam, x, h0):
        x = x.astype(jnp.result_type(lam, x)).at[:, 0].add(lam * h0)  # the initial state enters the first element
        a = jnp.broadcast_to(lam, x.shape)

        def combine(left, right):
            return right[0] * left[0], right[0] * left[1] + right[1]
        return jax.lax.associative_scan(combine, (a, x), axis=1)[1]

    return {"tullax": kernel, "lax.scan": scan, "associative_scan": associative}


def operations(fn, weight, complex_lam: bool = False):
    import jax
    import jax.numpy as jnp

    def loss(lam, x, h0):
        return jnp.sum(jnp.real(fn(lam, x, h0) * weight))

    def final(lam, x, h0):  # the batch-mean final state: n outputs (a jacobian of every h[b,t,n] is 64 GB)
        return jnp.real(fn(lam, x, h0)[:, -1, :].mean(0))

    def parts(lam, x, h0):  # a complex lam as its real and imaginary parts: jax's jacobians take real inputs
        return final(jax.lax.complex(lam[0], lam[1]), x, h0)

    jac = parts if complex_lam else final
    return {
        "forward": jax.jit(fn),
        "grad": jax.jit(jax.grad(loss, (0, 1, 2))),
        "jacrev_lam": jax.jit(jax.jacrev(jac, 0)),
        "jacfwd_lam": jax.jit(jax.jacfwd(jac, 0)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=25, help="rounds of forward and grad")
    parser.add_argument("--jac-rounds", type=int, default=5, help="rounds of the jacobians (each ~n calls)")
    parser.add_argument("--backend", default="c")
    parser.add_argument("--lengths", type=int, nargs="*", default=[64, 256, 1024])
    parser.add_argument("--complex", action="store_true",
                        help="a complex64 lam (S5's diagonal); the jacobians are w.r.t. its real and imaginary parts "
                             "(jax's jacobians take real inputs): a (2, n) input, lax.complex inside")
    parser.add_argument("--cpu", action="store_true", help="time by process CPU time, not the wall clock")
    parser.add_argument("--host-inputs", action="store_true",
                        help="pass NumPy arrays (each call then copies x into a device buffer first, as for every "
                             "subject) instead of device arrays made once")
    parser.add_argument("--ops", nargs="*", default=["forward", "grad", "jacrev_lam", "jacfwd_lam"],
                        help="the operations to time")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "scan.json"))
    args = parser.parse_args(argv)
    os.environ.setdefault("TULLAX_CACHE_DIR", tempfile.mkdtemp(prefix="tullax-scan-bench-"))
    os.environ.setdefault("TULLAX_C_TIERS", "off")  # time the optimised build from the first round, not tcc's
    clock = time.process_time if args.cpu else time.perf_counter
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import jax
    import numpy as np

    batch, n = 16, 64
    rng = np.random.default_rng(0)
    lam = rng.uniform(0.9, 0.999, n).astype(np.float32)
    if args.complex:
        lam = (lam * np.exp(1j * rng.uniform(0, 0.2, n))).astype(np.complex64)
    results = []
    for T in args.lengths:
        x = rng.normal(size=(batch, T, n)).astype(np.float32)
        h0 = rng.normal(size=(batch, n)).astype(np.float32)
        weight = rng.normal(size=(batch, T, n)).astype(np.float32)
        lam_parts = np.stack([lam.real, lam.imag]).astype(np.float32) if args.complex else lam
        if not args.host_inputs:  # a program's inputs are device arrays: time the scans, not the host copies
            lam_in, lam_parts, x, h0 = (jax.device_put(a) for a in (lam, lam_parts, x, h0))
        else:
            lam_in = lam
        calls = {}
        for name, fn in subjects(args.backend).items():
            for op, f in operations(fn, weight, args.complex).items():
                if op not in args.ops:
                    continue
                a = lam_parts if (args.complex and op.startswith("jac")) else lam_in
                calls[(name, op)] = (lambda f=f, a=a: jax.block_until_ready(f(a, x, h0)))
        reference = {op: np.asarray(calls[("lax.scan", op)]()[0] if op == "grad" else calls[("lax.scan", op)]())
                     for op in ("forward", "grad", "jacrev_lam", "jacfwd_lam") if op in args.ops}
        for (name, op), call in calls.items():  # compile, and check every subject against lax.scan
            value = call()
            if op in reference:
                got = np.asarray(value[0] if op == "grad" else value)
                scale = np.abs(reference[op]).max()
                assert np.abs(got - reference[op]).max() <= 1e-3 * scale, (name, op)
        times: dict = {key: [] for key in calls}
        keys = list(calls)
        for r in range(args.rounds):
            for key in keys[r % len(keys):] + keys[:r % len(keys)]:
                if key[1].startswith("jac") and r >= args.jac_rounds:
                    continue
                start = clock()
                calls[key]()
                times[key].append(clock() - start)
        for op in dict.fromkeys(op for _, op in calls):
            names = ("tullax", "lax.scan", "associative_scan")
            med = {name: statistics.median(times[(name, op)]) for name in names}
            best = {name: min(times[(name, op)]) for name in names}
            row = {"T": T, "op": op, "lam": "complex64" if args.complex else "float32",
                   **{f"{k}_ms": round(v * 1e3, 4) for k, v in med.items()},
                   **{f"{k}_best_ms": round(v * 1e3, 4) for k, v in best.items()},
                   "vs_scan": round(med["lax.scan"] / med["tullax"], 2),
                   "vs_associative": round(med["associative_scan"] / med["tullax"], 2),
                   "best_vs_scan": round(best["lax.scan"] / best["tullax"], 2),
                   "best_vs_associative": round(best["associative_scan"] / best["tullax"], 2)}
            results.append(row)
            print(f"T={T:5d} {op:11s} tullax {row['tullax_ms']:9.3f} ms  lax.scan {row['lax.scan_ms']:9.3f} ms  "
                  f"assoc {row['associative_scan_ms']:9.3f} ms  x{row['vs_scan']:.2f} / x{row['vs_associative']:.2f}"
                  f"  (best: x{row['best_vs_scan']:.2f} / x{row['best_vs_associative']:.2f})",
                  flush=True)
    record = {"spec": SPEC, "backend": args.backend, "batch": batch, "n": n, "rounds": args.rounds,
              "clock": "process CPU time" if args.cpu else "wall",
              "inputs": "NumPy (copied each call)" if args.host_inputs else "device arrays",
              "threads": os.environ.get("TULLAX_C_THREADS", "default"),
              "jac_rounds": args.jac_rounds, "machine": platform.machine(), "cpus": os.cpu_count(),
              "load_average": os.getloadavg(), "jax": jax.__version__, "results": results}
    out = Path(args.out)
    existing = json.loads(out.read_text()) if out.exists() else {}
    existing["complex64" if args.complex else "float32"] = record
    out.write_text(json.dumps(existing, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
