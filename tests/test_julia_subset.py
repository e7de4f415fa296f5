"""Tests of the Julia-subset evaluator (tests/julia_subset.py) on hand-written KA 0.9 kernels."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from julia_subset import (
    CPU_BACKEND,
    JuliaRuntimeError,
    JuliaSyntaxError,
    Launch,
    UndefinedName,
    UnsupportedJulia,
    cpu_launch,
    default_cpu_workgroupsize,
    load_module,
    parse_errors,
)

SAMPLES = Path(__file__).parent / "golden" / "julia_samples"
SAMPLE_FILES = sorted(SAMPLES.glob("*.jl"))
FLOATS = [np.float32, np.float64]


def sample(name: str):
    return load_module((SAMPLES / f"{name}.jl").read_text())


def rng():
    return np.random.default_rng(1234)


def module(body: str, *, imports: str = "using KernelAbstractions\nusing Atomix"):
    return load_module(f"module T\n{imports}\n{body}\nend\n")


def evaluate(expression: str, **params):
    """The value (with its Julia type) of one expression inside a plain function."""
    src = f"function f({', '.join(params)})\n    return {expression}\nend"
    return module(src).call("f", *params.values())


def kernel(body: str, params: str = "out"):
    """A module with one @kernel `k!(params...)` whose body is `body`."""
    return module(f"@kernel function k!({params})\n{body}\nend")


# -- layer 1: syntax -----------------------------------------------------------------------------


def test_there_are_samples_for_every_pattern():
    names = {f.stem for f in SAMPLE_FILES}
    assert {"matmul", "conv1d", "rowmax", "logsumexp", "scatter", "stride2", "scale"} <= names


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=lambda p: p.stem)
def test_samples_parse_without_error_or_missing_nodes(path):
    assert parse_errors(path.read_text()) == []


def test_parse_errors_name_line_and_column():
    assert parse_errors("module M\n@kernel function k!(a)\n    a[1 = 2\nend\nend\n") == ["3:8: MISSING ]"]
    errors = parse_errors("module M\nfunction f(x)\n    y = (x +\nend\nend\n")
    assert errors
    assert all(e.split(":")[0].isdigit() and e.split(":")[1].isdigit() for e in errors)
    with pytest.raises(JuliaSyntaxError) as info:
        load_module("module M\nfunction f(x)\n    y = (x +\nend\nend\n")
    assert info.value.errors == errors


# -- the samples compute what NumPy computes -----------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
def test_matmul_forward_by_launch_and_by_launcher(dtype):
    r = rng()
    a, b = r.standard_normal((3, 4)).astype(dtype), r.standard_normal((4, 5)).astype(dtype)
    m = sample("matmul")
    c = np.zeros((3, 5), dtype)
    m.launch("matmul_fwd!", c, a, b, 4, ndrange=(5, 3))
    np.testing.assert_allclose(c, a @ b, rtol=1e-5)
    c2 = np.zeros((3, 5), dtype)
    assert m.call("matmul!", CPU_BACKEND, c2, a, b) is None
    np.testing.assert_array_equal(c2, c)
    assert c.dtype == dtype


@pytest.mark.parametrize("dtype", FLOATS)
def test_matmul_gradient_kernels(dtype):
    r = rng()
    a, b = r.standard_normal((3, 4)).astype(dtype), r.standard_normal((4, 5)).astype(dtype)
    dc = r.standard_normal((3, 5)).astype(dtype)
    da, db = np.zeros_like(a), np.zeros_like(b)
    m = sample("matmul")
    m.call("matmul_grads!", CPU_BACKEND, da, db, dc, a, b)
    np.testing.assert_allclose(da, dc @ b.T, rtol=1e-5)
    np.testing.assert_allclose(db, a.T @ dc, rtol=1e-5)
    assert m.launches == [("matmul_grad_A!", (4, 3)), ("matmul_grad_B!", (5, 4))]


@pytest.mark.parametrize("dtype", FLOATS)
def test_conv1d_forward_and_guarded_gradients(dtype):
    r = rng()
    x, w = r.standard_normal(9).astype(dtype), r.standard_normal(3).astype(dtype)
    m = sample("conv1d")
    y = np.zeros(7, dtype)
    m.launch("conv_fwd!", y, x, w, 3, ndrange=(7,))
    np.testing.assert_allclose(y, np.correlate(x, w, "valid"), rtol=1e-5)
    dy = r.standard_normal(7).astype(dtype)
    dx, dw = np.zeros_like(x), np.zeros_like(w)
    m.launch("conv_grad_x!", dx, dy, w, 7, 3, ndrange=9)
    m.launch("conv_grad_w!", dw, dy, x, 7, ndrange=(3,))
    np.testing.assert_allclose(dx, np.convolve(dy, w), rtol=1e-5)
    np.testing.assert_allclose(dw, np.correlate(x, dy, "valid"), rtol=1e-5)


@pytest.mark.parametrize("dtype", FLOATS)
def test_rowmax_and_its_tie_splitting_gradient(dtype):
    x = np.array([[1, 3, 3, 0], [5, 2, 5, 5], [-1, -2, -3, -4]], dtype)
    m = sample("rowmax")
    mx = np.zeros(3, dtype)
    m.launch("rowmax_fwd!", mx, x, 4, ndrange=3)
    np.testing.assert_array_equal(mx, x.max(axis=1))
    dm = np.array([6, 9, 2], dtype)
    dx = np.full_like(x, np.nan)
    m.launch("rowmax_grad_x!", dx, dm, x, mx, 4, ndrange=(4, 3))
    ties = (x == mx[:, None])
    np.testing.assert_allclose(dx, ties * (dm / ties.sum(axis=1))[:, None])


@pytest.mark.parametrize("dtype", FLOATS)
def test_logsumexp_and_gradient(dtype):
    x = (rng().standard_normal((3, 5)) * 10).astype(dtype)
    x[2] = -np.inf
    m = sample("logsumexp")
    lse = np.zeros(3, dtype)
    m.launch("logsumexp_fwd!", lse, x, 5, ndrange=(3,))
    with np.errstate(divide="ignore"):
        expected = np.log(np.exp(x.astype(np.float64)).sum(axis=1))
    np.testing.assert_allclose(lse, expected, rtol=1e-5)
    assert lse[2] == -np.inf
    dl = np.array([1.0, 2.0, 3.0], dtype)
    dx = np.zeros_like(x)
    m.launch("logsumexp_grad_x!", dx[:2], dl[:2], x[:2], lse[:2], ndrange=(5, 2))
    np.testing.assert_allclose(dx[:2], dl[:2, None] * np.exp(x[:2] - lse[:2, None]), rtol=1e-5)


@pytest.mark.parametrize("dtype", FLOATS)
def test_gather_and_atomic_scatter_gradient(dtype):
    r = rng()
    w = r.standard_normal((4, 3)).astype(dtype)
    ix = np.array([2, 0, 2, 2, 1], np.int64)
    m = sample("scatter")
    out = np.zeros((5, 3), dtype)
    m.launch("gather_fwd!", out, w, ix, ndrange=(3, 5))
    np.testing.assert_array_equal(out, w[ix])
    dout = r.standard_normal((5, 3)).astype(dtype)
    dw = np.zeros_like(w)
    m.call("gather_grad!", CPU_BACKEND, dw, dout, ix)
    expected = np.zeros_like(w)
    np.add.at(expected, ix, dout)
    np.testing.assert_allclose(dw, expected, rtol=1e-5)


def test_stride2_gradient_guards():
    x = np.arange(1, 9, dtype=np.float32)
    m = sample("stride2")
    z = np.zeros(4, np.float32)
    m.launch("stride2_fwd!", z, x, ndrange=4)
    np.testing.assert_array_equal(z, x[0::2] + x[1::2])
    dz = np.array([1, 2, 3], np.float32)  # covers only the first 6 elements of a length-8 x
    dx = np.full(8, np.nan, np.float32)
    m.launch("stride2_grad_x!", dx, dz, 3, ndrange=(8,))
    np.testing.assert_array_equal(dx, [1, 1, 2, 2, 3, 3, 0, 0])


def test_scalar_parameters_zero_dimensional_outputs_and_helper_functions():
    x = np.array([0.5, -1.0, 2.0], np.float32)
    m = sample("scale")
    y = np.zeros(3, np.float32)
    m.launch("scale_fwd!", y, x, np.float32(2), np.float32(1), ndrange=3)
    np.testing.assert_array_equal(y, 2 * x + 1)
    da, db = np.zeros((), np.float32), np.zeros((), np.float32)
    dy = np.array([1, 2, 3], np.float32)
    m.launch("scale_grad_ab!", da, db, dy, x, 3, ndrange=(1,))
    assert da == np.dot(dy, x) and db == dy.sum()
    m.launch("squash!", y, x, ndrange=3)
    np.testing.assert_allclose(y, np.clip(1 / (1 + np.exp(-x)), 0.25, 0.75), rtol=1e-6)
    assert m.call("sigmoid", np.float32(0)) == np.float32(0.5)


# -- layout and indexing ---------------------------------------------------------------------------


def test_arrays_are_column_major_with_reversed_axes():
    m = kernel("    (j, i) = @index(Global, NTuple)\n    out[j, i] = 10 * i + j")
    out = np.zeros((2, 3), np.int64)
    m.launch("k!", out, ndrange=(3, 2))
    np.testing.assert_array_equal(out, [[11, 12, 13], [21, 22, 23]])  # out[i-1, j-1] == 10i + j


def test_linear_index_follows_the_c_order_of_the_numpy_buffer():
    m = kernel("    k = @index(Global, Linear)\n    out[k] = k")
    out = np.zeros((2, 3), np.int64)
    m.launch("k!", out, ndrange=6)
    np.testing.assert_array_equal(out.ravel(), np.arange(1, 7))


def test_linear_index_of_a_2d_ndrange_is_column_major():
    m = kernel("    k = @index(Global, Linear)\n    (a, b) = @index(Global, NTuple)\n    out[a, b] = k")
    out = np.zeros((2, 3), np.int64)
    m.launch("k!", out, ndrange=(3, 2))
    np.testing.assert_array_equal(out, [[1, 2, 3], [4, 5, 6]])


def test_size_length_eltype_and_ndrange():
    m = module("function f(A)\n    return (size(A, 1), size(A, 2), size(A, 3), length(A), size(A), ndims(A))\nend\n"
               "@kernel function k!(out)\n    I = @index(Global, Cartesian)\n    r = @ndrange()\n"
               "    out[I] = r[1] * 100 + I[1] + I[2] * 10\nend")
    a = np.zeros((2, 5), np.float32)
    assert m.call("f", a) == (5, 2, 1, 10, (5, 2), 2)
    out = np.zeros((2, 3), np.int64)
    m.launch("k!", out, ndrange=(3, 2))
    np.testing.assert_array_equal(out, [[311, 312, 313], [321, 322, 323]])


@pytest.mark.parametrize("index", ["0", "n + 1", "-1"])
def test_out_of_bounds_reads_raise_even_under_inbounds(index):
    m = kernel(f"    i = @index(Global, Linear)\n    @inbounds out[i] = x[{index}]", "out, @Const(x), n::Int")
    with pytest.raises(JuliaRuntimeError, match="BoundsError") as info:
        m.launch("k!", np.zeros(2, np.float32), np.ones(3, np.float32), 3, ndrange=2)
    assert info.value.line == 6  # module, 2 x using, @kernel, @index, then the access


def test_indices_must_be_integers_and_stores_convert_exactly():
    m = kernel("    i = @index(Global, Linear)\n    out[i] = x[1.0]", "out, x")
    with pytest.raises(JuliaRuntimeError, match="invalid index"):
        m.launch("k!", np.zeros(1), np.ones(1), ndrange=1)
    m = kernel("    i = @index(Global, Linear)\n    out[i] = 1.5", "out")
    with pytest.raises(JuliaRuntimeError, match="InexactError"):
        m.launch("k!", np.zeros(1, np.int64), ndrange=1)
    m.launch("k!", out := np.zeros(1, np.float32), ndrange=1)
    assert out[0] == 1.5


# -- numbers behave like Julia's -------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression, expected, dtype",
    [
        ("1f0 + 1", 2, np.float32),
        ("x + 1", 2.5, np.float32),
        ("x * 2.0", 3.0, np.float64),
        ("1 / 2", 0.5, np.float64),
        ("Float32(1) / 2", 0.5, np.float32),
        ("2^10", 1024, np.int64),
        ("2.0^-1", 0.5, np.float64),
        ("-2^2", -4, np.int64),
        ("2 ^ (3^2)", 512, np.int64),
        ("2 * -3^2", -18, np.int64),
        ("10 - 3 - 2", 5, np.int64),
        ("7 ÷ 2 * 2", 6, np.int64),
        ("-7 ÷ 2", -3, np.int64),
        ("-7 % 2", -1, np.int64),
        ("div(-7, 2)", -3, np.int64),
        ("rem(-7, 2)", -1, np.int64),
        ("fld(-7, 2)", -4, np.int64),
        ("mod(-7, 2)", 1, np.int64),
        ("mod(7, -2)", -1, np.int64),
        ("cld(-7, 2)", -3, np.int64),
        ("cld(7, 2)", 4, np.int64),
        ("mod(-0.5, 1.0)", 0.5, np.float64),
        ("rem(-0.5, 1.0)", -0.5, np.float64),
        ("max(1f0, 2)", 2, np.float32),
        ("min(3, 2)", 2, np.int64),
        ("max(1, 2, 7, 3)", 7, np.int64),
        ("clamp(5, 0f0, 1f0)", 1, np.float32),
        ("ifelse(x > 1, 1, 2)", 1, np.int64),
        ("false * Inf", 0.0, np.float64),
        ("exp(0)", 1.0, np.float64),
        ("exp(0f0)", 1.0, np.float32),
        ("sqrt(4f0)", 2.0, np.float32),
        ("log1p(0f0) + expm1(0f0) + tanh(0f0)", 0.0, np.float32),
        ("abs(-3)", 3, np.int64),
        ("float(3)", 3.0, np.float64),
        ("convert(Float32, 3)", 3.0, np.float32),
        ("Int(2.0)", 2, np.int64),
        ("Int32(7) + Int32(1)", 8, np.int32),
        ("Int32(7) + 1", 8, np.int64),
        ("zero(Float32) + one(x)", 1.0, np.float32),
        ("oneunit(Int32)", 1, np.int32),
        ("1_000 + 0.5f0 + 1.5f-3", 1000.5015, np.float32),
        ("1e-3", 0.001, np.float64),
        ("muladd(2f0, 3f0, 1f0)", 7, np.float32),
        ("abs2(-3f0)", 9, np.float32),
        ("true + true", 2, np.int64),
    ],
)
def test_arithmetic_and_promotion(expression, expected, dtype):
    result = evaluate(expression, x=np.float32(1.5))
    assert type(result) is dtype
    assert result == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("true || false && false", True),
        ("!(1 < 2)", False),
        ("1 ≤ 2 && 3 ≥ 3 && 1 ≠ 2", True),
        ("isnan(NaN32) && isinf(-Inf) && !isfinite(Inf32) && isfinite(1)", True),
        ("isnan(max(NaN, 1.0)) && isnan(min(1.0, NaN))", True),
        ("typemin(Float32) == -Inf32 && typemax(Int64) == 9223372036854775807", True),
        ("x > 1 ? true : false", True),
    ],
)
def test_logic_and_special_values(expression, expected):
    assert evaluate(expression, x=np.float32(1.5)) is expected


def test_max_and_min_order_signed_zeros_like_julia():
    assert evaluate("1 / min(-0.0, 0.0)") == -np.inf
    assert evaluate("1 / max(-0.0, 0.0)") == np.inf


@pytest.mark.parametrize(
    "expression, error",
    [
        ("1 ÷ 0", "DivideError"),
        ("mod(1, 0)", "DivideError"),
        ("2^-1", "DomainError"),
        ("sqrt(-1.0)", "DomainError"),
        ("log(-1f0)", "DomainError"),
        ("sin(Inf)", "DomainError"),
        ("(-8.0)^(1/3)", "DomainError"),
        ("Int(2.5)", "InexactError"),
        ("convert(Int32, 3000000000)", "InexactError"),
        ("Bool(2)", "InexactError"),
        ("ifelse(1, 2, 3)", "non-boolean"),
        ("!1", "non-boolean"),
        ("1 && true", "non-boolean"),
        ("max(1)", "MethodError"),
        ("size(1)", "MethodError"),
    ],
)
def test_julia_errors(expression, error):
    with pytest.raises(JuliaRuntimeError, match=error):
        evaluate(expression)


def test_literals_and_constants_keep_their_julia_types():
    values = evaluate("(1f0, 0.5f0, Inf32, NaN32, -Inf, 1.0, 2, true, nothing)")
    assert [type(v) for v in values] == [np.float32, np.float32, np.float32, np.float32, np.float64,
                                         np.float64, np.int64, bool, type(None)]
    assert values[2] == np.inf and np.isnan(values[3]) and values[4] == -np.inf


def test_float32_accumulation_stays_float32():
    m = kernel("    i = @index(Global, Linear)\n    acc = zero(eltype(out))\n    for k in 1:3\n"
               "        acc += x[k] / 3\n    end\n    out[i] = acc", "out, @Const(x)")
    x = np.array([0.1, 0.2, 0.3], np.float32)
    out = np.zeros(1, np.float32)
    m.launch("k!", out, x, ndrange=1)
    expected = np.float32(0)
    for v in x:
        expected = np.float32(expected + np.float32(v / np.float32(3)))
    assert out[0] == expected


# -- control flow and scope -------------------------------------------------------------------------


def test_loops_ranges_break_continue_and_while():
    src = """function f(n)
    total = 0
    for i in 1:n, j in 1:i
        total += 1
    end
    for i in n:-2:1
        total += 100 * i
    end
    k = 0
    while true
        k += 1
        if k < 3
            continue
        elseif k > 5
            break
        end
        total += 10000
    end
    for i in 5:4
        total = -1
    end
    return total
end"""
    assert module(src).call("f", 4) == (1 + 2 + 3 + 4) + 100 * (4 + 2) + 3 * 10000


def test_loop_variable_does_not_clobber_an_outer_local():
    assert module("function f()\n    i = 10\n    for i in 1:3\n    end\n    return i\nend").call("f") == 10


def test_loop_body_locals_are_fresh_in_every_iteration():
    src = """function f()
    for k in 1:2
        if k == 2
            y = t
        end
        t = k
    end
    return 0
end"""
    with pytest.raises(JuliaRuntimeError, match="UndefVarError: `t`"):
        module(src).call("f")


def test_a_name_assigned_only_inside_a_loop_is_not_visible_after_it():
    with pytest.raises(UndefinedName, match="`last`"):
        module("function f()\n    for k in 1:2\n        last = k\n    end\n    return last\nend")


def test_an_outer_local_assigned_after_the_loop_is_shared_with_it():
    # Julia's scopes are lexical: `s` is assigned in the function body, so it is a function local
    # and the loop updates it, even though that assignment comes later in the text.
    src = "function f()\n    for k in 1:3\n        s = k\n    end\n    r = s\n    s = 0\n    return r\nend"
    assert module(src).call("f") == 3


def test_typed_locals_convert_on_assignment():
    assert type(module("function f()\n    local s::Float32 = 0\n    s += 1.5\n    return s\nend").call("f")) \
        is np.float32
    with pytest.raises(JuliaRuntimeError, match="InexactError"):
        module("function f()\n    local n::Int = 1\n    n = 2.5\n    return n\nend").call("f")


def test_conditions_must_be_bool():
    with pytest.raises(JuliaRuntimeError, match="non-boolean") as info:
        module("function f(x)\n    if x\n        return 1\n    end\n    return 0\nend").call("f", 1)
    assert info.value.line == 5  # module, 2 x using, function, if


# -- kernel semantics ------------------------------------------------------------------------------


def test_const_arguments_are_read_only():
    m = kernel("    i = @index(Global, Linear)\n    x[i] = 0", "out, @Const(x)")
    with pytest.raises(JuliaRuntimeError, match="@Const"):
        m.launch("k!", np.zeros(2), np.ones(2), ndrange=2)


def test_const_arguments_must_not_alias():
    m = kernel("    i = @index(Global, Linear)\n    out[i] = x[i]", "out, @Const(x)")
    a = np.ones(2)
    with pytest.raises(JuliaRuntimeError, match="aliases"):
        m.launch("k!", a, a, ndrange=2)


def test_non_atomic_scatter_is_a_data_race():
    m = kernel("    (d, b) = @index(Global, NTuple)\n    dW[d, ix[b] + 1] += dout[d, b]",
               "dW, @Const(dout), @Const(ix)")
    with pytest.raises(JuliaRuntimeError, match="data race"):
        m.launch("k!", np.zeros((3, 2)), np.ones((4, 2)), np.array([0, 1, 0, 2]), ndrange=(2, 4))
    m.launch("k!", dw := np.zeros((3, 2)), np.ones((3, 2)), np.array([2, 0, 1]), ndrange=(2, 3))  # distinct rows
    np.testing.assert_array_equal(dw, np.ones((3, 2)))


def test_reading_what_another_work_item_wrote_is_a_data_race():
    m = kernel("    i = @index(Global, Linear)\n    out[i] = 1\n    out[i] = out[mod(i, n) + 1]", "out, n::Int")
    with pytest.raises(JuliaRuntimeError, match="data race"):
        m.launch("k!", np.zeros(4), 4, ndrange=4)


def test_zeros_makes_an_array_private_to_its_work_item():
    """Every work-item writes element 1 of its own ``zeros`` array: no race; its elements have the given type,
    start at zero and are bounds-checked."""
    m = kernel("    i = @index(Global, Linear)\n    t = zeros(Float64, 2)\n    t[1] += x[i]\n    out[i] = t[1] + t[2]",
               "out, @Const(x)")
    m.launch("k!", out := np.zeros(3, np.float32), np.array([1.5, 2.5, 3.5], np.float32), ndrange=3)
    np.testing.assert_array_equal(out, [1.5, 2.5, 3.5])
    assert type(module("function f()\n    t = zeros(Float64, 3)\n    return t[3]\nend").call("f")) is np.float64
    with pytest.raises(JuliaRuntimeError, match="BoundsError"):
        module("function f()\n    t = zeros(Float32, 2)\n    return t[3]\nend").call("f")


def test_an_order_dependent_kernel_is_caught():
    m = kernel("    i = @index(Global, Linear)\n    out[1] = i", "out")
    with pytest.raises(JuliaRuntimeError, match="data race"):
        m.launch("k!", np.zeros(1, np.int64), ndrange=3)


def test_every_point_of_the_ndrange_runs_exactly_once():
    m = kernel("    (a, b, c) = @index(Global, NTuple)\n    Atomix.@atomic out[a, b, c] += 1", "out")
    out = np.zeros((2, 3, 4), np.int64)
    m.launch("k!", out, ndrange=(4, 3, 2))
    np.testing.assert_array_equal(out, 1)
    m.launch("k!", out, ndrange=(0, 3, 2))
    np.testing.assert_array_equal(out, 1)


def test_launch_argument_checks():
    m = kernel("    i = @index(Global, Linear)\n    out[i] = n", "out, n::Int")
    with pytest.raises(JuliaRuntimeError, match="MethodError"):
        m.launch("k!", np.zeros(2), 1.5, ndrange=2)
    with pytest.raises(JuliaRuntimeError, match="MethodError"):
        m.launch("k!", np.zeros(2), ndrange=2)
    launcher = module("@kernel function k!(out)\n    i = @index(Global, Linear)\n    out[i] = 1\nend\n"
                      "function run!(backend, out)\n    k!(backend)(out)\nend")
    with pytest.raises(JuliaRuntimeError, match="ndrange"):
        launcher.call("run!", CPU_BACKEND, np.zeros(2))


def test_typed_array_parameters_are_checked():
    m = module("function f(A::AbstractArray{Float32,2}, n::Integer)\n    return n\nend")
    assert m.call("f", np.zeros((1, 1), np.float32), 3) == 3
    with pytest.raises(JuliaRuntimeError, match="MethodError"):
        m.call("f", np.zeros((1, 1), np.float64), 3)
    with pytest.raises(JuliaRuntimeError, match="MethodError"):
        m.call("f", np.zeros(1, np.float32), 3)


def test_launcher_with_implicit_keyword_and_static_workgroup():
    src = """@kernel function k!(out, @Const(x))
    i = @index(Global, Linear)
    out[i] = 2 * x[i]
end
function run!(backend, out, x)
    ndrange = length(out)
    kern = k!(backend, 4)
    kern(out, x; ndrange)
    KernelAbstractions.synchronize(backend)
end"""
    out = np.zeros(5, np.float32)
    module(src).call("run!", CPU_BACKEND, out, np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(out, 2 * np.arange(5))


def test_cpu_launch_geometry_follows_kernelabstractions():
    """KA 0.9.38-0.9.41 src/cpu.jl: without a work-group size, an ndrange of up to 1024 work-items is ONE group;
    beyond, groups of 1024 filled fastest dimension first; fld1 groups per dimension; one task per thread with
    groups (the README dist benchmark's (1, 1024) ndrange: one task; matmul 1024^3's (2, 1024): two)."""
    assert default_cpu_workgroupsize((1, 1024)) == (1, 1024)
    assert default_cpu_workgroupsize((2, 1024)) == (2, 512)
    assert default_cpu_workgroupsize((5000,)) == (1024,)
    assert default_cpu_workgroupsize((3, 2000, 9)) == (3, 341, 1)
    assert default_cpu_workgroupsize((0, 3)) == (1, 1)
    assert cpu_launch("k", (1, 1024), None, 16) == Launch("k", (1, 1024), (1, 1024), 1, 1)
    assert cpu_launch("k", (2, 1024), None, 16) == Launch("k", (2, 1024), (2, 512), 2, 2)
    assert cpu_launch("k", (10, 7), (3,), 4) == Launch("k", (10, 7), (3, 1), 28, 4)


def test_launches_record_their_geometry_and_threads_nthreads_is_the_evaluators():
    src = """@kernel function k!(out)
    i = @index(Global, Linear)
    out[i] = Threads.nthreads()
end
function run!(backend, out, wg)
    k!(backend)(out; ndrange = size(out), workgroupsize = wg)
    k!(backend)(out; ndrange = size(out))
    k!(backend, 2)(out; ndrange = size(out))
end"""
    m = load_module(f"module T\nusing KernelAbstractions\n{src}\nend\n", nthreads=3)
    out = np.zeros((4, 5), np.int64)  # Julia size (5, 4)
    m.call("run!", CPU_BACKEND, out, (1, 2))
    np.testing.assert_array_equal(out, 3)
    assert m.geometry == [Launch("k!", (5, 4), (1, 2), 10, 3), Launch("k!", (5, 4), (5, 4), 1, 1),
                          Launch("k!", (5, 4), (2, 1), 12, 3)]
    with pytest.raises(JuliaRuntimeError, match="more dimensions than the ndrange"):
        m.call("run!", CPU_BACKEND, out, (1, 2, 3))
    mismatch = module("@kernel function k!(out)\n    i = @index(Global, Linear)\n    out[i] = 1\nend\n"
                      "function run!(backend, out)\n    k!(backend, 2)(out; ndrange = 4, workgroupsize = 4)\nend")
    with pytest.raises(JuliaRuntimeError, match="Static WorkgroupSize"):
        mismatch.call("run!", CPU_BACKEND, np.zeros(4))
    assert evaluate("prod((2, 3, 4))") == 24 and evaluate("prod(())") == 1


def test_inbounds_on_loops_blocks_and_conditionals():
    src = """@kernel function k!(out, @Const(x), n::Int)
    i = @index(Global, Linear)
    acc = zero(eltype(out))
    @inbounds for k in 1:n
        acc += x[k]
    end
    @inbounds if i == 1
        acc += 100
    end
    @inbounds begin
        out[i] = acc
    end
end"""
    out = np.zeros(2, np.float32)
    module(src).launch("k!", out, np.arange(3, dtype=np.float32), 3, ndrange=2)
    np.testing.assert_array_equal(out, [103, 3])


def test_bare_definitions_are_accepted_as_the_bridge_evaluates_them():
    m = load_module("@kernel function k!(out)\n    i = @index(Global, Linear)\n    Atomix.@atomic out[1] += i\nend\n")
    out = np.zeros(1, np.int64)
    m.launch("k!", out, ndrange=4)
    assert out[0] == 10


# -- rejection of everything outside the subset ----------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        "function f(x)\n    try\n        x\n    catch e\n    end\nend",
        "function f(x)\n    ccall(:clock, Int32, ())\nend",
        "function f(x)\n    x .+= 1\nend",
        "function f(x)\n    y = x .+ 1\nend",
        "function f(x)\n    y = exp.(x)\nend",
        "function f(x)\n    return [i for i in 1:3]\nend",
        "function f(i)\n    return 2i\nend",
        "function f(x)\n    return @fastmath x + 1\nend",
        "function f(x)\n    @atomic x[1] += 1\nend",
        "function f(x)\n    return 1 < x < 3\nend",
        "function f(x)\n    return 2^x^2\nend",
        "function f(x)\n    return 2^(x + 1)\nend",  # tree-sitter-julia: juxtaposition 2 * ^(x + 1)
        "function f(x)\n    return x === 1\nend",
        "function f(x)\n    return x & 1\nend",
        "function f(x)\n    return x.field\nend",
        "function f(x)\n    return x[:, 1]\nend",
        "function f(x)\n    return x[end]\nend",
        "function f(x)\n    return Float32[1, 2]\nend",
        "function f(x)\n    g = y -> y\nend",
        "function f(x)\n    let y = 1\n    end\nend",
        "function f(x)\n    s = \"text\"\nend",
        "function f(x)\n    x::Float32\nend",
        "function f(x; k = 1)\n    return x\nend",
        "function f(x)::Float32\n    return x\nend",
        "function f(x::T) where {T}\n    return x\nend",
        "function f(x)\n    return sum(x)\nend",
        "function f(x)\n    for i in eachindex(x)\n    end\nend",
        "function f(x)\n    return x ^= 2\nend",
        "x = 1",
        "function f(x)\n    return x\nend\nfunction f(x, y)\n    return x\nend",
        "function max(x, y)\n    return x\nend",
        "@kernel cpu=false function k!(out)\n    i = @index(Global, Linear)\nend",
        "@kernel function k!(out)\n    i = @index(Local, Cartesian)\nend",
        "function f(out)\n    @synchronize()\nend",
        "function f(out)\n    x = @localmem Float32 (4,)\nend",
        "@kernel function k!(out)\n    i = @index(Global, Linear)\n    return\nend",
        "@kernel function k!(out)\n    i = @index(Global, Linear)\n    if i > 1\n"
        "        j = @index(Global, Linear)\n    end\nend",
        "@kernel function k!(out)\n    out[@index(Global, Linear)] = 1\nend",
        "@kernel function k!(out)\n    @synchronize(1)\nend",
        "@kernel function k!(out)\n    i = @index(Global, Linear)\n    break\nend",
        "@kernel function k!(out)\n    @print(\"x\")\nend",
        "@kernel function k!(out, n)\n    i = @index(Global, Linear)\n    n += 1\nend",
        "@kernel function k!(out, n)\n    i = @index(Global, Linear)\n    if i > 1\n        n = 2\n    end\nend",
    ],
)
def test_constructs_outside_the_subset_are_rejected(body):
    with pytest.raises(UnsupportedJulia) as info:
        module(body)
    assert info.value.line is not None


def test_work_groups_that_cooperate_run_at_once():
    """@localmem is one array per group, @synchronize() a barrier of the group: each work-item writes its slot,
    synchronises, then reads its neighbour's; the groups' numbers and positions come from @index(Group/Local)."""
    mod = module("@kernel function k!(out)\n    l = @index(Local, Linear)\n    g = @index(Group, Linear)\n"
                 "    s = @localmem Int64 (4,)\n    s[l] = 10 * g + l\n    @synchronize()\n"
                 "    out[(g - 1) * 4 + l] = s[mod(l, 4) + 1]\nend")
    out = np.zeros(8, np.int64)
    mod.launch("k!", out, ndrange=(8,), workgroupsize=(4,))
    assert out.tolist() == [12, 13, 14, 11, 22, 23, 24, 21]
    with pytest.raises(JuliaRuntimeError, match="whole number of work-groups"):
        mod.launch("k!", np.zeros(6, np.int64), ndrange=(6,), workgroupsize=(4,))


def test_rejections_name_the_node_type_and_line():
    with pytest.raises(UnsupportedJulia) as info:
        module("function f(x)\n    try\n        x\n    catch e\n    end\nend")
    assert info.value.node_type == "try_statement"
    assert info.value.line == 5  # the module header and the `using` lines come first
    assert "try_statement" in str(info.value) and "line 5" in str(info.value)


def test_package_names_need_their_using_statement():
    with pytest.raises(UndefinedName, match="using KernelAbstractions"):
        module("@kernel function k!(out)\n    i = @index(Global, Linear)\nend", imports="")
    with pytest.raises(UndefinedName, match="using Atomix"):
        module("@kernel function k!(out)\n    Atomix.@atomic out[1] += 1\nend", imports="using KernelAbstractions")
    with pytest.raises(UndefinedName, match="synchronize"):
        module("function f(b)\n    synchronize(b)\nend", imports="")
    with pytest.raises(UnsupportedJulia, match="LinearAlgebra"):
        module("", imports="using LinearAlgebra")


def test_unknown_functions_are_rejected_even_on_untaken_branches():
    with pytest.raises(UndefinedName, match="`erf`"):
        module("function f(x)\n    if false\n        return erf(x)\n    end\n    return x\nend")
