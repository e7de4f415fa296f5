"""Loop nests that share work (tullax.compiler.jam, tullax.compiler.rewrite): register tiles, the per-case code
of a gradient w.r.t. a coordinate, calls computed once. Each shape of the transformed nests runs against the naive
evaluator (through the bounds-checking IR interpreter of test_lower) and, for the Numba printer, against NumPy."""
from __future__ import annotations

import numpy as np
import pytest
from corpus import analysed
from test_lower import assert_close, execute, run_kernel, signature

from tullax.backends import host
from tullax.backends.base import Signature
from tullax.compiler.jam import RegisterTile, register_tiles
from tullax.compiler.loops import (
    BinOp,
    Call,
    If,
    Loop,
    Scratch,
    Store,
    expressions,
    parallel_nest,
    walk_expr,
    walk_stmts,
)
from tullax.compiler.lower import lower
from tullax.grad import gradients
from tullax.grad.run import gradient_env, run_gradient
from tullax.printers.numba import print_module
from tullax.spec.examples import random_inputs
from tullax.testing.oracle import naive_eval

GAUSS = "out[i,d] := exp(-((x[i,0]-y[j,0])^2 + (x[i,1]-y[j,1])^2 + (x[i,2]-y[j,2])^2)) * b[j,d]"


def _calls(stmts, fn: str) -> int:
    return sum(1 for e in expressions(stmts) for n in walk_expr(e) if isinstance(n, Call) and n.fn == fn)


def _whole_tile(kernel) -> If:
    """The ``if`` of a register-tiled kernel: then the jammed copies, else the ragged tile."""
    body = parallel_nest(kernel)[1]
    return next(s for s in body if isinstance(s, If))


@pytest.mark.parametrize("tile", [False, True])
def test_gaussian_gradient_wrt_a_coordinate_computes_one_exp_per_pair_and_no_delta(tile: bool):
    spec = analysed(GAUSS)
    step = next(g for g in gradients(spec) if g.wrt == "x").steps[0]
    kernel = lower(step, signature(step), tile=tile)
    jammed = _whole_tile(kernel).then
    assert _calls(jammed, "exp") == 1  # one per (i, j), shared by the three coordinates and every column d
    compares = [n for e in expressions(jammed) for n in walk_expr(e) if isinstance(n, BinOp) and n.op == "=="]
    assert compares == []  # (m == c) folded: each coordinate keeps only its own terms
    m = kernel.body[0].body[0].var
    assert m.endswith("_rt")
    stored = [s.index[1] for s in walk_stmts(jammed) if isinstance(s, Store)]
    assert [c.value for c in stored] == [0, 1, 2]
    assert _calls(lower(step, signature(step), tile=tile, share=False).body, "exp") == 3  # before: 3 per m


@pytest.mark.parametrize("wrt", ["x", "y", "b"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gaussian_gradients_match_naive(wrt: str, dtype: str):
    spec = analysed(GAUSS)
    grad = next(g for g in gradients(spec) if g.wrt == wrt)
    inputs = random_inputs(spec, {"x": (5, 3), "y": (6, 3), "b": (6, 5)}, seed=7)
    result = naive_eval(spec, inputs)
    env = gradient_env(spec, inputs, result, np.random.default_rng(8).standard_normal(np.shape(result)))
    expected = run_gradient(grad, spec, env, naive_eval)
    for tile in (False, True):
        got = run_gradient(grad, spec, env, lambda s, e: execute(s, e, tile=tile, dtype=dtype))
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("m", [1, 2, 3, 5])
def test_literal_cases_beyond_and_below_the_range_match_naive(m: int):
    """The first tile holds the cases 0 and 1; m >= 2 runs the plain body (all its terms are zero); an m range
    shorter than the cases runs only the ragged tile."""
    text = "z[i,m] := x[i,j]*(m == 0) + y[i,j]*(m == 1)"
    spec = analysed(text, {"m": m})
    kernel = lower(spec, signature(spec))
    assert kernel.body[0].body[0].var.endswith("_rt")
    env = random_inputs(spec, {"x": (3, 4), "y": (3, 4)}, seed=1)
    for tile in (False, True):
        assert_close(execute(spec, env, tile), naive_eval(spec, env))


def test_a_case_keeps_only_its_terms_even_where_the_others_are_not_finite():
    """(m == c) is a Kronecker delta: at m = 0 the term of m = 1 is not part of the result (jax.grad does not
    evaluate it either), so its infinity does not turn the result into inf*0 = NaN."""
    spec = analysed("z[i,m] := x[i]*(m == 0) + log(y[i])*(m == 1)", {"m": 2})
    kernel = lower(spec, signature(spec))
    x, y = np.array([1.0, 2.0]), np.array([0.0, 3.0])  # log(0) = -inf
    out = np.full((2, 2), np.nan)
    run_kernel(kernel, spec, out, [x, y])
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(out, np.stack([x, np.log(y)], axis=1))
    plain = np.full((2, 2), np.nan)
    run_kernel(lower(spec, signature(spec), share=False), spec, plain, [x, y])
    assert np.isnan(plain[0, 0])  # multiplied by zero: -inf * 0


@pytest.mark.parametrize("text, shapes", [
    ("D[i,j] := (W[k,i] - X[k,j])^2", {"W": (3, 5), "X": (3, 3)}),  # 2x2 tiles, ragged on both sides
    ("C[i,j] := A[i,k]*B[k,j]", {"A": (4, 2), "B": (2, 7)}),
    ("y[i] := x[i+k]*w[k]", {"x": (9,), "w": (3,)}),  # one parallel loop: tiles of 4, 7 outputs
    ("m[i,j] := max(A[i,k] - B[k,j], 0)", {"A": (1, 2), "B": (2, 1)}),  # only the ragged tile
])
def test_register_tiles_match_naive_on_ragged_extents(text: str, shapes: dict):
    spec = analysed(text)
    kernel = lower(spec, signature(spec))
    assert any(isinstance(s, Loop) and s.var.endswith("_rt") for s in walk_stmts(kernel.body))
    env = random_inputs(spec, shapes, seed=2)
    assert_close(execute(spec, env, tile=False), naive_eval(spec, env))
    assert_close(execute(spec, env, tile=False, dtype="float32"), naive_eval(spec, env))


def test_a_call_used_twice_in_a_block_is_computed_once():
    spec = analysed("y[i,j] := exp(x[i] - z[j]) + exp(x[i] - z[j])^2")
    kernel = lower(spec, signature(spec))
    assert _calls(kernel.body, "exp") == 1
    env = random_inputs(spec, seed=3)
    assert_close(execute(spec, env, tile=False), naive_eval(spec, env))


# A product whose body is large enough to be named once (rewrite.SPECULATED_MIN_NODES): its gradient's factor
# reads the body in every case of the zero-count rule (grad.forward._product_factor), all inside Select branches.
PRODUCT = "(*) p[i] := x[i,j]*w[j] - atan(y[j] + x[i,j])"
# Found by tullax.testing.fuzz (seed 4000): one statement of its gradient printed the body's atan 28 times (19k
# characters of Numba on one line), and Numba was still compiling that kernel after twenty minutes.
FUZZED_PRODUCT = ("(*) O[i,j,k] *= C[pad(2i),pad(j-1, 0.5)] - (B[i,i] == A[j,k,l]) - atan(A[i-1,l,i+j]) "
                  "+ 0.5*O[i,j,k]")


@pytest.mark.parametrize("tile", [False, True])
def test_a_product_gradient_computes_its_body_once(tile: bool):
    spec = analysed(PRODUCT)
    step = next(g for g in gradients(spec) if g.wrt == "x").steps[-1]
    assert _calls(lower(step, signature(step), tile=tile, share=False).body, "atan") >= 7
    kernel = lower(step, signature(step), tile=tile)
    blocks = [s.body for s in walk_stmts(kernel.body) if isinstance(s, Loop) and _calls(s.body, "atan")]
    innermost = [b for b in blocks if not any(isinstance(s, Loop) for s in b)]
    assert innermost and all(_calls(b, "atan") == 1 for b in innermost)


@pytest.mark.parametrize("text, shapes", [
    (PRODUCT, {"x": (3, 5), "w": (5,), "y": (5,)}),
    (FUZZED_PRODUCT, None),
    # a shared body holding pad and index checks: their loads stay behind their checks
    ("(*) p[i] := x[pad(i+j-1)]*W[pad(ix[i]),j] - atan(x[pad(i+j-1)] + W[pad(ix[i]),j])",
     {"x": (6,), "W": (4, 3), "ix": (5,)}),
])
def test_gradients_that_share_subexpressions_match_naive_and_stay_in_range(text: str, shapes: dict):
    """Every gradient step run by the bounds-checking interpreter of test_lower, tiled and not: a subexpression
    computed before its Select reads nothing that only the Select's condition kept in range."""
    spec = analysed(text)
    inputs = random_inputs(spec, shapes, seed=11)
    if "ix" in inputs:
        inputs["ix"] = np.array([0, 3, 7, -1, 2])  # two positions outside W's rows, read as zeros
    inputs = {k: np.where(np.arange(np.size(v)).reshape(np.shape(v)) % 5 == 1, 0.0, v)
              if k not in ("ix",) else v for k, v in inputs.items()}  # zero factors: every case of the rule runs
    result = naive_eval(spec, inputs)
    env = gradient_env(spec, inputs, result, np.random.default_rng(12).standard_normal(np.shape(result)))
    for grad in gradients(spec):
        if grad.wrt == "ix":
            continue
        expected = run_gradient(grad, spec, env, naive_eval)
        for tile in (False, True):
            got = run_gradient(grad, spec, env, lambda s, e: execute(s, e, tile=tile))
            np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12, equal_nan=True,
                                       err_msg=f"{grad.wrt}, tile={tile}")


def test_an_expression_is_not_shared_past_a_store_to_an_array_it_reads():
    """``a[i] = e*e; c[i] = e`` with ``e = a[i] + b[i]``: the second ``e`` reads the stored ``a``. Bound once before
    the first statement, it read the old one (the first statement's own write was only checked for Lets and
    accumulators)."""
    from tullax.compiler.loops import INDEX, Load, Store, Var, binop
    from tullax.compiler.rewrite import share_subexpressions

    i = Var("i0", INDEX)
    e = binop("+", Load("a", (i,), "float64"), Load("b", (i,), "float64"))
    stmts = (Store("a", (i,), binop("*", e, e), "set"), Store("c", (i,), e, "set"))
    assert share_subexpressions(stmts) == stmts
    # with no later use, the first statement's own write does not matter: it evaluates its value first
    shared = share_subexpressions(stmts[:1])
    assert len(shared) == 2 and shared[1].value.lhs == shared[1].value.rhs == Var(shared[0].var, "float64")


def _numba_run(spec, kernel, out, inputs) -> None:
    from tullax.backends.numba.backend import _load

    generated = host.GeneratedModule("numba", spec, Signature.for_dtype(spec, kernel.compute_dtype), kernel,
                                     print_module([kernel], disk_cache=False), f"test_sharing_{id(kernel)}", None, 0.)
    _load(generated)(out, *inputs)


@pytest.mark.compiles
def test_register_tile_of_a_strip_mined_long_sum_runs_in_numba():
    """A jammed kernel with the tile's float64 totals (a Scratch): one array with a segment per copy, declared
    once, before the tile's branches (under the long-sum guard it had). Declared in both branches, Numba's prange
    miscomputed rows (even corrupted memory)."""
    spec = analysed("C[i,j] := A[i,k]*B[k,j]")
    kernel = lower(spec, Signature.for_dtype(spec, "float32"), tile=True)
    tiled = register_tiles(kernel, [("i0", RegisterTile("i", 4))])
    scratch = [s for s in walk_stmts(tiled.body) if isinstance(s, Scratch)]
    body = parallel_nest(tiled)[1]
    before_tile = tuple(walk_stmts(tuple(s for s in body if not (isinstance(s, If) and s.orelse))))
    assert [(s.length, s in before_tile) for s in scratch] == [(2048, True)]
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((10, 700)).astype("float32"), rng.standard_normal((700, 6)).astype("float32")
    expected = a.astype(np.float64) @ b
    out = np.full((10, 6), np.nan, np.float32)
    run_kernel(tiled, spec, out, [a, b])
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)
    out = np.full((10, 6), np.nan, np.float32)
    _numba_run(spec, tiled, out, [a, b])
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.compiles
def test_gaussian_gradient_runs_in_numba():
    spec = analysed(GAUSS)
    step = next(g for g in gradients(spec) if g.wrt == "x").steps[0]
    kernel = lower(step, Signature.for_dtype(step, "float32"), tile=True)
    rng = np.random.default_rng(1)
    x, y, b = (rng.standard_normal(s).astype("float32") for s in ((9, 3), (700, 3), (700, 4)))
    seed = rng.standard_normal((9, 4)).astype("float32")
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    diff = x64[:, None, :] - y64[None, :, :]
    weight = np.exp(-(diff ** 2).sum(-1)) * (seed.astype(np.float64) @ b.T)  # [i, j]
    expected = -2 * (weight[:, :, None] * diff).sum(1)
    env = {"x": x, "y": y, "b": b, "Δout": seed}
    out = np.full((9, 3), np.nan, np.float32)
    _numba_run(step, kernel, out, [env[n] for n in step.input_names])
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
