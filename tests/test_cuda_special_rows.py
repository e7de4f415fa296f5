"""Row max and min in the printed CUDA C, run on the CPU by the host harness: NaN, +inf and -inf at every position
of rows of every length around a warp and a block (with a -0.0 beside each), and rows whose max or min is a zero
(the documented sign of that zero), in the three forms the CUDA printer gives a row reduction: a thread per row,
a warp per row and a block per row (the cooperative merges forced, ``FORCE_WARP``/``FORCE_BLOCK``), float32 and
float64, against NumPy. The same rows run on the loop backends and the printed Julia in test_nan_propagation.

Cost: one g++ build without the thread sanitizer (the kernels of one form and dtype are printed alike at every
length: one each, ~12 in all) and one run of 56 launches (about 1700 rows)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from cuda_harness import GPP, build, run
from special_rows import ROW_REDUCTIONS, assert_zero_contract, every_position, signed_zero_rows
from test_cuda_host import launch_for

from tullax.compiler.cooperate import FORCE_BLOCK, FORCE_WARP, Cooperation
from tullax.printers.cuda import kernel_function
from tullax.spec.frontend import compile_spec

pytestmark = pytest.mark.skipif(GPP is None, reason="g++ is not installed")

FORMS = {"thread": Cooperation(block_from=1 << 62, warp_from=1 << 62), "warp": FORCE_WARP, "block": FORCE_BLOCK}
# A thread per row: few lengths (no lanes). A warp or a block: one element, and one past a warp (33) or past the
# largest block of the harness's geometries (97: blocks of 32, 64 and 96 threads): every thread's slot and a
# ragged merge in each geometry. Their rows put NaN and the infinity that wins (+inf for a max) at every position:
# a block of 64 or 96 OS threads meets at every merge's barrier, so the cost is in the rows
LENGTHS = {"thread": (1, 2, 5), "warp": (1, 33), "block": (1, 97)}
ZERO_LENGTHS = {"thread": (1, 2, 5), "warp": (2, 9), "block": (2, 9)}


def collect():
    """(label, launch, check) for every launch, and the distinct kernels (one per printed source) they run."""
    kernels: dict[str, int] = {}
    built, jobs = [], []
    for spec_text, reference, filler in ROW_REDUCTIONS:
        spec = compile_spec(spec_text)[1]
        for dtype in (np.float32, np.float64):
            for form, cooperation in FORMS.items():
                values = (np.nan, np.inf, -np.inf) if form == "thread" else (np.nan, -filler * np.inf)
                rows_of = [(every_position(n, values), False) for n in LENGTHS[form]]
                rows_of += [(signed_zero_rows(n, filler), True) for n in ZERO_LENGTHS[form]]
                for rows, zero_rows in rows_of:
                    length = rows.shape[1]
                    launch = launch_for(spec, {"x": rows.astype(dtype)}, "k", dtype == np.float64,
                                        cooperation=cooperation)
                    assert launch.kernel.cooperative == (form != "thread"), (form, length)
                    assert launch.kernel.warp == (form == "warp"), (form, length)
                    source = kernel_function(launch.kernel, launch.index_bits)
                    if source not in kernels:
                        kernels[source] = len(built)
                        built.append((replace(launch.kernel, name=f"k{len(built)}"), launch.index_bits))
                    number = kernels[source]
                    launch = replace(launch, kernel=built[number][0])
                    label = f"{spec_text} {np.dtype(dtype).name} {form}, rows of {length}"
                    jobs.append((label + (" (zeros)" if zero_rows else ""), number, launch,
                                 (rows, reference, zero_rows, dtype)))
    return built, jobs


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    built, jobs = collect()
    exe = build(built, tmp_path_factory.mktemp("special-rows"), sanitize=False)
    return built, jobs, run(exe, [(number, launch) for _, number, launch, _ in jobs])


def test_nan_and_infinities_at_every_position_and_the_sign_of_a_zero(results):
    _, jobs, outputs = results
    for (label, _, _, (rows, reference, zero_rows, dtype)), got in zip(jobs, outputs, strict=True):
        if zero_rows:
            assert_zero_contract(got, rows, label)
        else:
            np.testing.assert_array_equal(got, reference(rows).astype(dtype), err_msg=label)


def test_each_form_prints_one_kernel_for_every_length(results):
    """The lengths run on one kernel per form and dtype: the build stays small (a change that bakes a length
    into the printed kernel multiplies it, and this says so)."""
    built, jobs, _ = results
    assert len(built) == len(ROW_REDUCTIONS) * 2 * len(FORMS), len(built)
    assert len(jobs) == 56
