"""Row streams (``tullax.compiler.schedule.STREAM_ROWS``): the c backend's max/min reductions reading several
contiguous rows at once (``streams``: ``$TULLAX_C_STREAMS=1``), against one row at a time (``rows``: the
default), with ``jnp`` beside them where the case has an idiomatic form, and, with ``--before REV``, the c
backend of commit REV (a git worktree of it: everything as it was then).

    python benchmarks/row_streams.py [--rounds 3] [--calls 60] [--before REV] [--json out.json] [--only "row max"]

Each (case, variant) runs in a new process with an empty compile cache of its own, rounds alternating the
variants, so load from other processes slows all alike. In each process the kernel is called ``--calls`` times on
random inputs on one thread (best call in process CPU time: on a shared machine wall time measures the neighbours)
and then on two (best wall time; the team's spinning would count as CPU time). ``jnp`` is ``jax.jit`` of the
idiomatic formulation in its own process (XLA picks its own threads; its one-thread figure is not taken).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = (  # name, spec, shapes, the jnp formulation (over the inputs in spec order) or None
    ("row max (make bench)", "(max) m[i] := x[i,j]", {"x": (4096, 4096)}, "jnp.max(x, axis=1)"),
    ("row max (TTFK size)", "(max) m[i] := x[i,j]", {"x": (1024, 1024)}, "jnp.max(x, axis=1)"),
    ("row min, batched", "(min) m[b,i] := x[b,i,j]", {"x": (64, 256, 256)}, "jnp.min(x, axis=2)"),
    ("row max, rows of 12", "(max) m[i] := x[i,j]", {"x": (65536, 12)}, "jnp.max(x, axis=1)"),
    ("max of |x - y|", "(max) m[i] := abs(x[i,j] - y[j])", {"x": (4096, 4096), "y": (4096,)},
     "jnp.max(jnp.abs(x - y), axis=1)"),
    ("max pool, window 3, stride 2", "(max) m[b,i] := x[b,2i+k]", {"x": (256, 16385)}, None),
)
VARIANTS = ("rows", "streams", "jnp")  # and "before" with --before

CHILD = r"""
import json, os, sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
text, shapes, variant, calls, jnp_text = (sys.argv[2], json.loads(sys.argv[3]), sys.argv[4], int(sys.argv[5]),
                                          sys.argv[6])
shapes = {k: tuple(v) for k, v in shapes.items()}
from tullax.spec.frontend import compile_spec
_, spec = compile_spec(text, {"k": 3} if "2i+k" in text else None)
rng = np.random.default_rng(0)
inputs = [rng.standard_normal(shapes[n]).astype(np.float32) for n in spec.input_names]

def timed(call):
    call()
    wall, cpu = [], []
    for _ in range(calls):
        t, u = time.perf_counter(), time.process_time()
        call()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - u)
    return min(wall) * 1e3, min(cpu) * 1e3

if variant == "jnp":
    import jax, jax.numpy as jnp
    f = jax.jit(eval("lambda " + ", ".join(spec.input_names) + ": " + jnp_text))
    args = [jnp.asarray(a) for a in inputs]
    wall, _ = timed(lambda: f(*args).block_until_ready())
    print(json.dumps({"two_wall_ms": wall}))
    raise SystemExit
from tullax.backends.c import backend as c
from tullax.backends.c.generate import STREAMS_ENV
from tullax.backends.base import Signature
if variant == "streams":  # the c backend's kernels read several long rows at once
    os.environ[STREAMS_ENV] = "1"
signature = Signature.for_dtype(spec, "float32")
start = time.perf_counter()
kernel = c.CBackend().build(spec, signature)
compile_s = time.perf_counter() - start
out = np.zeros(tuple(int(s.eval(shapes)) for s in spec.out_shape), np.float32)
source = c.generate_part(spec, signature, "forward")[1]
c.threads = lambda: 1
kernel._threads.clear()
_, one_cpu = timed(lambda: kernel(out, *inputs))
c.threads = lambda: 2
kernel._threads.clear()
two_wall, _ = timed(lambda: kernel(out, *inputs))
print(json.dumps({"compile_s": compile_s, "one_cpu_ms": one_cpu, "two_wall_ms": two_wall,
                  "streams": "_r0" in source, "teams": sorted(kernel.teams_run)}))
"""


def run(text: str, shapes: dict, variant: str, calls: int, jnp_text: str | None, before: Path | None) -> dict:
    env = dict(os.environ, TULLAX_CACHE_DIR=tempfile.mkdtemp(prefix="tullax-streams-"))
    root = before if variant == "before" else ROOT
    done = subprocess.run([sys.executable, "-c", CHILD, str(root), text, json.dumps(shapes), variant, str(calls),
                           jnp_text or ""], env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{variant} of {text!r} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--only", help="the cases whose name contains this")
    parser.add_argument("--before", help="also the c backend of this commit (a git worktree of it)")
    args = parser.parse_args(argv)
    before = _worktree(args.before) if args.before else None
    try:
        return _run(args, before)
    finally:
        if before is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)], check=False,
                           capture_output=True)


def _run(args: argparse.Namespace, before: Path | None) -> int:
    rows = []
    first = ["before"] if before else []
    print("| case | shapes | 1 thread, CPU ms: " + " | ".join(first + ["rows", "streams"]) + " | speed-up "
          "| 2 threads, wall ms: " + " | ".join(first + ["rows", "streams", "jnp"]) + " | vs jnp |")
    print("|---|---|" + "---:|" * (2 * len(first) + 7))
    for name, text, shapes, jnp_text in CASES:
        if args.only and args.only not in name:
            continue
        variants = tuple(first) + (VARIANTS if jnp_text else VARIANTS[:2])
        found: dict[str, list[dict]] = {v: [] for v in variants}
        for round_ in range(args.rounds):
            order = variants if round_ % 2 == 0 else tuple(reversed(variants))
            for variant in order:
                found[variant].append(run(text, shapes, variant, args.calls, jnp_text, before))
        one = {v: min(r["one_cpu_ms"] for r in found[v]) for v in variants if v != "jnp"}
        two = {v: min(r["two_wall_ms"] for r in found[v]) for v in variants}
        rows.append({"case": name, "spec": text, "shapes": shapes, "streams": found["streams"][0]["streams"],
                     "one_thread_cpu_ms": one, "two_threads_wall_ms": two, "runs": found})
        shown = ", ".join(f"{k} {'x'.join(map(str, v))}" for k, v in shapes.items())
        base = "before" if before else "rows"
        cells = [f"{one[v]:.3f}" for v in first + ["rows", "streams"]] + [f"{one[base] / one['streams']:.2f}x"]
        cells += [f"{two[v]:.3f}" for v in first + ["rows", "streams"]]
        cells += [f"{two['jnp']:.3f}", f"{two['jnp'] / two['streams']:.2f}x"] if "jnp" in two else ["", ""]
        print(f"| {name} | {shown} | " + " | ".join(cells) + " |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": args.rounds, "calls": args.calls, "before": args.before,
                                               "rows": rows}, indent=1))
    return 0


def _worktree(rev: str) -> Path:
    """A git worktree of ``rev`` in a temporary folder (detached; removed when the run ends)."""
    path = Path(tempfile.mkdtemp(prefix="tullax-before-")) / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev], check=True,
                   capture_output=True)
    return path


if __name__ == "__main__":
    raise SystemExit(main())
