"""Notation beyond the first release (issue 13): gradients of (*) reductions exact at zeros, diagonal writes
(``D[i,i] := A[i]``), ``*=`` updates, ``pad(e, value)`` and indirect positions inside affine arithmetic.

Every result is checked against an independent reference written with jnp/numpy (and jax.grad of it), on the
numba and xla backends, eagerly and under jit, in float64.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tullax
from tullax.errors import SpecError
from tullax.spec.frontend import compile_spec
from tullax.testing.oracle import naive_eval

BACKENDS = ("numba", "xla")


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def check(text: str, reference, args: dict, *, ranges=None, wrt=None, rtol=1e-10, atol=1e-12) -> None:
    """The kernel's value and its gradient (of a random linear loss) equal ``reference``'s and jax.grad of it,
    on every backend, eagerly and under jit; the naive evaluator agrees on the value."""
    wrt = tuple(wrt if wrt is not None else [n for n, v in args.items() if np.issubdtype(np.asarray(v).dtype,
                                                                                          np.floating)])
    want = np.asarray(reference(**args))
    np.testing.assert_allclose(naive_eval(compile_spec(text, ranges)[1], args), want, rtol=rtol, atol=atol)
    cot = np.random.default_rng(1).standard_normal(want.shape)

    def loss_of(fn):
        def loss(*diff):
            full = {**args, **dict(zip(wrt, diff))}
            return jnp.sum(fn(**full) * cot)
        return loss

    def grads_of(fn):
        return jax.grad(loss_of(fn), argnums=tuple(range(len(wrt))))(*(args[n] for n in wrt)) if wrt else ()

    want_grads = grads_of(reference)
    for backend in BACKENDS:
        kernel = tullax.einsum_kernel(text, backend=backend, ranges=ranges)
        call = lambda **kw: kernel(**kw)  # noqa: E731
        for jit in (False, True):
            fn = jax.jit(call) if jit else call
            np.testing.assert_allclose(np.asarray(fn(**args)), want, rtol=rtol, atol=atol,
                                       err_msg=f"{text} on {backend} jit={jit}")
            for name, got, expected in zip(wrt, grads_of(fn), want_grads):
                np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=rtol, atol=atol,
                                           err_msg=f"gradient wrt {name} of {text} on {backend} jit={jit}")


# =============================================================================================
# 5. Gradients of (*) reductions, exact where factors are zero
# =============================================================================================
def _rows_with_zeros() -> np.ndarray:
    x = np.random.default_rng(0).uniform(0.5, 1.5, (5, 4))
    x[1, 2] = 0.0  # one zero: the gradient there is the product of the others, elsewhere 0
    x[2, [0, 3]] = 0.0  # two zeros: every gradient is 0
    x[3, :] = 0.0
    return x


def test_product_gradient_at_zeros_matches_jax_prod() -> None:
    check("(*) p[i] := x[i,j]", lambda x: jnp.prod(x, axis=1), {"x": _rows_with_zeros()})


def test_product_gradient_is_the_product_of_the_others() -> None:
    x = _rows_with_zeros()
    (grad,) = jax.grad(lambda v: jnp.sum(tullax.einsum_kernel("(*) p[i] := x[i,j]", backend="numba")(v)))(x),
    np.testing.assert_allclose(grad[1], [0, 0, np.prod(np.delete(x[1], 2)), 0], rtol=1e-15, atol=0)
    np.testing.assert_array_equal(grad[2:4], 0)  # two or more zeros: exactly 0, no NaN


@pytest.mark.parametrize("backend", BACKENDS)
def test_product_hessian_at_zeros_matches_jax_prod(backend) -> None:
    kernel = tullax.einsum_kernel("(*) p := x[i]", backend=backend)
    for x in ([1.5, 2.0, 0.5, 3.0], [1.5, 0.0, 0.5, 3.0], [0.0, 0.0, 0.5, 3.0], [0.0, 0.0, 0.0, 3.0]):
        x = np.array(x)
        np.testing.assert_allclose(jax.hessian(kernel)(x), jax.hessian(jnp.prod)(x), rtol=1e-12, atol=0,
                                   err_msg=str(x))


def test_product_of_a_body_with_finaliser_and_two_inputs() -> None:
    x, y = _rows_with_zeros(), np.random.default_rng(2).uniform(0.5, 2.0, (5, 4))
    y[4, 1] = 0.0
    check("(*) p[i] := x[i,j]*y[i,j] + x[i,j]^2 |> sin", lambda x, y: jnp.sin(jnp.prod(x * y + x**2, axis=1)),
          {"x": x, "y": y})


def test_scalar_product_with_a_shift() -> None:
    x = np.array([1.5, 0.0, 2.0, -0.5, 3.0])
    check("(*) p := x[i+1]*w[i]", lambda x, w: jnp.prod(x[1:] * w), {"x": x, "w": np.array([2.0, 1.0, 0.5, 4.0])})


# =============================================================================================
# 2. Diagonal writes: D[i,i] := ..., zeros elsewhere
# =============================================================================================
def test_diagonal_write_of_a_vector() -> None:
    a = np.array([1.0, -2.0, np.inf, 4.0])  # inf stays on the diagonal: no 0*inf = NaN off it
    want = np.diag(a)
    check("D[i,i] := A[i]", lambda A: jnp.diag(A), {"A": a}, wrt=())
    np.testing.assert_array_equal(tullax.einsum_kernel("D[i,i] := A[i]", backend="numba")(a), want)
    check("D[i,i] := A[i]", lambda A: jnp.diag(A), {"A": a[[0, 1, 3]]})


def test_diagonal_write_of_a_reduction_and_a_finaliser() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 3))
    check("D[i,i] := A[i,k]*B[k,i]", lambda A, B: jnp.diag(jnp.einsum("ik,ki->i", A, B)), {"A": a, "B": b})
    check("T[i,i,i] := A[i] |> exp", lambda A: jnp.zeros((3, 3, 3)).at[jnp.arange(3), jnp.arange(3),
                                                                       jnp.arange(3)].set(jnp.exp(A)),
          {"A": a[0, :3]})
    check("D[j,i,j] := A[i,j]", lambda A: jnp.einsum("ij,jk->jik", A, jnp.eye(4)), {"A": a})


def test_diagonal_gradient_reads_the_diagonal() -> None:
    from tullax.grad import gradient_texts

    (text,) = gradient_texts(compile_spec("D[i,i] := A[i]")[1])
    assert text == "ΔA[i] := ΔD[i,i1]*(i == i1)"  # a guard the lowering solves: no loop over i1


def test_diagonal_write_refusals_say_what_to_write() -> None:
    with pytest.raises(SpecError, match=r"Reduce into a vector first"):
        compile_spec("(max) D[i,i] := A[i,k]")
    with pytest.raises(SpecError, match=r"ifelse\(i == j, A\[i\], 0\)"):
        compile_spec("D[i,i] += A[i]")


# =============================================================================================
# 4. '*=' updates: multiply every term into the given array (the (*) reduction)
# =============================================================================================
def test_multiply_update_of_a_row_product() -> None:
    rng = np.random.default_rng(4)
    y, x = rng.standard_normal(5), _rows_with_zeros()
    check("y[i] *= x[i,j]", lambda y, x: y * jnp.prod(x, axis=1), {"y": y, "x": x})


def test_multiply_update_of_part_of_the_array_reading_itself() -> None:
    y = np.array([1.5, -2.0, 0.5, 3.0, 0.0])
    x = np.array([2.0, 0.0, -1.0, 0.5, 4.0])
    # i runs where x[i+1] exists: y[4] keeps its value (and its gradient passes through unscaled)
    check("y[i] *= x[i+1]*w[i]", lambda y, x, w: jnp.asarray(y).at[:4].multiply(x[1:] * w[:4]),
          {"y": y, "x": x, "w": np.array([0.5, 2.0, -3.0, 1.5, 7.0])})
    # itself at the written position (y[i+1] would be a recurrence: refused, issue 44)
    check("y[i] *= y[i]*x[i+1]", lambda y, x: jnp.asarray(y).at[:4].multiply(y[:4] * x[1:]), {"y": y, "x": x})


def test_multiply_update_of_a_scalar() -> None:
    check("y *= x[i]", lambda y, x: y * jnp.prod(x), {"y": np.array(1.5), "x": np.array([0.5, -1.0, 0.3])})


def test_multiply_update_with_another_reduction_is_refused() -> None:
    with pytest.raises(SpecError, match=r"'\*=' multiplies every term"):
        compile_spec("(+) y[i] *= x[i,j]")
    with pytest.raises(SpecError, match=r"scatter with \+="):
        compile_spec("y[ix[i]] *= x[i]")
    with pytest.raises(SpecError, match=r"'\*=' takes no \|> finaliser"):
        compile_spec("y[i] *= x[i,j] |> exp")


# =============================================================================================
# 3. pad(e, value): the value outside the axis
# =============================================================================================
def test_pad_value_literal_shift() -> None:
    x = np.array([1.0, -2.0, 3.0, 0.5])
    check("y[i] := x[pad(i-1, 2.5)]", lambda x: jnp.concatenate([jnp.array([2.5]), x[:-1]]), {"x": x})
    check("y[i] := x[pad(i+1, -1)]*w[i]", lambda x, w: jnp.concatenate([x[1:], jnp.array([-1.0])]) * w,
          {"x": x, "w": np.array([0.5, 2.0, -1.0, 3.0])})


def test_pad_value_scalar_in_a_convolution_gets_its_gradient() -> None:
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal(6), rng.standard_normal(3)

    def reference(x, w, c):
        padded = jnp.concatenate([jnp.full(1, c), x, jnp.full(1, c)])
        return jnp.stack([padded[i:i + 3] @ w for i in range(6)])
    check("y[i] := x[pad(i+k-1, c)]*w[k]", reference, {"x": x, "w": w, "c": np.float64(0.7)}, ranges={"i": 6})


def test_pad_value_on_two_axes_max_pooling() -> None:
    a = np.random.default_rng(6).standard_normal((4, 5))

    def reference(A):
        padded = jnp.pad(A, 1, constant_values=-1e30)
        return jnp.stack([jnp.stack([jnp.max(padded[i:i + 3, j:j + 3]) for j in range(5)]) for i in range(4)])
    check("(max) P[i,j] := A[pad(i+k-1, -1e30), pad(j+l-1, -1e30)]", reference, {"A": a},
          ranges={"i": 4, "j": 5, "k": 3, "l": 3})


def test_pad_with_minus_inf_for_max_pooling() -> None:
    a = np.random.default_rng(11).standard_normal(6)
    check("(max) P[i] := A[pad(i+k-1, -Inf)]", lambda A: jnp.max(jnp.stack(
        [jnp.pad(A, 1, constant_values=-jnp.inf)[k:k + 6] for k in range(3)]), axis=0), {"A": a},
        ranges={"i": 6, "k": 3})


def test_pad_value_refusals() -> None:
    with pytest.raises(SpecError, match=r"a number or the name of a scalar input"):
        compile_spec("y[i] := x[pad(i-1, z[i])]")
    with pytest.raises(SpecError, match=r"differs between its axes"):
        compile_spec("y[i,j] := x[pad(i-1, 1), pad(j, 2)]")
    with pytest.raises(SpecError, match=r"on the left it has no meaning"):
        compile_spec("y[pad(i-1, 1)] += x[i]")


# =============================================================================================
# 1. Indirect positions inside affine arithmetic: A[inds[i]+j], A[2K[j]+i]
# =============================================================================================
def test_gather_of_windows_and_its_scatter_gradient() -> None:
    rng = np.random.default_rng(7)
    a, w = rng.standard_normal(10), rng.standard_normal(3)
    inds = np.array([0, 7, 3, 3], dtype=np.int32)  # window starts; 3 twice: its gradient adds up

    def reference(A, w, inds):
        return jnp.stack([A[s:s + 3] for s in inds]) * w
    check("y[i,j] := A[inds[i]+j]*w[j]", reference, {"A": a, "w": w, "inds": inds})


def test_scaled_indirect_with_a_shift_and_a_reduction() -> None:
    rng = np.random.default_rng(8)
    a, x = rng.standard_normal((12, 2)), rng.standard_normal((3, 2))
    K = np.array([4, 0, 2], dtype=np.int64)

    def reference(A, x, K):  # s[i] = sum_j,d A[2K[j]+i+1, d]*x[j,d] for i in 0..2
        return jnp.stack([sum(A[2 * K[j] + i + 1] @ x[j] for j in range(3)) for i in range(3)])
    check("s[i] := A[2K[j]+i+1, d]*x[j,d]", reference, {"A": a, "x": x, "K": K}, ranges={"i": 3})


def test_indirect_offsets_outside_the_array_are_refused_eagerly_and_nan_under_jit() -> None:
    a, w = np.arange(1.0, 7.0), np.ones(3)
    inds = np.array([0, 4, -1, 3], dtype=np.int32)  # 4+2 and -1+0 leave A (extent 6)
    for backend in BACKENDS:
        kernel = tullax.einsum_kernel("y[i,j] := A[inds[i]+j]*w[j]", backend=backend)
        with pytest.raises(tullax.ShapeError, match="outside"):
            kernel(A=a, w=w, inds=inds)
        out, vjp = jax.vjp(lambda A: jax.jit(lambda A: kernel(A=A, w=w, inds=inds))(A), a)
        out = np.asarray(out)
        np.testing.assert_array_equal(out[0], [1, 2, 3])
        np.testing.assert_array_equal(out[3], [4, 5, 6])
        np.testing.assert_array_equal(np.isnan(out[1]), [False, False, True])
        np.testing.assert_array_equal(np.isnan(out[2]), [True, False, False])
        (grad,) = vjp(np.ones_like(out))  # the scatter skips the positions outside
        np.testing.assert_array_equal(grad, [2, 2, 1, 1, 2, 2])


def test_indirect_arithmetic_refusals() -> None:
    with pytest.raises(SpecError, match="one indirect term"):
        compile_spec("y[i] := x[ix[i]+jx[i]]")
    with pytest.raises(SpecError, match="cannot be nested or wrapped in mod/clamp"):
        compile_spec("y[i] := x[mod(ix[i]+1)]")
    with pytest.raises(SpecError, match="cannot divide"):
        compile_spec("y[i] := x[(ix[i]+1)/2]")
    with pytest.raises(SpecError, match=r"pad\(ix\[e\], value\) is not supported.*pass x - v and add v"):
        compile_spec("y[i,j] := A[pad(ix[i]+j, 0.5)]*w[j]")


@pytest.mark.parametrize("text", ["y[i,j] := A[inds[i]+j]*w[j]", "y[i,j] := A[2K[j]+i]*v[i]",
                                  "y[i] := A[-ix[i]+3]*w[i]", "y[i,j] := A[ix[i]-j, j]", "O[ix[i]+1] += x[i]",
                                  "y[i,j] := A[2*ix[i+1]+j-1]*w[j]  (i in 0:size(ix,0)-1)"])
def test_example_index_arrays_keep_offset_positions_in_range(text) -> None:
    """``random_inputs`` (what the property tests, warm-up and generate_source run on) draws index values that
    keep ``scale*ix[e] + offset`` inside the axis for every offset the ranges give; before, it drew them below
    the extent, so ``A[inds[i]+j]`` read outside and the naive evaluator raised ShapeError."""
    from tullax.spec.examples import index_intervals, random_inputs, shapes_for
    from tullax.spec.shapes import eval_shapes

    spec = compile_spec(text)[1]
    for seed in range(5):
        shapes = shapes_for(spec, seed=seed)
        env = random_inputs(spec, shapes, seed=seed)
        naive_eval(spec, env)  # a ShapeError for any position outside its axis
        ranges = eval_shapes(spec, shapes)
        (name,) = [i.name for i in spec.inputs if i.kind == "index"]
        lo, hi = index_intervals(spec, shapes)[name]
        assert lo < hi and np.all((lo <= env[name]) & (env[name] < hi)), (shapes, ranges, env[name])


def test_example_index_arrays_under_pad_reach_outside_the_axis() -> None:
    """An index array read only under pad may point outside: its values reach one past each end."""
    from tullax.spec.examples import index_intervals, shapes_for

    spec = compile_spec("y[i,j] := A[pad(inds[i]+j)]*w[j]")[1]
    shapes = shapes_for(spec)
    lo, hi = index_intervals(spec, shapes)["inds"]
    extent, width = shapes["A"][0], shapes["w"][0]
    assert (lo, hi) == (-1, extent - width + 2)


# =============================================================================================
# Every construct under jax.vmap (the batching rule rewrites the spec)
# =============================================================================================
@pytest.mark.parametrize("text, reference, args", [
    ("y[i] *= x[i,j]", lambda y, x: y * jnp.prod(x, axis=1), {"y": (2, 3), "x": (2, 3, 4)}),
    ("D[i,i] := A[i]", lambda A: jnp.diag(A), {"A": (2, 3)}),
    ("y[i] := x[pad(i-1, 2.5)]", lambda x: jnp.concatenate([jnp.array([2.5]), x[:-1]]), {"x": (2, 4)}),
    ("(*) p[i] := x[i,j]", lambda x: jnp.prod(x, axis=1), {"x": (2, 3, 4)}),
])
def test_new_constructs_under_vmap(text, reference, args) -> None:
    rng = np.random.default_rng(9)
    batch = {name: rng.standard_normal(shape) for name, shape in args.items()}
    if "x" in batch and text.startswith("(*)"):
        batch["x"][0, 1, 2] = 0.0
    kernel = tullax.einsum_kernel(text, backend="numba")
    got = jax.vmap(lambda **kw: kernel(**kw))(**batch)
    want = jax.vmap(lambda **kw: reference(**kw))(**batch)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-14)
    cot = rng.standard_normal(want.shape)
    grads = jax.grad(lambda b: jnp.sum(jax.vmap(lambda **kw: kernel(**kw))(**b) * cot))(batch)
    wants = jax.grad(lambda b: jnp.sum(jax.vmap(lambda **kw: reference(**kw))(**b) * cot))(batch)
    for name in batch:
        np.testing.assert_allclose(np.asarray(grads[name]), np.asarray(wants[name]), rtol=1e-10, atol=1e-12)


def test_window_gather_under_vmap() -> None:
    rng = np.random.default_rng(10)
    a, w = rng.standard_normal((2, 10)), rng.standard_normal(3)
    inds = np.array([0, 7, 3], dtype=np.int32)
    kernel = tullax.einsum_kernel("y[i,j] := A[inds[i]+j]*w[j]", backend="numba")
    got = jax.vmap(lambda A: kernel(A=A, w=w, inds=inds))(a)
    np.testing.assert_allclose(np.asarray(got), np.stack([np.stack([r[s:s + 3] for s in inds]) * w for r in a]))
    both = np.array([[0, 7, 3], [1, 1, 6]], dtype=np.int32)  # the index array batched too
    got = jax.vmap(lambda A, inds: kernel(A=A, w=w, inds=inds))(a, both)
    np.testing.assert_allclose(np.asarray(got), np.stack([np.stack([r[s:s + 3] for s in ix]) * w
                                                          for r, ix in zip(a, both)]))


# =============================================================================================
# The printed Julia (CPU and CUDA flavours) of every new construct, run by the Julia-subset evaluator
# =============================================================================================
JULIA_CASES = [
    ("(*) p[i] := x[i,j]*y[i,j]", None),
    ("y[i] *= x[i,j]", None),
    ("D[i,i] := A[i,k]*B[k,i]", None),
    ("y[i] := x[pad(i+k-1, c)]*w[k]", {"i": 5}),
    ("y[i] *= x[i+1]", None),
]


@pytest.mark.parametrize("flavour", ["cpu", "cuda"])
@pytest.mark.parametrize("text, ranges", JULIA_CASES, ids=[c[0] for c in JULIA_CASES])
def test_printed_julia_of_new_constructs_matches_naive(text, ranges, flavour) -> None:
    from tests.corpus import Case
    from tests.test_julia_printer import TARGETS, assert_close, kernel_runs, run_julia

    for label, step, env in kernel_runs(Case("new", text, ranges=ranges), np.float64):
        assert_close(run_julia(step, env, TARGETS[flavour]), naive_eval(step, env), np.float64)


@pytest.mark.parametrize("flavour", ["cpu", "cuda"])
def test_printed_julia_of_an_indirect_window(flavour) -> None:
    from tests.test_julia_printer import TARGETS, assert_close, run_julia

    spec = compile_spec("y[i,j] := A[inds[i]+j]*w[j]")[1]
    env = {"A": np.arange(1.0, 7.0), "inds": np.array([0, 4, -1, 3]), "w": np.array([1.0, 2.0, 3.0])}
    got = run_julia(spec, env, TARGETS[flavour])  # out of range: NaN, as under jit
    want = np.array([[1, 4, 9], [5, 12, np.nan], [np.nan, 2, 6], [4, 10, 18]])
    np.testing.assert_array_equal(got, want)
    env["inds"] = np.array([0, 3, 1, 2])
    assert_close(run_julia(spec, env, TARGETS[flavour]), naive_eval(spec, env), np.float64)


def test_padded_indirect_window_reads_zero_outside() -> None:
    a, w = np.arange(1.0, 7.0), np.ones(3)
    inds = np.array([0, 4, -1], dtype=np.int32)
    want = np.array([[1, 2, 3], [5, 6, 0], [0, 1, 2]], dtype=np.float64)
    for backend in BACKENDS:
        kernel = tullax.einsum_kernel("y[i,j] := A[pad(inds[i]+j)]*w[j]", backend=backend)
        np.testing.assert_array_equal(kernel(A=a, w=w, inds=inds), want)  # eager: no error, pad reads 0
        out, vjp = jax.vjp(lambda A: jax.jit(lambda A: kernel(A=A, w=w, inds=inds))(A), a)
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(vjp(np.ones_like(want))[0], [2, 2, 1, 0, 1, 1])


@pytest.mark.parametrize("text, canonical", [
    ("y[i] := (x[i] < 0) < 1", "y[i] := (x[i] < 0) < 1"),
    ("y[i] := x[i] >= (z[i] == 1)", "y[i] := x[i] >= (z[i] == 1)"),
    ("y[i] := ((x[i] < 0) == (z[i] > 0))+1", "y[i] := ((x[i] < 0) == (z[i] > 0)) + 1"),
])
def test_a_comparison_of_comparisons_keeps_its_parentheses_in_the_canonical_text(text, canonical):
    """Comparisons do not chain, so the canonical text (the cache key, which ``einsum_kernel`` parses again)
    must keep the parentheses around a comparison inside another: it printed ``x[i] < 0 < 1``, and every
    backend refused the spec as a chained comparison."""
    source, spec = compile_spec(text)
    assert source == canonical
    env = {"x": np.array([-1.0, 2.0, 0.0]), "z": np.array([1.0, -3.0, 1.0])}
    args = [env[name] for name in spec.input_names]
    np.testing.assert_array_equal(np.asarray(tullax.einsum_kernel(text, backend="xla")(*args)), naive_eval(spec, env))
