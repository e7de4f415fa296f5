"""Time to first kernel under two settings of JAX/XLA that tullax never changes, next to `make bench`'s TTFK: JAX's
persistent compilation cache, and XLA's CPU fusion emitters.

Where the planner runs a kernel on XLA (conv2d at its TTFK inputs runs all three of its kernels on
``lax.conv``), tullax's compile cache holds the plan but XLA compiles the program again in every new process,
as it does for any jnp code. JAX can keep compiled programs across processes itself: its persistent compilation
cache, a setting of the user's program that tullax never changes. This script measures what it does to the
warm TTFK, as ``make bench`` measures TTFK (``tullax.benchmarking.worker``'s ``ttfk`` phase, new processes):

* ``cold``: empty tullax cache and empty JAX cache (the JAX cache on);
* ``warm``: the tullax cache populated, the JAX cache off: ``make bench``'s warm TTFK;
* ``warm + JAX cache``: both populated;
* ``cold`` and ``warm`` with ``XLA_FLAGS=--xla_cpu_use_fusion_emitters=false`` (``--xla-flags``): XLA's older CPU
  emitters, which compile each fused loop (the transposes around a convolution) several times faster and may run
  it slower; so this also times the jitted forward and VJP at the TTFK inputs (best of the worker's runs, one new
  process each) with and without the flags.

Each figure is the median of ``--runs`` processes (the warm ones interleaved). The JAX cache is turned on
through JAX's own environment variables (``JAX_COMPILATION_CACHE_DIR``, with its minimum compile time and entry
size at 0: by default JAX keeps only programs that took a second or more to compile)::

    PYTHONPATH=$PWD python benchmarks/ttfk_jax_cache.py [--cases conv2d Dist] [--backends auto jnp] [--runs 5]
        [--xla-flags "--xla_cpu_use_fusion_emitters=false"]

writes ``benchmarks/results/ttfk_jax_cache.json`` and prints a Markdown table.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def jax_cache_env(directory: str) -> dict[str, str]:
    return {"JAX_COMPILATION_CACHE_DIR": directory, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def ttfk_ms(job: dict, cache_dir: str, env: dict[str, str]) -> float:
    from tullax.benchmarking.runner import RunConfig, summarise_warm, ttfk_child

    config = RunConfig(backends=(job["backend"],), extra_env=env)
    found = summarise_warm(ttfk_child(job, cache_dir, config), config.ttfk_timeout_s)
    if "ttfk_warm_error" in found:
        raise SystemExit(f"{job['backend']}: the TTFK child failed: {found['ttfk_warm_error']}")
    return float(found["ttfk_warm_ms"])


def run_ms(job: dict, cache_dir: str, env: dict[str, str]) -> dict[str, float]:
    """The jitted forward and VJP of ``job`` at its TTFK inputs, best of ``repeat`` runs in one new process."""
    from tullax.benchmarking.runner import RunConfig, timing_child

    config = RunConfig(backends=(job["backend"],), extra_env=env)
    return timing_child({**job, "shapes": job["ttfk_shapes"]}, cache_dir, config)


def measure(document: dict, backend: str, runs: int, xla_flags: str) -> dict:
    from tullax.benchmarking.runner import RunConfig, backend_job

    job = backend_job(document, backend, RunConfig(backends=(backend,), repeat=1))
    flags = {"XLA_FLAGS": xla_flags}
    with tempfile.TemporaryDirectory(prefix="tullax-ttfk-jc-") as root:
        tullax_cache, jax_cache, flagged_cache = Path(root, "tullax"), Path(root, "jax"), Path(root, "flags")
        tullax_cache.mkdir()
        flagged_cache.mkdir()
        cold = ttfk_ms(job, str(tullax_cache), jax_cache_env(str(jax_cache)))
        flagged_cold = ttfk_ms(job, str(flagged_cache), flags)
        warm, both, flagged = [], [], []
        for _ in range(runs):
            warm.append(ttfk_ms(job, str(tullax_cache), {}))
            both.append(ttfk_ms(job, str(tullax_cache), jax_cache_env(str(jax_cache))))
            flagged.append(ttfk_ms(job, str(flagged_cache), flags))
        timed = {**job, "repeat": 30}
        plain_run, flagged_run = run_ms(timed, str(tullax_cache), {}), run_ms(timed, str(flagged_cache), flags)
    return {"case": document["name"], "backend": backend, "ttfk_shapes": document["ttfk_shapes"],
            "cold_ms": cold, "warm_ms": statistics.median(warm), "warm_jax_cache_ms": statistics.median(both),
            "warm_samples_ms": warm, "warm_jax_cache_samples_ms": both, "xla_flags": xla_flags,
            "flags_cold_ms": flagged_cold, "flags_warm_ms": statistics.median(flagged),
            "flags_warm_samples_ms": flagged,
            "run_ms": plain_run, "flags_run_ms": flagged_run}


def main() -> None:
    from benchmarks.cases import suite
    from tullax.benchmarking.runner import case_document

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=["conv2d"])
    parser.add_argument("--backends", nargs="*", default=["auto", "jnp"])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--xla-flags", default="--xla_cpu_use_fusion_emitters=false",
                        help="XLA_FLAGS of the last columns")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "ttfk_jax_cache.json"))
    args = parser.parse_args()
    rows = []
    for case in suite(names=args.cases):
        document = case_document(case, "float32")
        for backend in args.backends:
            rows.append(measure(document, backend, max(1, args.runs), args.xla_flags))
            print(_line(rows[-1]), file=sys.stderr, flush=True)
    Path(args.out).write_text(json.dumps({"runs": args.runs, "xla_flags": args.xla_flags, "rows": rows}, indent=1)
                              + "\n")
    print(f"XLA_FLAGS of the last four columns: {args.xla_flags}\n")
    print("| case | backend | TTFK cold | warm | warm + JAX cache | cold, flags | warm, flags | fwd / VJP ms | "
          "fwd / VJP ms, flags |\n|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['case']} | {row['backend']} | {row['cold_ms']:.0f} ms | {row['warm_ms']:.0f} ms | "
              f"{row['warm_jax_cache_ms']:.0f} ms | {row['flags_cold_ms']:.0f} ms | {row['flags_warm_ms']:.0f} ms | "
              f"{_pair(row['run_ms'])} | {_pair(row['flags_run_ms'])} |")


def _pair(times: dict[str, float]) -> str:
    return " / ".join(f"{times[which]:.3f}" if which in times else "-" for which in ("fwd", "bwd"))


def _line(row: dict) -> str:
    return (f"{row['case']} {row['backend']}: cold {row['cold_ms']:.0f} ms, warm {row['warm_ms']:.0f} ms, warm + JAX "
            f"cache {row['warm_jax_cache_ms']:.0f} ms; with the flags cold {row['flags_cold_ms']:.0f} ms, warm "
            f"{row['flags_warm_ms']:.0f} ms; fwd / VJP {_pair(row['run_ms'])} ms, with the flags "
            f"{_pair(row['flags_run_ms'])} ms")


if __name__ == "__main__":
    main()
