"""What huge pages for host-kernel outputs buy (``tullax.runtime.hugepages``), with them on and off
(``TULLAX_HUGE_PAGES``), in alternating fresh processes on the same inputs.

Kernels, each ``jax.jit``-ed on the given loop backend, beside XLA's own program for the same work:

* ``embedding gradient``: the VJP of ``out[b,d] := W[ix[b],d]``, W 50000x256 (51 MB of gradient, every page
  fresh); on, its scatter step clears its own output (``zero_start``); off, it adds into XLA's zeros;
* ``Dist forward``: ``D[i,j] := (W[k,i] - X[k,j])^2``, a 3000x3000 result (36 MB);
* ``exp forward``: ``y[i,j] := exp(x[i,j]) * 2`` on 4096x4096 (64 MB).

Each child times every kernel 30 times after a warm-up and reports the median; the table gives the median over
the children of each setting. Usage: ``python benchmarks/hugepages.py [--processes 3] [--backend c]``. The
kernel's transparent huge page mode is printed: with ``never`` both settings run the same code.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

MARK = "@@hugepages "
CASES = {
    "embedding gradient": ("out[b,d] := W[ix[b],d]", {"W": (50000, 256), "ix": (16384,)}, "W"),
    "Dist forward": ("D[i,j] := (W[k,i] - X[k,j])^2", {"W": (8, 3000), "X": (8, 3000)}, None),
    "exp forward": ("y[i,j] := exp(x[i,j]) * 2", {"x": (4096, 4096)}, None),
}
REPEATS = 30


def _median_ms(call) -> float:
    from tullax.benchmarking.timing import blocked, timed

    return timed(blocked(call), REPEATS).median_ms


def child(backend: str) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import tullax

    rng = np.random.default_rng(0)
    found = {}
    for name, (text, shapes, wrt) in CASES.items():
        values = {n: (rng.integers(0, 50000, s).astype(np.int32) if n == "ix" else
                      rng.standard_normal(s, dtype=np.float32)) for n, s in shapes.items()}
        args = [jnp.asarray(v) for v in values.values()]
        kernel = tullax.einsum_kernel(text, backend=backend)
        if wrt is None:
            ours = jax.jit(lambda *a, k=kernel: k(*a))
            xla = jax.jit(lambda *a, k=tullax.einsum_kernel(text, backend="xla"): k(*a))
            found[name] = {"tullax": _median_ms(lambda: ours(*args)), "xla": _median_ms(lambda: xla(*args))}
            continue
        W, ix = args
        cotangent = jnp.asarray(rng.standard_normal((shapes["ix"][0], shapes["W"][1]), dtype=np.float32))
        ours = jax.jit(lambda W, c, k=kernel: jax.vjp(lambda W: k(W, ix), W)[1](c)[0])
        xla = jax.jit(lambda W, c: jax.vjp(lambda W: jnp.take(W, ix, axis=0), W)[1](c)[0])
        found[name] = {"tullax": _median_ms(lambda: ours(W, cotangent)), "xla": _median_ms(lambda: xla(W, cotangent))}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=3, help="children per setting (default 3)")
    parser.add_argument("--backend", default="c", help="the loop backend (default c)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(MARK + json.dumps(child(args.backend)), flush=True)
        return
    from tullax.runtime.hugepages import thp_mode

    print(f"transparent huge pages: {thp_mode() or 'none'}; backend {args.backend}; "
          f"{args.processes} processes per setting, alternating", flush=True)
    results: dict[str, list[dict]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="tullax-hugepages-") as cache:
        for run in range(2 * args.processes):
            setting = ("on", "off")[run % 2]
            env = {**os.environ, "TULLAX_CACHE_DIR": cache, "TULLAX_HUGE_PAGES": "1" if setting == "on" else "0"}
            done = subprocess.run([sys.executable, __file__, "--child", "--backend", args.backend], env=env,
                                  capture_output=True, text=True, check=False)
            lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
            if done.returncode or not lines:
                sys.exit(f"child failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
            results[setting].append(json.loads(lines[-1][len(MARK):]))
            print(f"  [{run + 1}/{2 * args.processes}] huge pages {setting}: done", flush=True)
    print(f"\n| kernel | {args.backend}, huge pages on | {args.backend}, off | on vs off | XLA (in the same "
          "processes) | on vs XLA |")
    print("|---|---|---|---|---|---|")
    for name in CASES:
        on = statistics.median(r[name]["tullax"] for r in results["on"])
        off = statistics.median(r[name]["tullax"] for r in results["off"])
        xla = statistics.median(r[name]["xla"] for setting in results.values() for r in setting)
        print(f"| {name} | {on:.2f} ms | {off:.2f} ms | {off / on:.2f}x | {xla:.2f} ms | {xla / on:.2f}x |")


if __name__ == "__main__":
    main()
