"""Forward mode of recurrences (issue 48): ``jax.jvp``/``jacfwd`` of a ``(t scan)`` kernel runs its tangent
recurrence (``tullax.grad.tangent``), one forward scan kernel, checked against ``jax.jvp`` of the independent
``lax.scan`` oracles of tests/scan_cases.py in float64 on c, numba, xla and auto; the derived spec; that a jvp
lowers to two kernels (the forward and its tangent); higher orders through it; complex lam."""
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


@pytest.mark.parametrize("backend", ("numba", "xla"))  # the c printer has no complex type
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
