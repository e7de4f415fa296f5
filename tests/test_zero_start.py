"""A '+=' gradient step that starts from zeros (``ΔW[ix[b],d] += Δout[b,d]``) clears its own output on a host
backend instead of taking XLA's zeros (tullax.calls.host): which steps do, that they say so in the program,
that the result is the same whether the output is cleared by the callback or given as zeros, and that the
planner races such a step as it will run."""
from __future__ import annotations

import ctypes
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from loop_backends import c_param

import tullax
from tullax.backends.c.backend import CBackend
from tullax.backends.c.kernel import CHostKernel
from tullax.calls import host as callback
from tullax.grad import gradients
from tullax.grad.run import starts_from_zeros, zero_start_steps
from tullax.planner import candidates, store, tuning
from tullax.planner import decide as planner
from tullax.planner import race as racing
from tullax.planner.call import Call
from tullax.planner.rules import LOOPS, loop_backend
from tullax.runtime import exchange, hugepages
from tullax.spec.analyze import analyze
from tullax.spec.parse import parse_spec
from tullax.spec.text import format_spec

HOSTS = ["numba", c_param()]


def _spec(text: str):
    return analyze(parse_spec(text))


@pytest.fixture(params=["on", "off"])
def huge_pages(request, monkeypatch):
    """Huge pages on (the callback clears its output where the kernel allows them) and off (the step takes
    XLA's zeros as its output); the switch is read once per process, so read again here and after."""
    if request.param == "off":
        monkeypatch.setenv(hugepages.ENV, "0")
    else:
        monkeypatch.delenv(hugepages.ENV, raising=False)
    hugepages._madvise.cache_clear()
    yield request.param
    monkeypatch.undo()
    hugepages._madvise.cache_clear()


@pytest.mark.parametrize("text, expected", [
    ("out[b,d] := W[ix[b],d]", {"W": [True]}),
    ("y[i] := x[ix[i]] + x[jx[i]]", {"x": [True, False]}),  # the second scatter adds to the first
    ("y[b] := W[ix[b]] + W[b]", {"W": [False, False]}),  # the scatter adds to the ':=' step before it
    ("D[i,j] := (W[k,i] - X[k,j])^2", {"W": [False], "X": [False]}),
    ("out[i] := x[clamp(i+k)]*w[k]", {"x": [True], "w": [False]}),
])
def test_only_a_scatter_that_no_earlier_step_wrote_starts_from_zeros(text, expected):
    spec = _spec(text)
    found = {grad.wrt: list(starts_from_zeros(grad, spec)) for grad in gradients(spec)}
    assert found == expected
    assert {format_spec(s) for s in zero_start_steps(spec)} == {
        format_spec(step) for grad in gradients(spec) for step, zero in zip(grad.steps, expected[grad.wrt]) if zero}


def _gather_problem(rows=300, width=64, batch=200, seed=1):
    rng = np.random.default_rng(seed)
    W = jnp.asarray(rng.standard_normal((rows, width), dtype=np.float32))
    ix = jnp.asarray(rng.integers(0, rows, batch).astype(np.int32))
    cotangent = jnp.asarray(rng.standard_normal((batch, width), dtype=np.float32))
    expected = np.zeros((rows, width), np.float32)
    np.add.at(expected, np.asarray(ix), np.asarray(cotangent))
    return W, ix, cotangent, expected


def _kernel_ops(jaxpr) -> list:
    """Every tullax kernel op bound in ``jaxpr`` (nested jaxprs included)."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "tullax_kernel":
            found.append(eqn.params["op"])
        for sub in jax.core.subjaxprs(eqn) if hasattr(jax.core, "subjaxprs") else ():
            found += _kernel_ops(sub)
    return found


@pytest.mark.parametrize("backend", HOSTS + ["xla"])
def test_the_scatter_step_of_a_gradient_is_bound_as_starting_from_zeros(backend):
    kernel = tullax.einsum_kernel("out[b,d] := W[ix[b],d]", backend=backend)
    W, ix, cotangent, _ = _gather_problem()
    jaxpr = jax.make_jaxpr(lambda c, W: jax.vjp(lambda W: kernel(W, ix), W)[1](c)[0])(cotangent, W).jaxpr
    (op,) = [op for op in _kernel_ops(jaxpr) if op.spec.assign == "+="]
    assert format_spec(op.spec) == "ΔW[ix[b],d] += Δout[b,d]"
    assert op.zero_start is (backend != "xla")  # XLA's lowering takes the zeros: it fuses them into its scatter
    assert ("from zeros" in repr(op)) is op.zero_start


@pytest.mark.parametrize("path", ["buffer", "pure"])
@pytest.mark.parametrize("backend", HOSTS)
def test_a_scatter_gradient_is_the_same_from_its_own_clear_or_from_given_zeros(backend, path, huge_pages,
                                                                                monkeypatch):
    monkeypatch.setenv("TULLAX_CALLBACK", path)
    kernel = tullax.einsum_kernel("y[i] := x[ix[i]] + x[jx[i]]", backend=backend)
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal(50, dtype=np.float32))
    ix, jx = (jnp.asarray(rng.integers(0, 50, 80).astype(np.int32)) for _ in range(2))
    cotangent = jnp.asarray(rng.standard_normal(80, dtype=np.float32))
    got = jax.jit(lambda c, x: jax.vjp(lambda x: kernel(x, ix, jx), x)[1](c)[0])(cotangent, x)
    expected = np.zeros(50, np.float32)
    np.add.at(expected, np.asarray(ix), np.asarray(cotangent))
    np.add.at(expected, np.asarray(jx), np.asarray(cotangent))  # the second step adds to the first's result
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", HOSTS)
def test_a_large_scatter_gradient_under_vmap_and_grad_of_grad(backend, huge_pages):
    """A table above the huge-page threshold (the callback's clear and advice both run), batched by vmap and
    differentiated twice, against jnp."""
    kernel = tullax.einsum_kernel("out[b,d] := W[ix[b],d]", backend=backend)
    W, ix, cotangent, _ = _gather_problem(rows=9000, width=256, batch=500)  # 9.2 MB of table
    assert W.nbytes > hugepages.MIN_BYTES

    def loss(W, take):
        return jnp.sum(take(W) ** 2)

    ours = jax.jit(jax.grad(lambda W: loss(W, lambda W: kernel(W, ix))))(W)
    reference = jax.jit(jax.grad(lambda W: loss(W, lambda W: W[ix])))(W)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(reference), rtol=1e-5, atol=1e-5)
    scales = jnp.asarray([1.0, -2.0], jnp.float32)
    batched = jax.vmap(lambda s: jax.grad(lambda W: loss(s * W, lambda W: kernel(W, ix)))(W))(scales)
    np.testing.assert_allclose(np.asarray(batched[1]), -2.0 * -2.0 * np.asarray(reference), rtol=1e-5, atol=1e-4)
    hvp = jax.jvp(jax.grad(lambda W: loss(W, lambda W: kernel(W, ix))), (W,), (W,))[1]
    np.testing.assert_allclose(np.asarray(hvp), np.asarray(reference), rtol=1e-5, atol=1e-4)  # linear in W


@pytest.mark.parametrize("cleared", ["by memset", "by the kernel's clear", False])
def test_the_callback_clears_whatever_its_fresh_output_held(cleared):
    """The runner itself, on an output full of garbage: starting from zeros, it clears it before the kernel
    adds (with the kernel's own clear where it has one); given the zeros, it copies them in."""
    spec = next(iter(zero_start_steps(_spec("out[b,d] := W[ix[b],d]"))))
    ix = np.asarray([0, 2, 2], np.int32)
    cotangent = np.ones((3, 4), np.float32)
    added = []

    def run_kernel(out, inputs):
        assert inputs[0] is not None
        np.add.at(out, inputs[2], inputs[1])
        added.append(True)

    cleared_bytes = []

    def clear_bytes(address, nbytes):
        ctypes.memset(address, 0, nbytes)
        cleared_bytes.append(nbytes)

    out = np.full((3, 4), 7.0, np.float32)
    clear = {"by memset": exchange.start_from_zeros, False: None,
             "by the kernel's clear": partial(exchange.start_from_zeros, clear_bytes=clear_bytes)}[cleared]
    runner = callback._buffer_runner(spec, run_kernel, "ΔW[ix[b],d] += Δout[b,d]", "numba", clear)
    table = np.zeros((3, 4), np.float32)
    given = (cotangent, ix, table) if cleared else (np.zeros((3, 4), np.float32), cotangent, ix, table)
    runner(None, out, *given)
    assert added and cleared_bytes == ([out.nbytes] if cleared == "by the kernel's clear" else [])
    np.testing.assert_array_equal(out, [[1] * 4, [0] * 4, [2] * 4])


@pytest.mark.skipif(not CBackend().availability()[0], reason="no C compiler that builds OpenMP libraries here")
def test_the_c_callback_clears_with_its_modules_parallel_clear(monkeypatch):
    """On the c backend the scatter step's output is cleared by its module's own parallel clear
    (``CHostKernel.clear_bytes``), on both callback paths, and the gradient is right."""
    calls = []
    original = CHostKernel.clear_bytes

    def spy(self, address, nbytes):
        calls.append(nbytes)
        original(self, address, nbytes)

    monkeypatch.setattr(CHostKernel, "clear_bytes", spy)
    monkeypatch.delenv(hugepages.ENV, raising=False)
    hugepages._madvise.cache_clear()
    if not hugepages.enabled():
        pytest.skip("no transparent huge pages here: the step takes XLA's zeros")
    kernel = tullax.einsum_kernel("out[b,d] := W[ix[b],d]", backend="c")
    rng = np.random.default_rng(5)
    W = jnp.asarray(rng.standard_normal((3000, 512), dtype=np.float32))  # 6 MiB: three blocks of the clear
    ix = jnp.asarray(rng.integers(0, 3000, 700).astype(np.int32))
    cotangent = jnp.asarray(rng.standard_normal((700, 512), dtype=np.float32))
    expected = np.zeros((3000, 512), np.float32)
    np.add.at(expected, np.asarray(ix), np.asarray(cotangent))
    for path in ("buffer", "pure"):
        monkeypatch.setenv("TULLAX_CALLBACK", path)
        calls.clear()
        got = jax.jit(lambda c, W: jax.vjp(lambda W: kernel(W, ix), W)[1](c)[0])(cotangent, W)
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-6, atol=1e-6)
        assert calls == [W.nbytes], path


def test_a_given_array_that_is_not_zeros_is_never_cleared():
    """A user's own '+=' kernel adds to the array it is given: no zero start there, whatever the backend."""
    kernel = tullax.einsum_kernel("y[ix[b]] += x[b]", backend="numba")
    y, x, ix = jnp.arange(6.0, dtype=jnp.float32), jnp.ones(4, jnp.float32), jnp.asarray([0, 2, 2, 5])
    jaxpr = jax.make_jaxpr(kernel)(y, x, ix).jaxpr
    (op,) = _kernel_ops(jaxpr)
    assert not op.zero_start
    np.testing.assert_array_equal(np.asarray(jax.jit(kernel)(y, x, ix)), [1.0, 1.0, 4.0, 3.0, 4.0, 6.0])


def test_the_xla_candidate_of_a_zero_start_race_starts_from_its_own_zeros():
    """Raced as it will run: XLA's form ignores the given array's values and scatters onto zeros of its own."""
    step = next(iter(zero_start_steps(_spec("out[b,d] := W[ix[b],d]"))))
    env = {"ΔW": jnp.full((3, 2), 5.0, jnp.float32), "Δout": jnp.ones((2, 2), jnp.float32),
           "ix": jnp.asarray([1, 1], jnp.int32), "W": jnp.zeros((3, 2), jnp.float32)}
    from_zeros = jax.jit(candidates.xla_function(step, "xla:grid", True))(env)
    np.testing.assert_array_equal(np.asarray(from_zeros), [[0, 0], [2, 2], [0, 0]])
    onto_given = jax.jit(candidates.xla_function(step, "xla:grid", False))(env)
    np.testing.assert_array_equal(np.asarray(onto_given), [[5, 5], [7, 7], [5, 5]])


def test_a_zero_start_decision_is_kept_apart_from_one_on_a_given_array(monkeypatch, tmp_path):
    monkeypatch.setenv("TULLAX_CACHE_DIR", str(tmp_path))
    step = next(iter(zero_start_steps(_spec("out[b,d] := W[ix[b],d]"))))
    shapes = {"ΔW": (4096, 512), "Δout": (1024, 512), "ix": (1024,), "W": (4096, 512)}  # above the tiny rule's
    dtypes = {"ΔW": "float32", "Δout": "float32", "ix": "int32", "W": "float32"}
    loops = loop_backend(dtypes.values())
    on_zeros, on_given = (Call.of(step, shapes, dtypes, loops, zero_start) for zero_start in (True, False))
    assert store.cache_key(on_zeros) != store.cache_key(on_given)
    assert on_zeros.key != on_given.key
    raced = []

    def scripted(call, candidates, rounds=None):
        raced.append(call.zero_start)
        return [(c, 1.0 if c == LOOPS else 2.0) for c in candidates]

    monkeypatch.setattr(racing, "race", scripted)
    monkeypatch.setattr(tuning, "UNTIMED_WORK", 0)
    monkeypatch.setenv(tuning.TIMING_ENV, "1")
    planner.forget()
    try:
        planner.plan(step, shapes, dtypes, zero_start=True)
        planner.plan(step, shapes, dtypes)
        planner.plan(step, shapes, dtypes, zero_start=True)  # this process's decision: not raced again
    finally:
        planner.forget()
    assert raced == [True, False]
