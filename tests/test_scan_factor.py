"""Lane factors of recurrences (issue 48, ``tullax.grad.factor``): ``jacfwd``/``jacrev`` w.r.t. an input read
only at lane indices (``lam[n]``, a scalar, ``A[d,n]``, the initial state) run ONE sensitivity scan and a jnp
product, where they ran a scan batched over every basis tangent (n trajectories); checked against the
independent ``lax.scan`` oracles of tests/scan_cases.py in float64 on c, numba, xla and auto; the kernels a
jacobian runs (complex lam included); and the inputs that do not factor (mixing states, inputs along the scan)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from loop_backends import c_param
from scan_cases import CASES

import tullax
from tullax.grad.factor import lane_factor
from tullax.spec.frontend import compile_spec

BY_NAME = {case.name: case for case in CASES}


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def _inputs(case, seed=0):
    return list(case.inputs(np.random.default_rng(seed), "float64").values())


def _close(got, want, tol=1e-10):
    got, want = np.asarray(got), np.asarray(want)
    scale = max(1.0, float(np.abs(want).max(initial=0)))
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


def test_which_inputs_factor():
    def axes(case, name):
        return lane_factor(compile_spec(BY_NAME[case].spec)[1], name)

    assert axes("lru", "lam") == (2,) and axes("lru", "h0") == (0, 2) and axes("lru", "x") is None
    assert axes("tanh", "lam") == (2,)  # a finaliser-free nonlinear body: still lane by lane
    assert axes("second", "a1") == () and axes("second", "y0") is None  # an initial state of depth 2
    assert axes("mamba", "A") == (2, 3) and axes("mamba", "dt") is None  # dt varies along the scan
    assert axes("elman", "W") is None  # W mixes the lanes
    assert axes("returns", "gamma") is None
    _, spec = compile_spec("h[b,t,n] := lam[n]*h[b,t-1,n] + lam[m]*x[b,t,n,m]  (t scan)")
    assert lane_factor(spec, "lam") is None  # also read at a summed index
    _, spec = compile_spec("h[b,t,n] := lam[n]*h[b,t-1,n] + c[n,b]*x[b,t,n]  (t scan)")
    assert lane_factor(spec, "c") == (2, 0)  # its axes in its own order


def _final(fn, args, wrt):
    def f(value):
        full = list(args)
        full[wrt] = value
        out = fn(*full)
        return out[:, -1].mean(0) if out.ndim > 2 else out[:, -1]
    return f


# (case, the input differentiated): lane vectors, a scalar, a lane matrix, an initial state
FACTORED = [("lru", 0), ("lru", 2), ("tanh", 0), ("second", 0), ("mamba", 1)]


def _params():
    c_marks = c_param().marks
    for backend in ("c", "xla", "auto"):
        for name, wrt in FACTORED:
            marks = c_marks if backend == "c" else ()
            yield pytest.param(name, wrt, backend, id=f"{name}-{wrt}-{backend}", marks=marks)
    yield pytest.param("lru", 0, "numba", id="lru-0-numba")  # numba compiles slowly: one case


@pytest.mark.parametrize("name,wrt,backend", list(_params()))
def test_jacobians_wrt_lane_inputs_match_lax_scan(name, wrt, backend):
    case = BY_NAME[name]
    args = _inputs(case)
    kernel = tullax.einsum_kernel(case.spec, backend=backend)
    for jac in (jax.jacfwd, jax.jacrev):
        want = jac(_final(case.oracle, args, wrt))(args[wrt])
        _close(jax.jit(jac(_final(kernel, args, wrt)))(args[wrt]), want)


def _kernel_ranks(fn, *values):
    ranks = []

    def visit(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "tullax_kernel":
                ranks.append(eqn.outvars[0].aval.ndim)
            for value in eqn.params.values():
                inner = getattr(value, "jaxpr", None)
                if inner is not None and hasattr(inner, "eqns"):
                    visit(inner)

    visit(jax.make_jaxpr(fn)(*values).jaxpr)
    return ranks


@pytest.mark.parametrize("backend", [c_param(), "xla"])
def test_jacobians_wrt_lam_run_no_batched_scan(backend):
    """Before the factors, jacfwd ran the tangent scan batched over the n basis tangents and jacrev the adjoint
    scan batched over the n cotangents: a kernel with one more axis than the result, n trajectories."""
    case = BY_NAME["lru"]
    args = _inputs(case)
    kernel = tullax.einsum_kernel(case.spec, backend=backend)
    for jac in (jax.jacfwd, jax.jacrev):
        ranks = _kernel_ranks(jac(_final(kernel, args, 0)), args[0])
        assert ranks and max(ranks) == 3, (jac.__name__, ranks)


def test_inputs_that_do_not_factor_keep_the_batched_scan():
    """A mixing state (elman's W) and an input along the scan (x) still run one batched kernel, correctly."""
    case = BY_NAME["elman"]
    args = _inputs(case)
    kernel = tullax.einsum_kernel(case.spec, backend="xla")
    f = _final(kernel, args, 0)
    assert max(_kernel_ranks(jax.jacfwd(f), args[0])) == 4
    _close(jax.jacfwd(f)(args[0]), jax.jacfwd(_final(case.oracle, args, 0))(args[0]))


def test_vmap_of_jacfwd_over_the_primals_takes_the_general_path():
    """Batched primals: the sensitivity would be batched too, so the batched tangent scan runs (and agrees)."""
    case = BY_NAME["lru"]
    lam, x, h0 = _inputs(case)
    kernel = tullax.einsum_kernel(case.spec, backend="xla")
    xs = np.stack([x, 2 * x])

    def jac(fn):
        return jax.vmap(lambda x: jax.jacfwd(lambda lam: fn(lam, x, h0)[:, -1].sum(0))(lam))(xs)

    _close(jac(kernel), jac(case.oracle))
    assert jnp.shape(jac(kernel)) == (2, lam.shape[0], lam.shape[0])


@pytest.mark.parametrize("backend", [c_param(), "xla"])
def test_an_input_gradient_that_is_the_adjoint_state_runs_no_copy_kernel(backend):
    """``Δx[b,t,n] := gh[b,t,n]``: the gradient IS the adjoint state; it ran as a kernel writing a copy of it."""
    case = BY_NAME["lru"]
    lam, x, h0 = _inputs(case)
    kernel = tullax.einsum_kernel(case.spec, backend=backend)
    weight = np.random.default_rng(3).normal(size=x.shape)
    grad = jax.grad(lambda x: jnp.sum(kernel(lam, x, h0) * weight))
    assert len(_kernel_ranks(grad, x)) == 2  # the forward and the adjoint scan
    _close(jax.jit(grad)(x), jax.grad(lambda x: jnp.sum(case.oracle(lam, x, h0) * weight))(x))


def test_whole_copy_takes_only_an_unchanged_whole_array():
    from tullax.grad.run import whole_copy

    def spec(text):
        return compile_spec(text)[1]

    g, x = np.zeros((2, 3)), np.zeros((2, 3))
    assert whole_copy(spec("dx[i,j] := g[i,j]"), {"g": g}) == "g"
    assert whole_copy(spec("dx[j,i] := g[i,j]"), {"g": g}) is None  # a transpose
    assert whole_copy(spec("dx[i,j] := 2*g[i,j]"), {"g": g}) is None
    assert whole_copy(spec("dx[i,j] := g[i,j]  (i in 0:size(x,0))"), {"g": g, "x": x}) == "g"
    assert whole_copy(spec("dx[i,j] := g[i,j]  (i in 0:size(x,0))"), {"g": g, "x": x[:1]}) is None  # a part


@pytest.mark.parametrize("backend", [c_param()])
def test_jacobians_wrt_a_complex_lam_factor_and_match_lax_scan(backend):
    """S5's complex lam, differentiated through its real and imaginary parts (jax's jacobians take real inputs):
    its tangent is complex-linear in lam's, so it factors like a real one (it ran the batched scan, 2n
    trajectories); the jacobians agree with lax.scan's."""
    case = BY_NAME["lru"]
    lam, x, h0 = _inputs(case)
    lam = lam * np.exp(0.3j * np.arange(1, lam.size + 1))
    kernel = tullax.einsum_kernel(case.spec, backend=backend)

    def final(fn):
        return lambda parts: jnp.real(fn(jax.lax.complex(parts[0], parts[1]), x, h0)[:, -1].mean(0))

    parts = np.stack([lam.real, lam.imag])
    for jac in (jax.jacfwd, jax.jacrev):
        assert max(_kernel_ranks(jac(final(kernel)), parts)) == 3, jac.__name__
        _close(jax.jit(jac(final(kernel)))(parts), jac(final(case.oracle))(parts))
