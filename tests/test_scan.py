"""Recurrences (issue 48): ``(t scan)`` specs against independent ``lax.scan`` oracles (tests/scan_cases.py) on
c, numba, xla and auto: forward (eager and jit), grad, second derivatives, jacfwd, jacrev, vmap of grad, float32,
float64 and a complex64 lam; the printed CUDA C through the host harness and the printed Julia through the
subset evaluator; the loop structure (lanes parallel, t sequential inside); hostile specs refused with a caret."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from loop_backends import c_param
from scan_cases import CASES

import tullax
from tullax.backends.base import Signature
from tullax.compiler.loops import If, Let, Loop, Var, parallel_nest, walk_stmts
from tullax.compiler.lower import lower
from tullax.errors import SpecError, TullaxError
from tullax.grad import gradients
from tullax.grad.run import gradient_env, run_gradient
from tullax.spec.frontend import compile_spec

BACKENDS = (c_param(), "numba", "xla", "auto")
JAX_BACKENDS = (c_param(), "xla", "auto")
BY_NAME = {case.name: case for case in CASES}
TOL = {"float64": 1e-10, "float32": 2e-4}


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def _inputs(case, dtype="float64", seed=0):
    return list(case.inputs(np.random.default_rng(seed), dtype).values())


def _close(got, want, dtype="float64"):
    got, want = np.asarray(got, np.float64 if np.isrealobj(got) else np.complex128), np.asarray(want)
    scale = max(1.0, float(np.abs(want).max(initial=0)))
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype] * scale)


# ---------------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_forward_eager_matches_lax_scan(case, backend, dtype):
    args = _inputs(case, dtype)
    got = tullax.einsum_kernel(case.spec, backend=backend)(*args)
    want = case.oracle(*[np.asarray(a, np.float64) for a in args])
    assert np.asarray(got).dtype == np.dtype(dtype)
    _close(got, want, dtype)


@pytest.mark.parametrize("backend", JAX_BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_forward_under_jit(case, backend):
    args = _inputs(case)
    kernel = tullax.einsum_kernel(case.spec, backend=backend)
    _close(jax.jit(kernel)(*args), case.oracle(*args))


# ---------------------------------------------------------------------------------------------
# Derivatives
# ---------------------------------------------------------------------------------------------
def _loss(fn, weight):
    return lambda *a: jnp.sum(fn(*a) * weight)


@pytest.mark.parametrize("backend", (c_param(), "numba", "xla", "auto"))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_grad_of_every_input_matches_lax_scan(case, backend):
    args = _inputs(case)
    weight = np.random.default_rng(1).normal(size=np.shape(case.oracle(*args)))
    kernel = tullax.einsum_kernel(case.spec, backend=backend)
    argnums = tuple(range(len(args)))
    got = jax.jit(jax.grad(_loss(kernel, weight), argnums))(*args)
    want = jax.grad(_loss(case.oracle, weight), argnums)(*args)
    for g, w in zip(got, want):
        _close(g, w)


@pytest.mark.parametrize("backend", JAX_BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_jacfwd_and_jacrev_match_lax_scan(case, backend):
    args = _inputs(case)
    kernel = tullax.einsum_kernel(case.spec, backend=backend)
    for jac in (jax.jacfwd, jax.jacrev):
        _close(jac(kernel, argnums=0)(*args), jac(case.oracle, argnums=0)(*args))


@pytest.mark.parametrize("backend", JAX_BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_vmap_of_grad_matches_lax_scan(case, backend):
    args = _inputs(case)
    batched = [np.stack([a, 0.5 * np.asarray(a) + 0.1]) for a in args]
    kernel = tullax.einsum_kernel(case.spec, backend=backend)
    got = jax.vmap(jax.grad(lambda *a: jnp.sum(kernel(*a) ** 2), tuple(range(len(args)))))(*batched)
    want = jax.vmap(jax.grad(lambda *a: jnp.sum(case.oracle(*a) ** 2), tuple(range(len(args)))))(*batched)
    for g, w in zip(got, want):
        _close(g, w)


@pytest.mark.parametrize("backend", (c_param(), "xla"))
@pytest.mark.parametrize("case", [BY_NAME[n] for n in ("lru", "elman", "second", "returns")], ids=lambda c: c.name)
def test_second_derivatives(case, backend):
    """grad of a function of the gradient: the adjoint recurrence is differentiated like the forward one."""
    args = _inputs(case)
    kernel = tullax.einsum_kernel(case.spec, backend=backend)

    def outer(fn):
        inner = jax.grad(lambda a, *rest: jnp.sum(fn(a, *rest) ** 2))
        return jax.grad(lambda a, *rest: jnp.sum(inner(a, *rest) ** 2))

    _close(outer(kernel)(*args), outer(case.oracle)(*args))


@pytest.mark.parametrize("backend", (c_param(), "xla"))
def test_vmap_over_the_initial_state_only(backend):
    case = BY_NAME["lru"]
    lam, x, h0 = _inputs(case)
    h0s = np.stack([h0, -h0, 2 * h0])
    kernel = tullax.einsum_kernel(case.spec, backend=backend)
    _close(jax.vmap(kernel, in_axes=(None, None, 0))(lam, x, h0s),
           jax.vmap(case.oracle, in_axes=(None, None, 0))(lam, x, h0s))


@pytest.mark.parametrize("backend", (c_param(), "xla"))
def test_float32_grad(backend):
    case = BY_NAME["elman"]
    args = _inputs(case, "float32")
    kernel = tullax.einsum_kernel(case.spec, backend=backend)
    got = jax.grad(lambda W, x: jnp.sum(kernel(W, x)), (0, 1))(*args)
    want = jax.grad(lambda W, x: jnp.sum(case.oracle(W, x)), (0, 1))(*[np.float64(a) for a in args])
    for g, w in zip(got, want):
        assert g.dtype == np.float32
        _close(g, w, "float32")


@pytest.mark.parametrize("backend", (c_param(), "numba", "xla"))  # complex x and complex128: test_scan_complex
def test_complex_lam(backend):
    """S5 with a complex diagonal: forward, and the gradient of a real loss (jax's convention)."""
    case = BY_NAME["lru"]
    lam, x, h0 = _inputs(case)
    lam = (lam * np.exp(0.3j * np.arange(lam.size))).astype(np.complex64)
    x, h0 = x.astype(np.float32), h0.astype(np.float32)
    kernel = tullax.einsum_kernel(case.spec, backend=backend)
    _close(kernel(lam, x, h0), case.oracle(lam, x, h0), "float32")
    loss = lambda f: lambda lam, x: jnp.sum(jnp.abs(f(lam, x, h0)) ** 2)  # noqa: E731
    for g, w in zip(jax.grad(loss(kernel), (0, 1))(lam, x), jax.grad(loss(case.oracle), (0, 1))(lam, x)):
        _close(g, w, "float32")


@pytest.mark.parametrize("backend", (c_param(), "numba"))
def test_float32_keeps_precision_over_long_scans(backend):
    """What docs/recurrences.md promises for a T-step float32 recurrence (|lam| < 1): the rounding accumulated
    over the steps stays within a few ulps of the exact result of its float32 inputs, and the error against
    float64 (dominated by rounding lam, compounded over the memory of the scan) below T/4 ulps, both relative
    to the largest state."""
    rng = np.random.default_rng(3)
    T = 4096
    lam, x, h0 = rng.uniform(0.99, 0.9999, 8), rng.normal(size=(2, T, 8)), rng.normal(size=(2, 8))
    kernel = tullax.einsum_kernel(BY_NAME["lru"].spec, backend=backend)
    single = np.asarray(kernel(*(a.astype(np.float32) for a in (lam, x, h0))), np.float64)
    exact = np.asarray(kernel(lam, x, h0))
    of_rounded = np.asarray(kernel(*(a.astype(np.float32).astype(np.float64) for a in (lam, x, h0))))
    eps = np.finfo(np.float32).eps
    assert np.abs(single - of_rounded).max() / np.abs(of_rounded).max() < 16 * eps
    assert np.abs(single - exact).max() / np.abs(exact).max() < T / 4 * eps


# ---------------------------------------------------------------------------------------------
# The loop structure, the derived specs, the printers
# ---------------------------------------------------------------------------------------------
def _kernel(text, dtype="float64"):
    spec = compile_spec(text)[1]
    return spec, lower(spec, Signature.for_dtype(spec, dtype))


def test_lanes_parallel_t_sequential_inside():
    spec, kernel = _kernel(BY_NAME["lru"].spec)
    loops, inner = parallel_nest(kernel)
    assert len(loops) == 2  # b and n
    assert len(inner) == 1 and isinstance(inner[0], Loop) and not inner[0].parallel  # t walks each lane


def test_mixing_axis_runs_inside_t():
    spec, kernel = _kernel(BY_NAME["elman"].spec)
    loops, inner = parallel_nest(kernel)
    assert len(loops) == 1  # only b: n mixes
    t_loop = inner[0]
    assert isinstance(t_loop, Loop) and not t_loop.parallel
    assert isinstance(t_loop.body[0], Loop) and not t_loop.body[0].parallel  # n, inside each step
    assert not any(isinstance(s, Loop) and s.parallel for s in walk_stmts(inner))


def test_explain_prints_the_adjoint_recurrence():
    kernel = tullax.einsum_kernel(BY_NAME["lru"].spec, backend="xla")
    texts = kernel.grad_specs
    adjoint = "gh[b,t,n] := Δh[b,t,n] + gh[b,t+1,n]*lam[pad(n)]  (t scan reverse)"
    assert all(t.startswith(adjoint + "; ") for t in texts), texts
    assert "Δlam[n] := gh[b,t,n]*ifelse(t >= 1, h[b,pad(t-1),n], h0[b,n])" in texts[0]
    assert "Δh0[b,n] := gh[pad(b),pad(0),pad(n)]*lam[pad(n)]" in texts[2]
    assert "(t scan from h0)" in kernel.spec


def test_canonical_text_parses_back():
    for case in CASES:
        text, spec = compile_spec(case.spec)
        assert compile_spec(text)[1] == spec


@pytest.mark.parametrize("text, message, column", [
    ("h[b,t,n] := lam[n]*h[b,t+1,n] + x[b,t,n]  (t scan)", "not computed yet", 23),
    ("h[b,t,n] := lam[n]*h[b,t,n] + x[b,t,n]  (t scan)", "not computed yet", 23),
    ("G[b,t] := r[b,t] + G[b,t-1]  (t scan reverse)", "later positions", 23),
    ("h[b,t,n] := lam[n]*h[b,t-k,n] + x[b,t,n]  (t scan)", "constant offsets", 23),
    ("h[b,t,n] := lam[n]*h[b,2t-1,n] + x[b,t,n]  (t scan)", "constant offsets", 23),
    ("h[b,n] := lam[n]*h[b,t-1,n] + x[b,t,n]  (t scan)", "summed", None),
    ("h[b,t,n] := lam[n]*h[b,t-1,n] + x[b,t,n]  (t scan) (t scan)", "at most one scan clause", 51),
    ("h[b,t,n] := lam[n]*h[b,t-1,n] + x[b,t-1,n]  (t scan)", "read at t itself", 36),
    ("h[b,t,n] := lam[n]*h[b,t-1,n+1] + x[b,t,n]  (t scan)", "other axis", 27),
    ("h[b,t,n] += lam[n]*h[b,t-1,n]  (t scan)", "':='", None),
    ("h[b,t,n] := lam[n]*x[b,t,n]  (t scan)", "drop the scan clause", None),
    ("h[b,t,n] := lam[n]*h[b,t-1,n] + x[b,t,n]  (t scan sideways)", "scan reverse", 42),
    ("y[t] := 0.5*y[t-1] + 1  (t scan)", "give it", None),
])
def test_hostile_scan_specs_are_refused_with_a_caret(text, message, column):
    with pytest.raises(SpecError) as err:
        compile_spec(text)
    assert message in err.value.message, err.value.message
    if column is not None:
        assert err.value.column == column, (err.value.column, str(err.value))


def test_wrong_initial_state_shape_is_a_shape_error():
    case = BY_NAME["lru"]
    lam, x, h0 = _inputs(case)
    with pytest.raises(TullaxError, match="initial state"):
        tullax.einsum_kernel(case.spec, backend="xla")(lam, x, h0[:, :2])


@pytest.mark.parametrize("backend", (c_param(), "xla"))
def test_a_mixing_read_beyond_the_state_is_a_shape_error(backend):
    """W[n,m] with more columns than the state has lanes would read h[b,t-1,m] outside the state."""
    kernel = tullax.einsum_kernel(BY_NAME["elman"].spec, backend=backend)
    with pytest.raises(TullaxError, match=r"axis 2 of h \(as the scan reads it"):
        kernel(np.ones((3, 4)), np.ones((2, 5, 3)))


def _steps(case, dtype):
    """(spec, env) of the forward kernel and every gradient step of ``case``, environments from float64 runs."""
    spec = compile_spec(case.spec)[1]
    env = dict(zip(spec.input_names, _inputs(case, dtype)))
    runs = [(spec, env)]
    result = np.asarray(tullax.einsum_kernel(case.spec, backend="xla")(*env.values()))
    genv = gradient_env(spec, env, result, np.random.default_rng(7).normal(size=result.shape).astype(dtype))

    def record(step, step_env):
        runs.append((step, step_env))
        return _xla(step, step_env)

    for grad in gradients(spec):
        run_gradient(grad, spec, genv, record)
    return runs


ADJOINT = "g[b,t,n] := d[b,t,n] + lam[n]*g[b,t+1,n]  (t scan reverse)"  # the LRU's adjoint, as derived


def test_a_reverse_scan_walks_its_long_rows_by_descending_lines():
    """A reverse scan's contiguous row, from 512 bytes on, is walked a cache line at a time from its top line down
    (``compiler.scan.descending_lines``: rows walked upwards one after the other downwards left the prefetchers
    fetching the row just done; the complex LRU's adjoint ran at about twice its forward's time); a forward scan
    keeps its plain rows."""
    spec = compile_spec(ADJOINT)[1]
    kernel = lower(spec, Signature.for_dtype(spec, "complex64"), tile=True)
    branches = [s for s in walk_stmts(kernel.body) if isinstance(s, If)]
    assert len(branches) == 1, branches
    (walk,), (plain,) = branches[0].then, branches[0].orelse  # t's loop with long rows, and as it was
    lines = [s for s in walk_stmts(walk.body) if isinstance(s, Loop) and isinstance(s.body[0], Let)]
    assert len(lines) == 1
    line = lines[0].body[1]  # each line from its first element, the lines from the top one down
    assert isinstance(line, Loop) and line.start == Var(lines[0].body[0].var, "int64")
    assert [s.body for s in plain.body if isinstance(s, Loop)] == [line.body]  # short rows: the plain row loop
    forward = compile_spec(BY_NAME["lru"].spec)[1]
    assert not any(isinstance(s, If) for s in walk_stmts(
        lower(forward, Signature.for_dtype(forward, "complex64"), tile=True).body))


@pytest.mark.parametrize("dtype", ["complex128", "float64"])
@pytest.mark.parametrize("backend", (c_param(), "numba"))
def test_a_reverse_scan_over_long_and_short_rows(backend, dtype):
    """The descending lines against a NumPy reverse recurrence: rows of 70 (a part line at the top) and of 5
    (the plain loop)."""
    kernel = tullax.einsum_kernel(ADJOINT, backend=backend)
    rng = np.random.default_rng(3)
    for n in (70, 5):
        d = rng.normal(size=(2, 9, n)) + (1j * rng.normal(size=(2, 9, n)) if dtype == "complex128" else 0)
        lam = rng.uniform(0.5, 1.0, n) * (np.exp(0.3j * np.arange(n)) if dtype == "complex128" else 1)
        want = np.zeros_like(d)
        for t in range(8, -1, -1):
            want[:, t] = d[:, t] + (lam * want[:, t + 1] if t < 8 else 0)
        _close(kernel(d.astype(dtype), lam.astype(dtype)), want)


def test_printed_julia_of_a_reverse_scan_over_long_rows():
    pytest.importorskip("tree_sitter_julia")
    from test_julia_printer import run_julia

    spec = compile_spec(ADJOINT)[1]
    rng = np.random.default_rng(4)
    env = {"d": rng.normal(size=(2, 5, 70)), "lam": rng.uniform(0.5, 1.0, 70)}
    _close(run_julia(spec, env), _xla(spec, env))


def _xla(step, step_env):
    from tullax.backends.xla.lower import lower as xla_lower

    return np.asarray(xla_lower(step)(step_env))


@pytest.mark.parametrize("case", [BY_NAME[n] for n in ("lru", "elman", "second", "returns", "runmax")],
                         ids=lambda c: c.name)
def test_printed_julia_in_the_subset_evaluator(case):
    pytest.importorskip("tree_sitter_julia")
    from test_julia_printer import run_julia

    for step, env in _steps(case, "float64"):
        _close(run_julia(step, env), _xla(step, env))


@pytest.mark.parametrize("case", [BY_NAME[n] for n in ("lru", "elman", "second", "returns", "runmax")],
                         ids=lambda c: c.name)
def test_printed_cuda_in_the_host_harness(case, tmp_path):
    from cuda_harness import GPP, build, run

    if GPP is None:
        pytest.skip("g++ is not installed")
    from test_cuda_host import launch_for

    jobs, expected = [], []
    for k, (step, env) in enumerate(_steps(case, "float64")):
        jobs.append(launch_for(step, env, f"k{k}", True))
        expected.append(_xla(step, env))
    exe = build([(job.kernel, job.index_bits) for job in jobs], tmp_path)
    for got, want in zip(run(exe, list(enumerate(jobs))), expected):
        _close(got.reshape(want.shape), want)


def test_pseudo_printer_shows_the_sequential_loop():
    from tullax.printers.pseudo import format_kernel

    _, kernel = _kernel(BY_NAME["returns"].spec)
    text = format_kernel(kernel)
    assert "parallel" in text and text.count("for ") >= 2, text
