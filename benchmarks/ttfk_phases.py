"""Where a cold first kernel's time goes (issue 45, item 5): for one held-out spec of ``ttfk_tiers.py``, each
configuration runs in a new process with a new empty compile cache, makes its kernel and calls its jitted forward
and its jitted VJP w.r.t. every float input once (as ``ttfk_tiers.py`` does), and reports, summed over that window:
jax's own phases (``jax.monitoring``: tracing to a jaxpr, lowering to MLIR, XLA's compile), the process CPU time,
how many modules it imported (and which of tullax's), how many XLA programs it compiled and the size of the VJP's
optimised HLO (instructions). ``--profile N``: also the N tullax functions of most cumulative time (cProfile).

Configurations: ``xla`` (ttfk_tiers' reference: jax.jit of tullax's plain jnp lowering, differentiated by jax),
``xla-backend`` (``backend="xla"``: tullax's primitive, its derived gradient steps on XLA), ``auto``; with
``--before DIR`` (a checkout of an earlier commit), ``auto before`` too. Rounds interleave the configurations.

    PYTHONPATH=$PWD python benchmarks/ttfk_phases.py [--spec "gaussian distance"] [--reps 3] [--before DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
MARK = "@@ttfk-phases "
PHASES = {"/jax/core/compile/jaxpr_trace_duration": "trace", "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
          "/jax/core/compile/backend_compile_duration": "compile"}


def child(job: dict) -> dict:
    import jax
    import jax.monitoring

    import tullax
    from tullax.benchmarking.worker import block, device_inputs, differentiable_positions, plain_lowering, vjp_of
    from tullax.spec.frontend import compile_spec

    _, spec = compile_spec(job["spec"])
    args, cotangent = device_inputs(spec, job["shapes"], "float32", 0)
    phases: dict[str, float] = {}
    counts: dict[str, int] = {}

    def heard(event: str, seconds: float, **_: object) -> None:
        name = PHASES.get(event)
        if name is not None:
            phases[name] = phases.get(name, 0.0) + seconds * 1e3
            counts[name] = counts.get(name, 0) + 1

    jax.monitoring.register_event_duration_secs_listener(heard)
    before = set(sys.modules)
    profiler = None
    if job["profile"]:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    cpu, start = time.process_time(), time.perf_counter()
    if job["config"] == "xla":
        forward = plain_lowering(spec)
    else:
        forward = tullax.einsum_kernel(job["spec"], backend="xla" if job["config"] == "xla-backend" else "auto")
    fwd, bwd = jax.jit(forward), jax.jit(vjp_of(forward, differentiable_positions(spec)))
    block(fwd(*args))
    forward_ms = (time.perf_counter() - start) * 1e3
    block(bwd(cotangent, *args))
    wall, cpu = (time.perf_counter() - start) * 1e3, (time.process_time() - cpu) * 1e3
    top = []
    if profiler is not None:
        import pstats

        profiler.disable()
        stats = pstats.Stats(profiler)
        rows = [(v[3], f"{k[0].split('tullax/')[-1]}:{k[1]}:{k[2]}") for k, v in stats.stats.items()
                if "/tullax/" in k[0]]
        top = [f"{ms * 1e3:.0f} ms {where}" for ms, where in sorted(rows, reverse=True)[:job["profile"]]]
    new = sorted(set(sys.modules) - before)
    hlo = bwd.lower(cotangent, *args).compile().as_text()
    return {"wall_ms": wall, "fwd_ms": forward_ms, "cpu_ms": cpu, **{f"{k}_ms": v for k, v in phases.items()},
            **{f"{k}_n": v for k, v in counts.items()}, "modules": len(new),
            "tullax_modules": [m for m in new if m.startswith("tullax")],
            "hlo_instructions": sum(1 for line in hlo.splitlines() if " = " in line), "top": top}


def run_child(job: dict, code: Path = REPO) -> dict:
    from ttfk_tiers import run_script_child

    return run_script_child(__file__, MARK, job, {}, code)


def main() -> None:
    from ttfk_tiers import HELD_OUT

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spec", nargs="*", default=["gaussian distance"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--profile", type=int, default=0)
    parser.add_argument("--before", help="a checkout of the code to compare with (auto)")
    parser.add_argument("--out", help="a JSON file for the records")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(MARK + json.dumps(child(json.loads(args.child))), flush=True)
        return
    configs = [("xla", "xla", REPO), ("xla-backend", "xla-backend", REPO), ("auto", "auto", REPO)]
    if args.before:
        configs.append(("auto before", "auto", Path(args.before).resolve()))
    record: dict = {"before": args.before, "reps": args.reps, "results": {}}
    for name in args.spec:
        text, tiny, _ = HELD_OUT[name]
        runs = record["results"].setdefault(name, {label: [] for label, *_ in configs})
        for _ in range(args.reps):
            for label, config, code in configs:
                found = run_child({"spec": text, "shapes": tiny, "config": config, "profile": args.profile}, code)
                runs[label].append(found)
                print(name, label, json.dumps({k: v for k, v in found.items() if k != "tullax_modules"}), flush=True)
    record["load_after"] = os.getloadavg()
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1))
    keys = ("wall_ms", "cpu_ms", "trace_ms", "lower_ms", "compile_ms", "compile_n", "modules", "hlo_instructions")
    print("\n| spec | config | " + " | ".join(f"median {k}" for k in keys) + " | CPU / xla's |")
    print("|---|---|" + "---:|" * (len(keys) + 1))
    for name, runs in record["results"].items():
        xla_cpu = statistics.median(r["cpu_ms"] for r in runs["xla"])
        for label, found in runs.items():
            cells = [f"{statistics.median(r.get(k, 0) for r in found):.0f}" for k in keys]
            cpu = statistics.median(r["cpu_ms"] for r in found)
            print(f"| {name} | {label} | " + " | ".join(cells) + f" | {cpu / xla_cpu:.2f} |")


if __name__ == "__main__":
    main()
