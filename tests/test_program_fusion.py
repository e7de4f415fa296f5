"""Fused programs (issue 50, tullax.compiler.fuse): a row-wise program is ONE loop kernel whose parallel nest runs
over the rows its locals share, the locals per-row variables or row buffers (never arrays), printed by every printer
and computing what NumPy float64 computes: the C and Numba kernels on the host, the printed CUDA C through the host
harness, the printed Julia through the subset evaluator. One fused kernel per case and dtype, shared by every test
here."""
from __future__ import annotations

import functools
import importlib.util as importlib_util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from program_cases import CASES

import tullax
from tullax.backends.program_host import host_program, size_values
from tullax.compiler.fuse import NotFusable, block_per_row, fuse_program
from tullax.compiler.loops import Buffer, Let, Loop, Store, parallel_nest, walk_stmts
from tullax.spec.program import analyze_program, program_shapes

FUSED = [c for c in CASES if c.name in ("layernorm", "rmsnorm", "softmax", "logsoftmax", "groupnorm", "attention")]
NOT_FUSED = {"gelu_layer": "would lose its register tiles"}
ROWS = {"layernorm": ("b",), "rmsnorm": ("b",), "softmax": ("b", "i"), "logsoftmax": ("b", "i"),
        "groupnorm": ("b", "g"), "attention": ("b", "i")}
# locals with one index more than the rows: row buffers (softmax's and attention's shared exp term among them)
BUFFERS = {"softmax": {"z_t"}, "attention": {"s", "z_t", "p"}}
TOL = {"float64": 1e-12, "float32": 2e-5}


@functools.lru_cache(maxsize=None)
def _fused(name: str, dtype: str):
    case = next(c for c in CASES if c.name == name)
    program = analyze_program(case.spec)
    return case, program, fuse_program(program, dtype)


def _oracle(case, args):
    with jax.enable_x64(True):
        return np.asarray(case.oracle(*[jnp.asarray(a, jnp.float64) for a in args]))


def _close(got, want, dtype):
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=TOL[dtype], atol=TOL[dtype] * scale)


def _inputs(case, program, dtype, fused=None):
    """The case's inputs, by name, and the shapes the fused kernel's sizes read (those of the program it fused,
    which may have a shared term as a local of its own)."""
    args = case.inputs(np.random.default_rng(3), dtype)
    values = dict(zip(program.inputs, args))
    inputs = {n: np.shape(v) for n, v in values.items()}
    shapes = program_shapes(program, inputs) if fused is None else fused.shapes(inputs)
    return args, values, shapes


@pytest.mark.parametrize("case", FUSED, ids=lambda c: c.name)
def test_a_row_wise_program_is_one_parallel_nest_over_its_rows_with_locals_in_registers(case):
    _, program, fused = _fused(case.name, "float32")
    kernel = fused.kernel
    assert fused.rows == ROWS[case.name]
    loops, body = parallel_nest(kernel)
    assert len(loops) == len(fused.rows)  # the rows only: the output's other indices are serial inside a row
    assert not any(isinstance(s, Loop) and s.parallel for s in walk_stmts(body))
    buffers = BUFFERS.get(case.name, set())
    locals_ = {st.out for st in fused.program.statements if st.local} - buffers
    # no local is a parameter: each is one Let per row, or a row buffer (declared first in the row)
    assert {a.source for a in kernel.arrays} == set(program.inputs) - {s.source for s in kernel.scalars} | {
        fused.output}
    assert {f"l_{name}" for name in locals_} <= {s.var for s in walk_stmts(body) if isinstance(s, Let)}
    work = next(k for k, s in enumerate(body) if not isinstance(s, (Let, Buffer)))
    assert {s.var for s in body[:work] if isinstance(s, Buffer)} == {f"b_{name}" for name in buffers}
    assert not any(isinstance(s, Buffer) for s in walk_stmts(body[work:]))
    assert {s.array for s in walk_stmts(body) if isinstance(s, Store)} == {"a0"} | {f"b_{n}" for n in buffers}


def test_attention_rows_tile_their_dot_products_and_add_their_values_along_the_rows():
    """Attention's row: the scores' dot products four at a time (a register tile over j: four stores into the
    scores' buffer, and the ragged tile's one), and the values' contraction with its sum outside the output row's
    loop (the row cleared, then added into along e, four terms at a time). On the CPU a thread runs ROW_TILE rows
    at once (their keys' and values' loads shared): the whole tile holds each row's copy, its buffers a segment
    of buffers ROW_TILE times longer, the ragged tile a row at a time; the GPU's form a row per iteration."""
    from tullax.compiler.fuse import ROW_TILE
    from tullax.compiler.loops import If, Load, statement_expressions, walk_expr

    loops, body = parallel_nest(_fused("attention", "float32")[2].kernel)
    assert [loop.var for loop in loops] == ["r0", "r1_rt"]
    (tile,) = [s for s in body if isinstance(s, If)]
    for branch, rows in ((tile.then, ROW_TILE), (tile.orelse, 1)):
        stores = [s for s in walk_stmts(branch) if isinstance(s, Store)]
        assert sum(s.array == "b_s" for s in stores) == 5 * rows
        assert [s.mode for s in stores if s.array == "a0"][0] == "set"  # the clear
        assert {s.mode for s in stores if s.array == "a0"} == {"set", "add"}
        assert len({s.index for s in stores if s.array == "a0" and s.mode == "set"}) == rows
    # the whole tile's scores read each key row once for both rows' dot products: 4 keys + ROW_TILE queries
    inner = next(s for s in walk_stmts(tile.then) if isinstance(s, Loop) and s.var == "i3_1"
                 and not any(isinstance(t, Loop) for t in walk_stmts(s.body)))
    reads = {e for s in walk_stmts(inner.body) for x in statement_expressions(s) for e in walk_expr(x)
             if isinstance(e, Load)}
    assert len(reads) == 4 + ROW_TILE
    assert {s.var for s in body if isinstance(s, Buffer)} == {"b_s", "b_z_t", "b_p"}
    one_row = fuse_program(analyze_program(next(c for c in CASES if c.name == "attention").spec), "float32",
                           row_tile=1)
    assert [loop.var for loop in parallel_nest(one_row.kernel)[0]] == ["r0", "r1"]


def test_a_term_the_softmax_sums_and_divides_is_computed_once():
    """Softmax's exp(s - m) is summed by one statement and divided by the next: the fused row computes it once
    per element, into a row buffer that both read."""
    from tullax.compiler.fuse import ROW_TILE
    from tullax.compiler.loops import Call, expressions, walk_expr

    for name, count in (("softmax", 1), ("attention", 1 + ROW_TILE)):  # attention: a row tile's copies, ragged
        kernel = _fused(name, "float32")[2].kernel
        calls = [e for x in expressions(kernel.body) for e in walk_expr(x) if isinstance(e, Call) and e.fn == "exp"]
        assert len(calls) == count, name


@pytest.mark.parametrize("name", sorted(NOT_FUSED))
def test_programs_of_another_shape_say_why_they_do_not_fuse(name):
    case = next(c for c in CASES if c.name == name)
    with pytest.raises(NotFusable, match=NOT_FUSED[name]):
        fuse_program(analyze_program(case.spec), "float64")
    kernel = tullax.einsum_kernel(case.spec, backend="c")
    assert NOT_FUSED[name] in kernel.fusion.reason("float64")


@pytest.mark.parametrize("case", FUSED, ids=lambda c: c.name)
def test_every_printer_prints_the_fused_kernel(case):
    from tullax.printers import c, cuda, julia, numba

    _, program, fused = _fused(case.name, "float32")
    kernel = fused.kernel
    c_source = c.print_module([kernel])
    assert c_source.count("#pragma omp parallel for") == 1 and c_source.count("void program(") == 1
    buffers = BUFFERS.get(case.name, set())
    gpu = kernel
    if buffers:  # on a GPU a row buffer is a block per row's (a thread per row refuses one: tested below)
        _, values, _ = _inputs(case, program, "float32")
        found = block_per_row(program, "float32", {n: np.shape(v) for n, v in values.items()})
        gpu = None if found is None else found.kernel
    sources = (c_source, numba.print_module([kernel]), julia.print_module([kernel], flavour=julia.CPU_FLAVOUR),
               *([] if gpu is None else [cuda.print_module([(gpu, 32)])]))
    for source in sources:  # each local a per-row variable of the one kernel, or a row buffer
        assert all(f"l_{st.out} =" in source for st in fused.program.statements if st.local and st.out not in buffers)
        assert all(f"b_{name}[" in source for name in buffers)
    assert "@kernel" in sources[2] and (gpu is None or "__global__" in sources[3])


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("backend", ["c", "numba"])
@pytest.mark.parametrize("case", FUSED, ids=lambda c: c.name)
def test_the_fused_kernel_on_the_host_matches_numpy_float64(case, backend, dtype):
    case, program, fused = _fused(case.name, dtype)
    args, values, shapes = _inputs(case, program, dtype, fused)
    out = np.full(shapes[fused.output], np.nan, dtype)
    host_program(backend, fused.kernel)(out, values, shapes)
    _close(out, _oracle(case, args), dtype)


def test_a_fused_program_runs_one_kernel_forward_and_its_unfused_gradient():
    """Through the public kernel: forward (eager and jit) is the one custom call of the fused kernel (its launch
    count rises by one per call); grad runs the statements' derived gradients and matches jnp."""
    from tullax.backends import ffi

    case = next(c for c in CASES if c.name == "layernorm")
    kernel = tullax.einsum_kernel(case.spec, backend="c")
    with jax.enable_x64(True):
        args = [jnp.asarray(a) for a in case.inputs(np.random.default_rng(4), "float64")]
        want = _oracle(case, args)
        _close(kernel(*args), want, "float64")
        if not ffi.available()[0]:
            pytest.skip("no XLA FFI handler here")
        host = host_program("c", kernel.fusion.fused("float64").kernel)
        before = ffi.launches(host.slot)
        _close(jax.jit(kernel)(*args), want, "float64")
        assert ffi.launches(host.slot) == before + 1
        weights = np.random.default_rng(5).normal(size=want.shape)
        got = jax.grad(lambda *a: (kernel(*a) * weights).sum(), (0, 2, 3))(*args)
        expected = jax.grad(lambda *a: (case.oracle(*a) * weights).sum(), (0, 2, 3))(*args)
        for g, w in zip(got, expected):
            _close(g, np.asarray(w), "float64")


@pytest.mark.parametrize("case", FUSED, ids=lambda c: c.name)
def test_printed_julia_of_the_fused_kernel_in_the_subset_evaluator(case):
    pytest.importorskip("tree_sitter_julia")
    from julia_subset import CPU_BACKEND, load_module

    from tullax.printers.julia import CPU_FLAVOUR, launcher_name, print_module

    case, program, fused = _fused(case.name, "float64")
    kernel = fused.kernel
    args, values, shapes = _inputs(case, program, "float64", fused)
    out = np.full(shapes[fused.output], np.nan)
    from tullax.backends.program_host import arguments, size_values

    arrays, scalars = arguments(kernel, out, values)
    load_module(print_module([kernel], flavour=CPU_FLAVOUR)).call(
        launcher_name(kernel), CPU_BACKEND, *arrays, *(float(s) for s in scalars), *size_values(kernel, shapes))
    _close(out, _oracle(case, args), "float64")


def test_printed_cuda_of_the_fused_kernels_in_the_host_harness(tmp_path):
    """A thread per row: every fused case without a row buffer in one build, each launched as the harness's
    geometries say (with one, a block per row: the next tests)."""
    from cuda_harness import GPP, Launch, build, run

    from tullax.backends.program_host import arguments, size_values

    if GPP is None:
        pytest.skip("g++ is not installed")
    jobs, expected = [], []
    for number, case in enumerate(c for c in FUSED if c.name not in BUFFERS):
        case, program, fused = _fused(case.name, "float64")
        from dataclasses import replace

        kernel = replace(fused.kernel, name=f"program{number}")
        args, values, shapes = _inputs(case, program, "float64", fused)
        arrays, scalars = arguments(kernel, np.full(shapes[fused.output], np.nan), values)
        extents = [a.shape[axis] for a in arrays for axis in range(1, a.ndim)]
        jobs.append(Launch(kernel, 64, (*arrays, *scalars, *size_values(kernel, shapes), *extents)))
        expected.append(_oracle(case, args))
    exe = build([(job.kernel, job.index_bits) for job in jobs], tmp_path)
    for got, want in zip(run(exe, list(enumerate(jobs))), expected):
        _close(got.reshape(want.shape), want, "float64")


def test_printed_cuda_of_a_block_per_row_in_the_host_harness(tmp_path):
    """The GPU form: a block (or a warp) per row, its threads striding the row's reductions, combining them, and
    writing their share of the output row; softmax's exp once per element into a row buffer in the block's shared
    memory (a barrier before it is read, another before the next row writes it); under the harness's thread
    sanitizer, float32 and float64, blocks and warps in one build."""
    from dataclasses import replace

    from cuda_harness import GPP, Launch, build, run

    from tullax.backends.program_host import arguments, size_values
    from tullax.compiler.fuse import block_per_row

    if GPP is None:
        pytest.skip("g++ is not installed")
    jobs, expected = [], []
    # groupnorm's row is two loops deep, attention's holds row buffers read by a contraction: neither a block per row
    cases = [c for c in FUSED if c.name not in ("groupnorm", "attention")]
    for case, dtype, warp in [(c, d, w) for c in cases for d in ("float64", "float32") for w in (False, True)]:
        case, program, _ = _fused(case.name, dtype)
        args, values, _ = _inputs(case, program, dtype)
        found = block_per_row(program, dtype, {n: np.shape(v) for n, v in values.items()}, warp=warp)
        assert found is not None and found.kernel.cooperative
        buffered = [s for s in walk_stmts(found.kernel.body) if isinstance(s, Buffer)]
        # a warp per row has no buffer (the block's barrier would stall the other rows' warps)
        assert [s.shared for s in buffered] == ([True] if case.name == "softmax" and not warp else [])
        shapes = found.shapes({n: np.shape(v) for n, v in values.items()})
        kernel = replace(found.kernel, name=f"program{len(jobs)}")
        arrays, scalars = arguments(kernel, np.full(shapes[found.output], np.nan, dtype), values)
        extents = [a.shape[axis] for a in arrays for axis in range(1, a.ndim)]
        jobs.append(Launch(kernel, 32, (*arrays, *scalars, *size_values(kernel, shapes), *extents)))
        expected.append((_oracle(case, args), dtype))
    exe = build([(job.kernel, job.index_bits) for job in jobs], tmp_path)
    for got, (want, dtype) in zip(run(exe, list(enumerate(jobs))), expected):
        _close(got.reshape(want.shape), want, dtype)


def test_a_thread_per_row_cuda_kernel_refuses_a_row_buffer():
    """A row buffer per GPU thread was a device-heap malloc (slow, and failing once the heap is spent by the
    resident threads): the CUDA printer refuses it, and says where a row buffer lives on a GPU."""
    from tullax.errors import TullaxError
    from tullax.printers.cuda import kernel_function

    for name in BUFFERS:
        with pytest.raises(TullaxError, match="shared memory of a block per row"):
            kernel_function(_fused(name, "float64")[2].kernel, 32)


def test_a_block_per_row_buffer_past_the_shared_memory_recomputes_its_term():
    """The row buffer is the block's shared memory: a row whose buffer would pass ``SHARED_BYTES`` takes softmax's
    form with the exp recomputed (no buffer), and attention, whose scores are a buffer, has no block per row."""
    from tullax.compiler.cooperate import shared_buffer_bytes
    from tullax.compiler.fuse import SHARED_BYTES, block_per_row

    case, program, _ = _fused("softmax", "float64")
    for length, buffered in ((6, True), (SHARED_BYTES // 8 + 1, False)):
        found = block_per_row(program, "float64", {"s": (1, 2, length)})
        assert found is not None
        shapes = found.shapes({"s": (1, 2, length)})
        sizes = {s.name: int(s.size.eval(shapes)) for s in found.kernel.sizes}
        assert shared_buffer_bytes(found.kernel, sizes) == (8 * length if buffered else 0)
    attention = _fused("attention", "float64")
    _, values, _ = _inputs(*attention[:2], "float64")
    assert block_per_row(attention[1], "float64", {n: np.shape(v) for n, v in values.items()}) is None


def test_printed_julia_of_a_block_per_row_buffer_in_the_subset_evaluator():
    """The GPU flavour of the block-per-row softmax: its row buffer a work-group's ``@localmem``, written by the
    work-items' strided loop and read after ``@synchronize()``, run by the Julia-subset evaluator."""
    pytest.importorskip("tree_sitter_julia")
    from julia_subset import CPU_BACKEND, load_module

    from tullax.backends.program_host import arguments
    from tullax.compiler.fuse import block_per_row
    from tullax.printers.julia import GPU_FLAVOUR, launcher_name, print_module

    case, program, _ = _fused("softmax", "float64")
    args, values, _ = _inputs(case, program, "float64")
    inputs = {n: np.shape(v) for n, v in values.items()}
    found = block_per_row(program, "float64", inputs)
    shapes = found.shapes(inputs)
    source = print_module([found.kernel], flavour=GPU_FLAVOUR)
    assert "b_z_t = @localmem Float64" in source
    out = np.full(shapes[found.output], np.nan)
    arrays, scalars = arguments(found.kernel, out, values)
    load_module(source).call(launcher_name(found.kernel), CPU_BACKEND, *arrays, *(float(s) for s in scalars),
                             *size_values(found.kernel, shapes))
    _close(out, _oracle(case, args), "float64")


@pytest.mark.parametrize("backend", ["c", "numba"])
@pytest.mark.parametrize("case", FUSED, ids=lambda c: c.name)
def test_fused_gradient_programs_match_jnp(case, backend):
    """fuse='grad': the row-wise input's cotangent is one fused kernel (its gradient program fuses), the others
    (a partial that reduces) are gradient tails: one row program returning what they read of the rows, then a
    statement per partial; every cotangent matches jnp's (float64, jitted)."""
    from tullax.api.program import ProgramKernel

    kernel = ProgramKernel(case.spec, backend=backend, fuse="grad")
    grads = kernel.fusion.gradient_kernels(kernel.grad_specs)
    # attention's inputs each have a partial that reduces (over j or over the rows): all of them are tails
    assert len(grads) == (case.name != "attention") and all(g.fusion.fused("float64") is not None
                                                          for g in grads.values())
    rest = tuple(n for n in kernel.inputs if n not in grads)
    assert kernel.fusion.gradient_tails(kernel.grad_specs, rest) is not None
    with jax.enable_x64(True):
        args = [jnp.asarray(a) for a in case.inputs(np.random.default_rng(6), "float64")]
        weights = np.random.default_rng(7).normal(size=np.shape(case.oracle(*args)))
        wrt = tuple(k for k, a in enumerate(args) if np.ndim(a))
        got = jax.jit(jax.grad(lambda *a: (kernel(*a) * weights).sum(), wrt))(*args)
        want = jax.grad(lambda *a: (case.oracle(*a) * weights).sum(), wrt)(*args)
        for g, w in zip(got, want):
            _close(g, np.asarray(w), "float64")


def _attention_rows(q, k, scale, v, do):
    """NumPy float64: attention's softmax rows p and the scores' cotangent Δs for the output's cotangent do."""
    s = np.einsum("bid,bjd->bij", q, k) * scale
    e = np.exp(s - s.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    dp = np.einsum("bie,bje->bij", do, v)
    return p, p * (dp - (dp * p).sum(-1, keepdims=True))


def test_attention_gradient_is_one_fused_row_kernel_and_a_contraction_per_input(tmp_path):
    """Attention's gradient (fuse='grad'): ONE fused row kernel recomputes the row's softmax and returns p and the
    scores' cotangent Δs (Δp a row contraction, the softmax's gradient in row buffers), on the c host
    and in printed Julia (the subset evaluator) against NumPy float64; then Δq, Δk and Δv are one statement each
    (contractions of Δs, p and the inputs); jitted, the backward launches the row kernel once per call and every
    cotangent matches jnp's."""
    from tullax.api.program import ProgramKernel
    from tullax.backends import ffi
    from tullax.backends.program_host import arguments, size_values

    case = next(c for c in CASES if c.name == "attention")
    kernel = ProgramKernel(case.spec, backend="c", fuse="grad")
    rows, outputs, partials = kernel.fusion.gradient_tails(kernel.grad_specs, ("q", "k", "scale", "v"))
    assert outputs == ("p", "Δs") and sorted(partials) == ["k", "q", "scale", "v"]
    assert all(len(ks) == 1 and len(ks[0].program.statements) == 1 for ks in partials.values())
    fused = rows.fusion.fused("float64")
    assert fused is not None and fused.outputs == outputs
    assert {b.var for b in walk_stmts(fused.kernel.body) if isinstance(b, Buffer)} >= {"b_s", "b_Δp_5_0"}
    assert len(parallel_nest(fused.kernel)[0]) == len(fused.rows) == 2
    explained = tullax.explain(case.spec)
    assert "one row program returns p, Δs for the tails" in explained and "Δv[b,j,e] := Δo[b,i,e]*p[b,i,j]" in explained
    args = case.inputs(np.random.default_rng(12), "float64")
    do = np.random.default_rng(13).normal(size=np.shape(_oracle(case, args)))
    values = {**dict(zip(kernel.inputs, args)), "Δo": do}
    values = {n: values[n] for n in fused.program.inputs}
    shapes = fused.shapes({n: np.shape(v) for n, v in values.items()})
    want = _attention_rows(*args, do)
    outs = [np.full(shapes[name], np.nan) for name in outputs]  # numba: test_fused_gradient_programs_match_jnp
    host_program("c", fused.kernel)(outs, values, shapes)
    for got, w in zip(outs, want):
        _close(got, w, "float64")
    if importlib_util.find_spec("tree_sitter_julia") is not None:
        from julia_subset import CPU_BACKEND, load_module

        from tullax.printers.julia import CPU_FLAVOUR, launcher_name, print_module

        outs = [np.full(shapes[name], np.nan) for name in outputs]
        arrays, scalars = arguments(fused.kernel, outs, values)
        load_module(print_module([fused.kernel], flavour=CPU_FLAVOUR)).call(
            launcher_name(fused.kernel), CPU_BACKEND, *arrays, *(float(s) for s in scalars),
            *size_values(fused.kernel, shapes))
        for got, w in zip(outs, want):
            _close(got, w, "float64")
    with jax.enable_x64(True):
        xs = [jnp.asarray(a) for a in args]
        weights = np.random.default_rng(14).normal(size=do.shape)
        grad = jax.jit(jax.grad(lambda *a: (kernel(*a) * weights).sum(), (0, 1, 2, 3)))
        expected = jax.grad(lambda *a: (case.oracle(*a) * weights).sum(), (0, 1, 2, 3))(*xs)
        for g, w in zip(grad(*xs), expected):
            _close(g, np.asarray(w), "float64")
        if ffi.available()[0]:
            host = host_program("c", fused.kernel)
            before = ffi.launches(host.slot)
            jax.block_until_ready(grad(*xs))
            assert ffi.launches(host.slot) == before + 1


def test_forward_mode_under_fused_gradients():
    """fuse='grad' is a custom_vjp, which JAX cannot differentiate forwards: a call whose inputs carry JVP tangents
    (jvp, jacfwd, a Hessian's outer jacfwd) runs the custom_jvp path, and matches jnp's; reverse mode stays fused."""
    from tullax.api.program import ProgramKernel

    case = next(c for c in CASES if c.name == "rmsnorm")
    kernel = ProgramKernel(case.spec, backend="c", fuse="grad")
    with jax.enable_x64(True):
        args = [jnp.asarray(a) for a in case.inputs(np.random.default_rng(9), "float64")]
        tangent = jnp.asarray(np.random.default_rng(10).normal(size=np.shape(args[0])))
        got = jax.jvp(lambda x: kernel(x, *args[1:]), (args[0],), (tangent,))
        want = jax.jvp(lambda x: case.oracle(x, *args[1:]), (args[0],), (tangent,))
        for g, w in zip(got, want):
            _close(g, np.asarray(w), "float64")
        first = args[0][:1]
        _close(jax.jacfwd(lambda x: kernel(x, *args[1:]))(first),
               np.asarray(jax.jacfwd(lambda x: case.oracle(x, *args[1:]))(first)), "float64")


def test_auto_plans_a_program_as_one_unit(monkeypatch):
    """Under auto the fused kernel and the program's XLA lowering are the two candidates, timed once per shapes;
    with timing off the rule picks the fused kernel."""
    case = next(c for c in CASES if c.name == "rmsnorm")
    args = case.inputs(np.random.default_rng(8), "float32")
    kernel = tullax.einsum_kernel(case.spec)
    _close(jax.jit(kernel)(*args), _oracle(case, args), "float32")
    ((winner, timings),) = kernel.plans.values()
    assert winner in ("fused", "xla") and [label for label, _ in timings] == ["fused", "xla"]
    monkeypatch.setenv("TULLAX_PLAN_TIMING", "0")
    again = tullax.einsum_kernel(case.spec)
    _close(again(*args), _oracle(case, args), "float32")
    assert list(again.plans.values()) == [("fused", [])]


def test_several_returned_outputs_are_one_fused_kernel(tmp_path):
    """A program returning the row statistic its later statements read (mu) and the normalised rows: ONE kernel
    writing both (the later statements read mu back from its output, in the same row), on the c and numba hosts,
    in printed Julia and printed CUDA (the harness returns a kernel's first parameter: launched twice, each
    output first once), and through the public kernel: one custom call returning both, its gradient unfused."""
    from dataclasses import replace

    from tullax.backends import ffi
    from tullax.backends.program_host import arguments, size_values

    case = next(c for c in CASES if c.name == "two_outputs")
    program = analyze_program(case.spec)
    fused = fuse_program(program, "float64")
    kernel = fused.kernel
    assert fused.outputs == ("mu", "y") and [a.role for a in kernel.arrays[:3]] == ["out", "out", "in"]
    assert len(parallel_nest(kernel)[0]) == 1
    args, values, shapes = _inputs(case, program, "float64", fused)
    want = [np.asarray(w) for w in _oracle_tuple(case, args)]
    for backend in ("c", "numba"):
        outs = [np.full(shapes[name], np.nan) for name in fused.outputs]
        host_program(backend, kernel)(outs, values, shapes)
        for got, w in zip(outs, want):
            _close(got, w, "float64")
    if importlib_util.find_spec("tree_sitter_julia") is not None:
        from julia_subset import CPU_BACKEND, load_module

        from tullax.printers.julia import CPU_FLAVOUR, launcher_name, print_module

        outs = [np.full(shapes[name], np.nan) for name in fused.outputs]
        arrays, scalars = arguments(kernel, outs, values)
        load_module(print_module([kernel], flavour=CPU_FLAVOUR)).call(
            launcher_name(kernel), CPU_BACKEND, *arrays, *(float(s) for s in scalars), *size_values(kernel, shapes))
        for got, w in zip(outs, want):
            _close(got, w, "float64")
    from cuda_harness import GPP, Launch, build, run

    if GPP is not None:
        jobs = []
        for first in (0, 1):  # each output as the first parameter once
            order = (kernel.arrays[first], kernel.arrays[1 - first], *kernel.arrays[2:])
            variant = replace(kernel, name=f"program{first}", arrays=order)
            outs = [np.full(shapes[fused.outputs[k]], np.nan) for k in (first, 1 - first)]
            arrays, scalars = arguments(variant, outs, values)
            extents = [a.shape[axis] for a in arrays for axis in range(1, a.ndim)]
            jobs.append(Launch(variant, 64, (*arrays, *scalars, *size_values(variant, shapes), *extents)))
        exe = build([(job.kernel, job.index_bits) for job in jobs], tmp_path)
        for got, w in zip(run(exe, list(enumerate(jobs))), want):
            _close(got.reshape(w.shape), w, "float64")
    public = tullax.einsum_kernel(case.spec, backend="c")
    with jax.enable_x64(True):
        xs = [jnp.asarray(a) for a in args]
        host = host_program("c", public.fusion.fused("float64").kernel)
        got = jax.jit(public)(*xs)
        for g, w in zip(got, want):
            _close(g, w, "float64")
        if ffi.available()[0]:
            before = ffi.launches(host.slot)
            jax.block_until_ready(jax.jit(public)(*xs))
            assert ffi.launches(host.slot) == before + 1
        weights = np.random.default_rng(11).normal(size=want[1].shape)

        def loss(f):
            return lambda x: (f(x, xs[1])[1] * weights).sum() + f(x, xs[1])[0].sum()
        _close(jax.grad(loss(public))(xs[0]), np.asarray(jax.grad(loss(case.oracle))(xs[0])), "float64")


def _oracle_tuple(case, args):
    with jax.enable_x64(True):
        return case.oracle(*[jnp.asarray(a, jnp.float64) for a in args])


def test_a_row_buffer_too_long_for_a_threads_stack_runs_unfused():
    """A row buffer is a C variable-length array on the stack of the thread running the row: a row longer than
    ``ROW_BUFFER_BYTES`` allows runs unfused (it overflowed the stack: a crash, not an error), and still computes
    softmax."""
    from tullax.compiler.fuse import ROW_BUFFER_BYTES

    case, program, fused = _fused("softmax", "float64")
    short, long = 6, ROW_BUFFER_BYTES // 8 + 1
    for length, refused in ((short, False), (long, True)):
        inputs = {"s": (1, 1, length)}
        shapes = fused.shapes(inputs)
        sizes = dict(zip((s.name for s in fused.kernel.sizes), size_values(fused.kernel, shapes)))
        assert bool(fused.check(sizes)) == refused
    s = np.random.default_rng(0).standard_normal((1, 1, long)).astype(np.float32)
    _close(jax.jit(tullax.einsum_kernel(case.spec, backend="c"))(s), _oracle(case, [s]), "float32")
