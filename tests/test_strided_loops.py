"""The loops' strided window gradient (issue 45 item 2): a sum over a window index ``p`` read through
``pad((m-p)/s)`` whose range is no longer than the stride has at most one term per element, ``p`` fixed by
``m mod s`` (``compiler.guards._solve_residues``); the loops computed ``p`` by a loop testing each term's
divisibility. Checked on c and numba against NumPy float64 (``naive_eval``), and by the printed loop nest."""
from __future__ import annotations

import re

import numpy as np
import pytest
from loop_backends import c_param, run_host, skip_unavailable

import tullax
from tullax import backends
from tullax.spec.frontend import compile_spec
from tullax.testing.oracle import naive_eval

MAXPOOL_DX = ("Δx[n,c,m,r] := share[n,c,pad((m-p)/2),pad((r-q)/2)]*(x[n,c,m,r] == y[n,c,pad((m-p)/2),pad((r-q)/2)]) "
              "(p in 0:2) (q in 0:2)")
# (step spec, ranges, input shapes, the loops of its printed kernel): odd extents (an element no window reads)
CASES = [
    (MAXPOOL_DX, None, {"share": (2, 3, 4, 4), "x": (2, 3, 9, 8), "y": (2, 3, 4, 4)}, 4),
    ("Δx[n,m] := g[n,pad((m-p)/3)] (p in 0:2)", {"m": 14}, {"g": (2, 5)}, 2),  # a gap: no term at m mod 3 == 2
    ("Δx[n,m] := g[n,pad((m-p)/2)]*w[p] (p in range(1, 3))", {"m": 11}, {"g": (2, 5), "w": (3,)}, 2),  # from p = 1
    ("Δx[n,m] := g[n,pad((m+p-1)/2)]*w[p] (p in 0:2)", {"m": 9}, {"g": (2, 5), "w": (2,)}, 2),  # +p
    ("Δx[n,m] := g[n,pad((m-p)/2)]*w[p] (p in 0:3)", {"m": 9}, {"g": (2, 4), "w": (3,)}, 3),  # longer: looped
]


@pytest.mark.parametrize("backend", [c_param(), "numba"])
@pytest.mark.parametrize("text, ranges, shapes, loops", CASES)
def test_a_strided_window_gradient_on_the_loops_equals_numpy(backend, text, ranges, shapes, loops):
    skip_unavailable(backend)
    _, spec = compile_spec(text, ranges)
    rng = np.random.default_rng(0)
    env = {name: rng.integers(-2, 3, shapes[name]).astype(np.float64) for name in spec.input_names}
    np.testing.assert_array_equal(run_host(backends.get(backend), spec, env), naive_eval(spec, env))


@pytest.mark.parametrize("text, ranges, shapes, loops", CASES)
def test_a_window_within_its_stride_is_not_looped(text, ranges, shapes, loops):
    source = tullax.generate_source(text, backend="c", ranges=ranges)
    kernel = source[source.index("\nvoid forward("):source.index("\nvoid forward_packed(")]
    assert len(re.findall(r"\bfor \(", kernel)) == loops, kernel
