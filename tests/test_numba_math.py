"""The vectorisable float32 exp of generated Numba kernels (tullax/backends/numba_math.py) against np.exp in
float64: accuracy over the whole float32 range and np.exp's behaviour at every special value."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")

from numba import njit  # noqa: E402

from tullax.backends.numba.math import exp_f32  # noqa: E402

FLT_MAX = float(np.finfo(np.float32).max)
FLT_TINY = float(np.finfo(np.float32).tiny)  # smallest normal


@njit
def _exp_all(x, out):
    for i in range(x.size):
        out[i] = exp_f32(x[i])


def _exp(x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    _exp_all(x, out)
    return out


def test_relative_error_below_float32_epsilon_over_the_normal_range():
    x = np.linspace(-110.0, 95.0, 1_000_001, dtype=np.float32)
    got, ref = _exp(x).astype(np.float64), np.exp(x.astype(np.float64))
    normal = (ref > FLT_TINY) & (ref < FLT_MAX)
    assert np.max(np.abs(got[normal] - ref[normal]) / ref[normal]) < 1.5e-7
    assert np.all(np.isinf(got[ref > 3.4028236e38]))  # overflow
    tiny = ref <= FLT_TINY
    assert np.max(np.abs(got[tiny] - ref[tiny])) < 4e-45  # subnormal results: within a few 2^-149


@pytest.mark.parametrize("value, expected", [(np.inf, np.inf), (-np.inf, 0.0), (0.0, 1.0), (-0.0, 1.0),
                                             (1.0, np.e), (-1.0, 1 / np.e), (88.72, 3.3931804e38),
                                             (89.0, np.inf), (-104.0, 0.0), (-1e30, 0.0), (1e30, np.inf)])
def test_special_values(value, expected):
    got = float(_exp(np.array([value], np.float32))[0])
    assert got == pytest.approx(expected, rel=1e-6)


def test_nan_stays_nan():
    assert np.isnan(_exp(np.array([np.nan], np.float32))[0])


def test_float32_kernels_use_it_and_float64_kernels_keep_np_exp():
    import tullax

    spec = "(logsumexp) l[i] := x[i,j]"
    assert "_exp_f32(" in tullax.generate_source(spec, backend="numba", dtype="float32")
    float64 = tullax.generate_source(spec, backend="numba", dtype="float64")
    assert "_exp_f32" not in float64 and "np.exp(" in float64
