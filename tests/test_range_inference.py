"""Range inference the README promises (issue 13): an index seen only inside mod/clamp/pad of one axis runs
over that axis, and an index of the result that indexes nothing says so (a typo, usually)."""
from __future__ import annotations

import numpy as np
import pytest

import tullax
from tullax.errors import SpecError

x = np.arange(1.0, 6.0)


def _shifted(kind: str, shift: int) -> np.ndarray:
    n = len(x)
    out = []
    for i in range(n):
        pos = i + shift
        if kind == "mod":
            out.append(x[pos % n])
        elif kind == "clamp":
            out.append(x[min(max(pos, 0), n - 1)])
        else:
            out.append(x[pos] if 0 <= pos < n else 0.0)
    return np.array(out)


@pytest.mark.parametrize("backend", ["numba", "xla"])
@pytest.mark.parametrize("kind, shift", [("mod", 1), ("mod", -2), ("clamp", -1), ("clamp", 1), ("pad", -1),
                                         ("pad", 2)])
def test_an_index_only_inside_a_wrapper_runs_over_that_axis(backend, kind, shift):
    spec = f"y[i] := x[{kind}(i{shift:+d})]"
    np.testing.assert_allclose(tullax.einsum_kernel(spec, backend=backend)(x), _shifted(kind, shift))


def test_wrapped_on_two_different_axes_still_asks_for_a_range():
    with pytest.raises(SpecError, match="cannot infer the range of index i"):
        tullax.einsum_kernel("y[i] := x[pad(i-1)]*w[pad(i)]")


@pytest.mark.parametrize("spec, match", [
    ("C[i,j] := A[i,k]*B[k,l]", "index j is on the left but nowhere on the right \\(is k or l a typo for j\\?\\)"),
    ("y[i] := x[j]", "index i is on the left but nowhere on the right"),
])
def test_an_index_of_the_result_that_indexes_nothing_is_named(spec, match):
    with pytest.raises(SpecError, match=match):
        tullax.einsum_kernel(spec)
