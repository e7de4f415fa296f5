"""Where ``auto`` lost to jnp or to its own loop backend (issue 45 item 4): a patchify's gradient, a LayerNorm, a
logsumexp's gradient, a MaxPool's gradient. Each case under jnp, ``auto`` and ``c``, float32, jitted, interleaved
call after call after a warm-up (``auto``'s races there), median ms of wall time and of the process's CPU time
(every thread's: what a loaded machine leaves comparable); ratio jnp's time over tullax's (above 1, tullax is
faster). With the plan ``auto`` chose for every kernel of the case (backend, form, the race's timings).

Before and after in one run: each ``--tree`` (a tullax checkout, e.g. a ``git archive`` of the commit before)
is measured in a new process of its own, with an empty compile cache of its own.

    .venv/bin/python benchmarks/auto_losses.py [--tree before=/tmp/before] [--rounds 9] [--out FILE.json]
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
RESULTS = HERE.parent / "results" / "auto_losses.json"
PATCHIFY = "P[b,h,w,c,i,j] := x[b,c,4h+i,4w+j] (i in 0:4) (j in 0:4)"
MEAN = "m[b] := x[b,i] |> _ / size(x,1)"
RSTD = "r[b] := (x[b,i] - m[b])^2 |> 1 / sqrt(_ / size(x,1) + 1e-5)"
NORM = "y[b,i] := (x[b,i] - m[b])*r[b]*g[i] + beta[i]"
LSE = "(logsumexp) l[i] := x[i,j]"
MAXPOOL = "(max) y[n,c,h,w] := x[n,c,2h+p,2w+q] (p in 0:2) (q in 0:2)"
# programs (benchmarks/programs.py), differentiated: their statements' kernels race as any auto kernel's do
SOFTMAX = """
(max) local m[r,i] := s[r,i,j]
local z[r,i] := exp(s[r,i,j] - m[r,i])
p[r,i,j] := exp(s[r,i,j] - m[r,i]) / z[r,i]
"""
LAYERNORM = """
local mu[b]  := x[b,j] |> _ / size(x,1)
local var[b] := (x[b,j] - mu[b])^2 |> _ / size(x,1)
y[b,j] := (x[b,j] - mu[b]) / sqrt(var[b] + 1e-5) * g[j] + beta[j]
"""
ATTENTION = """
local s[b,i,j] := q[b,i,d] * k[b,j,d] * 0.125
(max) local m[b,i] := s[b,i,j]
local z[b,i] := exp(s[b,i,j] - m[b,i])
local p[b,i,j] := exp(s[b,i,j] - m[b,i]) / z[b,i]
o[b,i,e] := p[b,i,j] * v[b,j,e]
"""


def _cases(backend: str | None):
    """(name, function of the inputs, inputs) per case; ``backend`` None: the jnp code."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import tullax

    rng = np.random.default_rng(0)
    k = (lambda text: tullax.einsum_kernel(text, backend=backend)) if backend else None
    x4 = jnp.asarray(rng.standard_normal((16, 3, 64, 64)), jnp.float32)
    xn = jnp.asarray(rng.standard_normal((4096, 512)), jnp.float32)
    g = jnp.asarray(rng.standard_normal(512), jnp.float32)
    beta = jnp.asarray(rng.standard_normal(512), jnp.float32)
    xl = jnp.asarray(rng.standard_normal((2048, 1024)), jnp.float32)
    xp = jnp.asarray(rng.standard_normal((8, 32, 64, 64)), jnp.float32)
    xs = jnp.asarray(rng.standard_normal((32, 128, 128)), jnp.float32)
    xg = jnp.asarray(rng.standard_normal((512, 1024)), jnp.float32)
    gg, bg = (jnp.asarray(rng.standard_normal(1024), jnp.float32) for _ in range(2))
    qkv = [jnp.asarray(rng.standard_normal((8, 128, 64)), jnp.float32) for _ in range(3)]
    if backend:
        patchify, mean, rstd, norm, lse, pool = k(PATCHIFY), k(MEAN), k(RSTD), k(NORM), k(LSE), k(MAXPOOL)
        softmax, program_layernorm, attention = k(SOFTMAX), k(LAYERNORM), k(ATTENTION)

        def layernorm(x, g, beta):
            m = mean(x)
            return norm(x, m, rstd(x, m), g, beta)
    else:
        def patchify(x):
            b, c, hh, ww = x.shape
            return x.reshape(b, c, hh // 4, 4, ww // 4, 4).transpose(0, 2, 4, 1, 3, 5)

        def layernorm(x, g, beta):
            m = x.mean(1, keepdims=True)
            return (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(1, keepdims=True) + 1e-5) * g + beta

        def lse(x):
            return jax.nn.logsumexp(x, axis=1)

        def pool(x):
            n, c, hh, ww = x.shape
            return x.reshape(n, c, hh // 2, 2, ww // 2, 2).max(axis=(3, 5))

        def softmax(s):
            e = jnp.exp(s - s.max(-1, keepdims=True))
            return e / e.sum(-1, keepdims=True)

        def program_layernorm(x, g, beta):
            mu = x.mean(1, keepdims=True)
            return (x - mu) / jnp.sqrt(((x - mu) ** 2).mean(1, keepdims=True) + 1e-5) * g + beta

        def attention(q, k, v):
            return jnp.einsum("bij,bje->bie", softmax(jnp.einsum("bid,bjd->bij", q, k) * 0.125), v)

    def grad(f, argnums=0):
        return jax.grad(lambda *a: jnp.sum(jnp.sin(f(*a))), argnums)

    return [("patchify gradient", grad(patchify), (x4,)), ("LayerNorm", layernorm, (xn, g, beta)),
            ("logsumexp gradient", grad(lse), (xl,)), ("MaxPool gradient", grad(pool), (xp,)),
            ("softmax gradient", grad(softmax), (xs,)),
            ("LayerNorm gradient", grad(program_layernorm, (0, 1, 2)), (xg, gg, bg)),
            ("attention gradient", grad(attention, (0, 1, 2)), tuple(qkv))]


def child(rounds: int) -> dict:
    import jax
    import numpy as np

    from tullax.planner import decide

    fns = {name: _cases(name if name != "jnp" else None) for name in ("jnp", "auto", "c")}
    rows = []
    for index, (case, _, args) in enumerate(fns["jnp"]):
        jitted = {name: jax.jit(cases[index][1]) for name, cases in fns.items()}
        first = {}
        for name, fn in jitted.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            first[name] = time.perf_counter() - start
        def flat(value):  # one array of every leaf (a gradient w.r.t. several inputs is a tuple)
            return np.concatenate([np.ravel(np.asarray(v)) for v in jax.tree.leaves(value)])

        want = flat(jitted["jnp"](*args))
        error = {n: float(np.max(np.abs(flat(f(*args)) - want)) / (np.max(np.abs(want)) or 1.0))
                 for n, f in jitted.items()}
        times: dict[str, list[float]] = {name: [] for name in jitted}
        cpu: dict[str, list[float]] = {name: [] for name in jitted}
        for _ in range(rounds):
            for name, fn in jitted.items():
                jax.block_until_ready(fn(*args))
                start, used = time.perf_counter(), time.process_time()
                jax.block_until_ready(fn(*args))
                times[name].append((time.perf_counter() - start) * 1e3)
                cpu[name].append((time.process_time() - used) * 1e3)
        ms = {name: statistics.median(t) for name, t in times.items()}
        cpu_ms = {name: statistics.median(t) for name, t in cpu.items()}  # every thread's: a loaded machine's wall
        rows.append({"case": case, "ms": ms, "cpu_ms": cpu_ms, "first_call_s": first, "relative_error": error,
                     "auto_ratio": ms["jnp"] / ms["auto"], "c_ratio": ms["jnp"] / ms["c"],
                     "cpu_auto_ratio": cpu_ms["jnp"] / cpu_ms["auto"], "cpu_c_ratio": cpu_ms["jnp"] / cpu_ms["c"]})
    plans = sorted({(getattr(key[0], "text", None) or str(key[0])[:160], p.backend, p.form, p.source,
                     tuple(p.timings_ms)) for key, p in decide._MEMO.items()})
    try:  # how each differentiated call computes its gradient (a tree from before planner.autodiff has none)
        from tullax.planner import autodiff
    except ImportError:
        autodiff = None
    gradient_plans = [] if autodiff is None else [[str(key[0][0].out), p.form, p.source, list(p.timings_ms)]
                                                  for key, p in autodiff._MEMO.items()]
    return {"rows": rows, "plans": [list(p) for p in plans], "gradient_plans": gradient_plans}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--tree", action="append", default=[], help="LABEL=PATH of another tullax checkout")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.rounds)))
        return
    trees = [t.split("=", 1) for t in args.tree] + [["this checkout", str(HERE.parent.parent)]]
    runs = []
    for label, tree in trees:
        with tempfile.TemporaryDirectory() as cache:
            # run in the tree: ``python -c`` puts the working directory before PYTHONPATH on sys.path
            env = {**os.environ, "PYTHONPATH": tree, "TULLAX_CACHE_DIR": cache}
            done = subprocess.run([sys.executable, "-c", f"import runpy, sys; sys.argv = ['auto_losses', '--child', "
                                   f"'--rounds', '{args.rounds}']; runpy.run_path({str(HERE)!r}, run_name='__main__')"],
                                  env=env, capture_output=True, text=True, check=True, cwd=tree)
        found = json.loads(done.stdout.strip().splitlines()[-1])
        runs.append({"tree": label, **found})
        for row in found["rows"]:
            print(f"{label:14s} {row['case']:20s} auto {row['auto_ratio']:.2f}x  c {row['c_ratio']:.2f}x  "
                  f"(ms: {', '.join(f'{n} {v:.2f}' for n, v in row['ms'].items())}); CPU time: auto "
                  f"{row['cpu_auto_ratio']:.2f}x  c {row['cpu_c_ratio']:.2f}x", flush=True)
    Path(args.out).write_text(json.dumps({"rounds": args.rounds, "cpus": os.cpu_count(), "runs": runs}, indent=1)
                              + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
