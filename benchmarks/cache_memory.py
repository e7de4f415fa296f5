"""The memory of a process that compiles many distinct kernels (issue 15): its resident set size while it
compiles N distinct specs on the Numba backend (eager calls, each spec once), once with every compile in the
process (``TULLAX_NUMBA_INPROCESS_COMPILES=off``, as before the compile helper) and once with the default (the
first kernels compiled in the process, the rest in the helper process and loaded from the cache). Each run is a
fresh process with a fresh cache directory. Prints a table and writes benchmarks/results/cache_memory.json.

    .venv/bin/python benchmarks/cache_memory.py [--specs 500] [--every 50]

Not a test: it takes about a second per spec.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tullax` importable from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS = Path(__file__).resolve().parent / "results" / "cache_memory.json"
MIB = 2**20
MODES = {"all in process": "off", "default (helper)": ""}


def _rss_mib() -> float:
    """Resident set size now (Linux /proc), in MiB."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB


def measure(specs: int, every: int) -> list[dict]:
    """In this process: compile ``specs`` distinct kernels; the RSS growth after every ``every`` of them."""
    import numpy as np

    import tullax

    x, w = np.ones((8, 4)), np.ones(4)
    tullax.Kernel("y[i] := x[i,j] * w[j] + 0.5", backend="numba")(x, w)  # numba and its target, not counted
    base, start, points = _rss_mib(), time.perf_counter(), []
    for n in range(1, specs + 1):
        y = tullax.Kernel(f"y[i] := x[i,j] * w[j] + {n}.5", backend="numba")(x, w)
        assert y[0] == 4 * (1 + n + 0.5)  # the sum over j of (x*w + n.5)
        if n % every == 0 or n == specs:
            points.append({"specs": n, "rss_growth_mib": round(_rss_mib() - base, 1),
                           "seconds": round(time.perf_counter() - start, 1)})
    return points


def run_mode(setting: str, specs: int, every: int) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="tullax-memory-") as cache:
        env = {**os.environ, "TULLAX_CACHE_DIR": cache, "TULLAX_NUMBA_INPROCESS_COMPILES": setting}
        done = subprocess.run([sys.executable, __file__, "--child", str(specs), "--every", str(every)], env=env,
                              capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--specs", type=int, default=500)
    parser.add_argument("--every", type=int, default=50, help="report the growth after every this many specs")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.every)))
        return
    results = {mode: run_mode(setting, args.specs, args.every) for mode, setting in MODES.items()}
    print(f"{'specs':>6} " + " ".join(f"{mode + ' (MiB, s)':>28}" for mode in MODES))
    for row in zip(*results.values()):
        cells = [f"{point['rss_growth_mib']:>10.1f} MiB {point['seconds']:>8.1f} s" for point in row]
        print(f"{row[0]['specs']:>6} " + " ".join(f"{cell:>28}" for cell in cells))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"machine": platform.platform(), "cpus": os.cpu_count(), "specs": args.specs,
                                   "modes": results}, indent=1))


if __name__ == "__main__":
    main()
