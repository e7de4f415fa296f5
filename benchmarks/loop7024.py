"""Issue 7024's loop (issues 48 and 50): 8000 steps of a 4-12-1 MLP whose input is the previous output and three
features, written as ONE tullax scan program (a local hidden layer recomputed per step, the scan statement),
against the same loop written by hand as ``lax.scan`` in jnp, and against the program's own XLA lowering (one
``lax.scan`` over its statements). All jitted, float32, in ONE process with the subjects alternating each round;
each call timed by the process's CPU time (user + system, every thread): on a shared machine the wall clock
measures the other jobs' load. Operations: forward, and ``grad`` of the trajectory's sum w.r.t. W1, W2 and y0
(``--with-u``: and u). Prints medians and ratios (lax.scan / tullax: > 1 means tullax is faster) and writes
benchmarks/results/loop7024.json.

``tullax-before`` is the same kernel as it was before the step's math ran on vector lanes
(``tullax.printers.c_nest_strips``: the strips and the vector remainders, switched off while it compiles),
measured in the same run;
``tullax`` (the default) and ``tullax-adjoint`` (``fuse="grad"``, the same on c) take their gradient through the
derived reverse-scan adjoint (``tullax.grad.scan_program``: one reverse-scan kernel, then the flat program's gradient
tails with the weights' terms hoisted); ``tullax-scan-derivative`` is the same fused forward with JAX's derivative of
the program's ``lax.scan`` lowering as its gradient (the default before the derived adjoint was).

    PYTHONPATH=$PWD python benchmarks/loop7024.py [--rounds 15] [--steps 8000] [--batch 1] [--with-u]
        [--subjects tullax ...]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

SUBJECTS = ("tullax", "tullax-xla", "lax.scan", "tullax-before", "tullax-adjoint", "tullax-scan-derivative")
SPEC = """
local a[b,t,j] := sigmoid(softplus(W1[0,j])*y[b,t-1] + softplus(W1[i+1,j])*u[b,t,i])
y[b,t] := sigmoid(a[b,t,j]*softplus(W2[j]))   (t scan from y0)
"""


def by_hand(W1, u, W2, y0):
    """The same loop as ``lax.scan`` (each sum over the whole right-hand side, as the spec says)."""
    import jax
    import jax.numpy as jnp

    sp = jax.nn.softplus

    def step(y, ut):
        a = jax.nn.sigmoid(sp(W1[0])[None, None, :] * y[:, None, None] + sp(W1[1:])[None, :, :] * ut[:, :, None]
                           ).sum(1)
        new = jax.nn.sigmoid(a * sp(W2)[None, :]).sum(1)
        return new, new
    return jnp.moveaxis(jax.lax.scan(step, y0, jnp.moveaxis(u, 1, 0))[1], 0, 1)


def cpu_time(fn, *args) -> float:
    import jax

    start = time.process_time()
    jax.block_until_ready(fn(*args))
    return time.process_time() - start


def _compiled(fn, args, old_printer: bool):
    """``fn(*args)``, compiled first; ``old_printer``: with the C printer's nest strips and vector remainders off
    while the fused kernel compiles (the printed module is kept per kernel in the process: forgotten after, so the
    next subject compiles its own)."""
    import jax

    from tullax.backends import program_host
    from tullax.printers import c

    if not old_printer:
        return jax.block_until_ready(fn(*args))
    plan, rest = c.nest_strip_plan, c.vector_math
    c.nest_strip_plan, c.vector_math = (lambda loop: None), (lambda lets, accums: False)
    try:
        return jax.block_until_ready(fn(*args))
    finally:
        c.nest_strip_plan, c.vector_math = plan, rest
        program_host.host_program.cache_clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=8000)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--backend", default="c")
    parser.add_argument("--subjects", nargs="*", default=list(SUBJECTS), choices=SUBJECTS,
                        help="the subjects to time (lax.scan always: every ratio is against it)")
    parser.add_argument("--with-u", action="store_true", help="the gradient w.r.t. the features u too")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "loop7024.json"))
    opts = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np

    import tullax

    rng = np.random.default_rng(0)
    W1 = jnp.asarray(rng.normal(size=(4, 12)) * 0.5, jnp.float32)
    u = jnp.asarray(rng.normal(size=(opts.batch, opts.steps, 3)), jnp.float32)
    W2 = jnp.asarray(rng.normal(size=(12,)) * 0.5, jnp.float32)
    y0 = jnp.zeros((opts.batch,), jnp.float32)
    args = (W1, u, W2, y0)
    wanted = {*opts.subjects, "lax.scan"}
    makers = {"tullax": lambda: tullax.einsum_kernel(SPEC, backend=opts.backend),
              "tullax-xla": lambda: tullax.einsum_kernel(SPEC, backend="xla"),
              "lax.scan": lambda: by_hand, "tullax-before": lambda: tullax.einsum_kernel(SPEC, backend=opts.backend),
              "tullax-adjoint": lambda: tullax.einsum_kernel(SPEC, backend=opts.backend, fuse="grad"),
              "tullax-scan-derivative": lambda: tullax.einsum_kernel(SPEC, backend=opts.backend)}
    subjects = {name: make() for name, make in makers.items() if name in wanted}
    if "tullax-scan-derivative" in subjects:
        subjects["tullax-scan-derivative"].gradient = None  # reverse mode differentiates the lax.scan lowering
    fns = {}
    wrt = (0, 1, 2, 3) if opts.with_u else (0, 2, 3)
    for name, fn in subjects.items():
        fns[("forward", name)] = jax.jit(fn)
        fns[("grad", name)] = jax.jit(jax.grad(lambda W1, u, W2, y0, fn=fn: fn(W1, u, W2, y0).sum(), wrt))
    want = np.asarray(fns[("forward", "lax.scan")](*args))
    want_grad = fns[("grad", "lax.scan")](*args)
    for key in sorted(fns, key=lambda key: key[1] != "tullax-before"):  # compile (before first), check
        got = _compiled(fns[key], args, old_printer=key[1] == "tullax-before")
        op, name = key
        if op == "forward":
            err = float(np.abs(np.asarray(got) - want).max())
        else:
            err = max(float(np.abs(np.asarray(g) - np.asarray(w)).max() / (1 + np.abs(np.asarray(w)).max()))
                      for g, w in zip(got, want_grad))
        assert err < 1e-3, (key, err)
    times: dict[tuple[str, str], list[float]] = {key: [] for key in fns}
    for _ in range(opts.rounds):
        for key, fn in fns.items():
            times[key].append(cpu_time(fn, *args))
    rows = []
    for op in ("forward", "grad"):
        med = {name: statistics.median(times[(op, name)]) for name in subjects}
        row = {"op": op, **{f"{name} ms": round(1e3 * v, 3) for name, v in med.items()}}
        for top, bottom in (("lax.scan", "tullax"), ("lax.scan", "tullax-xla"), ("lax.scan", "tullax-before"),
                            ("tullax-before", "tullax"), ("lax.scan", "tullax-adjoint"),
                            ("lax.scan", "tullax-scan-derivative"), ("tullax-scan-derivative", "tullax")):
            if top in med and bottom in med:
                row[f"{top} / {bottom}"] = round(med[top] / med[bottom], 2)
        rows.append(row)
        print(json.dumps(row))
    record = {"spec": SPEC.strip(), "steps": opts.steps, "batch": opts.batch, "backend": opts.backend,
              "subjects": list(subjects), "grad wrt": ["W1", "u", "W2", "y0"] if opts.with_u else ["W1", "W2", "y0"],
              "rounds": opts.rounds, "dtype": "float32", "timer": "process CPU time, median",
              "load": os.getloadavg()[0], "machine": platform.machine(), "python": sys.version.split()[0],
              "jax": jax.__version__, "rows": rows}
    Path(opts.out).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
