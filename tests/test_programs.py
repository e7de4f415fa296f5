"""Programs (issue 50): several statements in one kernel string, against jnp written by hand
(tests/program_cases.py): forward eager and jit, gradients eager and jit, float32 and float64, on c, numba, xla
and auto; vmap and a second derivative; the flow checks with carets; explain."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from loop_backends import c_param
from program_cases import CASES, LAYERNORM

import tullax
from tullax.api.program import ProgramKernel
from tullax.errors import SpecError
from tullax.spec.program import is_program, split_statements

BACKENDS = (c_param(), "numba", "xla", "auto")
TOL = {"float64": 1e-9, "float32": 3e-4}


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def _close(got, want, dtype):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(1.0, float(np.abs(want).max(initial=0)))
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype] * scale)


def _outputs(value):
    return value if isinstance(value, tuple) else (value,)


def _oracle(case, args):
    return _outputs(case.oracle(*[jnp.asarray(a, jnp.float64) for a in args]))


# float64 eager and float32 jitted: each dtype and each mode once, at half the cases of their product
DTYPE_MODES = [("float64", "eager"), ("float32", "jit")]


@functools.lru_cache(maxsize=None)
def _kernel(spec: str, backend: str):
    """One kernel per program and backend for every test here (its compiled modules and, under auto, its plans)."""
    return tullax.einsum_kernel(spec, backend=backend)


@pytest.mark.parametrize(("dtype", "mode"), DTYPE_MODES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_forward_matches_jnp(case, backend, dtype, mode):
    args = case.inputs(np.random.default_rng(0), dtype)
    kernel = _kernel(case.spec, backend)
    assert isinstance(kernel, ProgramKernel)
    if mode == "jit":
        # Python scalars stay Python numbers (closed over): a jit argument would be a float64 tracer
        arrays = [k for k, a in enumerate(args) if not isinstance(a, float)]

        def run(*values):
            full = list(args)
            for k, value in zip(arrays, values):
                full[k] = value
            return kernel(*full)
        got = _outputs(jax.jit(run)(*[jnp.asarray(args[k]) for k in arrays]))
    else:
        got = _outputs(kernel(*args))
    want = _oracle(case, args)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert np.asarray(g).dtype == np.dtype(dtype)
        assert np.shape(g) == np.shape(w)
        _close(g, w, dtype)


def _loss(fn, weights):
    def loss(*args):
        return sum((out * w).sum() for out, w in zip(_outputs(fn(*args)), weights))
    return loss


@pytest.mark.parametrize(("dtype", "mode"), [("float32", "eager"), ("float64", "jit")])  # the other two pairs
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradients_match_jnp(case, backend, dtype, mode):
    """Every input's gradient, scalars included, of a weighted sum of the outputs (a plain sum of a softmax has
    zero gradient and would hide mistakes)."""
    rng = np.random.default_rng(1)
    args = [jnp.asarray(a, dtype) for a in case.inputs(rng, dtype)]
    want_out = _oracle(case, args)
    weights = [jnp.asarray(rng.normal(size=np.shape(w))) for w in want_out]
    kernel = _kernel(case.spec, backend)
    argnums = tuple(range(len(args)))
    grad = jax.grad(_loss(kernel, [w.astype(dtype) for w in weights]), argnums=argnums)
    got = (jax.jit(grad) if mode == "jit" else grad)(*args)
    want = jax.grad(_loss(case.oracle, weights), argnums=argnums)(*[a.astype(jnp.float64) for a in args])
    for name, g, w in zip(case.shapes, got, want):
        assert g.dtype == np.dtype(dtype), name
        _close(g, w, dtype)


@pytest.mark.parametrize("backend", [c_param(), "xla"])
def test_vmap_of_a_program(backend):
    case = next(c for c in CASES if c.name == "layernorm")
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(size=(3, 5, 8)))
    g, beta = jnp.asarray(rng.normal(size=8)), jnp.asarray(rng.normal(size=8))
    kernel = tullax.einsum_kernel(case.spec, backend=backend)
    got = jax.jit(jax.vmap(kernel, in_axes=(0, None, None, None)))(x, 1e-5, g, beta)
    want = jax.vmap(case.oracle, in_axes=(0, None, None, None))(x, 1e-5, g, beta)
    _close(got, want, "float64")


@pytest.mark.parametrize("backend", [c_param(), "xla"])
def test_second_derivative_of_a_program(backend):
    """A Hessian-vector product: the statements' gradient kernels are differentiated again."""
    case = next(c for c in CASES if c.name == "rmsnorm")
    rng = np.random.default_rng(3)
    x, g = jnp.asarray(rng.normal(size=(4, 6))), jnp.asarray(rng.normal(size=6))
    w, v = jnp.asarray(rng.normal(size=(4, 6))), jnp.asarray(rng.normal(size=(4, 6)))
    kernel = tullax.einsum_kernel(case.spec, backend=backend)

    def hvp(fn):
        loss = lambda x: (fn(x, 1e-5, g) * w).sum()  # noqa: E731
        return jax.jvp(jax.grad(loss), (x,), (v,))[1]

    _close(jax.jit(lambda: hvp(kernel))(), hvp(case.oracle), "float64")


def test_named_inputs_and_outputs():
    kernel = tullax.einsum_kernel(LAYERNORM, backend="xla")
    assert kernel.inputs == ("x", "eps", "g", "beta") and kernel.outputs == ("y",)
    rng = np.random.default_rng(4)
    x, g, beta = rng.normal(size=(3, 4)), rng.normal(size=4), rng.normal(size=4)
    np.testing.assert_allclose(kernel(x, g=g, beta=beta, eps=1e-5), kernel(x, 1e-5, g, beta))
    assert kernel.spec.splitlines()[0].startswith("local mu[b] := ")


def test_statements_split_on_newlines_semicolons_and_continuations():
    text = "local a[i] := x[i] +\n   1.0   # a comment\n\n b[i] := a[i]*2; c[i] := a[i]^2"
    assert split_statements(text) == ["local a[i] := x[i] + 1.0", "b[i] := a[i]*2", "c[i] := a[i]^2"]
    assert is_program(text)
    assert split_statements("y[b,j] := x[b,j]\n  * w[j]\n  (j in 1:3)") == ["y[b,j] := x[b,j] * w[j] (j in 1:3)"]
    assert not is_program("y[i] := x[i,j]\n")  # one statement stays an ordinary kernel
    assert not is_program("y[i] := local[i,j]")
    assert isinstance(tullax.einsum_kernel("y[i] := x[i,j]\n"), tullax.Kernel)


@pytest.mark.parametrize("text, message, caret", [
    ("y[i] := a[i] + 1\na[i] := x[i]", "reads a, the output of statement 2, which comes later",
     "y[i] := a[i] + 1\n        ^"),
    ("local a[i] := x[i]\ny[i] := x[i]*2", "local a is never read",
     "a[i] := x[i]\n^"),  # shown without the keyword: the caret on the output's name
    ("a[i] := b[i] + x[i]\nb[i] := a[i]*2", "a cycle", "a[i] := b[i] + x[i]\n        ^"),
    ("a[i] := x[i]\na[i] := x[i]*2", "already defines", None),
    # a scan whose step is several statements runs (tests/test_scan_program.py); what its step cannot hold is refused
    ("local a[b,t] := y[b,t+1] * w[b,t]\ny[b,t] := tanh(a[b,t])  (t scan)", "only at steps already computed",
     "a[b,t] := y[b,t+1] * w[b,t]\n              ^"),
    ("a[i] := x[i]\ny[i] += a[i]", "every statement defines a new array with ':='", None),
    ("a[i] := x[i]\ny[i] := a[i] +* 2", "statement 2 of the program", None),
])
def test_flow_errors_point_at_the_statement(text, message, caret):
    with pytest.raises(SpecError) as info:
        tullax.einsum_kernel(text)
    assert message in str(info.value)
    if caret is not None:
        shown = str(info.value).split("\n")[1:]
        rendered = "\n".join(line[4:] for line in shown)
        assert rendered == caret


def test_explain_prints_statements_groups_and_gradients():
    text = tullax.explain(LAYERNORM)
    assert "program:   3 statements; inputs x, eps, g, beta; returns y" in text
    assert "reads mu (statement 1), var (statement 2)" in text
    assert "fusion groups:" in text
    assert "Δmu = sum of the cotangents from statement 2, statement 3" in text
    assert "-> Δvar: Δvar[b] := " in text


# -- random two-statement programs: a first statement (elementwise, a sum or a max), a second reading it -------
_F = {"tanh": jnp.tanh, "sin": jnp.sin, "exp": jnp.exp, "sigmoid": jax.nn.sigmoid}


def _random_program(seed: int):
    """(text, jnp oracle over (x, w)) of a random program; its first statement local or returned."""
    rng = np.random.default_rng(seed)
    f, g = (str(rng.choice(list(_F))) for _ in range(2))
    first = int(rng.integers(3))
    if first == 0:
        s1, a = f"a[i,j] := {f}(x[i,j]) * w[j]", (lambda x, w: _F[f](x) * w)
    elif first == 1:
        s1, a = f"a[i] := {f}(x[i,j]) * w[j]", (lambda x, w: (_F[f](x) * w).sum(1))
    else:
        s1, a = "(max) a[i] := x[i,j] * w[j]", (lambda x, w: (x * w).max(1))
    if first == 0:
        s2, y = (f"y[i] := {g}(a[i,j]) * x[i,j]", lambda av, x: (_F[g](av) * x).sum(1)) if rng.integers(2) else \
            (f"y[i,j] := {g}(a[i,j]) + x[i,j]", lambda av, x: _F[g](av) + x)
    else:
        s2, y = (f"y[i,j] := {g}(a[i]) * x[i,j]", lambda av, x: _F[g](av)[:, None] * x) if rng.integers(2) else \
            (f"y[j] := {g}(a[i]) * x[i,j]", lambda av, x: (_F[g](av)[:, None] * x).sum(0))
    local = bool(rng.integers(2))
    text = f"{'local ' if local else ''}{s1}\n{s2}"

    def oracle(x, w):
        av = a(x, w)
        return y(av, x) if local else (av, y(av, x))
    return text, oracle


@pytest.mark.parametrize("backend", [c_param(), "xla"])
@pytest.mark.parametrize("seed", range(6))
def test_random_programs(seed, backend):
    text, oracle = _random_program(seed)
    rng = np.random.default_rng(seed)
    x, w = jnp.asarray(rng.normal(size=(4, 5))), jnp.asarray(rng.normal(size=5))
    kernel = tullax.einsum_kernel(text, backend=backend)
    assert kernel.inputs[:2] == ("x", "w") or kernel.inputs == ("x", "w"), text
    for got, want in zip(_outputs(jax.jit(kernel)(x, w)), _outputs(oracle(x, w))):
        _close(got, want, "float64")
    weights = [jnp.asarray(rng.normal(size=np.shape(o))) for o in _outputs(oracle(x, w))]
    got = jax.jit(jax.grad(_loss(kernel, weights), (0, 1)))(x, w)
    want = jax.grad(_loss(oracle, weights), (0, 1))(x, w)
    for gv, wv in zip(got, want):
        _close(gv, wv, "float64")


def test_generate_source_of_a_program_has_every_statement():
    source = tullax.generate_source("local a[i] := x[i,j]^2\ny[i,j] := x[i,j] / a[i]", backend="c", dtype="float64")
    assert "# ==== statement 1: a[i] := x[i,j]^2" in source and "# ==== statement 2: y[i,j] := x[i,j]/a[i]" in source


@pytest.mark.parametrize("backend", [c_param(), "xla"])
def test_a_scan_statement_inside_a_program(backend):
    """A (t scan) statement reads an earlier statement's local (a projection of the input), and a later one
    reads the trajectory: forward and gradients against lax.scan written by hand."""
    text = """
        local u[b,t,n] := x[b,t,i] * W[i,n]
        local h[b,t,n] := lam[n]*h[b,t-1,n] + u[b,t,n]   (t scan from h0)
        y[b,t] := h[b,t,n] * c[n]
    """

    def oracle(x, W, lam, h0, c):
        def step(h, ut):
            h = lam * h + ut
            return h, h
        _, hs = jax.lax.scan(step, h0, jnp.moveaxis(jnp.einsum("bti,in->btn", x, W), 1, 0))
        return jnp.einsum("tbn,n->bt", hs, c)

    rng = np.random.default_rng(5)
    args = [jnp.asarray(rng.normal(size=s)) for s in [(2, 7, 3), (3, 4), (4,), (2, 4), (4,)]]
    args[2] = jnp.asarray(rng.uniform(0.5, 0.9, 4))
    kernel = tullax.einsum_kernel(text, backend=backend)
    assert kernel.inputs == ("x", "W", "lam", "h0", "c")
    _close(jax.jit(kernel)(*args), oracle(*args), "float64")
    weights = [jnp.asarray(rng.normal(size=(2, 7)))]
    got = jax.jit(jax.grad(_loss(kernel, weights), tuple(range(5))))(*args)
    want = jax.grad(_loss(oracle, weights), tuple(range(5)))(*args)
    for g, w in zip(got, want):
        _close(g, w, "float64")


@pytest.mark.parametrize("backend", [c_param(), "xla"])
def test_jacfwd_and_vmap_of_grad_of_a_program(backend):
    case = next(c for c in CASES if c.name == "softmax")
    rng = np.random.default_rng(6)
    s = jnp.asarray(rng.normal(size=(3, 2, 2, 5)))
    w = jnp.asarray(rng.normal(size=(2, 2, 5)))
    kernel = tullax.einsum_kernel(case.spec, backend=backend)
    _close(jax.jit(jax.jacfwd(kernel))(s[0]), jax.jacfwd(case.oracle)(s[0]), "float64")
    per_batch = jax.vmap(jax.grad(lambda v, fn: (fn(v) * w).sum()), in_axes=(0, None))
    _close(jax.jit(lambda v: per_batch(v, kernel))(s), per_batch(s, case.oracle), "float64")


# -- the printed CUDA C and Julia of every statement's forward and gradient kernels -------------------------------
def _program_steps(case):
    """(spec, env) of every statement's forward kernel and each of its gradient steps, in program order, the
    locals from the XLA lowering of the statements before (float64)."""
    from tullax.backends.xla.lower import lower as xla_lower
    from tullax.grad import gradients
    from tullax.grad.run import gradient_env, run_gradient
    from tullax.spec.program import analyze_program

    program = analyze_program(case.spec)
    values = case.inputs(np.random.default_rng(8), "float64")
    env = {n: (np.float64(v) if isinstance(v, float) else v) for n, v in zip(program.inputs, values)}
    runs = []
    rng = np.random.default_rng(9)

    def record(step, step_env):
        runs.append((step, step_env))
        return np.asarray(xla_lower(step)(step_env))

    for st in program.statements:
        own = {n: env[n] for n in st.spec.input_names}
        result = record(st.spec, own)
        env[st.out] = result
        genv = gradient_env(st.spec, own, result, rng.normal(size=result.shape))
        for grad in gradients(st.spec):
            run_gradient(grad, st.spec, genv, record)
    return runs


def _xla(step, step_env):
    from tullax.backends.xla.lower import lower as xla_lower

    return np.asarray(xla_lower(step)(step_env))


# every statement's forward and gradient steps as printed on their own (the fused kernels of the row-wise
# programs: tests/test_program_fusion.py); erf is not in Base Julia (the Julia printer refuses it)
PRINTED = [c for c in CASES if c.name in ("layernorm", "attention", "gelu_layer")]
PRINTED_JULIA = [c for c in CASES if c.name in ("logsoftmax", "attention")]


@pytest.mark.parametrize("case", PRINTED_JULIA, ids=lambda c: c.name)
def test_printed_julia_of_every_statement_in_the_subset_evaluator(case):
    pytest.importorskip("tree_sitter_julia")
    from test_julia_printer import run_julia

    for step, env in _program_steps(case):
        _close(run_julia(step, env), _xla(step, env), "float64")


@pytest.mark.parametrize("case", PRINTED, ids=lambda c: c.name)
def test_printed_cuda_of_every_statement_in_the_host_harness(case, tmp_path):
    from cuda_harness import GPP, build, run

    if GPP is None:
        pytest.skip("g++ is not installed")
    from test_cuda_host import launch_for

    jobs, expected = [], []
    for k, (step, env) in enumerate(_program_steps(case)):
        jobs.append(launch_for(step, env, f"k{k}", True))
        expected.append(_xla(step, env))
    exe = build([(job.kernel, job.index_bits) for job in jobs], tmp_path)
    for got, want in zip(run(exe, list(enumerate(jobs))), expected):
        _close(got.reshape(want.shape), want, "float64")


def test_nograd_names_program_inputs():
    text = "local ms[b] := x[b,j]^2 |> _ / size(x,1); y[b,j] := x[b,j] / sqrt(ms[b] + 1e-5) * g[j]"
    rng = np.random.default_rng(10)
    x, g = jnp.asarray(rng.normal(size=(3, 4))), jnp.asarray(rng.normal(size=4))
    kernel = tullax.einsum_kernel(text, backend="xla", nograd="g")
    dx, dg = jax.grad(lambda x, g: kernel(x, g).sum(), (0, 1))(x, g)
    assert np.all(np.asarray(dg) == 0) and np.any(np.asarray(dx) != 0)
    with pytest.raises(tullax.TullaxError, match="not inputs of the program"):
        tullax.einsum_kernel(text, nograd="ms")
    with pytest.raises(SpecError, match="init= applies to one statement"):
        tullax.einsum_kernel(text, init=0.0)
