"""``tullax demo`` (what ``make demo`` runs): a few kernels, forward and gradients under jit on the default
backend, checked against XLA, with timings and the time to first kernel cold and warm."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DemoCase:
    name: str
    spec: str
    shapes: dict


CASES = (
    DemoCase("Dist", "D[i,j] := (W[k,i] - X[k,j])^2", {"W": (256, 512), "X": (256, 256)}),
    DemoCase("conv1d", "y[b,i] := x[b,i+k]*w[k]", {"x": (16, 4096), "w": (31,)}),
    DemoCase("row logsumexp", "(logsumexp) l[i] := x[i,j]", {"x": (1024, 1024)}),
    DemoCase("row norm", "n[i] := x[i,j]^2 |> sqrt", {"x": (1024, 1024)}),
)


def make_inputs(kernel, shapes: dict, dtype=np.float32, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shapes[name]).astype(dtype) for name in kernel.inputs]


def best_of(fn, repeat: int = 5) -> float:
    """Best wall time of ``repeat`` calls, in milliseconds (the first call is a warm-up)."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def run_case(case: DemoCase, backend: str) -> dict:
    import jax
    import jax.numpy as jnp

    import tullax
    from tullax.backends.xla.lower import lower

    kernel = tullax.einsum_kernel(case.spec, backend=backend)
    args = [jnp.asarray(a) for a in make_inputs(kernel, case.shapes)]
    spec = kernel.ir

    def plain(*xs):
        return lower(spec)(dict(zip(kernel.inputs, xs)))

    argnums = tuple(range(len(args)))
    fwd = jax.jit(kernel)
    bwd = jax.jit(jax.grad(lambda *xs: kernel(*xs).sum(), argnums))
    ref_fwd = jax.jit(plain)
    ref_bwd = jax.jit(jax.grad(lambda *xs: plain(*xs).sum(), argnums))

    out, ref = np.asarray(fwd(*args)), np.asarray(ref_fwd(*args))
    grads, ref_grads = bwd(*args), ref_bwd(*args)
    err = max([_relerr(out, ref)] + [_relerr(g, r) for g, r in zip(grads, ref_grads)])

    def block(f):
        return lambda: jax.block_until_ready(f(*args))

    return {
        "case": case.name, "spec": kernel.spec, "backend": kernel.backend.name,
        "fwd_ms": best_of(block(fwd)), "bwd_ms": best_of(block(bwd)),
        "xla_fwd_ms": best_of(block(ref_fwd)), "xla_bwd_ms": best_of(block(ref_bwd)), "max_rel_err": err,
    }


def _relerr(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-30))


# ---- time to first kernel: measured in fresh processes against an empty and a populated cache --------
def first_kernel_child(spec: str, backend: str) -> None:
    """Runs in a fresh process: forward and all gradients of ``spec`` once, under jit, timed."""
    import jax
    import jax.numpy as jnp

    import tullax

    start = time.perf_counter()
    kernel = tullax.einsum_kernel(spec, backend=backend)
    case = next(c for c in CASES if c.spec == spec)
    small = {name: tuple(min(s, 64) for s in shape) for name, shape in case.shapes.items()}
    args = [jnp.asarray(a) for a in make_inputs(kernel, small)]
    jax.block_until_ready(jax.jit(kernel)(*args))
    jax.block_until_ready(jax.jit(jax.grad(lambda *xs: kernel(*xs).sum(), tuple(range(len(args)))))(*args))
    print(json.dumps({"ttfk_ms": (time.perf_counter() - start) * 1e3}))


def time_to_first_kernel(spec: str, backend: str, cache_dir: str) -> float:
    env = dict(os.environ, TULLAX_CACHE_DIR=cache_dir)
    proc = subprocess.run([sys.executable, "-m", "tullax.cli.demo", "--child", spec, "--backend", backend],
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"time-to-first-kernel child failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["ttfk_ms"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tullax demo", description=__doc__)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        first_kernel_child(args.child, args.backend)
        return 0
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import track
    from rich.table import Table

    import tullax.backends as registry

    console = Console(width=None if sys.stdout.isatty() else 150, highlight=False)
    backend = registry.resolve(args.backend).name
    console.print(f"[bold]tullax demo[/] on backend [cyan]{backend}[/] (XLA is the reference)")
    rows = [run_case(case, backend) for case in track(CASES, description="forward + gradients", console=console)]
    with tempfile.TemporaryDirectory() as cache_dir:
        ttfk = []
        for case in track(CASES, description="time to first kernel (new processes)", console=console):
            cold = time_to_first_kernel(case.spec, backend, cache_dir)
            warm = time_to_first_kernel(case.spec, backend, cache_dir)
            ttfk.append((cold, warm))
    table = Table(title=f"tullax ({backend}) vs XLA, float32, best of 5, CPU")
    for col in ("kernel", "spec", "fwd ms", "XLA fwd", "grad ms", "XLA grad", "grad/fwd", "max rel err",
                "TTFK cold", "TTFK warm"):
        table.add_column(col, justify="left" if col in ("kernel", "spec") else "right")
    for row, (cold, warm) in zip(rows, ttfk):
        table.add_row(row["case"], escape(row["spec"]), f"{row['fwd_ms']:.2f}", f"{row['xla_fwd_ms']:.2f}",
                      f"{row['bwd_ms']:.2f}", f"{row['xla_bwd_ms']:.2f}", f"{row['bwd_ms'] / row['fwd_ms']:.1f}",
                      f"{row['max_rel_err']:.1e}", f"{cold / 1e3:.2f} s", f"{warm / 1e3:.2f} s")
    console.print(table)
    worst = max(r["max_rel_err"] for r in rows)
    console.print(f"all results match XLA within {worst:.1e} relative" if worst < 1e-3
                  else f"[red]results differ from XLA by {worst:.1e}[/]")
    return 0 if worst < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
