"""The wall time of compiling one spec's gradient-steps module (the c backend's ``STEPS`` part) as 1, 2, ...
translation units compiled at once, nothing else running: what the steps module gains on a machine with cores to
spare (``tullax.backends.c.backend._units``: one unit per core but one, from 3 cores up; one on 2 cores, where the other
core is this process's: its tracing, XLA's compiles, the forward module's compiler).

    python benchmarks/steps_units.py [--cases conv1d Dist] [--units 1 2 3] [--runs 3] [--json out.json]

Each figure is the best of ``--runs`` compiles of the float32 module from the same source (the compiler and
flags of ``tullax.backends.c.compile``, the units interleaved within each run), in this process.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))


def steps_source(spec_text: str) -> tuple[str, int]:
    """The float32 steps module of ``spec_text`` and how many kernels it holds."""
    from tullax.backends.base import Signature
    from tullax.backends.c import backend as c
    from tullax.spec.frontend import compile_spec

    _, spec = compile_spec(spec_text, None)
    signature = Signature.for_dtype(spec, "float32")
    return c.generate_part(spec, signature, c.STEPS)[1], len(c.part_kernels(spec, signature, c.STEPS))


def measure(spec_text: str, units: list[int], runs: int) -> dict:
    from tullax.backends.c import compile as c_compile

    source, kernels = steps_source(spec_text)
    best = {u: float("inf") for u in units}
    with tempfile.TemporaryDirectory(prefix="tullax-steps-units-") as scratch:
        path = Path(scratch) / "kernels.c"
        path.write_text(source)
        for _ in range(runs):
            for u in units:
                start = time.perf_counter()
                c_compile.compile_library(path, Path(scratch) / f"units{u}.so", units=u)
                best[u] = min(best[u], (time.perf_counter() - start) * 1e3)
    return {"kernels": kernels, "ms": {str(u): ms for u, ms in best.items()}}


def main() -> None:
    from cases import suite

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", nargs="*", help="suite cases (default: every case with gradient steps)")
    parser.add_argument("--units", nargs="*", type=int, default=[1, 2, 3])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", default=str(HERE / "results" / "steps_units.json"))
    args = parser.parse_args()
    rows = []
    print("| case | kernels | " + " | ".join(f"{u} unit{'s' * (u > 1)}" for u in args.units) + " |")
    print("|---|---:|" + "---:|" * len(args.units))
    for case in suite(names=args.cases):
        found = measure(case.spec, args.units, args.runs)
        if found["kernels"] < 1:
            continue
        rows.append({"case": case.name, "spec": case.spec, **found})
        cells = " | ".join(f"{found['ms'][str(u)]:.0f} ms" for u in args.units)
        print(f"| {case.name} | {found['kernels']} | {cells} |", flush=True)
    from tullax.backends.c import compile as c_compile

    Path(args.json).write_text(json.dumps({"runs": args.runs, "compiler": c_compile.identity()["path"],
                                           "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
