"""Padded, strided and dilated convolutions written with ``pad()`` (issue 45): tullax under ``backend`` (auto by
default) against ``lax.conv_general_dilated``, forward and gradient (w.r.t. image and kernel), for three layers:
equinox's Conv1d (stride 2, padding 1, dilation 2), a 3x3 stride-2 padded Conv2d and a "same" 3x3 Conv2d.
float32, jitted, the two interleaved call after call in one process after a warm-up (auto's race included there);
median ms per call (and the best, steadier on a loaded machine). Ratio: lax.conv's time over tullax's (above 1,
tullax is faster). Each tullax result is checked against lax.conv's first.

    .venv/bin/python benchmarks/conv_padded.py [--rounds 15] [--backend auto] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tullax` importable from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS = Path(__file__).resolve().parent / "results" / "conv_padded.json"
# (label, spec, image NC..., kernel OI..., strides, padding, dilation)
LAYERS = [
    ("equinox Conv1d s2 p1 d2", "y[n,o,i] := x[n,c,pad(2i+2k-1)]*w[o,c,k]", (8, 32, 1024), (64, 32, 3), (2,), 1,
     (2,)),
    ("Conv2d 3x3 s2 p1", "y[n,o,h,w] := x[n,c,pad(2h+p-1),pad(2w+q-1)]*k[o,c,p,q]", (8, 32, 64, 64),
     (64, 32, 3, 3), (2, 2), 1, (1, 1)),
    ("Conv2d 3x3 same", "y[n,o,h,w] := x[n,c,pad(h+p-1),pad(w+q-1)]*k[o,c,p,q]", (8, 32, 64, 64),
     (32, 32, 3, 3), (1, 1), 1, (1, 1)),
]


def _median_ms(fns: dict, args: tuple, rounds: int) -> dict:
    import jax

    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            jax.block_until_ready(fn(*args))
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()} | {
        f"{name} best": min(t) for name, t in times.items()}


def layer_row(label: str, text: str, xs: tuple, ks: tuple, strides: tuple, pad: int, dilation: tuple,
              backend: str, rounds: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    import tullax

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal(xs), jnp.float32)
    k = jnp.asarray(rng.standard_normal(ks), jnp.float32)
    dims = ("NCH", "OIH", "NCH") if len(xs) == 3 else ("NCHW", "OIHW", "NCHW")

    def conv(a, b):
        return lax.conv_general_dilated(a, b, strides, [(pad, pad)] * len(strides), rhs_dilation=dilation,
                                        dimension_numbers=dims, precision=lax.Precision.HIGHEST)

    kernel = tullax.einsum_kernel(text, backend=backend)
    first = time.perf_counter()
    got = jax.block_until_ready(jax.jit(kernel)(x, k))
    first_forward_s = time.perf_counter() - first
    want = conv(x, k)
    shape_ok = got.shape == want.shape
    error = float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want))) if shape_ok else None

    def grad_of(f):  # no cotangent of a fixed shape: the layer's output had another shape before issue 45
        return jax.jit(jax.grad(lambda a, b: jnp.sum(jnp.sin(f(a, b))), argnums=(0, 1)))

    first = time.perf_counter()
    jax.block_until_ready(grad_of(kernel)(x, k))
    first_gradient_s = time.perf_counter() - first
    forward = _median_ms({"tullax": jax.jit(kernel), "lax": jax.jit(conv)}, (x, k), rounds)
    gradient = _median_ms({"tullax": grad_of(kernel), "lax": grad_of(conv)}, (x, k), rounds)
    return {"layer": label, "spec": text, "image": xs, "kernel": ks, "output": list(got.shape),
            "lax_output": list(want.shape), "relative_error": error,
            "forward_ms": forward, "gradient_ms": gradient,
            "forward_ratio": forward["lax"] / forward["tullax"], "gradient_ratio": gradient["lax"] / gradient["tullax"],
            "forward_best_ratio": forward["lax best"] / forward["tullax best"],
            "gradient_best_ratio": gradient["lax best"] / gradient["tullax best"],
            "first_forward_s": first_forward_s, "first_gradient_s": first_gradient_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--label", default="", help="what this run measures (kept in the JSON)")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    rows = []
    for layer in LAYERS:
        row = layer_row(*layer, backend=args.backend, rounds=args.rounds)
        rows.append(row)
        print(f"{row['layer']:28s} out {row['output']} (lax {row['lax_output']}) "
              f"forward {row['forward_ratio']:.2f}x gradient {row['gradient_ratio']:.2f}x (best of rounds: "
              f"{row['forward_best_ratio']:.2f}x, {row['gradient_best_ratio']:.2f}x)", flush=True)
    record = {"label": args.label, "backend": args.backend, "rounds": args.rounds, "cpus": os.cpu_count(),
              "rows": rows}
    out = Path(args.out)
    existing = json.loads(out.read_text()) if out.exists() else {"runs": []}
    existing.setdefault("runs", []).append(record)
    out.write_text(json.dumps(existing, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
