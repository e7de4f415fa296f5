"""Issue 45 item 6: Dist, ``D[i,j] := (W[k,i] - X[k,j])^2``, as an expert writes it in jnp (``|w|^2 + |x|^2 -
2 w.x``: one GEMM and two row norms) against tullax's ``auto`` without and with the opt-in ``algebra="expand"``
(and ``backend="xla"`` with it, where the expansion always runs), forward and backward (the VJP w.r.t. W and X
with a random cotangent), float32, K=784, I=1024, J=512 by default.

Every subject is timed in this one process, alternating round by round, best of ``--rounds``, after a first call
that pays compiles and ``auto``'s races (reported apart; with a fresh compile cache, ``--fresh-cache``, the races
run here). Ratios are jnp's time over each subject's (above 1: the subject is faster), on the wall clock and on
the process's CPU time (every thread's; steadier than the wall clock on a shared machine, where other processes
take the cores for whole rounds). The accuracy of each
subject's forward against NumPy in float64 is measured on the same normal data and on close points (X = W's
first J columns plus noise of 1e-3): the largest error relative to max|D|, and relative to |w|^2 + |x|^2 (the
expansion's bound: cancellation leaves an error of a few ulps of that sum, not of D).

    .venv/bin/python benchmarks/dist_expand.py [--k 784 --i 1024 --j 512] [--rounds 7] [--fresh-cache]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tullax` importable from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS = Path(__file__).resolve().parent / "results" / "dist_expand.json"
DIST = "D[i,j] := (W[k,i] - X[k,j])^2"


def expert(W, X):
    """Dist as an expert writes it in jnp: row norms and one GEMM."""
    return (W * W).sum(0)[:, None] + (X * X).sum(0)[None, :] - 2 * (W.T @ X)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=784)
    parser.add_argument("--i", type=int, default=1024)
    parser.add_argument("--j", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--fresh-cache", action="store_true", help="a new, empty compile cache: the races run here")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    if args.fresh_cache:
        os.environ["TULLAX_CACHE_DIR"] = tempfile.mkdtemp(prefix="tullax-dist-expand-")

    import jax
    import jax.numpy as jnp
    import numpy as np

    import tullax

    k, i, j = args.k, args.i, args.j
    rng = np.random.default_rng(0)
    W = jnp.asarray(rng.standard_normal((k, i)).astype(np.float32))
    X = jnp.asarray(rng.standard_normal((k, j)).astype(np.float32))
    cotangent = jnp.asarray(rng.standard_normal((i, j)).astype(np.float32))
    subjects = {"jnp expert": expert, "auto": tullax.einsum_kernel(DIST),
                "auto expand": tullax.einsum_kernel(DIST, algebra="expand"),
                "xla expand": tullax.einsum_kernel(DIST, backend="xla", algebra="expand")}
    compiled = {}
    for name, fn in subjects.items():
        compiled[(name, "forward")] = jax.jit(fn)
        compiled[(name, "backward")] = jax.jit(lambda W, X, fn=fn: jax.vjp(fn, W, X)[1](cotangent))
    first_ms, best_ms = {}, {}
    for key, fn in compiled.items():
        start = time.perf_counter()
        jax.block_until_ready(fn(W, X))
        first_ms[key] = (time.perf_counter() - start) * 1e3
        print(f"{key[0]} {key[1]}: first call {first_ms[key]:.0f} ms", flush=True)
    cpu_ms = {}
    for _ in range(args.rounds):
        for key, fn in compiled.items():
            start, cpu = time.perf_counter(), time.process_time()
            jax.block_until_ready(fn(W, X))
            best_ms[key] = min(best_ms.get(key, float("inf")), (time.perf_counter() - start) * 1e3)
            cpu_ms[key] = min(cpu_ms.get(key, float("inf")), (time.process_time() - cpu) * 1e3)
    accuracy = {"normal": _accuracy(compiled, np.asarray(W), np.asarray(X))}
    close = np.asarray(W)[:, :j] + 1e-3 * rng.standard_normal((k, j)).astype(np.float32)
    accuracy["close"] = _accuracy(compiled, np.asarray(W), close)
    rows = {f"{name} {way}": {"best_ms": best_ms[(name, way)], "first_call_ms": first_ms[(name, way)],
                              "jnp_over_this": best_ms[("jnp expert", way)] / best_ms[(name, way)],
                              "best_cpu_ms": cpu_ms[(name, way)],
                              "jnp_over_this_cpu": cpu_ms[("jnp expert", way)] / cpu_ms[(name, way)]}
            for name, way in compiled}
    plans = {label: [line.strip() for line in tullax.explain(DIST, shapes={"W": (k, i), "X": (k, j)},
                                                             algebra=algebra).splitlines()
                     if line.strip().startswith("->")]
             for label, algebra in (("auto", None), ("auto expand", "expand"))}
    result = {"spec": DIST, "shape": {"K": k, "I": i, "J": j}, "dtype": "float32", "rounds": args.rounds,
              "fresh_cache": args.fresh_cache, "cpu_count": os.cpu_count(), "load_average": os.getloadavg(),
              "jax": jax.__version__, "results": rows, "accuracy": accuracy,
              "close_points": "X = W[:, :J] + 1e-3 * standard normal noise", "plan": plans}
    for name, row in rows.items():
        print(f"{name:24s} best {row['best_ms']:8.2f} ms   jnp/this {row['jnp_over_this']:.2f}x   cpu "
              f"{row['best_cpu_ms']:8.2f} ms   jnp/this {row['jnp_over_this_cpu']:.2f}x")
    for label, found in accuracy.items():
        print(f"accuracy, {label}:")
        for name, errs in found.items():
            print(f"  {name:12s} max err / max|D| {errs['rel_to_max']:.2e}   max err / (|w|^2+|x|^2) "
                  f"{errs['rel_to_norms']:.2e}   min D {errs['min']:.3g} (exact {errs['exact_min']:.3g})")
    for label, lines in plans.items():
        print(f"plan, {label}:\n  " + "\n  ".join(lines))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


def _accuracy(compiled: dict, W, X) -> dict:
    """Each subject's forward on (W, X) against NumPy in float64."""
    import numpy as np

    w, x = W.astype(np.float64), X.astype(np.float64)
    exact = np.concatenate([((w[:, a:a + 32, None] - x[:, None, :]) ** 2).sum(0) for a in range(0, w.shape[1], 32)])
    norms = (w * w).sum(0)[:, None] + (x * x).sum(0)[None, :]
    found = {}
    for (name, way), fn in compiled.items():
        if way != "forward":
            continue
        got = np.asarray(fn(W, X)).astype(np.float64)
        err = np.abs(got - exact)
        found[name] = {"rel_to_max": float(err.max() / np.abs(exact).max()), "rel_to_norms": float((err / norms).max()),
                       "min": float(got.min()), "exact_min": float(exact.min())}
    return found


if __name__ == "__main__":
    raise SystemExit(main())
