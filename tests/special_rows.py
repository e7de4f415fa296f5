"""Rows that test a row max/min where each printed form can go wrong: NaN, +inf and -inf at every position of
every length (every lane of a vector, every slot of a remainder, every thread of a cooperative merge), and rows
whose max or min is a zero, against the documented contract for the sign of that zero (docs/language.md): where
the row's zeros all have one sign, the result has it; where they mix, it is a zero of either sign.

Shared by the loop backends' tests (test_nan_propagation), the printed Julia's and the printed CUDA C's
(test_cuda_special_rows)."""
from __future__ import annotations

import numpy as np

# (spec, NumPy reference, the filler beside the zeros of a zero row: below a max's zero, above a min's)
ROW_REDUCTIONS = [("(max) m[i] := x[i,j]", lambda x: x.max(1), -1.0), ("(min) m[i] := x[i,j]", lambda x: x.min(1), 1.0)]


def every_position(length: int, values: tuple[float, ...] = (np.nan, np.inf, -np.inf)) -> np.ndarray:
    """Rows of ``length`` values: row r holds a NaN at position r, row length + r +inf, row 2*length + r -inf (or
    each of ``values`` in turn), and a -0.0 beside it: every position of every lane, vector and remainder of a
    max/min row's lanes."""
    x = np.random.default_rng(length).random((len(values) * length, length)) - 0.5
    for r in range(length):
        for block, value in enumerate(values):
            x[block * length + r, r] = value
            x[block * length + r, (r + 1) % length] = -0.0 if length > 1 else value
    return x


def signed_zero_rows(length: int, filler: float) -> np.ndarray:
    """Rows of ``length`` whose max (``filler`` < 0) or min (``filler`` > 0) is a zero: every element -0.0, every
    element +0.0; for each position r a lone -0.0 at r, a lone +0.0 at r (the rest ``filler``), and -0.0 at r
    beside +0.0 at r + 1 (a tie of the two zeros in every order and place)."""
    rows = [np.full(length, -0.0), np.full(length, 0.0)]
    for r in range(length):
        for zeros in ((-0.0,), (0.0,), (-0.0, 0.0), (0.0, -0.0)):
            if len(zeros) > length:
                continue
            row = np.full(length, filler)
            for k, zero in enumerate(zeros):
                row[(r + k) % length] = zero
            rows.append(row)
    return np.stack(rows)


def assert_zero_contract(got: np.ndarray, x: np.ndarray, what: str) -> None:
    """``got``, the max or min of each row of ``x`` (rows of ``signed_zero_rows``), keeps the documented contract:
    a zero in every row; -0.0 where the row's zeros are all -0.0, +0.0 where they are all +0.0."""
    got = np.asarray(got, np.float64)
    assert (got == 0).all(), f"{what}: a max/min of a row of zeros and fillers is not a zero: {got}"
    zeros = x == 0
    negative, positive = zeros & np.signbit(x), zeros & ~np.signbit(x)
    only_negative = negative.any(1) & ~positive.any(1)
    only_positive = positive.any(1) & ~negative.any(1)
    assert np.signbit(got[only_negative]).all(), f"{what}: rows whose zeros are all -0.0 gave +0.0: " \
        f"{np.flatnonzero(only_negative & ~np.signbit(got))}"
    assert not np.signbit(got[only_positive]).any(), f"{what}: rows whose zeros are all +0.0 gave -0.0: " \
        f"{np.flatnonzero(only_positive & np.signbit(got))}"
    assert only_negative.any() and only_positive.any()
