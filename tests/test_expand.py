"""The opt-in expansion of polynomial bodies (``einsum_kernel(..., algebra="expand")``, tullax.backends.xla.expand):
which specs it reaches, its accuracy against NumPy in float64 (normal data, close points: the cancellation bound),
its gradients against jax.grad of jnp, the planner's candidate (and its absence without the opt-in), the backends
that refuse it, and what ``explain`` says. Small shapes, a handful of kernels shared by the tests."""
from __future__ import annotations

import numpy as np
import pytest
from kernel_ops import planned_ops

import tullax
from tullax.backends.xla.expand import expansion, nonnegative, polynomial
from tullax.errors import SpecError
from tullax.spec.frontend import compile_spec

jax = pytest.importorskip("jax")
jnp = jax.numpy

from tullax.planner import decide as planner  # noqa: E402
from tullax.planner import race as racing  # noqa: E402
from tullax.planner import rules, tuning  # noqa: E402
from tullax.planner.call import kernel_shapes  # noqa: E402

DIST = "D[i,j] := (W[k,i] - X[k,j])^2"
WEIGHTED = "D[i,j] := c[k]*(W[k,i] - X[k,j])^2"
EPS32 = float(np.finfo(np.float32).eps)
# the documented bound of the expansion's error, in units of |w|^2 + |x|^2 (docs/backends.md): a few float32 ulps
# of that sum, with room for the order BLAS sums in; far below the relative error cancellation leaves in D
BOUND = 16 * EPS32


def _spec(text: str):
    return compile_spec(text)[1]


def _data(k=32, i=48, j=64, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((k, i)).astype(np.float32), rng.standard_normal((k, j)).astype(np.float32)


def _exact(W, X, c=None):
    w, x = W.astype(np.float64), X.astype(np.float64)
    c = np.ones(w.shape[0]) if c is None else c.astype(np.float64)
    return (c[:, None, None] * (w[:, :, None] - x[:, None, :]) ** 2).sum(0)


def _norms(W, X, c=None):
    w, x = W.astype(np.float64), X.astype(np.float64)
    c = np.ones(w.shape[0]) if c is None else np.abs(c.astype(np.float64))
    return (c[:, None] * w * w).sum(0)[:, None] + (c[:, None] * x * x).sum(0)[None, :]


# ---------------------------------------------------------------------------------------------
# Which specs expand
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, terms, square", [
    (DIST, 3, True),
    (WEIGHTED, 3, False),
    ("D[i,j] := (W[k,i] - X[k,j])^2 |> sqrt(_)", 3, True),
    ("D[i,j] := (W[k,i] - X[k,j])^4", 5, True),
    ("D[i,j] := (W[k,i] - 0.5*X[k,j])*(W[k,i] + X[k,j])/2", 3, False),
    ("ΔW[k,i] := ΔD[i,j]*(2*(W[k,i] - X[k,j]))", 2, False),  # Dist's gradient step
    ("Δc[k] := ΔD[i,j]*(W[k,i] - X[k,j])^2", 3, False),  # the weighted Dist's gradient w.r.t. its weights
])
def test_polynomial_bodies_expand(text, terms, square):
    found = expansion(_spec(text))
    assert found is not None and found.terms == terms and found.nonnegative == square
    assert found.largest < found.before


@pytest.mark.parametrize("text", [
    "C[i,j] := W[k,i]*X[k,j]",  # a contraction already: nothing to separate
    "D[i,j] := exp(W[k,i] - X[k,j])",  # not a polynomial
    "D[i,j] := abs(W[k,i] - X[k,j])",
    "(max) D[i,j] := (W[k,i] - X[k,j])^2",  # not a sum
    "D[i,k] := (W[k,i] - X[k,i])^2",  # no reduced index
    "D[i,j] := (W[k,i] - X[k,j])^9",  # past MAX_POWER
    "out[b,d] := (W[ix[b],d] - x[b,d])^2",  # an index array
])
def test_other_bodies_do_not(text):
    assert expansion(_spec(text)) is None


def test_the_polynomial_and_the_sign_of_a_square():
    body = _spec(DIST).body
    poly = polynomial(body)
    assert sorted(poly.values()) == [-2.0, 1.0, 1.0]
    assert nonnegative(body) and not nonnegative(_spec(WEIGHTED).body)


# ---------------------------------------------------------------------------------------------
# Accuracy against NumPy in float64
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dist_xla():
    return tullax.einsum_kernel(DIST, backend="xla", algebra="expand")


def test_the_expansion_runs_on_xla_and_matches_float64_on_normal_data(dist_xla):
    W, X = _data()
    assert [op.form for op in planned_ops(dist_xla, jnp.asarray(W), jnp.asarray(X))] == ["expanded"]
    got = np.asarray(jax.jit(dist_xla)(W, X), np.float64)
    exact = _exact(W, X)
    assert np.max(np.abs(got - exact) / _norms(W, X)) <= BOUND
    np.testing.assert_allclose(got, exact, rtol=1e-5)  # normal data: far apart, no cancellation


def test_close_points_lose_digits_to_cancellation_within_the_bound_and_never_go_negative(dist_xla):
    """The documented bound: |error| <= a few ulps of |w|^2 + |x|^2, not of D; equal points give 0 or a little
    more (the clamp at 0 removes the negatives the cancellation makes: without it this test fails)."""
    W, _ = _data()
    rng = np.random.default_rng(1)
    X = np.concatenate([W[:, :32], W[:, :32] + 1e-3 * rng.standard_normal((32, 32)).astype(np.float32)], axis=1)
    got = np.asarray(jax.jit(dist_xla)(W, X), np.float64)
    exact = _exact(W, X)
    err = np.abs(got - exact)
    assert np.max(err / _norms(W, X)) <= BOUND
    assert got.min() >= 0.0
    close = exact < 1e-3
    assert close.any() and np.max(err[close] / exact[close].clip(1e-30)) > 1e-3  # the cancellation is real
    unclamped = jax.jit(lambda w, x: (w * w).sum(0)[:, None] + (x * x).sum(0)[None, :] - 2 * (w.T @ x))(W, X)
    assert float(jnp.min(unclamped)) < 0  # what the clamp is for, on these points


def test_float32_expands_in_float64_where_jax_has_it():
    """As scikit-learn upcasts float32 blocks: with jax_enable_x64 the cancellation is float64's, the result
    rounded once to float32."""
    W, _ = _data(16, 24, 20)
    X = W[:, :20] + 1e-3 * np.random.default_rng(2).standard_normal((16, 20)).astype(np.float32)
    kernel = tullax.einsum_kernel(DIST, backend="xla", algebra="expand")
    with jax.enable_x64(True):
        got = np.asarray(jax.jit(kernel)(jnp.asarray(W), jnp.asarray(X)))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, _exact(W, X), rtol=4 * EPS32)


@pytest.mark.parametrize("text, ranges, numpy", [
    # a factor that is not a plain read: contracted on the grid (forms._factored) instead of on the arrays
    ("D[i,j] := (W[k,i] - exp(X[k,j]))^2", None,
     lambda W, X: ((W[:, :, None] - np.exp(X[:, None, :])) ** 2).sum(0)),
    # a range that is not the whole axis: the same
    ("D[i,j] := (W[k,i] - X[k,j])^2", {"k": (2, 12)}, lambda W, X: ((W[2:12, :, None] - X[2:12, None, :]) ** 2).sum(0)),
])
def test_expansions_the_arrays_cannot_contract_as_laid_out_run_on_the_grid(text, ranges, numpy):
    W, X = _data(16, 12, 10)
    kernel = tullax.einsum_kernel(text, backend="xla", ranges=ranges, algebra="expand")
    assert [op.form for op in planned_ops(kernel, jnp.asarray(W), jnp.asarray(X))] == ["expanded"]
    want = numpy(W.astype(np.float64), X.astype(np.float64))
    np.testing.assert_allclose(np.asarray(jax.jit(kernel)(W, X)), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_weighted_expansion_and_its_gradients_match_jnp():
    W, X = _data(16, 24, 20)
    c = np.random.default_rng(3).uniform(0.5, 2.0, 16).astype(np.float32)
    kernel = tullax.einsum_kernel(WEIGHTED, backend="xla", algebra="expand")
    got = np.asarray(jax.jit(kernel)(c, W, X), np.float64)
    assert np.max(np.abs(got - _exact(W, X, c)) / _norms(W, X, c)) <= BOUND
    g = jnp.asarray(np.random.default_rng(4).standard_normal((24, 20)).astype(np.float32))

    def reference(c, W, X):
        return (c[:, None, None] * (W[:, :, None] - X[:, None, :]) ** 2).sum(0)

    ours = jax.grad(lambda *a: jnp.sum(kernel(*a) * g), (0, 1, 2))(c, W, X)
    want = jax.grad(lambda *a: jnp.sum(reference(*a) * g), (0, 1, 2))(c, W, X)
    for a, b in zip(ours, want):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3 * float(jnp.max(jnp.abs(b))))
    ops = planned_ops(jax.grad(lambda *a: jnp.sum(kernel(*a) * g), (0, 1, 2)), c, W, X)
    assert {op.spec.out: op.form for op in ops} == {"D": "expanded", "Δc": "expanded", "ΔW": "expanded",
                                                     "ΔX": "expanded"}


def test_vmap_of_the_expanded_form(dist_xla):
    W, X = _data(8, 12, 10)
    batch = np.stack([W, W + 1]), np.stack([X, X - 1])
    got = jax.vmap(dist_xla)(*batch)
    for b in range(2):
        np.testing.assert_allclose(got[b], _exact(batch[0][b], batch[1][b]), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# The planner's candidate
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def scripted(monkeypatch, tmp_path):
    """Races that the expanded form wins (every other candidate 10x slower); the races seen, by spec."""
    monkeypatch.setenv(tuning.TIMING_ENV, "1")
    monkeypatch.setattr(tuning, "UNTIMED_WORK", 0)
    monkeypatch.setenv("TULLAX_CACHE_DIR", str(tmp_path))
    seen = {}

    def race(call, candidates, rounds=None):
        seen[call.spec.out] = tuple(candidates)
        return [(c, 1.0 if c == rules.EXPANDED else 10.0) for c in candidates]

    monkeypatch.setattr(racing, "race", race)
    planner.forget()
    yield seen
    planner.forget()


def test_auto_races_the_expansion_only_with_the_opt_in(scripted):
    W, X = (jnp.asarray(a) for a in _data())
    g = jnp.asarray(np.random.default_rng(5).standard_normal((48, 64)).astype(np.float32))
    loss = lambda k: (lambda w, x: jnp.sum(k(w, x) * g))  # noqa: E731
    # without the opt-in (planned without a trace: no loop module is built), no race times the expansion
    kernels = kernel_shapes(_spec(DIST), {"W": W.shape, "X": X.shape})
    for _, step, shapes in kernels:
        found = planner.plan(step, shapes, {n: "float32" for n in step.input_names})
        assert found.form != "expanded"
    assert set(scripted) == {"D", "ΔW", "ΔX"} and all(rules.EXPANDED not in c for c in scripted.values())
    scripted.clear()
    opted = tullax.einsum_kernel(DIST, algebra="expand")
    ops = planned_ops(jax.grad(loss(opted), (0, 1)), W, X)
    assert {op.spec.out: (op.backend, op.form) for op in ops} == {
        "D": ("xla", "expanded"), "ΔW": ("xla", "expanded"), "ΔX": ("xla", "expanded")}
    assert all(rules.EXPANDED in c for c in scripted.values()) and set(scripted) == {"D", "ΔW", "ΔX"}
    # the values: the forward within the bound, the gradients against jax.grad of jnp
    got = np.asarray(jax.jit(opted)(W, X), np.float64)
    assert np.max(np.abs(got - _exact(np.asarray(W), np.asarray(X))) / _norms(np.asarray(W), np.asarray(X))) <= BOUND
    ours = jax.jit(jax.grad(loss(opted), (0, 1)))(W, X)
    want = jax.grad(lambda w, x: jnp.sum(((w[:, :, None] - x[:, None, :]) ** 2).sum(0) * g), (0, 1))(W, X)
    for a, b in zip(ours, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(jnp.max(jnp.abs(b))))
    # the decision with the opt-in is kept apart from the one without (both read back from the compile cache)
    planner.forget()
    for _, step, shapes in kernels:
        dtypes = {n: "float32" for n in step.input_names}
        assert planner.plan(step, shapes, dtypes).form != "expanded"
        assert planner.plan(step, shapes, dtypes, algebra="expand").form == "expanded"
    assert not scripted or set(scripted) == {"D", "ΔW", "ΔX"}


# ---------------------------------------------------------------------------------------------
# Where the opt-in is refused, and what it does not touch
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["c", "numba"])
def test_a_loop_backend_refuses_the_opt_in(backend):
    with pytest.raises(SpecError, match="runs the loops as written: use backend='auto'"):
        tullax.einsum_kernel(DIST, backend=backend, algebra="expand")


def test_a_spec_with_nothing_to_expand_refuses_the_opt_in():
    with pytest.raises(SpecError, match="neither this spec nor its gradients"):
        tullax.einsum_kernel("C[i,j] := W[k,i]*X[k,j]", algebra="expand")
    with pytest.raises(SpecError, match="takes 'expand'"):
        tullax.einsum_kernel(DIST, algebra="fast")
    with pytest.raises(SpecError, match="applies to one statement"):
        tullax.einsum_kernel("local T[i,j] := (W[k,i] - X[k,j])^2\nS[i] := T[i,j]", algebra="expand")


def test_eager_numpy_calls_run_as_without_the_opt_in():
    W, X = _data(8, 12, 10)
    assert np.array_equal(tullax.einsum_kernel(DIST, algebra="expand")(W, X), tullax.einsum_kernel(DIST)(W, X))


def test_explain_says_where_the_expansion_would_apply_and_that_it_needs_the_opt_in(monkeypatch, tmp_path):
    monkeypatch.setenv("TULLAX_CACHE_DIR", str(tmp_path))  # no decision kept by another process: the rule's words
    planner.forget()
    shown = tullax.explain(DIST)
    assert shown.count("einsum_kernel(..., algebra='expand') would race xla:expanded") == 3
    assert "D[i,j] := W[k,i]*W[k,i] - 2*W[k,i]*X[k,j] + X[k,j]*X[k,j]" in shown
    opted = tullax.explain(DIST, shapes={"W": (784, 1024), "X": (784, 512)}, algebra="expand")
    assert "the first call times loops, xla:grid, xla:expanded" in opted
    assert "x fewer or better" in opted and "cancellation" in opted
    assert "algebra" not in tullax.explain("C[i,j] := W[k,i]*X[k,j]")


def test_the_cli_explains_the_opted_in_plan(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("TULLAX_CACHE_DIR", str(tmp_path))
    planner.forget()
    from tullax.cli import main

    assert main(["explain", DIST, "--algebra", "expand", "--shape", "W=64x48", "--shape", "X=64x40"]) == 0
    shown = capsys.readouterr().out
    assert "algebra='expand': raced as xla:expanded" in shown and "the first call times loops, xla:grid, " \
        "xla:expanded" in shown
