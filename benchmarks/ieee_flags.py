"""What IEEE values cost the ``c`` backend (issue 44): the benchmark suite's kernels, forward and every gradient
step, compiled in three ways and timed interleaved in one process (``interleaved``: every round times each variant once,
in a rotating and shuffled order, after an untimed call of the same variant; medians, fastest rounds and quartiles;
``--cpu``: CPU time):

  before   the fast-math flags before issue 44 (``-fno-signed-zeros -fassociative-math -freciprocal-math`` on
           top of ours, which let GCC fold NaN*0 to 0) and no ``omp simd`` pragma;
  no-simd  our flags, no pragma: what dropping those flags alone costs;
  after    our flags and what ships: float sums/products along an array's last axis as vector lanes of partial
           sums (``CPrinter.sum_lanes``; plain arithmetic printed on GCC vectors, ``printers/c_vector.py``),
           rows shorter than a vector as half vectors (``c_vector.half_row``), other sum/product loops under
           ``#pragma omp simd reduction``, a scalar loop's calls of vector math (exp) in strips of ``omp simd``
           (``printers/c_math_strips.py``), and GCC's instruction scheduling before register allocation
           (``compile.SCHEDULE_FLAGS``; ``before`` and ``no-simd`` turn it off, as it was).

``before`` and ``no-simd`` print without the sum lanes and the strips of vector math
(``printers/c_math_strips.py``): the printer's ``_sum_lanes`` and ``math_strip_plan`` answer no while they build.

Each variant is its own module in the compile cache (the flags are in its key). Writes
benchmarks/results/ieee_flags.json and .md (``after/before`` per case: below 1 is faster now).

    python benchmarks/ieee_flags.py [--quick] [--repeat N] [--threads N] [CASE ...]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cases import suite  # noqa: E402
from tullax.backends import host  # noqa: E402
from tullax.backends.base import Signature  # noqa: E402
from tullax.backends.c import backend as c_backend  # noqa: E402
from tullax.backends.c import compile as c_compile  # noqa: E402
from tullax.benchmarking.timing import timed  # noqa: E402
from tullax.grad import gradients  # noqa: E402
from tullax.grad.run import gradient_env, run_gradient  # noqa: E402
from tullax.printers import c as c_printer  # noqa: E402
from tullax.spec.examples import make_inputs  # noqa: E402
from tullax.spec.frontend import compile_spec  # noqa: E402

# before and no-simd without the pre-allocation scheduling ours now add (the flags as they were)
_UNSCHEDULED = " ".join(flag.replace("-f", "-fno-", 1) for flag in c_compile.SCHEDULE_FLAGS)
VARIANTS = {"before": (" ".join(c_compile.OLD_FAST_FLAGS) + " " + _UNSCHEDULED, False),
            "no-simd": (_UNSCHEDULED, False), "after": ("", True)}
RESULTS = Path(__file__).parent / "results"
BATCH_MS = 5.0


def _without_simd(source: str) -> str:
    return "\n".join(line for line in source.splitlines() if "#pragma omp simd" not in line) + "\n"


def build(spec, signature: Signature, variant: str):
    """The c backend's host kernel of ``spec`` compiled as ``variant`` says."""
    extra, simd = VARIANTS[variant]
    saved = os.environ.get(c_compile.CFLAGS_ENV)
    os.environ[c_compile.CFLAGS_ENV] = extra
    try:
        base = c_backend._recipe(c_backend.FORWARD)

        def generate(spec, signature):
            if simd:
                return base.generate(spec, signature)
            lanes, strips = c_printer._sum_lanes, c_printer.math_strip_plan
            c_printer._sum_lanes = lambda loop, declared: False  # the printing before the sum lanes
            c_printer.math_strip_plan = lambda loop: None  # and before the strips of vector math
            try:
                kernel, source = base.generate(spec, signature)
            finally:
                c_printer._sum_lanes, c_printer.math_strip_plan = lanes, strips
            return kernel, _without_simd(source)

        recipe = dataclasses.replace(base, options={**base.options, "ieee_variant": variant},
                                     generate=generate, load_cached=None)
        return host.build_module(recipe, spec, signature)
    finally:
        if saved is None:
            os.environ.pop(c_compile.CFLAGS_ENV, None)
        else:
            os.environ[c_compile.CFLAGS_ENV] = saved


def same_code(spec, signature: Signature) -> bool:
    """Whether the C that ships for ``spec`` compiles to the same assembly under the old fast-math flags as under
    ours (the same source, the same scheduling flags, ``-S``): where it does, the IEEE flags cost that kernel
    nothing, and a ratio measured beside it is the printing change's, the scheduling's or the machine's."""
    _, source = c_backend._recipe(c_backend.FORWARD).generate(spec, signature)
    with tempfile.TemporaryDirectory(prefix="tullax-ieee-asm-") as scratch:
        path = Path(scratch) / "kernel.c"
        path.write_text(source, encoding="utf-8")
        texts = []
        for extra in ((), c_compile.OLD_FAST_FLAGS):
            out = path.with_suffix(f".{len(extra)}.s")
            subprocess.run([c_compile.compiler(), *c_compile.flags(), *extra, "-S", "-o", str(out), str(path)],
                           check=True, capture_output=True)
            texts.append([line for line in out.read_text().splitlines()
                          if not line.startswith(("\t.file", "\t.ident"))])
    return texts[0] == texts[1]


def execute(variant: str, kernels: dict, touched: list | None = None):
    """``execute(step, env)`` on ``variant``'s kernels (built once per step); each step run and its signature are
    appended to ``touched`` where given."""
    def run(step, env):
        inputs = [np.asarray(env[name]) for name in step.input_names]
        signature = Signature(tuple(v.dtype.name for v in inputs), "float32")
        if touched is not None:
            touched.append((step, signature))
        key = (variant, step, signature)
        if key not in kernels:
            kernels[key] = build(step, signature, variant)
        shapes = {name: v.shape for name, v in zip(step.input_names, inputs)}
        if step.assign == ":=":
            out = np.zeros(tuple(s.eval(shapes) for s in step.out_shape), np.float32)
        else:
            out = np.array(env[step.out], np.float32, copy=True)
        kernels[key](out, *inputs)
        return out
    return run


def interleaved(runs: dict, call, repeat: int, cpu: bool, seed: int = 0, batch: int = 1) -> dict[str, list[float]]:
    """``repeat`` rounds; each round times every variant once (a batch of ``batch`` calls, read per call), in an
    order that rotates round by round and is shuffled after the first rotation, each timed batch preceded by an
    untimed call of the same variant (so the caches, the branch predictors and the allocator hold that variant's
    own state, never the previous variant's)."""
    order = list(runs)
    rng = random.Random(seed)
    times: dict[str, list[float]] = {variant: [] for variant in runs}
    for round_ in range(repeat):
        shift = round_ % len(order)
        now = order[shift:] + order[:shift]
        if round_ >= len(order):
            rng.shuffle(now)
        for variant in now:
            timing = timed(lambda run=runs[variant]: call(run), 1, warmup=1, batch=batch)
            times[variant].append(timing.cpu_ms[0] if cpu else timing.wall_ms[0])
    return times


def summarise(times: dict[str, list[float]]) -> dict:
    """Per variant the median, the fastest round and the quartiles; ``after/before`` of the medians, and the
    quartiles of the per-round ratio (the two timed within one round: a paired figure, less moved by load)."""
    def quartiles(values):
        q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
        return q[0], q[2]

    median = {v: statistics.median(t) for v, t in times.items()}
    paired = [a / b for a, b in zip(times["after"], times["before"])]
    q1, q3 = quartiles(paired)
    return {"median_ms": median, "ms": {v: min(t) for v, t in times.items()},
            "quartiles_ms": {v: quartiles(t) for v, t in times.items()}, "rounds_ms": times,
            "after/before": median["after"] / median["before"],
            "after/before_min": min(times["after"]) / min(times["before"]),
            "no-simd/before": median["no-simd"] / median["before"],
            "paired_median": statistics.median(paired), "paired_q1": q1, "paired_q3": q3}


def measure(case, repeat: int, cpu: bool = False) -> dict:
    spec = compile_spec(case.spec)[1]
    env = dict(zip(spec.input_names, make_inputs(spec, case.shapes, "float32")))
    kernels: dict = {}
    jobs = {"forward": lambda run: run(spec, env)}
    forward = execute("after", kernels)(spec, env)
    cotangent = np.random.default_rng(1).standard_normal(forward.shape).astype(np.float32)
    genv = gradient_env(spec, env, forward, cotangent)
    for grad in gradients(spec):
        if np.asarray(env[grad.wrt]).dtype.kind == "f":
            jobs[f"grad {grad.wrt}"] = lambda run, grad=grad: run_gradient(grad, spec, genv, run)
    found = {}
    for job, call in jobs.items():
        touched: list = []
        runs = {variant: execute(variant, kernels, touched if variant == "after" else None) for variant in VARIANTS}
        results = {variant: call(run) for variant, run in runs.items()}  # builds, and checks they agree
        same = all(same_code(step, signature) for step, signature in dict.fromkeys(touched))
        for variant, value in results.items():
            np.testing.assert_allclose(value, results["after"], rtol=2e-3, atol=2e-3 * np.abs(value).max(),
                                       err_msg=f"{case.name} {job} {variant}")
        one = min(timed(lambda: call(runs["after"]), 3, warmup=0).wall_ms)
        batch = max(1, min(50, round(BATCH_MS / max(one, 1e-3))))  # a round of at least BATCH_MS: less clock noise
        found[job] = summarise(interleaved(runs, call, repeat, cpu, seed=len(found), batch=batch))
        found[job]["batch"] = batch
        found[job]["same_code"] = same
        r = found[job]
        print(f"{case.name:22s} {job:10s} " + " ".join(f"{v} {t:8.3f}" for v, t in r["median_ms"].items())
              + f" ms (median)  after/before {r['after/before']:.2f} [{r['paired_q1']:.2f}-{r['paired_q3']:.2f}]"
              + ("  (same code under both flags)" if same else ""),
              flush=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the suite's --quick sizes")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None, help="TULLAX_C_THREADS: the kernels' threads")
    parser.add_argument("--cpu", action="store_true", help="CPU time of this process, not wall time: with --threads 1 "
                        "it leaves out the time other work on a shared machine takes the core")
    parser.add_argument("cases", nargs="*")
    args = parser.parse_args()
    if args.threads:
        os.environ["TULLAX_C_THREADS"] = str(args.threads)
    cases = suite(quick=args.quick, names=args.cases or None)
    results = {case.name: measure(case, args.repeat, args.cpu) for case in cases}
    ratios = [job["after/before"] for case in results.values() for job in case.values()]
    command = ("python benchmarks/ieee_flags.py" + (" --quick" if args.quick else "") + f" --repeat {args.repeat}"
               + (f" --threads {args.threads}" if args.threads else "") + (" --cpu" if args.cpu else ""))
    record = {"command": command, "quick": args.quick, "machine": platform.machine(),
              "cores": c_compile.cores(), "compiler": c_compile.identity()["path"], "flags": {
                  v: list(c_compile.flags()) + extra.split() + ([] if simd else ["(no omp simd)"])
                  for v, (extra, simd) in VARIANTS.items()},
              "geomean_after_over_before": float(np.exp(np.mean(np.log(ratios)))), "cases": results}
    name = "ieee_flags-quick" if args.quick else "ieee_flags"
    (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
    clock = "CPU" if args.cpu else "wall"
    lines = [f"# C backend: IEEE flags against the old fast-math flags ({record['command']})", "",
             f"{record['cores']} cores; {clock} time per call in ms, median of {args.repeat} rounds (the fastest "
             "round in brackets). The variants are interleaved: each round times every variant once, in a rotating "
             "then shuffled order, each timed call after an untimed call of the same variant. after/before: the "
             "ratio of the medians (< 1: faster now; what the IEEE flags cost as shipped); paired: the median and "
             "quartiles of the ratio within each round (less moved by a load change between rounds); no-simd/before: "
             "what dropping the fast-math flags alone costs; same code: whether the C that ships compiles to the "
             "same assembly under the old fast-math flags as under ours (`-S`, the same scheduling flags; yes: the "
             "IEEE flags cost that kernel nothing, and its after/before is the printing's, the scheduling's or the "
             "machine's). "
             f"Geometric mean after/before: {record['geomean_after_over_before']:.3f}.", "",
             "| case | kernel | before | no-simd | after | after/before | paired [q1-q3] | no-simd/before "
             "| same code |",
             "|---|---|---|---|---|---|---|---|---|"]
    for case, jobs in results.items():
        for job, r in jobs.items():
            med, best = r["median_ms"], r["ms"]
            cells = " | ".join(f"{med[v]:.3f} ({best[v]:.3f})" for v in VARIANTS)
            lines.append(f"| {case} | {job} | {cells} | {r['after/before']:.2f} "
                         f"| {r['paired_median']:.2f} [{r['paired_q1']:.2f}-{r['paired_q3']:.2f}] "
                         f"| {r['no-simd/before']:.2f} | {'yes' if r['same_code'] else 'no'} |")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print(f"geomean after/before {record['geomean_after_over_before']:.3f}; wrote {RESULTS / name}.json/.md")


if __name__ == "__main__":
    main()
