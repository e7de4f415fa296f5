"""Programs (issue 50): LayerNorm, softmax and an attention block written as one tullax program, run FUSED (one
loop kernel over the rows, ``tullax.compiler.fuse``; attention does not fuse and runs its statements), UNFUSED
(``ProgramKernel(fuse=False)``: each statement its own kernel, locals as arrays; the fused subject is
``fuse="grad"``: its gradient w.r.t. the row-wise input is one fused kernel too) and as jnp written by hand, all
jitted, in ONE process with the subjects alternating each round. Operations: forward, and ``grad`` of a weighted
sum w.r.t. every array input. Prints medians and ratios (jnp / fused and unfused / fused: > 1 means the fused
program is faster), the same for the best of the rounds, and the ratio of the median process CPU times (every
thread's; on a machine shared with other work, where wall times wait on the scheduler), and writes them to
benchmarks/results/programs.json.

    PYTHONPATH=$PWD python benchmarks/programs.py [--rounds 15] [--backend c] [--quick]
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

LAYERNORM = """
local mu[b]  := x[b,j] |> _ / size(x,1)
local var[b] := (x[b,j] - mu[b])^2 |> _ / size(x,1)
y[b,j] := (x[b,j] - mu[b]) / sqrt(var[b] + 1e-5) * g[j] + beta[j]
"""
SOFTMAX = """
(max) local m[r,i] := s[r,i,j]
local z[r,i] := exp(s[r,i,j] - m[r,i])
p[r,i,j] := exp(s[r,i,j] - m[r,i]) / z[r,i]
"""
ATTENTION = """
local s[b,i,j] := q[b,i,d] * k[b,j,d] * 0.125
(max) local m[b,i] := s[b,i,j]
local z[b,i] := exp(s[b,i,j] - m[b,i])
local p[b,i,j] := exp(s[b,i,j] - m[b,i]) / z[b,i]
o[b,i,e] := p[b,i,j] * v[b,j,e]
"""


def _softmax(s):
    import jax.numpy as jnp

    e = jnp.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# the inputs' shapes: default, and --quick (make bench --quick)
SHAPES = {"layernorm": ((512, 1024), (1024,), (1024,)), "softmax": ((32, 128, 128),),
          "attention": ((8, 128, 64),) * 3}
QUICK_SHAPES = {"layernorm": ((128, 256), (256,), (256,)), "softmax": ((8, 64, 64),),
                "attention": ((4, 64, 32),) * 3}


def cases(rng, quick: bool = False):
    import jax.numpy as jnp

    def layernorm(x, g, beta):
        mu = x.mean(1, keepdims=True)
        var = ((x - mu) ** 2).mean(1, keepdims=True)
        return (x - mu) / jnp.sqrt(var + 1e-5) * g + beta

    def attention(q, k, v):
        return jnp.einsum("bij,bje->bie", _softmax(jnp.einsum("bid,bjd->bij", q, k) * 0.125), v)

    shapes = QUICK_SHAPES if quick else SHAPES
    programs = {"layernorm": (LAYERNORM, layernorm), "softmax": (SOFTMAX, _softmax),
                "attention": (ATTENTION, attention)}
    return [(name, text, oracle, [rng.normal(size=shape).astype("float32") for shape in shapes[name]])
            for name, (text, oracle) in programs.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--backend", default="c")
    parser.add_argument("--quick", action="store_true", help="smaller inputs (make bench --quick)")
    parser.add_argument("--programs", nargs="*", default=list(SHAPES), choices=list(SHAPES),
                        help="the programs to time")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "programs.json"))
    args = parser.parse_args(argv)
    os.environ.setdefault("TULLAX_CACHE_DIR", tempfile.mkdtemp(prefix="tullax-programs-bench-"))
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import jax
    import jax.numpy as jnp
    import numpy as np

    from tullax.api.program import ProgramKernel

    rng = np.random.default_rng(0)
    results = []
    for name, text, oracle, inputs in cases(rng, args.quick):  # every case's inputs drawn, as in a full run
        if name not in args.programs:
            continue
        fused = ProgramKernel(text, backend=args.backend, fuse="grad")
        subjects = {"fused": fused, "jnp": oracle, "unfused": ProgramKernel(text, backend=args.backend, fuse=False)}
        dtype = np.asarray(inputs[0]).dtype.name
        why = fused.fusion.reason(dtype) if fused.fusion is not None else "no fusion on this backend"
        weight = rng.normal(size=np.shape(oracle(*inputs))).astype(np.float32)
        calls = {}
        for label, fn in subjects.items():
            def loss(*a, fn=fn):
                return jnp.sum(fn(*a) * weight)
            for op, f in (("forward", jax.jit(fn)), ("grad", jax.jit(jax.grad(loss, tuple(range(len(inputs))))))):
                calls[(label, op)] = (lambda f=f: jax.block_until_ready(f(*inputs)))
        for (label, op), call in calls.items():  # compile, and check every subject against jnp
            got, want = call(), calls[("jnp", op)]()
            for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
                assert np.abs(np.asarray(g) - np.asarray(w)).max() <= 1e-3 * max(1.0, np.abs(w).max()), (name, label)
        times: dict = {key: [] for key in calls}
        cpu: dict = {key: [] for key in calls}
        keys = list(calls)
        for r in range(args.rounds):
            for key in keys[r % len(keys):] + keys[:r % len(keys)]:
                start, start_cpu = time.perf_counter(), time.process_time()
                calls[key]()
                times[key].append(time.perf_counter() - start)
                cpu[key].append(time.process_time() - start_cpu)
        for op in ("forward", "grad"):
            med = {label: statistics.median(times[(label, op)]) for label in subjects}
            best = {label: min(times[(label, op)]) for label in subjects}
            used = {label: statistics.median(cpu[(label, op)]) for label in subjects}
            row = {"program": name, "op": op, "shapes": [list(np.shape(a)) for a in inputs],
                   "fused": not why, "not_fused_because": why,
                   **{f"{k}_ms": round(v * 1e3, 4) for k, v in med.items()},
                   **{f"{k}_best_ms": round(v * 1e3, 4) for k, v in best.items()},
                   "best_jnp_over_fused": round(best["jnp"] / best["fused"], 2),
                   "best_unfused_over_fused": round(best["unfused"] / best["fused"], 2),
                   "jnp_over_fused": round(med["jnp"] / med["fused"], 2),
                   "unfused_over_fused": round(med["unfused"] / med["fused"], 2),
                   **{f"{k}_cpu_ms": round(v * 1e3, 4) for k, v in used.items()},
                   "cpu_jnp_over_fused": round(used["jnp"] / used["fused"], 2),
                   "cpu_unfused_over_fused": round(used["unfused"] / used["fused"], 2)}
            results.append(row)
            print(f"{name:10s} {op:8s} fused {row['fused_ms']:9.3f} ms  jnp {row['jnp_ms']:9.3f} ms  "
                  f"unfused {row['unfused_ms']:9.3f} ms  jnp/fused x{row['jnp_over_fused']:.2f}  "
                  f"unfused/fused x{row['unfused_over_fused']:.2f}  (best: x{row['best_jnp_over_fused']:.2f} / "
                  f"x{row['best_unfused_over_fused']:.2f}; cpu: x{row['cpu_jnp_over_fused']:.2f} / "
                  f"x{row['cpu_unfused_over_fused']:.2f}){'' if not why else '  [not fused: ' + why + ']'}",
                  flush=True)
    record = {"backend": args.backend, "dtype": "float32", "rounds": args.rounds, "quick": args.quick,
              "machine": platform.machine(), "cpus": os.cpu_count(), "load_average": os.getloadavg(),
              "jax": jax.__version__, "results": results}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
