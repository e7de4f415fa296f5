"""Register strips (``tullax.compiler.strips``, printed as vectors by ``tullax.printers.c_strips``): a strip-mined
kernel's rows register-tiled and the tile's output segments held in vector registers across the reduction (the
small MLP's contractions of issue 45 item 2; Dist's gradient w.r.t. X of issue 44).

The printed C holds the segments; the same loop IR runs on the bounds-checking interpreter, the Numba printer, the
Julia printer (subset evaluator) and the CUDA printer (host harness); the c, numba and xla backends compute forward
and gradients. Everything against NumPy float64, in float32 and float64, on ragged sizes: rows not a multiple of the
register tile's, columns not a multiple of a chunk, and (on the backends) float32 sums longer than one block."""
from __future__ import annotations

import functools
import re
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_cuda_host import kernel_runs, naive_result
from test_lower import run_kernel
from test_sharing import _numba_run

import tullax
from tullax.backends.base import Signature
from tullax.backends.c.generate import module_source
from tullax.compiler.loops import Loop, walk_stmts
from tullax.compiler.lower import lower
from tullax.compiler.strips import STRIP_ROWS, strip_width
from tullax.spec.examples import random_inputs
from tullax.spec.frontend import compile_spec

MLP = "h[b,o] := x[b,i]*W[i,o] |> tanh(_ + c[o])"
DIST = "D[i,j] := (W[k,i] - X[k,j])^2"
DTYPES = ("float32", "float64")
# rows 13 = 2 whole register tiles and a ragged one; columns 37 = 2 whole chunks of float32 (4 of float64) and a
# ragged one; the reduction short here (the interpreter and the evaluator are slow), long on the backends
SMALL = {MLP: {"x": (13, 5), "W": (5, 37), "c": (37,)}, DIST: {"W": (5, 13), "X": (5, 37)}}
LONG = 530  # > the 512 terms of a float32 block: the tile's float64 totals run too
TARGETS = ("interpreter", "numba-printer", "julia-evaluator", "cuda-host-harness")


def _function(source: str, name: str) -> str:
    start = source.index(f"\nvoid {name}(")
    return source[start:source.index("\n}\n", start)]


def _block(text: str, opening: str) -> str:
    """The text of the first block ``opening ... {`` of ``text``, to its matching brace."""
    start = text.index(opening)
    depth, at = 0, text.index("{", start)
    for at in range(at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[at], 0)
        if depth == 0:
            break
    return text[start:at + 1]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("text, kernel", [(MLP, "forward"), (MLP, "grad1_step1"), (DIST, "grad1_step0")],
                         ids=["mlp-forward", "mlp-dW", "dist-dX"])
def test_the_printed_c_holds_the_tiles_output_segments_in_vectors_across_the_reduction(text: str, kernel: str,
                                                                                          dtype: str):
    """A whole chunk of the tile loads its rows' segments into vectors, the reduction adds into them (no read or
    write of the output inside it: what reloaded the row every 4 terms), and stores them after."""
    spec = compile_spec(text)[1]
    function = _function(module_source(spec, dtype), kernel)
    width = strip_width(dtype)
    vector = "tx_v8_f32" if dtype == "float32" else "tx_v4_f64"
    whole = _block(function, f"if (i1_chi - i1_clo == {width})")
    segments = sorted(set(re.findall(rf"{vector} (i1_ch_s\d+_v\d+);", whole)))
    assert len(segments) == STRIP_ROWS * 2, segments
    reduction = whole[whole.index("for (", whole.index(segments[-1])):]
    reduction = _block(reduction, "for (")
    assert "a0[" not in reduction, reduction
    assert {s: reduction.count(f"{s} += ") for s in segments} == {s: 1 for s in segments}
    assert whole.split(reduction)[1].count("memcpy(&a0[") == len(segments)


def _sizes(kernel, step, out, inputs) -> dict[str, int]:
    shapes = {name: np.shape(v) for name, v in zip(step.input_names, inputs)}
    shapes[step.out] = out.shape
    return {s.name: s.size.eval(shapes) for s in kernel.sizes}


@functools.cache
def _lowered_runs(dtype: str) -> tuple:
    """(step, env, kernel lowered with strips, NumPy float64 result) of the forward and gradient steps of both
    specs, at the SMALL sizes."""
    runs = []
    for text, shapes in SMALL.items():
        spec = compile_spec(text)[1]
        env = random_inputs(spec, shapes, seed=4, dtype=np.dtype(dtype).type)
        for step, step_env in kernel_runs(spec, env, np.dtype(dtype).type):
            arrays = [np.asarray(step_env[n]) for n in step.input_names]
            signature = Signature(tuple(a.dtype.name for a in arrays), dtype)
            kernel = lower(step, signature, "kernel", tile=True, strips=True)
            runs.append((step, step_env, kernel, naive_result(step, step_env)))
    return tuple(runs)


def test_the_stripped_kernels_are_the_contractions():
    """The forward and dW of the MLP, Dist's forward and dX get chunk loops; dx, dc and Dist's dW (contiguous
    reductions, not strip-mined) do not."""
    stripped = [str(step.out) for step, _, kernel, _ in _lowered_runs("float32") if _has_strips(kernel)]
    assert stripped == ["h", "ΔW", "D", "ΔX"], stripped


def _has_strips(kernel) -> bool:
    return any(isinstance(s, Loop) and s.registers for s in walk_stmts(kernel.body))


def _stripped_runs(dtype: str) -> tuple:
    """The runs of ``_lowered_runs`` whose kernels have strips: what the printers are run on."""
    return tuple(run for run in _lowered_runs(dtype) if _has_strips(run[2]))


def _run_target(target: str, step, env, kernel, dtype: str) -> np.ndarray:
    inputs = [np.asarray(env[n]) for n in step.input_names]
    out = np.full(naive_result(step, env).shape, np.nan, dtype)
    if target == "interpreter":
        out = out.astype(np.float64)
        run_kernel(kernel, step, out, inputs)
    elif target == "numba-printer":
        _numba_run(step, kernel, out, inputs)
    elif target == "julia-evaluator":
        pytest.importorskip("tree_sitter_julia")
        from julia_subset import CPU_BACKEND, load_module

        from tullax.backends.julia.backend import CPU, launch_arguments
        from tullax.printers import julia
        from tullax.printers.julia import launcher_name

        source = julia.print_module([kernel], flavour=CPU.flavour)
        args, copy_back = launch_arguments(kernel, step, out, inputs)
        load_module(source).call(launcher_name(kernel), CPU_BACKEND, *args)
        if copy_back is not None:
            out[...] = copy_back
    return out


@pytest.mark.compiles
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("target", TARGETS)
def test_the_stripped_ir_prints_correct_code_on_every_printer(target: str, dtype: str):
    runs = _stripped_runs(dtype)
    if target == "cuda-host-harness" and dtype == "float32":
        pytest.skip("the CUDA printer prints no Scratch: a strip-mined float32 kernel's float64 totals (the device "
                    "lowering never strip-mines)")
    if target == "cuda-host-harness":
        outputs = _cuda_outputs(dtype)
    else:
        outputs = [_run_target(target, step, env, kernel, dtype) for step, env, kernel, _ in runs]
    tol = 1e-5 if dtype == "float32" else 1e-12
    for (step, _, _, want), got in zip(runs, outputs):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max(), err_msg=f"{target} {step}")


def _cuda_outputs(dtype: str) -> list[np.ndarray]:
    """Every stripped kernel printed as CUDA C and run on the host harness: one g++ build."""
    from cuda_harness import GPP, Launch, build, run

    from tullax.printers.cuda import parameters

    if not GPP:
        pytest.skip("g++ is not installed")
    launches = []
    for n, (step, env, kernel, want) in enumerate(_stripped_runs(dtype)):
        kernel = kernel.__class__(**{**kernel.__dict__, "name": f"k{n}"})
        inputs = {a.name: np.asarray(env[a.source]) for a in kernel.arrays if a.role == "in"}
        out = np.full(want.shape, np.nan, dtype)
        sizes = _sizes(kernel, step, out, [np.asarray(env[i]) for i in step.input_names])
        arrays = {kernel.arrays[0].name: out, **inputs}
        args = []
        for param in parameters(kernel, 64):
            if param.kind == "array":
                args.append(arrays[param.array])
            elif param.kind == "size":
                args.append(sizes[param.name])
            elif param.kind == "extent":
                args.append(np.shape(arrays[param.array])[param.axis])
            else:
                raise AssertionError(f"no scalar in these kernels: {param}")
        launches.append(Launch(kernel, 64, tuple(args)))
    exe = build([(launch.kernel, 64) for launch in launches], Path(tempfile.mkdtemp(prefix="tullax-strips-")),
                sanitize=False)
    return run(exe, list(enumerate(launches)))


def _mlp_reference(x, W, c, cotangent):
    h = np.tanh(x @ W + c)
    g = cotangent * (1 - h * h)
    return h, (x.T @ g, g @ W.T, g.sum(0))


def _dist_reference(W, X, cotangent):
    D = ((W[:, :, None] - X[:, None, :]) ** 2).sum(0)
    dW = 2 * (W * cotangent.sum(1) - X @ cotangent.T)
    dX = 2 * (X * cotangent.sum(0) - W @ cotangent)
    return D, (dW, dX)


@pytest.mark.compiles
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", ["c", "numba", "xla"])
def test_forward_and_gradients_on_the_backends_match_numpy_float64(backend: str, dtype: str, monkeypatch):
    monkeypatch.setenv("TULLAX_C_TIERS", "off")  # the optimised build, whose printed C has the strips
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(5)
    tol = 2e-5 if dtype == "float32" else 1e-11

    def check(got, want, what):
        np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol * np.abs(want).max(),
                                   err_msg=f"{backend} {dtype} {what}")

    x, W, c = (rng.standard_normal(s) for s in ((13, LONG), (LONG, 37), (37,)))
    W /= np.sqrt(LONG)
    cot = rng.standard_normal((13, 37))
    h, grads = _mlp_reference(x, W, c, cot)
    mlp = tullax.einsum_kernel(MLP, backend=backend)
    args = [jnp.asarray(a.astype(dtype)) for a in (x, W, c)]
    check(mlp(*args), h, "mlp forward")
    got = jax.grad(lambda *a: jnp.sum(mlp(*a) * cot.astype(dtype)), (1, 0, 2))(*args)
    for name, g, want in zip(("dW", "dx", "dc"), got, grads):
        check(g, want, f"mlp {name}")

    Wd, X = rng.standard_normal((LONG, 13)), rng.standard_normal((LONG, 37))
    D, grads = _dist_reference(Wd, X, cot)
    dist = tullax.einsum_kernel(DIST, backend=backend)
    args = [jnp.asarray(a.astype(dtype)) for a in (Wd, X)]
    check(dist(*args), D, "dist forward")
    got = jax.grad(lambda *a: jnp.sum(dist(*a) * cot.astype(dtype)), (0, 1))(*args)
    for name, g, want in zip(("dW", "dX"), got, grads):
        check(g, want, f"dist {name}")


@pytest.mark.compiles
@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_and_inf_reach_exactly_the_elements_they_reach_in_numpy(dtype: str, monkeypatch):
    """Special values in the columns a tile's ragged last chunk shares with the chunk before (30 columns: chunks
    from 0 and, shifted back, from 30 - width): an old lane adds -0.0, never the term, so a NaN or inf there counts
    once and nowhere else; NaN*0 stays NaN (no factor is hoisted)."""
    monkeypatch.setenv("TULLAX_C_TIERS", "off")  # the optimised build, whose printed C has the strips
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(9)
    K, rows, cols = 7, 13, 30
    W, X = rng.standard_normal((K, rows)), rng.standard_normal((K, cols))
    width = strip_width(dtype)
    X[2, cols - width] = np.nan  # a column both chunks of the tile cover
    X[4, cols - width + 1] = np.inf
    W[3, 5] = -np.inf
    cot = rng.standard_normal((rows, cols))
    cot[6, cols - 1] = 0.0  # times the inf of W's row: NaN
    terms = W[:, :, None] - X[:, None, :]
    with np.errstate(invalid="ignore"):
        want = {"D": (terms ** 2).sum(0), "dW": (cot[None] * (2 * terms)).sum(2),
                "dX": -(cot[None] * (2 * terms)).sum(1)}
    dist = tullax.einsum_kernel(DIST, backend="c")
    args = [jnp.asarray(a.astype(dtype)) for a in (W, X)]
    dW, dX = jax.grad(lambda *a: jnp.sum(dist(*a) * cot.astype(dtype)), (0, 1))(*args)
    tol = 1e-5 if dtype == "float32" else 1e-12
    for name, got in (("D", dist(*args)), ("dW", dW), ("dX", dX)):
        got, expected = np.asarray(got, np.float64), want[name]
        assert np.array_equal(np.isnan(got), np.isnan(expected)), name
        infinities = [np.where(np.isinf(a), np.sign(a), 0) for a in (got, expected)]
        assert np.array_equal(*infinities), name
        finite = np.isfinite(expected)
        np.testing.assert_allclose(got[finite], expected[finite], rtol=tol, atol=tol * 100, err_msg=name)
