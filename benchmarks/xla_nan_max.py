"""The xla lowering's NaN-propagating row max (``tullax.backends.xla.lower._nan_propagating``) against `jnp.max` and the
form it replaced, in one process, alternating the three call after call on the same 4096x4096 float32 array.

* ``jnp.max``: XLA's own reduction, which drops a NaN in arrays of 4096 elements or more on jaxlib 0.10.2 (checked
  below: ``correct`` says whether each form kept the NaNs planted in three rows);
* ``checked sum`` (before): ``jnp.max``, and a row sum read beside it; only where a sum is NaN, the NaN marked;
* ``variadic`` (now, tullax's xla backend): one ``lax.reduce`` of the values and of their NaN flags.

    .venv/bin/python benchmarks/xla_nan_max.py [--calls 200] [--rows 4096] [--cols 4096] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tullax` importable from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS = Path(__file__).resolve().parent / "results" / "xla_nan_max.json"


def forms() -> dict:
    import jax
    import jax.numpy as jnp

    from tullax.backends.xla.lower import _nan_propagating

    def checked_sum(x):
        found = jnp.max(x, axis=1)
        suspect = jnp.isnan(jnp.sum(x, axis=1)).any()
        marked = lambda: jnp.where(jnp.isnan(x).any(axis=1), jnp.nan, found)  # noqa: E731
        return jax.lax.cond(suspect, marked, lambda: found)

    return {"jnp.max": jax.jit(lambda x: jnp.max(x, axis=1)), "checked sum": jax.jit(checked_sum),
            "variadic": jax.jit(lambda x: _nan_propagating("max")(x, (1,)))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, args.cols)).astype(np.float32)
    planted = x.copy()
    for row, col in ((7, 1234 % args.cols), (args.rows // 2, args.cols - 1), (args.rows - 1, 0)):
        planted[row, col] = np.nan
    want = np.max(planted, axis=1)
    subjects = forms()
    clean, dirty = jnp.asarray(x), jnp.asarray(planted)
    correct = {name: bool(np.array_equal(np.asarray(f(dirty)), want, equal_nan=True)) for name, f in subjects.items()}
    times: dict[str, list[float]] = {name: [] for name in subjects}
    for _ in range(args.calls):
        for name, f in subjects.items():
            start = time.perf_counter()
            f(clean).block_until_ready()
            times[name].append((time.perf_counter() - start) * 1e3)
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name in subjects:
        print(f"{name:12s} median {medians[name]:.3f} ms  ({medians[name] / medians['jnp.max']:.2f}x jnp.max's "
              f"time)  keeps the NaNs: {correct[name]}")
    Path(args.out).write_text(json.dumps({"shape": [args.rows, args.cols], "calls": args.calls,
                                          "median_ms": medians, "keeps_nan": correct}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
