"""Why ``auto`` loses a logsumexp's gradient to jnp (issue 45 item 4): jax's gradient of ``jax.nn.logsumexp``
keeps ``exp(x - max)`` from the forward and multiplies it by the cotangent; tullax's derived gradient
``Δx[i,j] := Δl[i]*exp(x[i,j] - l[i])`` computes every exponential a second time. The test of that cause: jnp's
logsumexp with a custom VJP that recomputes ``exp(x - l)`` as tullax's does, beside jnp's own gradient and
tullax's (xla, c, auto), and each gradient step alone, in one process, interleaved; median and best ms of wall
and process CPU time (every thread's). Ratios: jnp's own gradient over each (above 1, faster than jnp).
``auto`` races its derived steps against JAX's autodiff of the forward's XLA form (``tullax.planner.autodiff``);
"auto gradient, derived steps" is the same kernel with that race off (the plan before it: the before/after
of one run).

    .venv/bin/python benchmarks/lse_grad_reuse.py [--rounds 40] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "lse_grad_reuse.json"
LSE = "(logsumexp) l[i] := x[i,j]"
STEP = "Δx[i,j] := Δl[i]*exp(x[i,j] - l[i])"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np

    import tullax
    from tullax.planner import decide

    x = jnp.asarray(np.random.default_rng(0).standard_normal((2048, 1024)), jnp.float32)
    l_ = jax.nn.logsumexp(x, axis=1)
    dl = jnp.cos(l_)

    @jax.custom_vjp
    def recomputed(x):
        return jax.nn.logsumexp(x, axis=1)

    def forward(x):
        out = jax.nn.logsumexp(x, axis=1)
        return out, (x, out)

    def backward(saved, g):
        x, out = saved
        return (g[:, None] * jnp.exp(x - out[:, None]),)

    recomputed.defvjp(forward, backward)

    def grad(fn):
        return jax.jit(jax.grad(lambda a: jnp.sum(jnp.sin(fn(a)))))

    from tullax.jaxop.autodiff import DERIVED_ONLY
    from tullax.jaxop.primitives import apply
    from tullax.planner import autodiff

    kernels = {b: tullax.einsum_kernel(LSE, backend=b) for b in ("xla", "c", "auto")}
    derived_only = kernels["auto"].ir  # 'auto' with its gradient as derived steps, whatever the race says

    def derived(a):
        return apply(derived_only, "auto", [a], gradient=DERIVED_ONLY)

    cases = {"jnp gradient": (grad(lambda a: jax.nn.logsumexp(a, axis=1)), (x,)),
             "jnp gradient, exp recomputed": (grad(recomputed), (x,)),
             **{f"{b} gradient": (grad(k), (x,)) for b, k in kernels.items()},
             "auto gradient, derived steps": (grad(derived), (x,)),
             "jnp forward": (jax.jit(lambda a: jax.nn.logsumexp(a, axis=1)), (x,)),
             "jnp Δx step (exp recomputed)": (jax.jit(lambda d, a, m: d[:, None] * jnp.exp(a - m[:, None])),
                                              (dl, x, l_)),
             **{f"{b} forward": (jax.jit(tullax.einsum_kernel(LSE, backend=b)), (x,)) for b in ("xla", "c")},
             **{f"{b} Δx step": (jax.jit(tullax.einsum_kernel(STEP, backend=b)), (dl, x, l_)) for b in ("xla", "c")}}
    for fn, given in cases.values():
        for _ in range(3):
            jax.block_until_ready(fn(*given))
    time.sleep(3)  # a c kernel's optimised build in the background has landed
    wall: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, (fn, given) in cases.items():
            start, used = time.perf_counter(), time.process_time()
            jax.block_until_ready(fn(*given))
            wall[name].append((time.perf_counter() - start) * 1e3)
            cpu[name].append((time.process_time() - used) * 1e3)
    rows = {name: {"wall_ms": statistics.median(wall[name]), "best_wall_ms": min(wall[name]),
                   "cpu_ms": statistics.median(cpu[name]), "best_cpu_ms": min(cpu[name])} for name in cases}
    base = rows["jnp gradient"]
    for name, row in rows.items():
        row["ratio"], row["cpu_ratio"] = base["wall_ms"] / row["wall_ms"], base["cpu_ms"] / row["cpu_ms"]
        print(f"{name:30s} wall {row['wall_ms']:7.3f} ms (best {row['best_wall_ms']:7.3f})  CPU {row['cpu_ms']:7.3f}"
              f" ms (best {row['best_cpu_ms']:7.3f})  jnp gradient / this: {row['ratio']:.2f} wall, "
              f"{row['cpu_ratio']:.2f} CPU", flush=True)
    plans = sorted({(str(key[0].out), p.backend, p.form, p.source, tuple(p.timings_ms))
                    for key, p in decide._MEMO.items()})
    gradient_plans = [[str(key[0][0].out), p.form, p.source, list(p.timings_ms)] for key, p in autodiff._MEMO.items()]
    print("auto gradient plans:", gradient_plans)
    Path(args.out).write_text(json.dumps({"rounds": args.rounds, "cpus": os.cpu_count(),
                                          "load": os.getloadavg(), "rows": rows,
                                          "auto_plans": [list(p) for p in plans],
                                          "auto_gradient_plans": gradient_plans}, indent=1) + "\n",
                              encoding="utf-8")


if __name__ == "__main__":
    main()
