"""XLA's CPU convolution with and without padding, and what tullax's convolution form costs XLA to compile with
and without its own layout changes: the two measurements behind the planner's 'conv-padded' candidate and the
FFI layout change of ``tullax.backends.xla.forms._conv``.

* **padding**: ``lax.conv_general_dilated`` of NCHW float32 arrays with 'VALID' padding against the same call with
  one element of padding at the end of the first spatial axis and that output row cut off again (the very same
  numbers, checked), at a few shapes; jitted, alternated call after call in one process, median ms per call.
  On jaxlib 0.10.2's CPU client a convolution without any padding takes another path, several times slower at
  some shapes and a little faster at others: hence a candidate the planner races, not a rewrite.
* **compile**: the forward program of tullax's 'conv' form at conv2d's TTFK inputs (x 2x32x32x32, k
  32x32x3x3), compiled by XLA in a new process each time: with the layout changes as custom calls of the c
  backend's FFI handler (what runs on the CPU where the handler builds) and as XLA's own transposes.

    .venv/bin/python benchmarks/conv_padding.py [--rounds 15] [--compiles 3] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tullax` importable from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS = Path(__file__).resolve().parent / "results" / "conv_padding.json"
# (label, image NCHW, kernel OIHW, strides)
SHAPES = [
    ("conv2d suite 8x32x64x64, 32x32x3x3", (8, 32, 64, 64), (32, 32, 3, 3), (1, 1)),
    ("conv2d TTFK 2x32x32x32, 32x32x3x3", (2, 32, 32, 32), (32, 32, 3, 3), (1, 1)),
    ("16x64x56x56, 64x64x3x3", (16, 64, 56, 56), (64, 64, 3, 3), (1, 1)),
    ("4x128x28x28, 128x128x3x3", (4, 128, 28, 28), (128, 128, 3, 3), (1, 1)),
    ("1x3x224x224, 64x3x7x7, stride 2", (1, 3, 224, 224), (64, 3, 7, 7), (2, 2)),
    ("1x16x256x256, 16x16x5x5", (1, 16, 256, 256), (16, 16, 5, 5), (1, 1)),
    ("8x32x64x64, 64x32x1x1", (8, 32, 64, 64), (64, 32, 1, 1), (1, 1)),
]
CONV2D = "y[n,o,h,w] := x[n,c,h+p,w+q]*k[o,c,p,q]"


def padding_row(label: str, image: tuple, kernel: tuple, strides: tuple, rounds: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal(image), jnp.float32)
    k = jnp.asarray(rng.standard_normal(kernel), jnp.float32)
    rows = (image[2] - kernel[2]) // strides[0] + 1
    exact = lax.Precision.HIGHEST
    forms = {
        "valid": jax.jit(lambda a, b: lax.conv_general_dilated(a, b, strides, "VALID", precision=exact)),
        "padded": jax.jit(lambda a, b: lax.conv_general_dilated(a, b, strides, [(0, 1), (0, 0)],
                                                                precision=exact)[:, :, :rows]),
    }
    same = bool(np.array_equal(np.asarray(forms["valid"](x, k)), np.asarray(forms["padded"](x, k))))
    times: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(rounds):
        for name, fn in forms.items():
            jax.block_until_ready(fn(x, k))
            start = time.perf_counter()
            for _ in range(3):
                jax.block_until_ready(fn(x, k))
            times[name].append((time.perf_counter() - start) / 3 * 1e3)
    valid, padded = statistics.median(times["valid"]), statistics.median(times["padded"])
    return {"shape": label, "valid_ms": valid, "padded_ms": padded, "valid_over_padded": valid / padded,
            "same_numbers": same}


def compile_child(layout: str) -> float:
    """One new process: ms XLA took to compile the 'conv' form's forward program at conv2d's TTFK inputs."""
    import jax

    from tullax.backends import ffi
    from tullax.backends.xla import forms as xla_forms
    from tullax.spec.frontend import compile_spec

    if layout == "xla":
        ffi.permute_available = lambda: False  # XLA's own transposes, as on a machine without the handler
    elif not ffi.permute_available():
        raise SystemExit("no FFI handler here")
    _, spec = compile_spec(CONV2D)
    env = {"x": jax.ShapeDtypeStruct((2, 32, 32, 32), "float32"), "k": jax.ShapeDtypeStruct((32, 32, 3, 3), "float32")}
    lowered = jax.jit(xla_forms.lower_form(spec, "conv")).lower(env)
    start = time.perf_counter()
    lowered.compile()
    return (time.perf_counter() - start) * 1e3


def compile_ms(layout: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    done = subprocess.run([sys.executable, __file__, "--compile-child", layout], capture_output=True, text=True,
                          env=env, timeout=300, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--compiles", type=int, default=3, help="new processes per layout")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--compile-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.compile_child:
        print(compile_child(args.compile_child))
        return
    import jax

    rows = []
    print("| shape | VALID ms | padded ms | VALID / padded | same numbers |\n|---|---:|---:|---:|---|")
    for label, image, kernel, strides in SHAPES:
        row = padding_row(label, image, kernel, strides, args.rounds)
        rows.append(row)
        print(f"| {label} | {row['valid_ms']:.3f} | {row['padded_ms']:.3f} | {row['valid_over_padded']:.2f}x | "
              f"{row['same_numbers']} |", flush=True)
    compiles = {layout: [] for layout in ("ffi", "xla")}
    for _ in range(args.compiles):
        for layout in compiles:
            compiles[layout].append(compile_ms(layout))
    print(f"\nconv form's forward program, compiled at conv2d's TTFK inputs (median of {args.compiles} processes): "
          f"layout changes as FFI calls {statistics.median(compiles['ffi']):.1f} ms, as XLA transposes "
          f"{statistics.median(compiles['xla']):.1f} ms")
    record = {"jax": jax.__version__, "rounds": args.rounds, "padding": rows, "compile_ms": compiles}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
