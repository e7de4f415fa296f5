"""``backend="auto"`` against the best XLA formulation (tullax's jnp lowering and the hand-written jnp of
``tullax.benchmarking.idiomatic``), forward and backward, in ONE process with the subjects alternating (in an order
rotated each round), so a burst of load from other processes on a shared machine slows every subject alike (``make
bench`` runs each backend in its own process, one after the other, and needs a quiet machine).

    PYTHONPATH=$PWD python benchmarks/auto_vs_xla.py "Gaussian kernel sum" conv2d --rounds 15

Forward: ``jax.jit`` of the kernel; backward: ``jax.jit`` of the VJP w.r.t. every float input (as the bench). Prints
the median and best wall time and the median process CPU time (every thread) per subject, and auto's ratio (best XLA
/ auto: >= 1 means auto is at least as fast) from each. The planner decides as a fresh process would (a temporary,
empty compile cache, timing on), and its decisions are printed (``tullax explain``)."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help="suite case names (default: all)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="the suite's --quick sizes")
    parser.add_argument("--no-explain", action="store_true")
    parser.add_argument("--numba", action="store_true", help="also time backend='numba' (not in the ratio)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TULLAX_CACHE_DIR", tempfile.mkdtemp(prefix="tullax-autovsxla-"))
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import jax

    import tullax
    from benchmarks.cases import suite
    from tullax.benchmarking.case import differentiable_positions
    from tullax.benchmarking.idiomatic import JNP
    from tullax.benchmarking.worker import device_inputs, plain_lowering, vjp_of

    for case in suite(quick=args.quick, names=args.cases or None):
        kernel = tullax.einsum_kernel(case.spec, backend="auto")
        spec = kernel.ir
        wrt = differentiable_positions(spec)
        values, cotangent = device_inputs(spec, case.shapes, "float32", 0)
        subjects = {"auto": kernel, "xla": plain_lowering(spec)}
        if case.idiomatic:
            subjects["jnp"] = JNP[case.idiomatic]
        if args.numba:
            subjects["numba"] = tullax.einsum_kernel(case.spec, backend="numba")
        calls = {}
        for name, fn in subjects.items():
            fwd, bwd = jax.jit(fn), jax.jit(vjp_of(fn, wrt))
            calls[(name, "fwd")] = (lambda f=fwd: jax.block_until_ready(f(*values)))
            calls[(name, "bwd")] = (lambda b=bwd: jax.block_until_ready(b(cotangent, *values)))
        start = time.perf_counter()
        for call in calls.values():
            call()  # compile, plan, first run
        print(f"== {case.name}  (compiling and planning {time.perf_counter() - start:.1f} s)", flush=True)
        wall: dict = {key: [] for key in calls}
        cpu: dict = {key: [] for key in calls}
        order = list(calls)
        for round_ in range(args.rounds):
            # rotated each round: no subject always runs right after the same other (after a large backward,
            # the next call pays for the memory it left behind)
            for key in order[round_ % len(order):] + order[:round_ % len(order)]:
                call = calls[key]
                t0, c0 = time.perf_counter(), time.process_time()
                call()
                wall[key].append((time.perf_counter() - t0) * 1e3)
                cpu[key].append((time.process_time() - c0) * 1e3)
        for way in ("fwd", "bwd"):
            for name in subjects:
                got, used = wall[(name, way)], cpu[(name, way)]
                print(f"  {way} {name:5s} wall median {statistics.median(got):9.3f} best {min(got):9.3f} ms;  "
                      f"CPU median {statistics.median(used):9.3f} ms")
            ratios = []
            for label, times, pick in (("wall medians", wall, statistics.median), ("wall bests", wall, min),
                                       ("CPU medians", cpu, statistics.median)):
                best = min(pick(times[(n, way)]) for n in subjects if n not in ("auto", "numba"))
                ratios.append(f"{best / pick(times[('auto', way)]):.2f}x ({label})")
            print(f"  {way} auto vs best XLA: " + ", ".join(ratios), flush=True)
        if not args.no_explain:
            shapes = {n: tuple(s) for n, s in case.shapes.items()}
            print("\n".join("  " + line for line in tullax.explain(case.spec, shapes=shapes).splitlines()
                            if "->" in line))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
