"""The c backend's kernel inside `jax.jit` on its two host paths, against `jnp.max`, in one process, alternating
round after round on the same array (the best of a batch of calls, each waited for; the median over rounds): the
row max `(max) m[i] := x[i,j]` at the suite's size (4096x4096 float32, 64 MB read per call) and at tiny sizes,
where the per-call cost is all there is.

* ``ffi`` (the default): XLA's custom call of the compiled FFI handler (``tullax.backends.ffi``), no Python;
* ``buffer``: ``jax.experimental.buffer_callback``, a Python function per call (``TULLAX_CALLBACK=buffer``);
* ``jnp.max``: XLA's own reduction (which drops NaNs on jaxlib 0.10.2; the kernel keeps them).

    .venv/bin/python benchmarks/ffi_call.py [--rounds 11] [--out FILE.json]
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

if __package__ in (None, ""):  # run as a script: make `tullax` importable from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS = Path(__file__).resolve().parent / "results" / "ffi_call.json"
SPEC = "(max) m[i] := x[i,j]"
SIZES = ((4096, 4096), (1024, 1024), (64, 64))


def paths(shape: tuple[int, int]) -> dict:
    """The three jitted functions, each traced and run once, on one array of ``shape``."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import tullax

    fns = {}
    for path in ("ffi", "buffer"):
        os.environ["TULLAX_CALLBACK"] = path
        kernel = tullax.einsum_kernel(SPEC, backend="c")
        fns[path] = jax.jit(lambda x, kernel=kernel: kernel(x))
        x = jnp.asarray(np.random.default_rng(0).standard_normal(shape, dtype=np.float32))
        jax.block_until_ready(fns[path](x))
        lowered = jax.jit(lambda x, kernel=kernel: kernel(x)).lower(x).as_text()
        assert ("tullax_c_kernel" in lowered) == (path == "ffi"), f"the {path} path was not taken"
    os.environ.pop("TULLAX_CALLBACK")
    fns["jnp.max"] = jax.jit(lambda x: jnp.max(x, axis=1))
    np.testing.assert_array_equal(np.asarray(fns["ffi"](x)), np.asarray(fns["jnp.max"](x)))
    return {"fns": fns, "x": x}


def measure(shape: tuple[int, int], rounds: int) -> dict:
    import jax

    made = paths(shape)
    fns, x = made["fns"], made["x"]
    calls = max(10, int(2e8 // (shape[0] * shape[1] * 4) // 4))  # about 50 ms of reading per batch
    per = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            jax.block_until_ready(fn(x))
            best = float("inf")
            for _ in range(calls):  # each call waited for, as make bench times them: latency, not throughput
                start = time.perf_counter()
                jax.block_until_ready(fn(x))
                best = min(best, time.perf_counter() - start)
            per[name].append(best * 1e6)
    med = {name: statistics.median(v) for name, v in per.items()}
    # per round: the ratio of neighbouring batches, less disturbed by a busy spell than medians taken apart
    ratio = statistics.median(j / f for j, f in zip(per["jnp.max"], per["ffi"]))
    return {"shape": list(shape), "calls_per_batch": calls, "median_us": med, "rounds_us": per,
            "jnp_over_ffi": ratio, "buffer_over_ffi": statistics.median(b / f for b, f in zip(per["buffer"],
                                                                                             per["ffi"]))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    import jax

    rows = [measure(shape, args.rounds) for shape in SIZES]
    print(f"{SPEC} under jax.jit, c backend; jax {jax.__version__}, {os.cpu_count()} cpus, {platform.processor()}")
    print(f"{'shape':<12}{'ffi us':>10}{'buffer us':>11}{'jnp.max us':>12}{'jnp/ffi':>9}{'buffer/ffi':>11}")
    for row in rows:
        m = row["median_us"]
        print(f"{'x'.join(map(str, row['shape'])):<12}{m['ffi']:>10.1f}{m['buffer']:>11.1f}{m['jnp.max']:>12.1f}"
              f"{row['jnp_over_ffi']:>9.2f}{row['buffer_over_ffi']:>11.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"spec": SPEC, "jax": jax.__version__, "cpus": os.cpu_count(),
                                    "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
