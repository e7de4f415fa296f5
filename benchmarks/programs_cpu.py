"""Programs (issue 50), forward only, in process CPU time: each program of benchmarks/programs.py as a fused
``ProgramKernel`` (``fuse=True``) and as jnp written by hand, both jitted, alternating call by call in ONE process
(the order swapped every round), the median CPU time of each (every thread's: on a machine shared with other work
the wall time waits on the scheduler). Prints jnp / fused (> 1: the fused program is faster) and writes
benchmarks/results/programs-forward-cpu.json. ``--before-row-tile 1``: a third subject, the fused program built
with ``tullax.compiler.fuse.ROW_TILE`` set to 1 (a row per iteration: the form before row tiles), in the same
rounds (before / fused > 1: the row tiles are faster). ``--before-registers 1``: the third subject is the fused
program without its register schedules (``tullax.compiler.fuse.ROW_STRIP_VECTORS = 0``: the values' output rows
not held in registers, the scores' constant factor in every term; ``tullax.printers.c.FOLD_EIGHT = False``: a tile's
sums folded one by one). ``--before-fold-store 1``: the third subject printed with
``tullax.printers.c.FOLD_STORE = False`` (a tile's folded scores scaled and stored one by one, not from one vector).

    PYTHONPATH=$PWD python benchmarks/programs_cpu.py [--rounds 150] [--out FILE] [--before-row-tile 1]
        [--before-registers 1] [--before-fold-store 1]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "programs-forward-cpu.json"))
    parser.add_argument("--before-row-tile", type=int, default=0)
    parser.add_argument("--before-registers", type=int, default=0)
    parser.add_argument("--before-fold-store", type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault("TULLAX_CACHE_DIR", tempfile.mkdtemp(prefix="tullax-programs-cpu-"))
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.dirname(here)]
    import jax
    import numpy as np
    from programs import cases

    from tullax.api.program import ProgramKernel
    from tullax.backends.program_host import host_program
    from tullax.compiler import fuse
    from tullax.printers import c as cprinter

    results = []
    for name, text, oracle, inputs in cases(np.random.default_rng(0)):
        subjects = {"fused": jax.jit(ProgramKernel(text, backend="c")), "jnp": jax.jit(oracle)}
        if args.before_row_tile or args.before_registers or args.before_fold_store:
            subjects["before"] = jax.jit(ProgramKernel(text, backend="c"))
        for label, fn in subjects.items():
            saved = fuse.ROW_TILE, fuse.ROW_STRIP_VECTORS, cprinter.FOLD_EIGHT, cprinter.FOLD_STORE
            if label == "before" and args.before_row_tile:
                fuse.ROW_TILE = args.before_row_tile
            if label == "before" and args.before_registers:
                fuse.ROW_STRIP_VECTORS, cprinter.FOLD_EIGHT = 0, False
            if label == "before" and args.before_fold_store:  # the same loop kernel, printed otherwise: not the
                cprinter.FOLD_STORE = False                  # fused subject's compiled program (cached per kernel)
                host_program.cache_clear()
            try:  # fused (and compiled) at the first call
                jax.block_until_ready(fn(*inputs))
            finally:
                if label == "before":
                    host_program.cache_clear()
                fuse.ROW_TILE, fuse.ROW_STRIP_VECTORS, cprinter.FOLD_EIGHT, cprinter.FOLD_STORE = saved
        cpu: dict = {label: [] for label in subjects}
        labels = list(subjects)
        for r in range(args.rounds):
            for label in (labels if r % 2 else labels[::-1]):
                start = time.process_time()
                jax.block_until_ready(subjects[label](*inputs))
                cpu[label].append(time.process_time() - start)
        med = {label: statistics.median(v) for label, v in cpu.items()}
        row = {"program": name, "op": "forward", **{f"{k}_cpu_ms": round(v * 1e3, 4) for k, v in med.items()},
               "cpu_jnp_over_fused": round(med["jnp"] / med["fused"], 2)}
        if "before" in med:
            row.update(cpu_jnp_over_before=round(med["jnp"] / med["before"], 2),
                       cpu_before_over_fused=round(med["before"] / med["fused"], 2))
        results.append(row)
        print(f"{name:10s} forward  cpu: fused {row['fused_cpu_ms']:.3f} ms  jnp {row['jnp_cpu_ms']:.3f} ms  "
              f"jnp/fused x{row['cpu_jnp_over_fused']:.2f}" + ("" if "before" not in med else
              f"  before {row['before_cpu_ms']:.3f} ms  jnp/before x{row['cpu_jnp_over_before']:.2f}  "
              f"before/fused x{row['cpu_before_over_fused']:.2f}"), flush=True)
    record = {"backend": "c", "dtype": "float32", "rounds": args.rounds, "before_row_tile": args.before_row_tile,
              "before_registers": args.before_registers, "before_fold_store": args.before_fold_store,
              "cpus": os.cpu_count(),
              "load_average": os.getloadavg(), "jax": jax.__version__, "results": results}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
