"""Attention as one fused program on the c backend (issue 50): its scores' eight dot products of a register tile
fold together (``tx_vfold8add_f32``: each lane's additions those of ``tx_vfoldadd_f32``, bitwise), their constant
factor multiplied once per sum (``factor_sums(each=True)``) and the tile's totals stored from one vector
(``tullax.printers.c_fold_store``), and the values' output rows held in vector registers across the sum over j
(``tullax.compiler.strips`` inside the fused row). Values against NumPy float64 at shapes that take the vector
paths (whole and ragged chunks of e, tails of d and j, sums past one block), NaN and inf included."""
from __future__ import annotations

import ctypes
import functools

import numpy as np
import pytest

from tullax.backends.program_host import host_program
from tullax.compiler.fuse import fuse_program
from tullax.compiler.loops import Accum, BinOp, Const, Loop, walk_stmts
from tullax.spec.program import analyze_program

ATTENTION = """
local s[b,i,j] := q[b,i,d] * k[b,j,d] * 0.125
(max) local m[b,i] := s[b,i,j]
local z[b,i] := exp(s[b,i,j] - m[b,i])
local p[b,i,j] := exp(s[b,i,j] - m[b,i]) / z[b,i]
o[b,i,e] := p[b,i,j] * v[b,j,e]
"""


@functools.lru_cache(maxsize=None)
def _fused(dtype: str):
    program = analyze_program(ATTENTION)
    return program, fuse_program(program, dtype)


def _numpy(q, k, v):
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = np.einsum("bid,bjd->bij", q, k) * 0.125
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(s - s.max(-1, keepdims=True))
        return np.einsum("bij,bje->bie", e / e.sum(-1, keepdims=True), v)


def _run(dtype, q, k, v):
    program, fused = _fused(dtype)
    values = dict(zip(program.inputs, (q, k, v)))
    shapes = fused.shapes({n: np.shape(a) for n, a in values.items()})
    out = np.full(shapes[fused.output], np.nan, dtype)
    host_program("c", fused.kernel)(out, values, shapes)
    return out


def test_the_scores_sum_their_products_and_scale_once_and_the_values_stay_in_registers():
    from tullax.printers.c import print_module

    kernel = _fused("float32")[1].kernel
    sums = [s for s in walk_stmts(kernel.body) if isinstance(s, Loop) and s.var.startswith("i3_1")
            and s.body and all(isinstance(a, Accum) for a in s.body)]
    assert sums and all(not any(isinstance(n, Const) for a in loop.body for n in _factors(a.value))
                        for loop in sums)  # no 0.125 inside a dot product's loop
    scaled = [a for a in walk_stmts(kernel.body) if isinstance(a, Accum) and isinstance(a.value, BinOp)
              and a.value.lhs == Const(0.125, "float32")]
    assert len(scaled) >= 8  # the whole tile's eight sums, each scaled once
    chunks = [s for s in walk_stmts(kernel.body) if isinstance(s, Loop) and s.registers]
    assert chunks  # the values' output rows in registers across j
    source = print_module([kernel])
    assert "tx_vfold8add_f32(" in source[source.index("void program("):]


def test_the_scores_totals_are_scaled_and_stored_from_one_vector():
    """After the tile's fold, its eight sums times 0.125 go into their totals as one vector multiply-add, stored
    from its lanes (``tullax.printers.c_fold_store``), where the blocked sums' guard (past 512 terms) does not
    hold; the statements as written where it does."""
    from tullax.printers.c import print_module

    source = print_module([_fused("float32")[1].kernel])
    lines = [line.strip() for line in source[source.index("void program("):].splitlines()]
    at = next(n for n, line in enumerate(lines) if "_tot = (tx_v8_f32){" in line)
    assert lines[at - 1].startswith("if (!(") and lines[at - 1].endswith("> 512)) {")
    assert "} + 0.125f * (tx_v8_f32){" in lines[at]
    assert [line.startswith("b_s[") for line in lines[at + 1:at + 17]] == [False] * 8 + [True] * 8
    assert lines[at + 17] == "} else {"
    assert sum("0.125f * i3_1_s" in line for line in lines[at + 18:at + 26]) == 8  # the guard's path as written


def _factors(expr):
    if isinstance(expr, BinOp) and expr.op == "*":
        return _factors(expr.lhs) + _factors(expr.rhs)
    return [expr]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(2, 9, 70, 21, 72), (1, 4, 16, 8, 64), (1, 3, 9, 600, 16)],
                         ids=["ragged", "whole", "blocked"])  # blocked: float32 sums past 512 terms
def test_fused_attention_matches_numpy_float64_on_the_vector_paths(dtype, shape):
    b, i, j, d, e = shape
    rng = np.random.default_rng(5)
    q, k, v = (rng.normal(size=s).astype(dtype) for s in ((b, i, d), (b, j, d), (b, j, e)))
    tol = 2e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(_run(dtype, q, k, v), _numpy(q, k, v), rtol=tol, atol=tol)


def test_fused_attention_keeps_nan_and_inf_where_numpy_has_them():
    rng = np.random.default_rng(6)
    q, k, v = (rng.normal(size=s).astype("float32") for s in ((1, 4, 16), (1, 24, 16), (1, 24, 40)))
    q[0, 1, 3] = np.nan  # a NaN score row: NaN everywhere in its output row
    v[0, 5, 33] = np.inf  # an inf value: inf in its column (every p > 0)
    k[0, 7, 2] = np.inf  # an inf key: +-inf scores, NaN after the max's subtraction where inf - inf
    got, want = _run("float32", q, k, v), _numpy(q, k, v)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-5, atol=2e-5)


def test_eight_sums_folded_together_are_bitwise_each_folded_alone(tmp_path):
    """The batched fold against eight ``tx_vfoldadd_f32``: every lane's additions in the same order, so the same
    bits, signed zeros, infs and NaNs included."""
    from tullax.backends.c.compile import compile_library
    from tullax.printers.c import print_module

    kernel = _fused("float32")[1].kernel
    module = print_module([kernel])
    prelude = module[:module.index("// program:")]
    source = tmp_path / "fold.c"
    source.write_text(prelude + """
void check(const float* in, const float* acc, float* together, float* alone) {
    tx_v8_f32 l[8];
    for (int t = 0; t < 8; ++t) memcpy(&l[t], &in[8 * t], sizeof(tx_v8_f32));
    tx_v8_f32 a;
    memcpy(&a, acc, sizeof(a));
    const tx_v8_f32 f = tx_vfold8add_f32(l[0], l[1], l[2], l[3], l[4], l[5], l[6], l[7], a);
    memcpy(together, &f, sizeof(f));
    for (int t = 0; t < 8; ++t) alone[t] = tx_vfoldadd_f32(l[t], acc[t]);
}
""")
    library = tmp_path / "fold.so"
    compile_library(source, library, units=1)
    check = ctypes.CDLL(str(library)).check
    rng = np.random.default_rng(7)
    for trial in range(200):
        values = (rng.normal(size=64) * 10.0 ** rng.integers(-30, 30, size=64)).astype(np.float32)
        acc = rng.normal(size=8).astype(np.float32)
        if trial % 3 == 0:  # specials: cancellations, signed zeros, inf, NaN
            picks = rng.integers(0, 64, size=6)
            values[picks] = rng.choice(np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.4e38], np.float32), 6)
            acc[rng.integers(0, 8)] = rng.choice(np.array([-0.0, 0.0, np.inf], np.float32))
        together, alone = np.empty(8, np.float32), np.empty(8, np.float32)
        check(*(a.ctypes.data_as(ctypes.c_void_p) for a in (values, acc, together, alone)))
        np.testing.assert_array_equal(together.view(np.int32), alone.view(np.int32))
