"""Kernels split by JAX's SPMD partitioner (``tullax.jaxop.partition``) against their jnp formulations, on 1, 2
and 4 host devices (``--xla_force_host_platform_device_count``, one subprocess per count):

* the bytes the compiled program's collectives produce per call (the result shapes of its all-gather,
  all-reduce, reduce-scatter, collective-permute and all-to-all ops in ``.compile().as_text()``), for each case
  split along each of its indices in turn, tullax's c kernel against the jnp formulation, and the same for the
  gradient of the sum of squares of the result;
* the time per call (median of rounds, each the best of a few calls) split along the case's first index.

On a machine with fewer cores than devices the time cannot scale with the device count: read it as it is.

    .venv/bin/python benchmarks/sharding.py [--rounds 5] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tullax` importable from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS = Path(__file__).resolve().parent / "results" / "sharding.json"
COUNTS = (1, 2, 4)
def cases() -> dict:
    """name: (spec, jnp formulation, input shapes (an int dtype marks an index array), {index: split axis per
    input (None: replicated)})."""
    import jax
    import jax.numpy as jnp

    return {
        "dist": ("D[i,j] := (W[k,i] - X[k,j])^2", lambda W, X: ((W[:, :, None] - X[:, None, :]) ** 2).sum(0),
                 ((32, 1024), (32, 1024)), {"i": (1, None), "j": (None, 1), "k": (0, 0)}),
        "linear": ("y[b,o] := x[b,i]*w[o,i]", lambda x, w: jnp.einsum("bi,oi->bo", x, w),
                   ((1024, 256), (512, 256)), {"b": (0, None), "o": (None, 0), "i": (1, 1)}),
        "logsumexp": ("(logsumexp) r[i] := x[i,j]", lambda x: jax.nn.logsumexp(x, axis=1), ((2048, 1024),),
                      {"i": (0,), "j": (1,)}),
        "rowmax": ("(max) r[i] := x[i,j]", lambda x: x.max(1), ((2048, 1024),), {"i": (0,), "j": (1,)}),
        "conv1d": ("y[i] := x[i+k]*w[k]", lambda x, w: jnp.correlate(x, w, "valid"), (((1 << 20) + 8,), (9,)),
                   {"i": (0, None)}),
        "stencil": ("y[i] := x[pad(i-1)] - 2*x[i] + x[pad(i+1)]",
                    lambda x: jnp.pad(x, (1, 0))[:-1] - 2 * x + jnp.pad(x, (0, 1))[1:], ((1 << 20,),), {"i": (0,)}),
        "conv_same": ("y[i] := x[pad(i+k-4)]*w[k]", lambda x, w: jnp.correlate(x, w, "same"), ((1 << 20,), (9,)),
                      {"i": (0, None)}),
        "embedding": ("out[b,d] := W[ix[b],d]", lambda W, ix: W[ix], ((4096, 64), ("int", 16384)),
                      {"b": (None, 0), "d": (1, None), "row": (0, None)}),
        # fewer lookups than rows: each device looks up its rows, one psum (more: the table is gathered)
        "embedding_few": ("out[b,d] := W[ix[b],d]", lambda W, ix: W[ix], ((4096, 64), ("int", 1024)),
                          {"row": (0, None)}),
        # the "same" convolution's w gradient written by hand (k's range reads x's extent): split along i
        "wgrad": ("Δw[k] := Δy[i]*x[pad(i+k-4)]",
                  lambda dy, x: jax.grad(lambda w: jnp.vdot(dy, jnp.correlate(x, w, "same")))(jnp.zeros(9, dy.dtype)),
                  ((1 << 20,), (1 << 20,)), {"i": (0, 0)}),
        "dot": ("s := x[i]*y[i]", lambda x, y: jnp.dot(x, y), ((1 << 22,), (1 << 22,)), {"i": (0, 0)}),
    }


def _inputs(shapes: tuple, rng) -> list:
    import numpy as np

    made = []
    for shape in shapes:
        if shape and shape[0] == "int":
            made.append(rng.integers(0, 4096, shape[1:]).astype(np.int32))
        else:
            made.append(rng.standard_normal(shape).astype(np.float32))
    return made


def _best_ms(function, args, calls: int = 3) -> float:
    import jax

    best = float("inf")
    for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(function(*args))
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def child(rounds: int) -> dict:
    """Run in a subprocess with its device count set: every case, split along each index."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import tullax
    from tullax.testing.hlo import collective_bytes

    count = jax.device_count()
    mesh = jax.make_mesh((count,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    rng = np.random.default_rng(0)
    found = {}
    for name, (text, ref, shapes, splits) in cases().items():
        kernel = tullax.einsum_kernel(text, backend="c")
        args = _inputs(shapes, rng)
        for position, (index, axes) in enumerate(splits.items()):
            specs = [P() if axis is None else P(*([None] * axis + ["x"])) for axis in axes]
            placed = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, specs)]
            ours, theirs = jax.jit(kernel), jax.jit(ref)
            row = {"tullax_bytes": collective_bytes(ours.lower(*placed).compile().as_text()),
                   "jnp_bytes": collective_bytes(theirs.lower(*placed).compile().as_text())}
            floats = tuple(k for k, shape in enumerate(shapes) if not (shape and shape[0] == "int"))
            for label, f in (("tullax", kernel), ("jnp", ref)):  # the gradient of the sum of squares
                grad = jax.jit(jax.grad(lambda *a, f=f: (f(*a) ** 2).sum(), floats))
                row[f"grad_{label}_bytes"] = collective_bytes(grad.lower(*placed).compile().as_text())
            if position == 0:
                for f in (ours, theirs):
                    jax.block_until_ready(f(*placed))
                times: dict[str, list[float]] = {"tullax_ms": [], "jnp_ms": []}
                for _ in range(rounds):
                    times["tullax_ms"].append(_best_ms(ours, placed))
                    times["jnp_ms"].append(_best_ms(theirs, placed))
                row.update({key: round(statistics.median(v), 3) for key, v in times.items()})
            found[f"{name}/{index}"] = row
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        print(json.dumps(child(options.rounds)))
        return
    root = Path(__file__).resolve().parent.parent
    by_count = {}
    for count in COUNTS:
        env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={count}",
               "PYTHONPATH": str(root), "TULLAX_PLAN_TIMING": "0"}
        done = subprocess.run([sys.executable, __file__, "--child", "--rounds", str(options.rounds)], env=env,
                              capture_output=True, text=True, check=False)
        if done.returncode:
            raise SystemExit(done.stderr[-4000:])
        by_count[str(count)] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{count} device(s): done", flush=True)
    report = {"machine": {"cores": os.cpu_count(), "python": platform.python_version()},
              "command": "benchmarks/sharding.py --rounds " + str(options.rounds), "devices": by_count}
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    for key, row in by_count[str(COUNTS[-1])].items():
        ours, theirs = sum(row["tullax_bytes"].values()), sum(row["jnp_bytes"].values())
        grads = sum(row["grad_tullax_bytes"].values()), sum(row["grad_jnp_bytes"].values())
        times = [(c, by_count[str(c)][key]) for c in COUNTS if "tullax_ms" in by_count[str(c)][key]]
        print(f"{key:16s} collective bytes tullax {ours:>10d} jnp {theirs:>10d}, gradient {grads[0]:>10d} / "
              f"{grads[1]:>10d}  "
              + "  ".join(f"{c}: {t['tullax_ms']} / {t['jnp_ms']} ms" for c, t in times))


if __name__ == "__main__":
    main()
