"""``auto``'s gradient as JAX's autodiff of the forward's XLA form (``tullax.planner.autodiff``,
``tullax.jaxop.autodiff``): raced against the derived steps; where it is chosen, the backward reads what the
forward kept (a logsumexp's exponentials) instead of computing it again, and everything above it (jit, vmap,
higher orders, forward mode) still works. The decisions are put where another process's race would leave them
(the compile cache), so each test knows what runs."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tullax
from tullax.jaxop.autodiff import SCOPE
from tullax.planner import autodiff, decide, store, tuning
from tullax.spec.frontend import compile_spec

LSE = "(logsumexp) l[i] := x[i,j]"


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty compile cache of its own, no timing, and no decision of this process."""
    monkeypatch.setenv("TULLAX_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(tuning.TIMING_ENV, "0")
    decide.forget()
    yield
    decide.forget()


def _decide(text: str, shapes: dict, dtype: str, candidate: str) -> None:
    """Keep ``candidate`` as the decision of the gradient of ``text`` w.r.t. every input, as a race would."""
    _, spec = compile_spec(text)
    dtypes = {name: dtype for name in spec.input_names}
    call = autodiff._call(spec, shapes, dtypes)
    store.store(autodiff.decision_key(call, dtype, spec.input_names, "cpu"), call,
                {"candidate": candidate, "timings_ms": []})


def _lowered(fn, *args, platform: str = "cpu") -> str:
    """``fn`` jitted and lowered for ``platform`` from this CPU host, with its locations (the ops' names)."""
    return jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text(debug_info=True)


def _primitives(fn, *args) -> list[str]:
    found = []

    def visit(jaxpr):
        for eqn in jaxpr.eqns:
            found.append(eqn.primitive.name)
            for value in eqn.params.values():
                inner = getattr(value, "jaxpr", None)
                if inner is not None:
                    visit(getattr(inner, "jaxpr", inner))

    visit(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


def _loss(kernel):
    return lambda a: jnp.sum(jnp.sin(kernel(a)))


def _jnp_loss(a):
    return jnp.sum(jnp.sin(jax.nn.logsumexp(a, axis=1)))


def test_logsumexp_gradient_under_autodiff_computes_its_exponentials_once(fresh):
    """Chosen, the gradient is jnp code whose backward multiplies the forward's exp(x - max) by the cotangent:
    one exponential per element, no tullax kernel; the derived plan runs tullax's kernels (forward and
    Δx := Δl*exp(x - l), a second exponential), as does the xla backend, the derivation rules' oracle."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal((64, 96)), jnp.float32)
    _decide(LSE, {"x": (64, 96)}, "float32", "autodiff:grid")
    kernel = tullax.einsum_kernel(LSE)
    cpu = _lowered(jax.grad(_loss(kernel)), x)
    assert SCOPE in cpu and "tullax_kernel" not in cpu and "custom_call" not in cpu
    assert cpu.count("stablehlo.exponential ") == 1, cpu
    np.testing.assert_allclose(jax.jit(jax.grad(_loss(kernel)))(x), jax.grad(_jnp_loss)(x), rtol=1e-5, atol=1e-6)
    oracle = _primitives(jax.grad(_loss(tullax.einsum_kernel(LSE, backend="xla"))), x)
    assert "tullax_kernel" in oracle

    decide.forget()
    _decide(LSE, {"x": (64, 96)}, "float32", "derived")
    assert "tullax_kernel" in _primitives(jax.grad(_loss(tullax.einsum_kernel(LSE))), x)


def test_autodiff_chosen_on_the_cpu_stays_out_of_a_cuda_lowering_traced_here(fresh):
    """The decision was timed on this host's CPU: the JVP rule puts JAX's autodiff in the CPU branch of
    ``lax.platform_dependent`` and the derived steps in the default one, so a lowering for cuda from this host
    holds the derived steps (tullax's kernels as XLA code: the second exponential) and no plan timed on the CPU,
    and the CPU's lowering holds only the autodiff branch."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal((64, 96)), jnp.float32)
    _decide(LSE, {"x": (64, 96)}, "float32", "autodiff:grid")
    grad = jax.grad(_loss(tullax.einsum_kernel(LSE)))
    cuda = _lowered(grad, x, platform="cuda")
    assert SCOPE not in cuda and "tullax_kernel" in cuda and "custom_call" not in cuda
    assert cuda.count("stablehlo.exponential ") == 2, cuda
    assert SCOPE in _lowered(grad, x)


def test_the_gradient_race_times_both_whole_gradients_and_keeps_its_decision(monkeypatch, tmp_path):
    """With timing on, a differentiated logsumexp races its derived steps against JAX's autodiff of its XLA form
    (both run), keeps the decision in the compile cache (a later process reads it, untimed), and explain
    shows it. Either may win: the values are jnp's either way."""
    monkeypatch.setenv("TULLAX_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(tuning.TIMING_ENV, "1")
    monkeypatch.setattr(tuning, "UNTIMED_WORK", 0)
    decide.forget()
    try:
        x = jnp.asarray(np.random.default_rng(1).standard_normal((48, 80)), jnp.float32)
        kernel = tullax.einsum_kernel(LSE)
        got = jax.jit(jax.grad(_loss(kernel)))(x)
        np.testing.assert_allclose(got, jax.grad(_jnp_loss)(x), rtol=1e-5, atol=1e-6)
        assert autodiff.STATS["timed"] == 1
        (found,) = autodiff._MEMO.values()
        assert found.source == "timed" and dict(found.timings_ms).keys() == {"derived", "autodiff:grid"}
        decide.forget()
        monkeypatch.setenv(tuning.TIMING_ENV, "0")
        shown = "\n".join(tullax.explain(LSE, shapes={"x": (48, 80)}).splitlines()[-1:])
        assert "gradient (differentiated w.r.t. every input)" in shown and found.form in shown, shown
        assert "decision from the compile cache" in shown and autodiff.STATS["timed"] == 0
    finally:
        decide.forget()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_autodiff_logsumexp_gradient_equals_jnp_with_infinite_and_nan_rows(fresh, dtype):
    """Rows of -inf (the result -inf, a zero gradient), one -inf entry, a NaN, +inf: as jnp's gradient."""
    with jax.enable_x64(dtype == "float64"):
        x = np.random.default_rng(2).standard_normal((6, 5)).astype(dtype)
        x[1] = -np.inf
        x[2, 3] = -np.inf
        x[3, 0] = np.nan
        x[4, 2] = np.inf
        x = jnp.asarray(x)
        _decide(LSE, {"x": (6, 5)}, dtype, "autodiff:grid")
        kernel = tullax.einsum_kernel(LSE)
        assert "tullax_kernel" not in _lowered(jax.grad(_loss(kernel)), x)
        np.testing.assert_allclose(jax.jit(kernel)(x), jax.nn.logsumexp(x, axis=1))
        got = jax.jit(jax.grad(_loss(kernel)))(x)
        assert got.dtype == x.dtype
        np.testing.assert_allclose(got, jax.grad(_jnp_loss)(x), rtol=1e-6, atol=1e-7, equal_nan=True)


def test_autodiff_gradient_composes_with_higher_orders_vmap_jit_and_forward_mode(fresh):
    x = jnp.asarray(np.random.default_rng(3).standard_normal((4, 6)), jnp.float32)
    _decide(LSE, {"x": (4, 6)}, "float32", "autodiff:grid")
    kernel = tullax.einsum_kernel(LSE)
    lse = _loss(kernel)
    tol = {"rtol": 2e-5, "atol": 2e-6}
    np.testing.assert_allclose(jax.jit(jax.hessian(lse))(x), jax.hessian(_jnp_loss)(x), **tol)
    third = jax.grad(lambda a: jnp.sum(jax.grad(lambda b: jnp.sum(jax.grad(lse)(b) ** 2))(a)))
    third_jnp = jax.grad(lambda a: jnp.sum(jax.grad(lambda b: jnp.sum(jax.grad(_jnp_loss)(b) ** 2))(a)))
    np.testing.assert_allclose(jax.jit(third)(x), third_jnp(x), **tol)
    t = jnp.ones_like(x)
    np.testing.assert_allclose(jax.jvp(jax.jit(kernel), (x,), (t,))[1],
                               jax.jvp(lambda a: jax.nn.logsumexp(a, axis=1), (x,), (t,))[1], **tol)
    stacked = jnp.stack([x, 2 * x, -x])
    want = jax.vmap(jax.grad(_jnp_loss))(stacked)
    np.testing.assert_allclose(jax.jit(jax.vmap(jax.grad(lse)))(stacked), want, **tol)
    np.testing.assert_allclose(jax.jit(jax.grad(lambda s: jnp.sum(jax.vmap(lse)(s))))(stacked), want, **tol)


GAUSS = "D[i,j] := exp(-(x[i,k]-y[j,k])^2) * w[k]"


def _gauss_loss(kernel):
    return lambda x, y, w: jnp.sum(jnp.sin(kernel(x, y, w)))


def _gauss_jnp(x, y, w):
    return jnp.sum(jnp.sin(jnp.sum(jnp.exp(-(x[:, None, :] - y[None, :, :]) ** 2) * w, axis=-1)))


def test_a_tiny_call_on_a_new_cache_takes_jax_autodiff_of_its_xla_form_on_every_platform(fresh, monkeypatch):
    """Issue 45 item 5: a tiny call on a new compile cache runs its forward on XLA (rule tiny, TINY_COLD), and so
    would each derived step, each computing the exponential again (three more here), each traced, planned and
    compiled on the first call. Its gradient is JAX's autodiff of the forward's XLA form instead, by a rule that
    holds on every platform: no tullax kernel and no platform branch traced, one exponential in the CPU's and in a
    cuda lowering from this host. A polynomial body, or where a loop module may be compiled: the derived steps."""
    from tullax.planner import rules

    monkeypatch.setattr(rules, "nothing_compiled", lambda: True)
    rng = np.random.default_rng(4)
    args = [jnp.asarray(rng.standard_normal(s), jnp.float32) for s in [(16, 3), (12, 3), (3,)]]
    grad = jax.grad(_gauss_loss(tullax.einsum_kernel(GAUSS)), argnums=(0, 1, 2))
    traced = _primitives(grad, *args)
    assert not any(p.startswith(("tullax_kernel", "platform_index", "cond")) for p in traced), traced
    for platform in ("cpu", "cuda"):
        lowered = _lowered(grad, *args, platform=platform)
        assert lowered.count("stablehlo.exponential ") == 1 and "custom_call" not in lowered, lowered
    want = jax.grad(_gauss_jnp, argnums=(0, 1, 2))(*args)
    for got, expected in zip(jax.jit(grad)(*args), want):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    _, spec = compile_spec(GAUSS)
    found = autodiff.gradient_plan(spec, {"x": (16, 3), "y": (12, 3), "w": (3,)},
                                   dict.fromkeys("xyw", "float32"), "float32", "xyw")
    assert (found.backend, found.form, found.rule) == ("xla", "autodiff:grid", "tiny"), found

    # a polynomial body (Dist) keeps its derived steps, which factor into contractions: a smaller program
    dist = tullax.einsum_kernel("D[i,j] := (W[k,i]-X[k,j])^2")
    assert "tullax_kernel" in _primitives(jax.grad(lambda a, b: jnp.sum(dist(a, b)), argnums=(0, 1)), args[0].T,
                                          args[1].T)

    decide.forget()
    monkeypatch.setattr(rules, "nothing_compiled", lambda: False)
    assert "tullax_kernel" in _primitives(jax.grad(_gauss_loss(tullax.einsum_kernel(GAUSS)), argnums=(0, 1, 2)),
                                          *args)


def test_kernels_the_rules_keep_on_derived_steps_never_race(fresh):
    """A max (ties), an index array, a pure contraction: the derived steps, whatever timing would say."""
    for text, dtypes in [("(max) y[i] := x[i,j]", {"x": "float32"}),
                         ("y[b,d] := W[ix[b],d]*s[b]", {"W": "float32", "ix": "int32", "s": "float32"}),
                         ("y[i,j] := A[i,k]*B[k,j]", {"A": "float32", "B": "float32"}),
                         ("(logsumexp) l[i] := x[i,j]", {"x": "complex64"})]:
        _, spec = compile_spec(text)
        assert autodiff.refusal(spec, dtypes) is not None, text
    _, spec = compile_spec(LSE)
    assert autodiff.refusal(spec, {"x": "float32"}) is None


def test_a_close_gradient_race_is_raced_again_by_the_next_process(monkeypatch, tmp_path):
    """As a kernel's close call: a decision whose runner-up came within CLOSE_RATIO is raced again by the next
    process with timing on (the best per candidate over the races kept) until CONFIRMING_RACES races stand
    behind it or one is clear; with timing off, or once settled, it is followed untimed."""
    monkeypatch.setenv("TULLAX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tuning, "UNTIMED_WORK", 0)
    _, spec = compile_spec(LSE)
    call = autodiff._call(spec, {"x": (48, 80)}, {"x": "float32"})
    key = autodiff.decision_key(call, "float32", ["x"], autodiff.race_platform())
    # two earlier races, autodiff ahead by a hair (best times no run here can beat: the merged race keeps them)
    prior = [["derived", 1e-6], ["autodiff:grid", 0.9e-6]]
    store.store(key, call, {"candidate": "autodiff:grid", "timings_ms": [], "bests": prior,
                            "races": tuning.CONFIRMING_RACES - 1, "settled": False})
    x = jnp.asarray(np.random.default_rng(1).standard_normal((48, 80)), jnp.float32)

    def grad(a):  # traced anew each time: a decision is taken when the call is traced
        return jax.grad(_loss(tullax.einsum_kernel(LSE)))(a)

    decide.forget()
    try:
        monkeypatch.setenv(tuning.TIMING_ENV, "0")
        # untimed: the decision as it stands
        assert SCOPE in _lowered(lambda a: grad(a), x) and autodiff.STATS["timed"] == 0
        decide.forget()
        monkeypatch.setenv(tuning.TIMING_ENV, "1")
        assert SCOPE in _lowered(lambda a: grad(a), x) and autodiff.STATS["timed"] == 1  # raced again
        kept = store.load(key)
        assert kept["candidate"] == "autodiff:grid" and kept["races"] == tuning.CONFIRMING_RACES, kept
        assert kept["settled"] and kept["bests"] == prior, kept
        decide.forget()
        assert SCOPE in _lowered(lambda a: grad(a), x) and autodiff.STATS["timed"] == 0  # settled: not raced again
        np.testing.assert_allclose(jax.jit(grad)(x), jax.grad(_jnp_loss)(x), rtol=1e-5, atol=1e-6)
    finally:
        decide.forget()
