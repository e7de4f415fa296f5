"""Programs (issue 50), reverse mode, in process CPU time: ``jax.grad`` of a weighted sum of each program of
benchmarks/programs.py w.r.t. every array input, jitted, for the program under ``fuse="grad"`` (``fused``), the
same with its gradient tails off (``before``: the inputs no gradient program covers run the unfused statements'
gradients, as before the tails) and jnp written by hand, alternating call by call in ONE process (the order
swapped every round), the median CPU time of each (every thread's). Prints jnp / fused and before / fused (> 1: the
fused gradient is faster) and writes benchmarks/results/programs-grad-cpu.json. ``--before-registers 1``: ``before``
is the fused gradient (tails on) without the fused rows' register schedules (``tullax.compiler.fuse.
ROW_STRIP_VECTORS = 0``, ``tullax.printers.c.FOLD_EIGHT = False``: see benchmarks/programs_cpu.py);
``--before-fold-store 1``: the fused gradient (tails on) printed with ``tullax.printers.c.FOLD_STORE = False``.

    PYTHONPATH=$PWD python benchmarks/programs_grad_cpu.py [--rounds 100] [--out FILE] [--before-registers 1]
        [--before-fold-store 1]
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
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "programs-grad-cpu.json"))
    parser.add_argument("--before-registers", type=int, default=0)
    parser.add_argument("--before-fold-store", type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault("TULLAX_CACHE_DIR", tempfile.mkdtemp(prefix="tullax-programs-grad-cpu-"))
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.dirname(here)]
    import jax
    import jax.numpy as jnp
    import numpy as np
    from programs import cases

    from tullax.api.program import ProgramKernel
    from tullax.backends.program_host import host_program
    from tullax.compiler import fuse
    from tullax.printers import c as cprinter

    rng = np.random.default_rng(0)
    results = []
    for name, text, oracle, inputs in cases(rng):
        before = ProgramKernel(text, backend="c", fuse="grad")
        before.fusion.tails = bool(args.before_registers or args.before_fold_store)
        programs = {"fused": ProgramKernel(text, backend="c", fuse="grad"), "before": before, "jnp": oracle}
        weight = rng.normal(size=np.shape(oracle(*inputs))).astype(np.float32)
        wrt = tuple(range(len(inputs)))
        subjects = {label: jax.jit(jax.grad(lambda *a, f=f: jnp.sum(f(*a) * weight), wrt))
                    for label, f in programs.items()}
        want = subjects["jnp"](*inputs)
        for label, fn in subjects.items():  # compile, and check against jnp
            saved = fuse.ROW_STRIP_VECTORS, cprinter.FOLD_EIGHT, cprinter.FOLD_STORE
            if label == "before" and args.before_registers:
                fuse.ROW_STRIP_VECTORS, cprinter.FOLD_EIGHT = 0, False
            if label == "before" and args.before_fold_store:  # the same loop kernels printed otherwise: not the
                cprinter.FOLD_STORE = False                  # fused subject's compiled programs (cached per kernel)
                host_program.cache_clear()
            try:
                found = fn(*inputs)
            finally:
                fuse.ROW_STRIP_VECTORS, cprinter.FOLD_EIGHT, cprinter.FOLD_STORE = saved
                if label == "before":
                    host_program.cache_clear()
            for g, w in zip(found, want):
                assert np.abs(np.asarray(g) - np.asarray(w)).max() <= 1e-3 * max(1.0, np.abs(w).max()), (name, label)
        cpu: dict = {label: [] for label in subjects}
        labels = list(subjects)
        for r in range(args.rounds):
            for label in (labels if r % 2 else labels[::-1]):
                start = time.process_time()
                jax.block_until_ready(subjects[label](*inputs))
                cpu[label].append(time.process_time() - start)
        med = {label: statistics.median(v) for label, v in cpu.items()}
        row = {"program": name, "op": "grad", **{f"{k}_cpu_ms": round(v * 1e3, 4) for k, v in med.items()},
               "cpu_jnp_over_fused": round(med["jnp"] / med["fused"], 2),
               "cpu_jnp_over_before": round(med["jnp"] / med["before"], 2),
               "cpu_before_over_fused": round(med["before"] / med["fused"], 2)}
        results.append(row)
        print(f"{name:10s} grad  cpu: fused {row['fused_cpu_ms']:.3f} ms  before {row['before_cpu_ms']:.3f} ms  "
              f"jnp {row['jnp_cpu_ms']:.3f} ms  jnp/fused x{row['cpu_jnp_over_fused']:.2f}  "
              f"jnp/before x{row['cpu_jnp_over_before']:.2f}  before/fused x{row['cpu_before_over_fused']:.2f}",
              flush=True)
    record = {"backend": "c", "dtype": "float32", "rounds": args.rounds, "before_registers": args.before_registers,
              "before_fold_store": args.before_fold_store,
              "cpus": os.cpu_count(),
              "load_average": os.getloadavg(), "jax": jax.__version__, "results": results}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
