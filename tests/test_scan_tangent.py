"""Forward mode of recurrences (issue 48): ``jax.jvp``/``jacfwd`` of a ``(t scan)`` kernel runs its tangent
recurrence (``tullax.grad.tangent``), one forward scan kernel, checked against ``jax.jvp`` of the independent
``lax.scan`` oracles of tests/scan_cases.py in float64 on c, numba, xla and auto; the derived spec; that a jvp
lowers to two kernels (the forward and its tangent); higher orders through it; complex lam. And the XLA form
'associative' (``lax.associative_scan`` of a linear recurrence) against the same oracles, and raced by the
planner."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from loop_backends import c_param
from scan_cases import CASES

import tullax
from tullax.grad.tangent import tangent_spec
from tullax.spec.frontend import compile_spec
from tullax.spec.text import format_spec

BY_NAME = {case.name: case for case in CASES}
# numba compiles slowly: the first-order, second-order and mixing recurrences there; every case elsewhere
NUMBA_CASES = ("lru", "second", "elman")


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def _inputs(case, seed=0):
    return list(case.inputs(np.random.default_rng(seed), "float64").values())


def _tangents(args, seed=5):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=np.shape(a)).astype(np.asarray(a).dtype) for a in args]


def _close(got, want, tol=1e-10):
    got, want = np.asarray(got), np.asarray(want)
    scale = max(1.0, float(np.abs(want).max(initial=0)))
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


def _params():
    c_marks = c_param().marks
    for case in CASES:
        for backend in ("c", "xla", "auto") + (("numba",) if case.name in NUMBA_CASES else ()):
            yield pytest.param(case, backend, id=f"{case.name}-{backend}", marks=c_marks if backend == "c" else ())


@pytest.mark.parametrize("case,backend", list(_params()))
def test_jvp_of_every_input_matches_lax_scan(case, backend):
    """Every input's tangent at once, under jit (one tangent kernel per case and backend)."""
    args, tangents = _inputs(case), _tangents(_inputs(case))
    kernel = tullax.einsum_kernel(case.spec, backend=backend)
    got_out, got = jax.jit(lambda a, t: jax.jvp(kernel, a, t))(tuple(args), tuple(tangents))
    want_out, want = jax.jvp(case.oracle, tuple(args), tuple(tangents))
    _close(got_out, want_out)
    _close(got, want)


def test_the_tangent_recurrence_is_derived_as_the_issue_writes_it():
    _, spec = compile_spec(BY_NAME["lru"].spec)
    found = tangent_spec(spec, ("lam", "x", "h0"))
    assert format_spec(found.spec) == ("dh[b,t,n] := ifelse(t >= 1, h[b,pad(t-1),n], h0[b,n])*dlam[n] "
                                       "+ lam[n]*dh[b,t-1,n] + dx[b,t,n]  (t scan from dh0)")
    assert dict(found.tangents) == {"lam": "dlam", "x": "dx", "h0": "dh0"}
    _, tanh = compile_spec(BY_NAME["tanh"].spec)  # the derivative at the stored result, no recomputed tanh
    assert "tanh" not in format_spec(tangent_spec(tanh, ("lam",)).spec)
    _, elman = compile_spec(BY_NAME["elman"].spec)
    assert format_spec(tangent_spec(elman, ("W",)).spec) == (
        "dh[b,t,n] := h[b,pad(t-1),m]*dW[n,m] + W[n,m]*dh[b,t-1,m] |> (1 - h[b,pad(t),n]^2)*_  (t scan)")
    _, runmax = compile_spec(BY_NAME["runmax"].spec)  # a max inside the step: the general forward mode
    assert tangent_spec(runmax, ("x",)) is None


@pytest.mark.parametrize("backend", [c_param(), "xla"])
def test_a_jvp_lowers_to_the_forward_and_one_tangent_kernel(backend):
    """Before the tangent recurrence, forward mode ran the VJP of the gradient kernels: the adjoint recurrence
    and one gradient kernel per input, each transposed again (10 kernels here on c, 5 lax.scan loops on xla)."""
    case = BY_NAME["lru"]
    args = _inputs(case)
    kernel = tullax.einsum_kernel(case.spec, backend=backend)
    text = jax.jit(lambda a, t: jax.jvp(kernel, a, t)).lower(tuple(args), tuple(_tangents(args))).as_text()
    if backend == "xla":
        assert len(re.findall(r"stablehlo\.while", text)) == 2
    else:
        assert text.count("custom_call") == 2


def test_jacfwd_of_jacfwd_runs_the_tangent_of_the_tangent():
    case = BY_NAME["lru"]
    lam, x, h0 = _inputs(case)
    kernel = tullax.einsum_kernel(case.spec, backend="c")

    def final(fn):
        return lambda lam: jnp.sum(fn(lam, x, h0)[:, -1] ** 2)

    _close(jax.jacfwd(jax.jacfwd(final(kernel)))(lam), jax.jacfwd(jax.jacfwd(final(case.oracle)))(lam), 1e-8)


def test_grad_of_a_jvp_differentiates_the_tangent_recurrence():
    """Reverse over forward on a nonlinear body: the tangent kernel's own derived gradients."""
    case = BY_NAME["tanh"]
    lam, x = _inputs(case)
    direction = _tangents([lam])[0]
    kernel = tullax.einsum_kernel(case.spec, backend="c")

    def along(fn):
        return lambda lam: jnp.sum(jax.jvp(lambda a: fn(a, x), (lam,), (direction,))[1] ** 2)

    _close(jax.grad(along(kernel))(lam), jax.grad(along(case.oracle))(lam), 1e-8)


@pytest.mark.parametrize("backend", (c_param(), "numba", "xla"))
def test_jvp_with_a_complex_lam(backend):
    """S5's complex diagonal: holomorphic in lam, so the tangent is ∂h/∂lam · l̇am (complex64)."""
    case = BY_NAME["lru"]
    lam, x, h0 = _inputs(case)
    lam = (lam * np.exp(0.3j * np.arange(lam.size))).astype(np.complex64)
    x, h0 = x.astype(np.float32), h0.astype(np.float32)
    dlam = (np.linspace(0.1, 0.5, lam.size) * (1 - 0.5j)).astype(np.complex64)
    kernel = tullax.einsum_kernel(case.spec, backend=backend)
    got = jax.jvp(lambda lam: kernel(lam, x, h0), (lam,), (dlam,))[1]
    want = jax.jvp(lambda lam: case.oracle(lam, x, h0), (lam,), (dlam,))[1]
    assert got.dtype == np.complex64
    _close(got, want, 2e-5)


# ---------------------------------------------------------------------------------------------
# lax.associative_scan: the planner's candidate for a linear recurrence
# ---------------------------------------------------------------------------------------------
LINEAR = [BY_NAME[n] for n in ("lru", "returns", "mamba")]


@pytest.mark.parametrize("case", LINEAR, ids=lambda c: c.name)
def test_the_associative_form_equals_the_sequential_scan(case):
    """Forward and the gradient of every input through it (jitted: eager, each op dispatches alone), against
    the lax.scan oracle."""
    from tullax.backends.xla.forms import lower_form

    _, spec = compile_spec(case.spec)
    args = _inputs(case)
    run = lower_form(spec, "associative")
    env = lambda a: dict(zip(spec.input_names, a))  # noqa: E731
    _close(jax.jit(lambda *a: run(env(a)))(*args), case.oracle(*args))
    weight = np.random.default_rng(1).normal(size=np.shape(case.oracle(*args)))
    argnums = tuple(range(len(args)))
    got = jax.jit(jax.grad(lambda *a: jnp.sum(run(env(a)) * weight), argnums))(*args)
    want = jax.grad(lambda *a: jnp.sum(case.oracle(*a) * weight), argnums)(*args)
    for g, w in zip(got, want):
        _close(g, w)


def test_the_associative_form_with_a_complex_lam_and_a_long_scan():
    from tullax.backends.xla.forms import lower_form

    case = BY_NAME["lru"]
    rng = np.random.default_rng(2)
    lam = rng.uniform(0.9, 0.99, 3) * np.exp(0.3j * np.arange(3))
    x, h0 = rng.normal(size=(2, 300, 3)), rng.normal(size=(2, 3))
    _, spec = compile_spec(case.spec)
    run = jax.jit(lambda *a: lower_form(spec, "associative")(dict(zip(spec.input_names, a))))
    _close(run(lam, x, h0), case.oracle(lam, x, h0), 1e-9)


def test_a_nonlinear_or_mixing_step_has_no_associative_form():
    from tullax.backends.xla.associative import is_linear

    for text in ("h[b,t,n] := tanh(lam[n]*h[b,t-1,n] + x[b,t,n])  (t scan)",
                 "h[b,t,n] := lam[n]*h[b,t-1,n]*h[b,t-1,n] + x[b,t,n]  (t scan)",
                 "h[b,t,n] := conj(h[b,t-1,n]) + x[b,t,n]  (t scan)",
                 "h[b,t,n] := W[n,m]*h[b,t-1,m] + x[b,t,n]  (t scan)",
                 "y[b,t] := a1*y[b,t-1] + a2*y[b,t-2] + x[b,t]  (t scan from y0)",
                 "(max) m[b,t] := max(m[b,t-1], x[b,t,j])  (t scan)"):
        assert not is_linear(compile_spec(text)[1]), text
    assert not is_linear(compile_spec("h[b,t] := (x[b,t] - 1)*(h[b,t-1] + 2) |> 2*_  (t scan)")[1])  # finaliser
    assert is_linear(compile_spec("h[b,t] := (x[b,t] - 1)*(h[b,t-1] + 2)  (t scan)")[1])


def test_the_planner_races_the_associative_form_and_runs_it_when_it_wins(monkeypatch, tmp_path):
    """A race on a scripted clock where lax.associative_scan is fastest: the plan says so, and an ``auto``
    kernel of those shapes then runs it, matching the oracle."""
    from tullax.planner import candidates, tuning
    from tullax.planner import decide as planner

    monkeypatch.setenv(tuning.TIMING_ENV, "1")
    monkeypatch.setenv("TULLAX_CACHE_DIR", str(tmp_path))
    from tullax.backends import workload

    monkeypatch.setattr(tuning, "UNTIMED_WORK", 0)  # small shapes, raced all the same
    monkeypatch.setattr(workload, "serial_threshold", lambda: 0)
    clock = {"now": 0.0}
    original = candidates.prepared
    raced = []

    def scripted(call, candidate, values):
        if call.spec.scan is None or original(call, candidate, values) is None:
            return original(call, candidate, values)
        raced.append(candidate)

        def run() -> None:
            clock["now"] += 0.001 if candidate == "xla:associative" else 0.005
        return run

    monkeypatch.setattr(candidates, "prepared", scripted)
    case = BY_NAME["lru"]
    _, spec = compile_spec(case.spec)
    rng = np.random.default_rng(4)
    lam, x, h0 = rng.uniform(0.5, 0.95, 4), rng.normal(size=(3, 40, 4)), rng.normal(size=(3, 4))
    planner.forget()
    try:
        found = planner.plan(spec, {"lam": lam.shape, "x": x.shape, "h0": h0.shape},
                             {"lam": "float64", "x": "float64", "h0": "float64"}, clock=lambda: clock["now"])
        assert {"loops", "xla:grid", "xla:associative"} <= set(raced)
        assert (found.rule, found.backend, found.form) == ("linear recurrence", "xla", "associative")
        kernel = tullax.einsum_kernel(case.spec, backend="auto")
        assert "on xla associative" in str(jax.make_jaxpr(kernel)(lam, x, h0))
        _close(jax.jit(kernel)(lam, x, h0), case.oracle(lam, x, h0))
    finally:
        planner.forget()


def test_the_associative_form_of_a_reverse_scan_from_an_initial_state():
    from tullax.backends.xla.forms import lower_form

    rng = np.random.default_rng(6)
    r, gamma, G0 = rng.normal(size=(2, 7)), rng.uniform(0.5, 0.9, (2, 7)), rng.normal(size=2)
    want, G = np.zeros((2, 7)), G0
    for t in reversed(range(7)):
        want[:, t] = G = r[:, t] + gamma[:, t] * G
    _, spec = compile_spec("G[b,t] := r[b,t] + gamma[b,t]*G[b,t+1]  (t scan reverse from G0)")
    _close(jax.jit(lambda *a: lower_form(spec, "associative")(dict(zip(spec.input_names, a))))(r, gamma, G0), want)


def test_explain_prints_the_tangent_recurrence():
    text = tullax.explain(BY_NAME["lru"].spec)
    assert "tangent (jvp, jacfwd):\n  dh[b,t,n] := ifelse(t >= 1, h[b,pad(t-1),n], h0[b,n])*dlam[n]" in text
    assert "(none: the transpose of the gradient kernels)" in tullax.explain(BY_NAME["runmax"].spec)
