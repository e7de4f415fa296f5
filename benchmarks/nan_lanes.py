"""The cost of NaN propagation in the Numba printer's max/min lanes (issue 13), on one core.

A row max over 4096x4096 float32 with the three forms the lanes could take (see ``NumbaPrinter._lanes``):
  fast      ``lane = v if v > lane else lane``: one compare-select, skips NaN (the form before issue 13);
  in-lane   ``lane = lane if (lane != lane or v <= lane) else v``: the lane itself keeps a NaN;
  flags     the fast form plus ``flag = flag | (v != v)`` per lane, the result NaN when a flag is set;
  sum       the fast form plus ``total = total + v`` per lane: a NaN sum (a NaN value, or +inf beside -inf) sends
            the row to the exact NaN-propagating loop (printed; the timed rows hold no NaN).
Each form is 8 lanes over blocks of 8 columns, compiled with Numba and timed alternately (CPU time, medians), then
the printed tullax kernel and ``np.max``. Writes benchmarks/results/nan_lanes.json.

    NUMBA_NUM_THREADS=1 python benchmarks/nan_lanes.py
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from numba import njit

LANES = 8
FORMS = {
    "fast": ["acc{l} = v if v > acc{l} else acc{l}"],
    "in-lane": ["acc{l} = acc{l} if (acc{l} != acc{l} or v <= acc{l}) else v"],
    "flags": ["acc{l} = v if v > acc{l} else acc{l}", "nan{l} = nan{l} | (v != v)"],
    "sum": ["acc{l} = v if v > acc{l} else acc{l}", "nan{l} = nan{l} + v"],
}


def row_max(form: str):
    """A row-max kernel whose inner block is written in ``form`` (generated text, as the printer does)."""
    lines = ["def kernel(a, out):", "    for i in range(a.shape[0]):"]
    start = "np.float32(0)" if form == "sum" else "False"  # the sum form's check is a float, NaN when it fires
    lines += [f"        acc{lane} = np.float32(-np.inf)\n        nan{lane} = {start}" for lane in range(LANES)]
    lines += [f"        top = a.shape[1] // {LANES} * {LANES}", f"        for b in range(0, top, {LANES}):"]
    for lane in range(LANES):
        lines.append(f"            v = a[i, b + {lane}]")
        lines += ["            " + line.format(l=lane) for line in FORMS[form]]
    lines.append("        acc = acc0")
    lines += [f"        acc = acc if (acc != acc or acc >= acc{lane}) else acc{lane}" for lane in range(1, LANES)]
    fired = [f"(nan{lane} != nan{lane})" if form == "sum" else f"nan{lane}" for lane in range(LANES)]
    lines.append("        if " + " | ".join(fired) + ":\n            acc = np.nan")  # printed: the exact loop
    lines += ["        for j in range(top, a.shape[1]):", "            acc = max(acc, a[i, j])", "        out[i] = acc"]
    namespace = {"np": np}
    exec("\n".join(lines), namespace)  # noqa: S102 - our own generated text, as in the printer
    return njit(nogil=True)(namespace["kernel"])


def cpu_ms(function, repeats: int = 9) -> list[float]:
    from tullax.benchmarking.timing import timed

    return list(timed(function, repeats, warmup=0).cpu_ms)


def main() -> None:
    import tullax

    x = np.random.default_rng(0).random((4096, 4096), dtype=np.float32)
    out = np.empty(4096, np.float32)
    kernels = {form: row_max(form) for form in FORMS}
    printed = tullax.einsum_kernel("(max) m[i] := x[i,j]", backend="numba")
    runs = {form: (lambda k=kernel: k(x, out)) for form, kernel in kernels.items()}
    runs["tullax (printed)"] = lambda: np.asarray(printed(x))
    runs["np.max"] = lambda: x.max(1)
    for run in runs.values():
        run()
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(5):  # alternate, so load on a shared machine falls on every form alike
        for name, run in runs.items():
            samples[name] += cpu_ms(run, 3)
    result = {name: float(np.median(times)) for name, times in samples.items()}
    report = {"threads": os.environ.get("NUMBA_NUM_THREADS"), "shape": [4096, 4096], "median_cpu_ms": result,
              "vs_fast": {name: result[name] / result["fast"] for name in result}}
    path = Path(__file__).parent / "results" / "nan_lanes.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    for name, ms in result.items():
        print(f"{name:18s} {ms:7.2f} ms   {ms / result['fast']:.2f}x the fast form")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
