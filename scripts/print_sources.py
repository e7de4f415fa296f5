"""Print everything the compiler generates for the test corpus, one file per case, so a refactoring can be
checked byte for byte: ``python scripts/print_sources.py OUTDIR`` then ``diff -r BEFORE AFTER``.

Per corpus case: the canonical spec, ``explain``, every gradient spec, the loop IR in pseudo-code (forward and
every gradient step, tiled and untiled), and the whole Numba and Julia (CPU and CUDA) modules in float32 and
float64."""
from __future__ import annotations

import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tullax  # noqa: E402
from tests.corpus import CORPUS, Case, analysed  # noqa: E402
from tullax.backends.base import Signature  # noqa: E402
from tullax.compiler.lower import lower  # noqa: E402
from tullax.errors import TullaxError  # noqa: E402
from tullax.grad import gradients  # noqa: E402
from tullax.printers.pseudo import format_kernel  # noqa: E402


def _attempt(fn) -> str:
    try:
        return fn()
    except TullaxError as err:
        return f"TullaxError: {err}"
    except Exception:  # a crash is part of the output to compare
        return "CRASH:\n" + traceback.format_exc(limit=1)


def case_text(case) -> str:
    parts = []
    spec = analysed(case.spec, case.ranges)
    parts.append(f"== spec\n{spec.text if hasattr(spec, 'text') else case.spec}")
    parts.append("== explain\n" + _attempt(lambda: tullax.explain(case.spec, ranges=case.ranges)))
    try:
        grads = gradients(spec)
    except TullaxError as err:
        grads = ()
        parts.append(f"== gradients\nTullaxError: {err}")
    steps = [("forward", spec)]
    for grad in grads:
        for number, step in enumerate(grad.steps):
            steps.append((f"grad {grad.wrt} step {number}", step))
    for label, step in steps:
        for dtype in ("float32", "float64"):
            for tile in (False, True):
                signature = Signature.for_dtype(step, dtype)
                parts.append(f"== loops {label} {dtype} tile={tile}\n"
                             + _attempt(lambda: format_kernel(lower(step, signature, tile=tile))))
    for backend in ("numba", "julia", "julia-cuda", "cuda"):
        for dtype in ("float32", "float64"):
            parts.append(f"== source {backend} {dtype}\n" + _attempt(
                lambda: tullax.generate_source(case.spec, backend=backend, dtype=dtype, ranges=case.ranges)))
    return "\n\n".join(parts) + "\n"


RANDOM_SPECS = 150  # random valid specs (fixed seeds) beside the corpus: constructs the corpus combines rarely


def main(outdir: str) -> None:
    from tullax.testing.specgen import random_spec

    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    cases = list(CORPUS) + [Case(f"random{seed:03d}", random_spec(seed)) for seed in range(RANDOM_SPECS)]
    for case in cases:
        (out / f"{case.id}.txt").write_text(case_text(case))
    print(f"wrote {len(cases)} cases to {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "sources")
