"""Dtypes beyond float32/float64 (issue 13): float16 and bfloat16 are computed and accumulated in float32 and
rounded to the dtype ``jnp.result_type`` gives; integer data keeps an integer result where the body is
integer-valued (wrapping like jnp's integers), and gets a float one where it is not (``/``, ``exp``, a float
literal). Each case against jnp of the same formula, on the numba and xla backends, eagerly and under jit; the
half-precision gradients against jax.grad of the jnp reference in float32; the printed Julia and CUDA C of
integer kernels run through the Julia-subset evaluator and g++."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest
from loop_backends import c_param

import tullax

BACKENDS = ("numba", "xla", c_param())


def _sum(v, axis=None):
    import jax.numpy as jnp

    return jnp.sum(v, axis=axis, dtype=v.dtype)  # the body's dtype: tullax's result_type rule, not jnp.sum's


def _prod(v, axis=None):
    import jax.numpy as jnp

    return jnp.prod(v, axis=axis, dtype=v.dtype)


def _jnp():
    import jax.numpy as jnp

    return jnp


# (id, spec, input shapes in input order, the jnp formula)
CORPUS: list[tuple[str, str, tuple[tuple[int, ...], ...], Callable]] = [
    ("matmul", "C[i,j] := A[i,k]*B[k,j]", ((5, 7), (7, 3)), lambda A, B: _sum(A[:, :, None] * B[None], 1)),
    ("dist", "D[i,j] := (W[k,i] - X[k,j])^2", ((4, 5), (4, 6)),
     lambda W, X: _sum((W[:, :, None] - X[:, None, :]) ** 2, 0)),
    ("dot_all", "s := x[i,j]*y[i,j]", ((6, 5), (6, 5)), lambda x, y: _sum(x * y)),
    ("row_max", "(max) m[i] := x[i,j] - y[j]", ((4, 9), (9,)), lambda x, y: _jnp().max(x - y[None], 1)),
    ("row_min", "(min) m[i] := x[i,j]*y[j]", ((4, 9), (9,)), lambda x, y: _jnp().min(x * y[None], 1)),
    ("product", "(*) p[i] := x[i,j] + y[j]", ((3, 4), (4,)), lambda x, y: _prod(x + y[None], 1)),
    ("abs_relu_max", "y[i] := abs(x[i,j]) + max(x[i,j], y0[j]) + relu(x[i,j])", ((4, 6), (6,)),
     lambda x, y: _sum(_jnp().abs(x) + _jnp().maximum(x, y[None]) + _jnp().maximum(x, 0), 1)),
    ("index_value", "y[i] := x[i,j]*j + 2", ((3, 5),),
     lambda x: _sum(x * _jnp().arange(5).astype(x.dtype)[None] + 2, 1)),
    ("divide", "y[i] := x[i,j]/2", ((3, 5),), lambda x: _jnp().sum(x / 2, 1)),
    ("exp", "y[i] := exp(x[i,j]/4)", ((3, 5),), lambda x: _jnp().sum(_jnp().exp(x / 4), 1)),
]
CORPUS_BY_ID = {case[0]: case for case in CORPUS}
# Each case takes these dtypes for its inputs (the last one repeated): halves, integers, mixtures.
DTYPES = (("float16",), ("bfloat16",), ("int32",), ("int64",), ("uint8",), ("int32", "float16"), ("uint8", "int8"),
          ("bfloat16", "float32"))
HALF_TOL = {"float16": 2e-3, "bfloat16": 1.6e-2}  # twice the unit roundoff: one rounding of a float32 result


def _inputs(shapes, dtypes, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for k, shape in enumerate(shapes):
        dtype = _np_dtype(dtypes[min(k, len(dtypes) - 1)])
        if dtype.kind == "u":
            values = rng.integers(0, 6, shape)
        elif dtype.kind == "i":
            values = rng.integers(-5, 6, shape)
        else:
            values = rng.uniform(-2, 2, shape)
        out.append(np.asarray(values).astype(dtype))
    return out


def _np_dtype(name):
    from tullax.spec.dtypes import as_dtype

    return as_dtype(name)


def _reference(formula, arrays):
    """(values, dtype): the dtype of jnp's formula on the arrays, with 64-bit types as they are (x64 on; a
    float64 that no input asked for is the default float, float32, as tullax computes it without x64); the
    values of the formula with half precision inputs in float32 (what tullax computes, rounded once)."""
    import jax
    import jax.numpy as jnp

    with jax.enable_x64(True):
        args = [jnp.asarray(a) for a in arrays]
        dtype = np.dtype(jax.eval_shape(formula, *args).dtype)
        if dtype == np.float64 and not any(a.dtype == np.float64 for a in arrays):
            dtype = np.dtype(np.float32)
        ref = formula(*[a.astype(jnp.float32) if a.dtype.name in HALF_TOL else a for a in args])
        return np.asarray(ref.astype(jnp.float64) if dtype.kind == "f" or dtype.name in HALF_TOL else ref), dtype


def _compare(got, ref, dtype):
    assert np.dtype(got.dtype) == dtype, (got.dtype, dtype)
    if dtype.kind in "iu":
        np.testing.assert_array_equal(np.asarray(got), ref.astype(dtype))
        return
    tol = HALF_TOL.get(dtype.name, 1e-6)
    scale = max(1.0, float(np.max(np.abs(ref))))
    np.testing.assert_allclose(np.asarray(got).astype(np.float64), ref, rtol=tol, atol=tol * 1e-2 * scale)


@pytest.mark.parametrize("dtypes", DTYPES, ids="-".join)
@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c[0])
@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_matches_jnp_in_value_and_dtype(backend, case, dtypes):
    _, text, shapes, formula = case
    arrays = _inputs(shapes, dtypes)
    ref, dtype = _reference(formula, arrays)
    _compare(tullax.einsum_kernel(text, backend=backend)(*arrays), ref, dtype)


@pytest.mark.parametrize("dtypes", [("float16",), ("int32",), ("uint8", "int8"), ("bfloat16", "float32")],
                         ids="-".join)
@pytest.mark.parametrize("case", [CORPUS_BY_ID[c] for c in ("matmul", "row_max")], ids=lambda c: c[0])
@pytest.mark.parametrize("backend", BACKENDS)
def test_under_jit_and_vmap_too(backend, case, dtypes):
    import jax
    import jax.numpy as jnp

    _, text, shapes, formula = case
    arrays = _inputs(shapes, dtypes)
    ref, dtype = _reference(formula, arrays)
    kernel = tullax.einsum_kernel(text, backend=backend)
    args = [jnp.asarray(a) for a in arrays]
    _compare(jax.jit(kernel)(*args), ref, dtype)
    batched = jax.vmap(kernel, in_axes=(0,) + (None,) * (len(args) - 1))(jnp.stack([args[0]] * 2), *args[1:])
    _compare(batched[1], ref, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_int64_keeps_its_digits_and_int32_sums_wrap_as_in_jnp(backend):
    """The issue's example: int64 2147483647 came back as 2.1474836e9."""
    import jax.numpy as jnp

    kernel = tullax.einsum_kernel("y[i] := x[i,j]", backend=backend)
    big = np.array([[2147483647, 0], [2**40, 3]], np.int64)
    got = kernel(big)
    assert got.dtype == np.int64 and got.tolist() == [2147483647, 2**40 + 3]
    wraps = np.array([[2147483647, 1], [-2147483647, -2]], np.int32)
    assert kernel(wraps).tolist() == np.asarray(jnp.sum(jnp.asarray(wraps), 1, dtype=jnp.int32)).tolist()
    assert kernel(wraps).tolist() == [-2147483648, 2147483647]
    assert kernel(np.array([[200, 100]], np.uint8)).tolist() == [44]  # uint8 arithmetic modulo 256
    product = tullax.einsum_kernel("(*) p := x[i]", backend=backend)(np.array([65536, 65536, 3], np.int32))
    assert product.dtype == np.int32 and int(product) == 0  # 2^32 * 3 wraps to 0, as jnp.prod in int32


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_max_min_start_at_the_extremes_of_the_type(backend):
    x = np.array([[-2**62, -2**63 + 5], [2**62, 2**63 - 7]], np.int64)
    assert tullax.einsum_kernel("(max) m[i] := x[i,j]", backend=backend)(x).tolist() == [-2**62, 2**63 - 7]
    assert tullax.einsum_kernel("(min) m[i] := x[i,j]", backend=backend)(x).tolist() == [-2**63 + 5, 2**62]


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_out_of_range_gather_of_integers_reads_jnp_takes_fill(backend):
    """Under jit index values are not checked: a gather outside the axis reads what jnp.take's fill gives
    (NaN for floats; the minimum of a signed result type, the maximum of an unsigned one)."""
    import jax
    import jax.numpy as jnp

    ix = jnp.array([1, 7])
    kernel = jax.jit(tullax.einsum_kernel("y[b] := W[ix[b]]", backend=backend))
    for dtype in (jnp.int32, jnp.uint8, jnp.int16):
        W = jnp.arange(3, dtype=dtype)
        expected = jnp.take(W, ix, mode="fill")
        got = kernel(W, ix)
        assert got.dtype == expected.dtype and got.tolist() == expected.tolist()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_accumulates_in_float32(backend, dtype):
    """4096 ones: a float16 accumulator stops at 2048 (and bfloat16 at 256); float32 gets 4096, which both
    halves hold exactly."""
    x = np.ones(4096, _np_dtype(dtype))
    got = tullax.einsum_kernel("s := x[i]", backend=backend)(x)
    assert got.dtype == _np_dtype(dtype) and float(got) == 4096.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_weak_python_scalars_take_the_arrays_type(backend):
    import jax

    x = np.arange(4, dtype=np.int32)
    kernel = tullax.einsum_kernel("y[i] := s*x[i]", backend=backend)
    for scalar, dtype in ((3, np.int32), (0.5, np.float32)):
        assert kernel(scalar, x).dtype == dtype
        assert jax.jit(kernel)(scalar, x).dtype == dtype
        np.testing.assert_allclose(kernel(scalar, x), scalar * np.arange(4))
    half = kernel(3, np.arange(4).astype(np.float16))
    assert half.dtype == np.float16


# ---------------------------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------------------------
GRAD_CASES = ("matmul", "dist", "row_max", "exp")


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("dtypes", [("float16",), ("float16", "float32"), ("bfloat16", "int32")], ids="-".join)
@pytest.mark.parametrize("case_id", GRAD_CASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_half_precision_gradients_match_jax_in_float32(backend, case_id, dtypes, jit):
    """Cotangents arrive in the half dtype; each input's gradient comes back in that input's dtype (an integer
    input gets none: JAX's float0), with the values of jax.grad of the jnp formula in float32."""
    import jax
    import jax.numpy as jnp

    _, text, shapes, formula = CORPUS_BY_ID[case_id]
    args = [jnp.asarray(a) for a in _inputs(shapes, dtypes, seed=3)]
    kernel = tullax.einsum_kernel(text, backend=backend)
    weights = jnp.asarray(np.random.default_rng(5).uniform(0.5, 1.5, np.shape(formula(*args))), jnp.float32)
    argnums = tuple(k for k, a in enumerate(args) if jnp.issubdtype(a.dtype, jnp.floating))

    def loss(fn):
        return lambda *a: (fn(*a).astype(jnp.float32) * weights).sum()

    grad = jax.grad(loss(kernel), argnums=argnums)
    got = (jax.jit(grad) if jit else grad)(*args)
    wide = [a.astype(jnp.float32) if jnp.issubdtype(a.dtype, jnp.floating) else a for a in args]
    expected = jax.grad(loss(formula), argnums=argnums)(*wide)
    for k, g, e in zip(argnums, got, expected):
        assert g.dtype == args[k].dtype, (k, g.dtype, args[k].dtype)
        tol = 4 * HALF_TOL["bfloat16" if "bfloat16" in dtypes else "float16"]
        scale = max(1.0, float(jnp.max(jnp.abs(e))))
        np.testing.assert_allclose(np.asarray(g.astype(jnp.float32)), np.asarray(e), rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_inputs_are_not_differentiable_as_in_jax(backend):
    """jax.grad refuses integer inputs (a TypeError from JAX itself, at the call, not inside a callback); with
    allow_int they get float0 zeros; a float input beside an integer one gets its gradient."""
    import jax
    import jax.numpy as jnp

    x = jnp.arange(6, dtype=jnp.int32).reshape(2, 3)
    kernel = tullax.einsum_kernel("y[i] := x[i,j]*x[i,j]", backend=backend)
    with pytest.raises(TypeError, match="integer"):
        jax.grad(lambda x: kernel(x).sum())(x)
    with pytest.raises(TypeError, match="integer"):
        jax.grad(lambda x: (x * x).sum(1).sum())(x)
    assert jax.grad(lambda x: kernel(x).sum().astype(jnp.float32), allow_int=True)(x).dtype == jax.dtypes.float0
    mixed = tullax.einsum_kernel("y[i] := x[i,j]*w[j]", backend=backend)
    w = jnp.array([1.0, 2.0, 3.0])
    gx, gw = jax.grad(lambda x, w: mixed(x, w).sum(), argnums=(0, 1), allow_int=True)(x, w)
    assert gx.dtype == jax.dtypes.float0
    np.testing.assert_allclose(gw, x.sum(0).astype(jnp.float32))
    _, tangent = jax.jvp(kernel, (x,), (np.zeros(x.shape, jax.dtypes.float0),))
    assert tangent.dtype == jax.dtypes.float0


# ---------------------------------------------------------------------------------------------
# The result dtype and the kernels' dtypes
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, dtypes, expected", [
    ("y[i] := x[i,j]", ["int32"], "int32"),
    ("y[i] := x[i,j]", ["uint8"], "uint8"),
    ("y[i] := x[i,j]", ["bfloat16"], "bfloat16"),
    ("y[i] := x[i,j]*w[j]", ["int32", "float16"], "float16"),
    ("y[i] := x[i,j]*w[j]", ["uint8", "int8"], "int16"),
    ("y[i] := x[i,j]*w[j]", ["bfloat16", "float16"], "float32"),
    ("y[i] := x[i,j]^2 + i", ["int64"], "int64"),
    ("y[i] := x[i,j]^0.5", ["int32"], "float32"),
    ("y[i] := x[i,j]/w[j]", ["int32", "int32"], "float32"),
    ("y[i] := x[i,j]*2.0", ["int32"], "float32"),
    ("y[i] := ifelse(x[i,j] > 0, x[i,j], -x[i,j])", ["int8"], "int8"),
    ("y[i] := (x[i,j] > 0.5)", ["int32"], "float32"),  # a float literal in the comparison
    ("y[i] := exp(x[i,j])", ["int32"], "float32"),
    ("y[i] := x[i,j] |> sqrt", ["int32"], "float32"),
    ("y[i] := x[i,j] |> abs", ["int32"], "int32"),
    ("(logsumexp) y[i] := x[i,j]", ["int32"], "float32"),
    ("y[i] := x[i,j]", ["bool"], "float32"),  # bool data alone: the default float, as before
    ("y[i] := x[i,j] + w[j]", ["bool", "int16"], "int16"),
    ("y[i] := s*x[i,j]", [int, "int16"], "int16"),
    ("y[i] := s*x[i,j]", [float, "int16"], "float32"),
    ("y[i] := W[ix[i],j]", ["int32", "int64"], "int32"),  # the index array does not take part
])
def test_result_dtype_follows_result_type_where_the_body_keeps_integers(text, dtypes, expected):
    from tullax.spec.dtypes import as_dtype
    from tullax.spec.frontend import compile_spec
    from tullax.spec.shapes import result_dtype

    spec = compile_spec(text)[1]
    given = [d if isinstance(d, type) else as_dtype(d) for d in dtypes]
    assert result_dtype(spec, given).name == expected


@pytest.mark.parametrize("narrow, wide", [
    (("float16", "float16"), ("float32", "float32")),
    (("bfloat16", "int64", "bfloat16"), ("float32", "int64", "float32")),
    (("uint8", "uint8"), ("uint8", "int64")),
    (("int32", "int32"), ("int32", "int64")),
    (("int64", "int64"), ("int64", "int64")),
    (("float32", "float32"), ("float32", "float32")),
])
def test_loop_kernels_get_half_precision_as_float32_and_integer_results_as_int64(narrow, wide):
    from tullax.backends.base import Signature

    signature = Signature(narrow[:-1], narrow[-1])
    assert signature.widened() == Signature(wide[:-1], wide[-1])


def test_generated_sources_spell_the_widened_types():
    """What each printer writes for a bfloat16 spec (float32 data) and an int32 one (int32 loads, int64
    compute and result, int64's minimum spelled so each language parses it as an int64)."""
    half = {be: tullax.generate_source("C[i,j] := A[i,k]*B[k,j]", backend=be, dtype="bfloat16")
            for be in ("numba", "julia", "cuda")}
    assert "float* __restrict__ a0" in half["cuda"] and "bfloat16" not in half["cuda"]
    assert "0.0f0" in half["julia"] and "np.float32(0.0)" in half["numba"]
    text = "(max) y[i] := abs(x[i,j]) + i"
    ints = {be: tullax.generate_source(text, backend=be, dtype="int32") for be in ("numba", "julia", "cuda")}
    assert "tx_i64* __restrict__ a0" in ints["cuda"] and "const tx_i32* __restrict__ a1" in ints["cuda"]
    assert "acc = -2147483648;" in ints["cuda"]  # the int32 result's minimum
    assert "acc = -2147483648" in ints["julia"] and "Int64(a1[" in ints["julia"]
    assert "np.int64(a1[" in ints["numba"]
    assert "grad" not in ints["numba"]  # integer results have no gradient kernels
    # the sum of a load and an index is wrapped to int32 before max compares it (x % Int32 in Julia)
    assert "tx_i64(tx_i32(tx_iabs(tx_i64(a1[" in ints["cuda"] and ") % Int32)" in ints["julia"]
    longs = {be: tullax.generate_source(text, backend=be, dtype="int64") for be in ("julia", "cuda")}
    assert "(-9223372036854775807LL - 1)" in longs["cuda"] and "typemin(Int64)" in longs["julia"]
    assert "% Int" not in longs["julia"]  # an int64 result needs no wrapping


def test_printed_julia_of_integer_kernels_runs_in_the_subset_evaluator():
    """The printed Julia of integer kernels (int32 loads into Int64, typemin(Int64) for max), run by
    the Julia-subset evaluator with Julia's semantics (exact conversions on store), against jnp."""
    import julia_subset

    from tullax.backends.base import Signature
    from tullax.backends.julia.backend import kernel_module
    from tullax.spec.frontend import compile_spec

    for case_id, dtypes in (("row_max", ("int32",)), ("matmul", ("int32",)), ("abs_relu_max", ("int32",)),
                            ("product", ("int32", "int64"))):
        _, text, shapes, formula = CORPUS_BY_ID[case_id]
        arrays = _inputs(shapes, dtypes, seed=2)
        ref, dtype = _reference(formula, arrays)
        spec = compile_spec(text)[1]
        signature = Signature(tuple(a.dtype.name for a in arrays), dtype.name).widened()
        kernel, source = kernel_module(spec, signature)
        module = julia_subset.load_module(source)
        out = np.zeros(ref.shape, np.int64)
        sizes = _size_arguments(kernel, spec, arrays, out)
        used = [arrays[spec.input_names.index(a.source)] for a in kernel.arrays if a.role == "in"]
        module.call(f"run_{kernel.name}!", julia_subset.CPU_BACKEND, out, *used, *sizes)
        np.testing.assert_array_equal(out.astype(dtype), ref.astype(dtype), err_msg=case_id)


def _size_arguments(kernel, spec, arrays, out):
    shapes = {n: a.shape for n, a in zip(spec.input_names, arrays)}
    shapes[spec.out] = out.shape
    return [int(s.size.eval(shapes)) for s in kernel.sizes]


def test_printed_cuda_of_integer_kernels_runs_under_gpp(tmp_path):
    """The printed CUDA C of integer kernels (int64 compute, int32/uint8 loads), compiled with g++ and launched
    with the host's launch plan, which keeps their index arithmetic 64 bits wide."""
    from cuda_harness import GPP, Launch, build, run

    from tullax.backends.base import Signature
    from tullax.backends.cuda.launch import plan_launch
    from tullax.compiler.lower import lower
    from tullax.spec.frontend import compile_spec

    if GPP is None:
        pytest.skip("g++ is not installed")
    jobs, expected = [], []
    for n, (case_id, dtypes) in enumerate((("row_max", ("int32",)), ("matmul", ("uint8",)),
                                           ("dist", ("int32",)), ("abs_relu_max", ("int8", "int32")))):
        _, text, shapes, formula = CORPUS_BY_ID[case_id]
        arrays = _inputs(shapes, dtypes, seed=4)
        ref, dtype = _reference(formula, arrays)
        spec = compile_spec(text)[1]
        signature = Signature(tuple(a.dtype.name for a in arrays), dtype.name).widened()
        kernel = lower(spec, signature, name=f"k{n}")
        named = {name: a.shape for name, a in zip(spec.input_names, arrays)}
        plan = plan_launch(kernel, spec, {**named, spec.out: ref.shape}, signature.out_dtype)
        assert plan.index_bits == 64
        out = np.zeros(ref.shape, np.int64)
        pointers = [out if source is None else arrays[source] for source in plan.pointers]
        jobs.append(Launch(kernel, plan.index_bits, (*pointers, *plan.values)))
        expected.append((case_id, ref.astype(dtype), dtype))
    exe = build([(launch.kernel, launch.index_bits) for launch in jobs], tmp_path)
    for got, (case_id, ref, dtype) in zip(run(exe, list(enumerate(jobs))), expected):
        np.testing.assert_array_equal(got.astype(dtype), ref, err_msg=case_id)


# ---------------------------------------------------------------------------------------------
# Random specs with random dtypes
# ---------------------------------------------------------------------------------------------
RANDOM_SPECS = {"xla": 60, "numba": 4, "c": 8}


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_specs_with_random_dtypes_match_the_naive_evaluator(backend):
    """Random specs (tullax.testing.specgen) on inputs of random dtypes (random_dtypes): the values of the
    naive evaluator on the same numbers in float64; an integer result only where those values are integers
    (and then exactly them: the inputs are small, nothing overflows), a floating one of jnp.result_type's
    dtype when every input is floating."""
    import jax.numpy as jnp

    from tullax.errors import TullaxError
    from tullax.spec.examples import random_inputs
    from tullax.spec.frontend import compile_spec
    from tullax.testing.oracle import naive_eval
    from tullax.testing.specgen import random_dtypes, random_spec

    rng = np.random.default_rng(20261124)
    checked, kinds = 0, set()
    while checked < RANDOM_SPECS[backend]:
        text = random_spec(rng)
        try:
            spec = compile_spec(text)[1]
        except TullaxError:
            continue
        data = [i.name for i in spec.inputs if i.kind in ("array", "scalar")]
        dtypes = random_dtypes(data, rng, ("float16", "bfloat16", "int32", "int64", "int16", "float32"))
        env = random_inputs(spec, seed=checked)
        env = {n: _small_values(v, dtypes[n]) if n in dtypes else v for n, v in env.items()}
        with np.errstate(all="ignore"):
            expected = np.asarray(naive_eval(spec, {n: _as_float64(v) for n, v in env.items()}), np.float64)
        got = tullax.einsum_kernel(text, backend=backend)(*[env[n] for n in spec.input_names])
        got_dtype = np.dtype(got.dtype)
        kinds.add(got_dtype.name)
        if all(_np_dtype(d).kind == "f" or d in HALF_TOL for d in dtypes.values()) and dtypes:
            assert got_dtype == np.dtype(jnp.result_type(*[_np_dtype(d) for d in dtypes.values()])), text
        if got_dtype.kind in "iu":
            finite = np.isfinite(expected)
            assert np.all(expected[finite] == np.round(expected[finite])), (text, dtypes)
            np.testing.assert_array_equal(np.asarray(got)[finite], expected[finite], err_msg=f"{text} {dtypes}")
        else:
            # float32 arithmetic where the oracle has float64: a cos or exp of a long product amplifies it
            tol = max(HALF_TOL.get(got_dtype.name, 0.0), 5e-3)
            wide = np.asarray(got).astype(np.float64)
            usable = np.isfinite(expected) & (np.abs(expected) < 1e4)  # float16 tops out at 65504
            scale = max(1.0, float(np.max(np.abs(expected[usable]), initial=0.0)))
            np.testing.assert_allclose(wide[usable], expected[usable], rtol=tol, atol=tol * scale,
                                       err_msg=f"{text} {dtypes}")
        checked += 1
    assert {"float16", "bfloat16", "int32", "int64"} <= kinds or backend in ("numba", "c")


def _small_values(value, dtype):
    """``value`` in ``dtype``; integers from small rounded values (-3..3), so nothing overflows."""
    target = _np_dtype(dtype)
    if target.kind in "iu":
        return np.round(np.clip(np.asarray(value, np.float64) * 2, -3, 3)).astype(target)[()]
    return np.asarray(value).astype(target)[()]


def _as_float64(value):
    array = np.asarray(value)
    return array.astype(np.float64) if array.dtype.kind == "f" or array.dtype.name in HALF_TOL else array
