"""The chunked GPU scan (issue 48, ``tullax/compiler/scan_chunks.py``) against a thread per lane walking ``t`` and
``lax.scan``, on jax issue 19498's recurrence ``h = lam*h + x`` (from h0) with few lanes and a long ``t``.

For each (batch, state, T): the CUDA-event device time of the forward kernel and of the gradient's adjoint scan
(the reverse scan ``gh``), each built chunked (the default) and a thread per lane (``TULLAX_CUDA_SCAN_CHUNKS=0``),
in one process; and the pipelined milliseconds per call of the jitted forward and ``grad`` (w.r.t. lam, x, h0) of
tullax's cuda backend (chunked) and of ``lax.scan``. Ratios > 1: the chunked kernel is faster. Writes
scan-gpu-<device>.{json,md} to ``--out-dir``.

    PYTHONPATH=$PWD python benchmarks/scan_gpu.py [--lengths 1024 4096 16384 65536] [--out-dir DIR]
    PYTHONPATH=$PWD python benchmarks/scan_gpu.py --dry-run     # no GPU: the schedules, NVRTC for sm_90

``--dry-run`` needs no GPU: it lowers every kernel both ways, checks the schedule each gets, compiles them with
NVRTC (when it loads) and prints the plan; scripts/gpu_session.sh --dry-run runs it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

SPEC = "h[b,t,n] := lam[n]*h[b,t-1,n] + x[b,t,n]  (t scan from h0)"
LANES = ((1, 16), (16, 64))  # (batch, state): 16 and 1024 lanes
LENGTHS = (1024, 4096, 16384, 65536)
ENV = "TULLAX_CUDA_SCAN_CHUNKS"


def shapes(batch: int, state: int, steps: int) -> dict:
    return {"lam": (state,), "x": (batch, steps, state), "h0": (batch, state)}


def scans(batch: int, state: int, steps: int, dtype: str = "float32") -> list[dict]:
    """The kernels that walk ``t`` (the forward and the adjoint scan) with their shapes (gpu_device.kernel_work)."""
    from gpu_device import kernel_work

    found: list[dict] = []
    for work in kernel_work(SPEC, shapes(batch, state, steps), dtype):
        # every gradient runs the same adjoint scan first: one of each
        if work["spec"].scan is not None and all(work["spec"] != w["spec"] for w in found):
            found.append(work)
    return [{**work, "label": label} for label, work in zip(("forward", "adjoint"), found)]


def lowered(work: dict, chunked: bool, dtype: str = "float32"):
    from tullax.backends.base import Signature
    from tullax.backends.cuda.launch import device_lowering

    previous = os.environ.get(ENV)
    os.environ[ENV] = "1024" if chunked else "0"
    try:
        spec = work["spec"]
        return device_lowering(spec, Signature.for_dtype(spec, dtype), {**work["shapes"], spec.out: work["out_shape"]},
                               "kernel")
    finally:
        if previous is None:
            del os.environ[ENV]
        else:
            os.environ[ENV] = previous


def dry_run(lengths: list[int]) -> int:
    """The schedule of every kernel both ways, and an NVRTC build of each for sm_90 where NVRTC loads."""
    try:
        from tullax.backends.cuda import compile as cuda_compile

        cuda_compile.nvrtc()
    except Exception as err:  # noqa: BLE001 - the dry run goes on without NVRTC
        print(f"NVRTC not loaded ({err}): schedules only")
        cuda_compile = None
    from tullax.printers.cuda import print_module

    failed = 0
    for batch, state in LANES:
        for steps in lengths:
            for work in scans(batch, state, steps):
                for chunked in (True, False):
                    kernel, plan = lowered(work, chunked)
                    ok = kernel.cooperative == chunked
                    compiled = ""
                    if cuda_compile is not None:
                        cuda_compile.compile_with_report(print_module([(kernel, plan.index_bits)]), "sm_90")
                        compiled = ", NVRTC sm_90 ok"
                    failed += not ok
                    print(f"B={batch} N={state} T={steps} {work['label']}: "
                          f"{'chunked' if chunked else 'thread per lane'} -> grid {plan.grid} x block {plan.block}"
                          f"{compiled}{'' if ok else '  UNEXPECTED SCHEDULE'}")
    return 1 if failed else 0


def measure(lengths: list[int], rounds: int, done) -> list[dict]:
    import jax
    import jax.numpy as jnp
    from gpu_device import event_ms, pipelined_ms

    import tullax
    from tullax.backends.base import Signature
    from tullax.backends.cuda.backend import device_kernel

    def scan(lam, x, h0):
        def step(h, xt):
            h = lam * h + xt
            return h, h
        _, hs = jax.lax.scan(step, h0, jnp.moveaxis(x, 1, 0))
        return jnp.moveaxis(hs, 0, 1)

    kernel = tullax.einsum_kernel(SPEC, backend="cuda")
    rows = []
    for batch, state in LANES:
        for steps in lengths:
            rng = np.random.default_rng(0)
            args = (jnp.asarray(rng.uniform(0.9, 0.999, state), jnp.float32),
                    jnp.asarray(rng.normal(size=(batch, steps, state)), jnp.float32),
                    jnp.asarray(rng.normal(size=(batch, state)), jnp.float32))
            row: dict[str, Any] = {"batch": batch, "state": state, "T": steps}
            for work in scans(batch, state, steps):
                spec = work["spec"]
                env = {"lam": args[0], "x": args[1], "h0": args[2]}
                values = [env[n] if n in env else jnp.asarray(rng.normal(size=work["shapes"][n]), jnp.float32)
                          for n in spec.input_names]
                for chunked in (True, False):
                    os.environ[ENV] = "1024" if chunked else "0"
                    try:
                        built = device_kernel(spec, Signature.for_dtype(spec, "float32"),
                                              {**work["shapes"], spec.out: work["out_shape"]})
                        out = jnp.zeros(work["out_shape"], jnp.float32)
                        key = f"{work['label']}_{'chunked' if chunked else 'per_lane'}_ms"
                        row[key] = min(event_ms(built, out, values, launches=20) for _ in range(rounds))
                    except Exception as err:  # noqa: BLE001 - a row records what failed and the run goes on
                        row[f"{work['label']}_error"] = f"{type(err).__name__}: {err}"[:300]
                    finally:
                        os.environ.pop(ENV, None)

            def loss(fn):
                return jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a) * a[1]), argnums=(0, 1, 2)))

            calls = max(2, min(20, 20 * 4096 // steps))  # lax.scan steps t from the host side: ~0.5 s a call at 65536
            for name, fn in (("tullax", kernel), ("lax.scan", scan)):
                try:
                    row[f"{name}_forward_ms"] = min(pipelined_ms(jax.jit(fn), args, calls) for _ in range(rounds))
                    row[f"{name}_grad_ms"] = min(pipelined_ms(loss(fn), args, calls) for _ in range(rounds))
                except Exception as err:  # noqa: BLE001
                    row[f"{name}_error"] = f"{type(err).__name__}: {err}"[:300]
            print(row, flush=True)
            rows.append(row)
            done(rows)  # written after every row: a step stopped by its time cap keeps what it measured
    return rows


def markdown(rows: list[dict], device: str) -> str:
    lines = [f"# Chunked scan on {device}", "",
             "| B x N | T | forward chunked ms | per lane ms | ratio | adjoint chunked ms | per lane ms | ratio | "
             "tullax fwd ms | lax.scan fwd ms | tullax grad ms | lax.scan grad ms |", "|" + "---|" * 12]

    def cell(row, key):
        value = row.get(key)
        return f"{value:.4f}" if isinstance(value, float) else "-"

    def ratio(row, slow, fast):
        a, b = row.get(slow), row.get(fast)
        return f"{a / b:.1f}" if isinstance(a, float) and isinstance(b, float) and b > 0 else "-"

    for row in rows:
        fwd, adj = "forward", "adjoint"
        lines.append(f"| {row['batch']} x {row['state']} | {row['T']} | {cell(row, fwd + '_chunked_ms')} | "
                     f"{cell(row, fwd + '_per_lane_ms')} | {ratio(row, fwd + '_per_lane_ms', fwd + '_chunked_ms')} | "
                     f"{cell(row, adj + '_chunked_ms')} | {cell(row, adj + '_per_lane_ms')} | "
                     f"{ratio(row, adj + '_per_lane_ms', adj + '_chunked_ms')} | {cell(row, 'tullax_forward_ms')} | "
                     f"{cell(row, 'lax.scan_forward_ms')} | {cell(row, 'tullax_grad_ms')} | "
                     f"{cell(row, 'lax.scan_grad_ms')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="*", default=list(LENGTHS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dry-run", action="store_true", help="no GPU: schedules and NVRTC builds only")
    parser.add_argument("--out-dir", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    if args.dry_run:
        return dry_run(args.lengths)
    import jax

    device = jax.devices()[0].device_kind
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = "scan-gpu-" + "".join(c if c.isalnum() else "-" for c in device.lower())

    def done(rows: list[dict]) -> None:
        (out / f"{stem}.json").write_text(json.dumps({"device": device, "spec": SPEC, "rows": rows}, indent=1))
        (out / f"{stem}.md").write_text(markdown(rows, device))

    print(markdown(measure(args.lengths, args.rounds, done), device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
