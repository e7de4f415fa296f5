"""float32 precision of the chunked GPU scan (``tullax/compiler/scan_chunks.py``) against the serial one, on
``h = lam*h + x`` (from h0, 16 lanes), the printed CUDA C run on the CPU by the host harness (tests/cuda_harness.py,
g++ -O1, no FMA contraction): the chunked kernel reassociates the products of lam over a chunk and the carries.

Errors relative to the largest |h|, in float32 ulps (eps = 1.19e-7), against the exact result of the float32 inputs
(the serial recurrence in float64 on them): the chunked kernel, and ``lax.scan`` in float32 (serial). Writes
benchmarks/results/scan-chunks-precision.{json,md}.

    PYTHONPATH=$PWD python benchmarks/scan_chunks_precision.py
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the harness lives beside the tests

SPEC = "h[b,t,n] := lam[n]*h[b,t-1,n] + x[b,t,n]  (t scan from h0)"
ROWS = (((0.9, 0.99), 1024), ((0.9, 0.99), 16384), ((0.99, 0.9999), 1024), ((0.99, 0.9999), 16384),
        ((0.9999, 1.0), 1024), ((0.9999, 1.0), 16384))
EPS = float(np.finfo(np.float32).eps)


def main() -> int:
    import jax
    import jax.numpy as jnp
    from cuda_harness import build, run
    from test_cuda_host import launch_for

    from tullax.spec.frontend import compile_spec

    os.environ["TULLAX_CUDA_SCAN_CHUNKS"] = "1024"
    spec = compile_spec(SPEC)[1]
    launches, envs = [], []
    for number, ((lo, hi), steps) in enumerate(ROWS):
        rng = np.random.default_rng(number)
        env = {"lam": rng.uniform(lo, hi, 16).astype(np.float32),
               "x": rng.normal(size=(1, steps, 16)).astype(np.float32),
               "h0": rng.normal(size=(1, 16)).astype(np.float32)}
        launches.append(launch_for(spec, env, f"k{number}", False))
        envs.append(env)
    with tempfile.TemporaryDirectory() as tmp:
        exe = build([(launch.kernel, launch.index_bits) for launch in launches], Path(tmp), sanitize=False)
        outputs = run(exe, list(enumerate(launches)))

    def serial(lam, x, h0):
        def step(h, xt):
            h = lam * h + xt
            return h, h
        return jnp.moveaxis(jax.lax.scan(step, h0, jnp.moveaxis(x, 1, 0))[1], 0, 1)

    rows = []
    for ((lo, hi), steps), env, got in zip(ROWS, envs, outputs):
        lam, x, h0 = (v.astype(np.float64) for v in env.values())
        exact = np.empty(x.shape)
        h = h0
        for t in range(steps):
            h = lam * h + x[:, t]
            exact[:, t] = h
        scale = np.abs(exact).max() * EPS
        scan32 = np.asarray(jax.jit(serial)(*(jnp.asarray(v) for v in env.values())), np.float64)
        rows.append({"lam": [lo, hi], "T": steps, "chunked_ulps": float(np.abs(got - exact).max() / scale),
                     "lax_scan_ulps": float(np.abs(scan32 - exact).max() / scale)})
        print(rows[-1], flush=True)
    lines = ["| lam in | T | chunked (ulps of max abs h) | lax.scan float32 (ulps) |", "|---|---|---|---|"]
    lines += [f"| [{r['lam'][0]}, {r['lam'][1]}) | {r['T']} | {r['chunked_ulps']:.1f} | {r['lax_scan_ulps']:.1f} |"
              for r in rows]
    out = HERE / "results"
    (out / "scan-chunks-precision.json").write_text(json.dumps({"spec": SPEC, "rows": rows}, indent=1))
    (out / "scan-chunks-precision.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
