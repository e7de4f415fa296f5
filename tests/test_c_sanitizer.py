"""Memory safety of the c backend: its generated kernels, forward and every gradient step, run under gcc's
AddressSanitizer (``tests/sanitizer.py``), so a read or write one element outside any array stops the child with
the sanitizer's report instead of passing silently.

The specs are the corpus's (``tests/corpus.py``) that reach the C printer's every pattern (register tiles,
strip-mined tiles and their ragged ends, jammed reductions, blocked float32 sums, max/min lanes, narrowed
convolution windows, pad/clamp/mod and indirect positions, scatters and their clearing), at the naive evaluator's
small shapes (checked against it) and at shapes five times larger, where tiles, lanes and blocks are whole
and ragged; and reductions longer than a float32 block (512 terms) and than a lane row. Then the property cases
of ``tests/test_index_safety.py`` (affine and indirect positions near the int64 limits, which Numba runs with
bounds checking on) on the c backend, called eagerly and under jit.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from corpus import CASES_BY_ID
from loop_backends import c_unavailable
from sanitizer import OVERFLOW, asan_env, asan_unavailable
from test_index_safety import _CHILD as AFFINE_CHILD
from test_index_safety import _INDIRECT_CHILD as INDIRECT_CHILD
from test_index_safety import check_affine_results, check_indirect_results, indirect_cases, property_cases

CASE_IDS = (
    "matmul", "batched_matmul", "dist", "conv1d", "strided", "embedding", "row_max", "row_logsumexp",
    "logsumexp_bias", "max_all", "products", "row_norm", "maxpool", "bias_after_reduction", "finaliser_shifted_read",
    "diagonal", "conv_reversed", "conv2d_nchw", "laplace", "mod_shift", "circular_conv", "clamp_smooth",
    "pad_stencil", "full_conv", "upsample_pad_div", "two_indirect", "indirect_shifted_inner", "scatter_indirect",
    "scatter_embedding_grad", "scatter_shift", "scatter_mod", "scatter_pad", "accumulate_matmul",
    "range_clause_symbolic", "explicit_subrange",
)
# (spec, shapes): a float32 sum of more than one block of terms, and max/min rows longer than their lanes
# (and than schedule.STREAM_MIN_BYTES)
LONG = (
    ("s := x[i]", {"x": (3001,)}),
    ("r[i] := A[i,j]*B[j]", {"A": (3, 1100), "B": (1100,)}),
    ("(max) m[i] := x[i,j]", {"x": (5, 1037)}),
    ("(min) m[b,i] := x[b,i,j]", {"x": (2, 7, 2053)}),  # rows long enough to be read 4 at once, and the rest
    ("(min) m[i] := x[i,j]*w[j]", {"x": (3, 70), "w": (70,)}),
    ("(logsumexp) l[i] := x[i,j]", {"x": (4, 531)}),
)
SCALE = 5

_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    sys.path.insert(0, sys.argv[2])
    from loop_backends import run_host
    from tullax import backends
    from tullax.planner.call import kernel_shapes
    from tullax.errors import TullaxError
    from tullax.spec.analyze import analyze
    from tullax.spec.examples import random_inputs, shapes_for
    from tullax.spec.parse import parse_spec
    from tullax.testing.oracle import naive_eval

    c = backends.get("c")
    results = []
    for text, ranges, shapes, scale in json.loads(sys.argv[1]):
        forward = analyze(parse_spec(text), ranges)
        sizes = {name: tuple(n * scale for n in shape) for name, shape in (shapes or shapes_for(forward, 0)).items()}
        try:
            kernels = kernel_shapes(forward, sizes)
        except TullaxError as err:  # the scaled sizes do not fit the spec: nothing runs
            results.append({"spec": str(forward.out), "text": text, "refused": str(err).splitlines()[0]})
            continue
        for _, spec, spec_sizes in kernels:
            try:
                env = random_inputs(spec, spec_sizes, seed=0, dtype=np.float32)
                got = run_host(c, spec, env, "float32")
            except TullaxError as err:
                results.append({"spec": str(spec.out), "text": text, "refused": str(err).splitlines()[0]})
                continue
            result = {"spec": str(spec.out), "text": text, "scale": scale}
            if scale == 1 and np.prod(got.shape) * 50 < 10**6:  # the naive evaluator is Python loops
                want = naive_eval(spec, {k: np.asarray(v, np.float64) for k, v in env.items()})
                result["close"] = bool(np.allclose(got, want, rtol=2e-4, atol=2e-4, equal_nan=True))
            results.append(result)
    print("RESULTS" + json.dumps(results), flush=True)
""")


def _jobs() -> list[list]:
    jobs = []
    for case_id in CASE_IDS:
        case = CASES_BY_ID[case_id]
        ranges = dict(case.ranges) if case.ranges else None
        shapes = {k: list(v) for k, v in case.shapes.items()} if case.shapes else None
        jobs += [[case.spec, ranges, shapes, 1], [case.spec, ranges, shapes, SCALE]]
    return jobs + [[text, None, {k: list(v) for k, v in shapes.items()}, 1] for text, shapes in LONG]


def _sanitized(tmp_path: Path, *args: str, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -c *args`` under the sanitizer, with no report in its stderr."""
    why = asan_unavailable()
    if why:
        pytest.skip(why)
    proc = subprocess.run([sys.executable, "-c", *args], capture_output=True, text=True,
                          env={**asan_env(tmp_path / "cache"), **(extra_env or {})}, timeout=1800)
    assert OVERFLOW not in proc.stderr and "AddressSanitizer" not in proc.stderr, proc.stderr[-4000:]
    return proc


needs_c = pytest.mark.skipif(bool(c_unavailable()), reason=f"c backend: {c_unavailable()}")


@pytest.mark.slow
@needs_c
def test_the_c_kernels_stay_inside_every_array_under_address_sanitizer(tmp_path: Path):
    jobs = _jobs()
    tests_dir = str(Path(__file__).resolve().parent)
    proc = _sanitized(tmp_path, _CHILD, json.dumps(jobs), tests_dir)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS"))[len("RESULTS"):])
    ran = [r for r in results if "refused" not in r]
    assert len(ran) >= 0.9 * len(results), [r for r in results if "refused" in r]
    assert {r["text"] for r in ran} >= {CASES_BY_ID[i].spec for i in CASE_IDS} | {text for text, _ in LONG}
    assert not [r for r in ran if r.get("close") is False], [r for r in ran if r.get("close") is False]
    assert sum(r.get("close") is True for r in ran) >= len(CASE_IDS)


@pytest.mark.slow
@needs_c
def test_the_row_streams_stay_inside_every_array_under_address_sanitizer(tmp_path: Path):
    """The max/min rows read several at once (``$TULLAX_C_STREAMS=1``, not the default): whole tiles of rows,
    the ragged last one and the rows after them."""
    from tullax.backends.c.generate import STREAMS_ENV

    jobs = [[text, None, {k: list(v) for k, v in shapes.items()}, 1] for text, shapes in LONG if "(m" in text]
    tests_dir = str(Path(__file__).resolve().parent)
    proc = _sanitized(tmp_path, _CHILD, json.dumps(jobs), tests_dir, extra_env={STREAMS_ENV: "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS"))[len("RESULTS"):])
    assert {r["text"] for r in results if r.get("close") is True} >= {job[0] for job in jobs}, results


@pytest.mark.slow
@needs_c
def test_affine_positions_near_int64_limits_on_c_under_address_sanitizer(tmp_path: Path):
    cases = property_cases(24) + property_cases(8, seed=1, reduced=True)
    check_affine_results(cases, _sanitized(tmp_path, AFFINE_CHILD, json.dumps(cases), "c"))


@pytest.mark.slow
@needs_c
def test_indirect_positions_near_int64_limits_on_c_under_address_sanitizer(tmp_path: Path):
    # products that wrap around int64 into the array: 3*6148914691236517206 = 2^64 + 2, 2^62*4 = 2^64
    cases = indirect_cases(12) + [{"scale": 3, "const": 0, "values": [6148914691236517206, 1, 0, 2, 3], "n_x": 4},
                                  {"scale": 2**62, "const": 1, "values": [4, 0, -4, 1, 0], "n_x": 4}]
    check_indirect_results(cases, _sanitized(tmp_path, INDIRECT_CHILD, json.dumps(cases), "c"), 1)
