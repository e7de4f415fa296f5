"""A scan whose step is several statements (issues 48 and 50: issue 7024's loop as ONE kernel), against lax.scan
oracles written by hand in jnp: the locals before the (t scan) statement are recomputed at every step inside the
one sequential t loop of the fused kernel (c, numba), lowered to one lax.scan over the statements on xla, printed
by every printer (the CUDA C through the host harness, the Julia through the subset evaluator). One kernel per
case and backend, shared by the tests here; small shapes."""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tullax
from tullax.backends.program_host import arguments, host_program, size_values
from tullax.compiler.fuse import NotFusable
from tullax.compiler.loops import Buffer, Load, Loop, Store, expressions, parallel_nest, walk_stmts
from tullax.compiler.scan_program import fuse_scan_program
from tullax.errors import SpecError, TullaxError
from tullax.spec.program import analyze_program

MLP = """
local a[b,t,j] := sigmoid(softplus(W1[0,j])*y[b,t-1] + softplus(W1[i+1,j])*u[b,t,i])
y[b,t] := sigmoid(a[b,t,j]*softplus(W2[j]))   (t scan from y0)
"""


def _mlp(W1, u, W2, y0):
    """Issue 7024's loop as the spec says it (each sum over the whole right-hand side, as in every tullax spec)."""
    sp = jax.nn.softplus

    def step(y, ut):  # ut: (b, i)
        a = jax.nn.sigmoid(sp(W1[0])[None, None, :] * y[:, None, None]
                           + sp(W1[1:])[None, :, :] * ut[:, :, None]).sum(1)
        new = jax.nn.sigmoid(a * sp(W2)[None, :]).sum(1)
        return new, new
    return jnp.moveaxis(jax.lax.scan(step, y0, jnp.moveaxis(u, 1, 0))[1], 0, 1)


def _second_order(w, x, c):
    def step(carry, wxc):
        prev2, prev1 = carry
        wt, xt, ct = wxc
        a = jnp.tanh(prev1 * wt + xt)
        new = a * ct + 0.5 * prev2
        return (prev1, new), new
    zero = jnp.zeros(w.shape[0], w.dtype)
    return jnp.moveaxis(jax.lax.scan(step, (zero, zero), tuple(jnp.moveaxis(v, 1, 0) for v in (w, x, c)))[1], 0, 1)


def _reverse(w, x, h0):
    def step(nxt, wx):
        wt, xt = wx
        a = nxt * wt
        b = jnp.cos(a) * xt
        new = jnp.sin(a) + b
        return new, new
    return jnp.moveaxis(jax.lax.scan(step, h0, (jnp.moveaxis(w, 1, 0), jnp.moveaxis(x, 1, 0)), reverse=True)[1], 0, 1)


@dataclass(frozen=True)
class Case:
    name: str
    spec: str
    oracle: Callable
    shapes: tuple
    buffer: bool  # a local with one index more than the lanes and t: a row buffer


CASES = [
    Case("mlp7024", MLP, _mlp, ((4, 5), (2, 9, 3), (5,), (2,)), True),
    Case("second_order", "local a[b,t] := tanh(y[b,t-1]*w[b,t] + x[b,t]); y[b,t] := a[b,t]*c[b,t] + 0.5*y[b,t-2]"
                         "   (t scan)", _second_order, ((3, 8), (3, 8), (3, 8)), False),
    Case("reverse", "local a[b,t] := y[b,t+1]*w[b,t]\nlocal e[b,t] := cos(a[b,t])*x[b,t]\n"
                    "y[b,t] := sin(a[b,t]) + e[b,t]   (t scan reverse from h0)", _reverse, ((3, 7), (3, 7), (3,)),
         False),
]
BY_NAME = {c.name: c for c in CASES}
TOL = {"float64": 1e-12, "float32": 2e-5}


def _inputs(case: Case, dtype: str, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=shape).astype(dtype) * (0.5 if len(shape) > 1 else 1.0) for shape in case.shapes]


def _oracle(case: Case, args) -> np.ndarray:
    with jax.enable_x64(True):
        return np.asarray(case.oracle(*[jnp.asarray(a, jnp.float64) for a in args]))


def _close(got, want, dtype):
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=TOL[dtype], atol=TOL[dtype] * scale)


@functools.lru_cache(maxsize=None)
def _fused(name: str, dtype: str):
    program = analyze_program(BY_NAME[name].spec)
    return program, fuse_scan_program(program, dtype)


@functools.lru_cache(maxsize=None)
def _fused_gpu(name: str, dtype: str):
    return fuse_scan_program(analyze_program(BY_NAME[name].spec), dtype, gpu=True)


@functools.lru_cache(maxsize=None)
def _kernel(name: str, backend: str):
    return tullax.einsum_kernel(BY_NAME[name].spec, backend=backend)


def _host_inputs(name: str, dtype: str):
    program, fused = _fused(name, dtype)
    args = _inputs(BY_NAME[name], dtype)
    values = dict(zip(program.inputs, args))
    shapes = fused.shapes({n: np.shape(v) for n, v in values.items()})
    return args, values, shapes


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_every_statement_of_the_step_runs_inside_the_one_sequential_t_loop(name):
    """One kernel: the lanes parallel outermost, then ONE serial loop over t holding every statement's work (the
    locals registers or a row buffer, never arrays), the result stored once per step; before it only the row
    buffers and the terms every step would recompute (issue 7024's softplus of the weights), which read inputs
    only."""
    program, fused = _fused(name, "float64")
    assert program.step is not None and program.step.number == len(program.statements)
    out = fused.kernel.arrays[0].name
    loops, inner = parallel_nest(fused.kernel)
    step = inner[-1]
    assert len(loops) == 1 and isinstance(step, Loop) and not step.parallel
    stores = [s for s in walk_stmts((step,)) if isinstance(s, Store)]
    assert {s.array for s in stores} - {"b_a"} == {out}
    assert all(a.source in program.inputs or a.role == "out" for a in fused.kernel.arrays)
    assert not any(isinstance(s, Buffer) for s in walk_stmts((step,)))  # declared once per lane, not per step
    buffers = {s.var for s in inner if isinstance(s, Buffer)}
    assert ("b_a" in buffers) == BY_NAME[name].buffer
    before = [s for s in inner[:-1] if not isinstance(s, Buffer)]
    assert all(isinstance(s, Loop) for s in before)
    assert not any(isinstance(e, Load) and e.array == out for e in expressions(before))
    hoisted = {s.array for s in walk_stmts(tuple(before)) if isinstance(s, Store)}
    assert hoisted == (buffers - {"b_a"}) and (len(hoisted) == 3) == (name == "mlp7024")
    plain = fuse_scan_program(program, "float64", hoist=False).kernel
    assert not any(isinstance(s, Buffer) and s.var != "b_a" for s in walk_stmts(plain.body))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("backend", ["c", "numba"])
@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_the_fused_scan_kernel_on_the_host_matches_the_lax_scan_oracle(name, backend, dtype):
    program, fused = _fused(name, dtype)
    args, values, shapes = _host_inputs(name, dtype)
    out = np.full(shapes[fused.output], np.nan, dtype)
    host_program(backend, fused.kernel)(out, values, shapes)
    _close(out, _oracle(BY_NAME[name], args), dtype)
    if name == "mlp7024" and backend == "c" and dtype == "float32":  # hoisting changes no bit
        plain = fuse_scan_program(program, dtype, hoist=False).kernel
        again = np.full_like(out, np.nan)
        host_program(backend, plain)(again, values, shapes)
        assert np.array_equal(out, again)


@pytest.mark.parametrize("backend", ["c", "numba", "xla", "auto"])
@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_forward_and_gradients_through_the_public_kernel(name, backend):
    """Eager and jit forward, float64 and float32; grad w.r.t. every input in float64 (the derivative runs the
    step's lax.scan lowering, which JAX differentiates)."""
    case = BY_NAME[name]
    kernel = _kernel(name, backend)
    with jax.enable_x64(True):
        for dtype in ("float64", "float32"):
            args = [jnp.asarray(a) for a in _inputs(case, dtype, seed=1)]
            want = _oracle(case, args)
            got = kernel(*args)
            assert got.dtype == np.dtype(dtype)
            _close(got, want, dtype)
            _close(jax.jit(kernel)(*args), want, dtype)
        args = [jnp.asarray(a) for a in _inputs(case, "float64", seed=2)]
        weights = np.random.default_rng(3).normal(size=want.shape)
        argnums = tuple(range(len(args)))
        got = jax.grad(lambda *a: (kernel(*a) * weights).sum(), argnums)(*args)
        expected = jax.grad(lambda *a: (case.oracle(*a) * weights).sum(), argnums)(*args)
        for g, w in zip(got, expected):
            _close(g, np.asarray(w), "float64")


def test_the_c_kernel_is_one_launch_and_vmap_and_float32_gradients_match():
    from tullax.backends import ffi

    case = BY_NAME["mlp7024"]
    kernel = _kernel("mlp7024", "c")
    args = [jnp.asarray(a) for a in _inputs(case, "float32", seed=4)]
    want = _oracle(case, args)
    jitted = jax.jit(kernel)
    _close(jax.block_until_ready(jitted(*args)), want, "float32")
    if ffi.available()[0]:  # the first jitted call registered the kernel's slot (run alone, nothing had before)
        host = host_program("c", kernel.fusion.fused("float32").kernel)
        before = ffi.launches(host.slot)
        jax.block_until_ready(jitted(*args))
        assert ffi.launches(host.slot) == before + 1
    us = jnp.stack([args[1], args[1] * 0.5])
    batched = jax.vmap(kernel, in_axes=(None, 0, None, None))(args[0], us, args[2], args[3])
    _close(batched[0], want, "float32")
    _close(batched[1], _oracle(case, [args[0], us[1], args[2], args[3]]), "float32")
    got = jax.jit(jax.grad(lambda *a: kernel(*a).sum(), (0, 2, 3)))(*args)
    with jax.enable_x64(True):
        wide = [jnp.asarray(a, jnp.float64) for a in args]
        expected = jax.grad(lambda *a: case.oracle(*a).sum(), (0, 2, 3))(*wide)
    for g, w in zip(got, expected):
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_every_printer_prints_the_scan_kernel(name):
    from tullax.printers import c, cuda, julia, numba
    from tullax.printers.pseudo import format_kernel

    _, fused = _fused(name, "float32")
    kernel = fused.kernel
    c_source = c.print_module([kernel])
    assert c_source.count("#pragma omp parallel for") == 1
    assert "for r1" in numba.print_module([kernel]) and "for r1" in format_kernel(kernel)
    assert "@kernel" in julia.print_module([kernel], flavour=julia.CPU_FLAVOUR)
    if BY_NAME[name].buffer:  # a thread per lane holds no row buffer on a GPU: the GPU form computes it in place
        with pytest.raises(TullaxError, match="row buffer"):
            cuda.print_module([(kernel, 32)])
    gpu = _fused_gpu(name, "float32").kernel
    assert not any(isinstance(s, Buffer) for s in walk_stmts(gpu.body))
    assert "__global__" in cuda.print_module([(gpu, 32)])


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_printed_julia_of_the_scan_kernel_in_the_subset_evaluator(name):
    pytest.importorskip("tree_sitter_julia")
    from julia_subset import CPU_BACKEND, load_module

    from tullax.printers.julia import CPU_FLAVOUR, GPU_FLAVOUR, launcher_name, print_module

    args, values, shapes = _host_inputs(name, "float64")
    for kernel, flavour in ((_fused(name, "float64")[1].kernel, CPU_FLAVOUR),
                            (_fused_gpu(name, "float64").kernel, GPU_FLAVOUR)):  # the GPU form, a work-item per lane
        out = np.full(shapes["y"], np.nan)  # every case's result is y
        arrays, scalars = arguments(kernel, out, values)
        load_module(print_module([kernel], flavour=flavour)).call(
            launcher_name(kernel), CPU_BACKEND, *arrays, *(float(s) for s in scalars), *size_values(kernel, shapes))
        _close(out, _oracle(BY_NAME[name], args), "float64")


def test_printed_cuda_of_the_scan_kernels_in_the_host_harness(tmp_path):
    """A thread per lane walking t (the GPU form: issue 7024's hidden layer computed inside the output's sum, no
    row buffer), every case in one build."""

    from cuda_harness import GPP, Launch, build, run

    if GPP is None:
        pytest.skip("g++ is not installed")
    jobs, expected = [], []
    for number, case in enumerate(CASES):
        fused = _fused_gpu(case.name, "float64")
        kernel = replace(fused.kernel, name=f"program{number}")
        args, values, shapes = _host_inputs(case.name, "float64")
        arrays, scalars = arguments(kernel, np.full(shapes[fused.output], np.nan), values)
        extents = [a.shape[axis] for a in arrays for axis in range(1, a.ndim)]
        jobs.append(Launch(kernel, 64, (*arrays, *scalars, *size_values(kernel, shapes), *extents)))
        expected.append(_oracle(case, args))
    exe = build([(job.kernel, job.index_bits) for job in jobs], tmp_path)
    for got, want in zip(run(exe, list(enumerate(jobs))), expected):
        _close(got.reshape(want.shape), want, "float64")


@pytest.mark.parametrize("text, message, caret", [
    ("a[b,t] := y[b,t-1]*w[b,t]\ny[b,t] := tanh(a[b,t])  (t scan)", "write it 'local'", "a[b,t] := y[b,t-1]*w[b,t]\n^"),
    ("local a[b,t] := y[b,t]*w[b,t]\ny[b,t] := tanh(a[b,t])  (t scan)", "only at steps already computed",
     "a[b,t] := y[b,t]*w[b,t]\n              ^"),
    ("local a[b,t] := y[b,t+1]*w[b,t]\ny[b,t] := tanh(a[b,t])  (t scan)", "only at steps already computed", None),
    ("local a[b,t,n] := y[b,t-1,m]*w[n,m]\ny[b,t,n] := tanh(a[b,t,n])  (t scan)", "whose lanes mix", None),
    ("local a[b,t] := y[b,t-1]*w[b,t]\ny[b,t] := tanh(a[b,t-1])  (t scan)", "exists for the current step only",
     "y[b,t] := tanh(a[b,t-1])  (t scan)\n               ^"),
    ("local a[b] := y[b,3]*w[b]\ny[b,t] := tanh(a[b]) + x[b,t]  (t scan)", "indexed by the scan index t", None),
    ("local a[b,t] := y[b,t-1]*w[b,t]\ny[b,t] := tanh(a[b,t])  (t scan)\nz[b,t] := y[b,t]*2",
     "a scan program ends with its scan statement", None),
])
def test_what_a_scan_step_cannot_hold_is_a_spec_error_with_a_caret(text, message, caret):
    with pytest.raises(SpecError) as info:
        tullax.einsum_kernel(text)
    assert message in str(info.value)
    if caret is not None:
        rendered = "\n".join(line[4:] for line in str(info.value).split("\n")[1:])
        assert rendered == caret


def test_a_nograd_input_of_a_scan_program_gets_no_gradient():
    kernel = tullax.einsum_kernel(BY_NAME["second_order"].spec, backend="xla", nograd="w")
    args = [jnp.asarray(a) for a in _inputs(BY_NAME["second_order"], "float32")]
    gw, gx = jax.grad(lambda w, x: kernel(w, x, args[2]).sum(), (0, 1))(args[0], args[1])
    assert float(jnp.abs(gw).max()) == 0.0 and float(jnp.abs(gx).max()) > 0.0



def test_explain_prints_the_scan_step():
    text = tullax.explain(MLP)
    assert "scan step:  statements 1-2, (t scan from y0)" in text
    assert "ONE sequential loop over t" in text and "3 terms every step would recompute" in text
    # the derived adjoint's statements: the locals recomputed, their cotangents, the reverse scan
    assert "    local gy[b,t] := Δy[b,t] + cy[b,t+1]\n    local Δa[b,t,j] := gy[b,t]*(sigmoid(" in text
    assert "    cy[b,t] := Δyprev[b,t]   (t scan reverse)" in text and "  Δy0: cy at the first step" in text
    assert "the step reads its state 2 steps back" in tullax.explain(BY_NAME["second_order"].spec)


def _has_scan(jaxpr) -> bool:
    """Whether a lax.scan runs anywhere in ``jaxpr`` (sub-jaxprs of calls, custom rules and control flow too)."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            return True
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns") and _has_scan(inner):
                    return True
    return False


# a local read by two statements and the previous state read by both: cotangents summed in the adjoint
TWO_READERS = "local a[b,t] := tanh(y[b,t-1]*w[b,t])\ny[b,t] := a[b,t]*x[b,t] + 0.5*y[b,t-1]*a[b,t]   (t scan from h0)"


def _two_readers(w, x, h0):
    def step(prev, wx):
        a = jnp.tanh(prev * wx[0])
        new = a * wx[1] + 0.5 * prev * a
        return new, new
    return jnp.moveaxis(jax.lax.scan(step, h0, (jnp.moveaxis(w, 1, 0), jnp.moveaxis(x, 1, 0)))[1], 0, 1)


@pytest.mark.parametrize("backend", ["c", "numba"])
@pytest.mark.parametrize("name", ["mlp7024", "reverse", "two_readers"])
def test_reverse_mode_runs_the_derived_adjoint_kernels_not_jaxs_derivative_of_the_lax_scan(name, backend):
    """With fuse='grad' (and by default on c), the gradient of a scan program whose step reads its previous state is
    tullax's derived adjoint: one fused
    reverse-scan kernel (the locals recomputed per step), then the flat program's gradient kernels; no lax.scan
    anywhere in grad's jaxpr (JAX differentiating the lowering runs one). Every input, eager and jit, f64 and
    f32, against jax.grad of the hand-written lax.scan; and a second order (grad of grad) through them."""
    case = BY_NAME.get(name) or Case(name, TWO_READERS, _two_readers, ((3, 6), (3, 6), (3,)), False)
    kernel = tullax.einsum_kernel(case.spec, backend=backend, fuse="grad")
    assert kernel.gradient.adjoint is not None
    if name in BY_NAME:  # by default the derived adjoint on c; numba and fuse=False: JAX's derivative of the lax.scan
        assert (_kernel(name, backend).gradient is not None) == (backend == "c")
        assert tullax.einsum_kernel(case.spec, backend=backend, fuse=False).gradient is None
    with jax.enable_x64(True):
        for dtype in ("float64", "float32"):
            args = [jnp.asarray(a) for a in _inputs(case, dtype, seed=5)]
            argnums = tuple(range(len(args)))
            weights = np.random.default_rng(6).normal(size=_oracle(case, args).shape)
            loss = jax.grad(lambda *a: (kernel(*a) * weights).sum(), argnums)
            wide = [jnp.asarray(a, jnp.float64) for a in args]
            expected = jax.grad(lambda *a: (case.oracle(*a) * weights).sum(), argnums)(*wide)
            assert not _has_scan(jax.make_jaxpr(loss)(*args).jaxpr)
            for got in (loss(*args), jax.jit(loss)(*args)):
                for g, w, a in zip(got, expected, args):
                    assert g.dtype == a.dtype
                    _close(g, np.asarray(w), dtype)
        adjoint, _ = kernel.gradient.kernels()
        assert adjoint.fusion.fused("float64") is not None  # the reverse scan is one loop kernel
        if name == "two_readers" and backend == "c":
            args = [jnp.asarray(a) for a in _inputs(case, "float64", seed=7)]
            second = jax.grad(lambda w: (jax.grad(lambda v: (kernel(v, *args[1:]) ** 2).sum())(w) ** 2).sum())
            want = jax.grad(lambda w: (jax.grad(lambda v: (case.oracle(v, *args[1:]) ** 2).sum())(w) ** 2).sum())
            _close(second(args[0]), np.asarray(want(args[0])), "float64")
            ws = jnp.stack([args[0], 0.5 * args[0]])  # vmap of the derived gradient
            got = jax.vmap(jax.grad(lambda w: (kernel(w, *args[1:]) ** 2).sum()))(ws)
            _close(got, np.asarray(jax.vmap(jax.grad(lambda w: (case.oracle(w, *args[1:]) ** 2).sum()))(ws)),
                   "float64")


def test_a_nograd_input_of_a_derived_adjoint_gets_no_gradient():
    case = BY_NAME["reverse"]
    kernel = tullax.einsum_kernel(case.spec, backend="c", nograd="x", fuse="grad")
    with jax.enable_x64(True):
        args = [jnp.asarray(a) for a in _inputs(case, "float64")]
        got = jax.grad(lambda *a: kernel(*a).sum(), (0, 1, 2))(*args)
        want = jax.grad(lambda *a: case.oracle(*a).sum(), (0, 2))(*args)
    assert kernel.gradient.adjoint is not None and float(jnp.abs(got[1]).max()) == 0.0
    _close(got[0], np.asarray(want[0]), "float64")
    _close(got[2], np.asarray(want[1]), "float64")


def test_the_gpu_form_refuses_a_row_buffer_read_by_two_loops():
    program = analyze_program("local a[b,t,j] := y[b,t-1]*w[b,t,j]\nlocal c[b,t] := a[b,t,j]\n"
                              "y[b,t] := a[b,t,j]*c[b,t]  (t scan)")
    with pytest.raises(NotFusable, match="GPU thread per lane holds no buffer"):
        fuse_scan_program(program, "float64", gpu=True)
    assert any(isinstance(s, Buffer) for s in walk_stmts(fuse_scan_program(program, "float64").kernel.body))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_steps_short_sums_of_sigmoids_run_on_vector_lanes_and_long_ones_as_written(dtype, monkeypatch):
    """Issue 7024's hidden layer (12 units, each a sum of 3 sigmoids, every step): on c the step computes the
    sums' terms for a strip of units in an omp simd loop over the units (glibc's vector expf) before summing them
    in order (``tullax.printers.c_nest_strips``); within libmvec's ulps of the scalar kernel. A sum longer than
    the strip holds (10 features) runs as written, in the same compiled module."""
    from tullax.printers import c

    _, fused = _fused("mlp7024", dtype)
    source = c.print_module([fused.kernel])
    strip = source[source.index("_nn = "):]
    assert "_terms[128];" in strip and "#pragma omp simd\n" in strip and "} else {" in strip
    monkeypatch.setattr(c, "nest_strip_plan", lambda loop: None)
    assert "_terms[" not in c.print_module([fused.kernel])
    monkeypatch.undo()
    for features in (3, 10):
        case = replace(BY_NAME["mlp7024"], shapes=((features + 1, 5), (2, 9, features), (5,), (2,)))
        args = _inputs(case, dtype)
        program = analyze_program(case.spec)
        values = dict(zip(program.inputs, args))
        shapes = fused.shapes({n: np.shape(v) for n, v in values.items()})
        out = np.full(shapes[fused.output], np.nan, dtype)
        host_program("c", fused.kernel)(out, values, shapes)
        _close(out, _oracle(case, args), dtype)


def test_hoisted_terms_are_a_weights_unary_calls_at_plain_or_shifted_indices():
    from tullax.api.hoist_terms import hoist_terms

    got = hoist_terms(["Δw[m,j] := d[b,t,j]*softplus(w[m,j])*u[b,t,pad(m-1)]*tanh(u[b,t,m])",
                       "x[b,t,i] := d[b,t,j]*softplus(w[pad(i+1),j])*sigmoid(w[i+1,j])"], ("b", "t"), ("w", "u", "d"))
    # a padded read stays (softplus of the zero outside w is not zero); a row-indexed input stays
    assert got.texts == ("Δw[m,j] := d[b,t,j]*softplus_w[m,j]*u[b,t,pad(m-1)]*tanh(u[b,t,m])",
                         "x[b,t,i] := d[b,t,j]*softplus(w[pad(i+1),j])*sigmoid_w[i+1,j]")
    assert got.arrays == {"softplus_w": ("softplus", "w"), "sigmoid_w": ("sigmoid", "w")}


@pytest.mark.parametrize("backend", ["c", "numba", "xla"])
def test_the_flat_gradient_is_one_row_program_and_a_statement_per_partial_with_the_weights_terms_hoisted(backend):
    """The derived adjoint's parallel part, issue 7024's loop: the flat program's gradient tails over the scan's
    rows (``tullax.api.fused_grad.gradient_tails``): the step's local and its cotangent once per row, then one
    statement per partial, each reading the weights' softplus computed once over the weight, not at every step
    (JAX's VJP of the flat kernel recomputed them in every statement's gradient). Eager and jit, f64 and f32,
    against jax.grad of the hand-written lax.scan."""
    case = BY_NAME["mlp7024"]
    kernel = tullax.einsum_kernel(case.spec, backend=backend, fuse="grad")
    with jax.enable_x64(True):
        for dtype in ("float64", "float32"):
            args = [jnp.asarray(a) for a in _inputs(case, dtype, seed=3)]
            loss = jax.grad(lambda *a: (kernel(*a) ** 2).sum(), (0, 1, 2, 3))
            wide = [jnp.asarray(a, jnp.float64) for a in args]
            expected = jax.grad(lambda *a: (case.oracle(*a) ** 2).sum(), (0, 1, 2, 3))(*wide)
            for got in (loss(*args), jax.jit(loss)(*args)):
                for g, w, a in zip(got, expected, args):
                    assert g.dtype == a.dtype
                    _close(g, np.asarray(w), dtype)
    (found,) = {k: v for k, v in kernel.gradient._tails.items() if v is not None}.values()
    (rows, outputs, partials), hoisted = found
    assert outputs == ("a", "Δa") and {n: len(p) for n, p in partials.items()} == {"W1": 2, "u": 1, "W2": 1}
    assert set(hoisted.arrays) == {"softplus_W1", "softplus_W2", "sigmoid_W1", "sigmoid_W2"}
    # Δu's read of W1 through pad(i+1), inside W1 at these shapes, read plainly and hoisted too
    assert "softplus(W" not in rows.source + "".join(k.source for ks in partials.values() for k in ks)
    # the row program computes Δa itself (no share of it copied) and is ONE kernel over the scan's rows (b,t),
    # though its sum over i is a contraction into its outputs' rows (b,t,j)
    assert "Δa_" not in rows.source and len(rows.program.statements) == 2
    if backend != "xla":
        assert rows.fusion.fused("float32").rows == ("b", "t")
    if backend == "c":  # the backward's kernels: the reverse scan, the row program, one per partial
        args = [jnp.asarray(a) for a in _inputs(case, "float32", seed=3)]
        calls = _kernel_calls(jax.make_jaxpr(jax.grad(lambda *a: kernel(*a).sum(), (0, 1, 2, 3)))(*args).jaxpr)
        assert calls == 1 + 1 + 1 + 4, calls  # the forward too


def _kernel_calls(jaxpr) -> int:
    """The tullax kernels ``jaxpr`` calls (an FFI call or a kernel primitive), sub-jaxprs included."""
    found = 0
    for eqn in jaxpr.eqns:
        found += eqn.primitive.name in ("ffi_call", "tullax_kernel", "pure_callback")
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += _kernel_calls(inner)
    return found


def test_a_padded_read_inside_the_array_at_the_calls_shapes_is_read_plainly():
    from tullax.api.hoist_terms import unpad

    text = "Δu[b,t,i] := d[b,t,j]*softplus(W1[pad(i+1),j])*u[b,t,i]*v[b,t,pad(i-1)]"
    assert unpad(text, {"u": (2, 9, 3), "W1": (4, 5), "v": (2, 9, 3)}) == (
        "Δu[b,t,i] := d[b,t,j]*softplus(W1[i+1,j])*u[b,t,i]*v[b,t,pad(i-1)]")  # i-1 leaves v at i = 0
    assert unpad(text, {"u": (2, 9, 4), "W1": (4, 5), "v": (2, 9, 4)}) == text  # i+1 = 4 would leave W1
