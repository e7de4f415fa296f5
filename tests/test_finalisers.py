"""Finalisers that are expressions of ``_`` (the reduced value), reading scalars, index values, ``size(A, d)`` and
arrays at the free indices (issue 13): ``|> relu(_ + b[j])`` is bias-after-reduction, ``|> _ / size(x,1)`` a mean.

Every case runs on the numba and xla backends, eager and under jit, forward and backward, against a jnp reference
written independently (and its jax.grad), and against the naive evaluator.
"""
from __future__ import annotations

import numpy as np
import pytest

import tullax
from tullax.errors import ShapeError, SpecError
from tullax.spec.frontend import compile_spec
from tullax.spec.text import format_spec
from tullax.testing.oracle import naive_eval

RNG = np.random.default_rng(13)
W, X = RNG.standard_normal((5, 3)), RNG.standard_normal((5, 4))
A, B = RNG.standard_normal((3, 6)), RNG.standard_normal((6, 4))
x, z = RNG.standard_normal((4, 6)), RNG.standard_normal(4)
b4, c3 = RNG.standard_normal(4), RNG.standard_normal(3)
w6 = RNG.standard_normal(6)


def _relu(v):
    import jax.numpy as jnp

    return jnp.maximum(v, 0)


def _lse(v):
    import jax

    return jax.nn.logsumexp(v, axis=1)


# (spec, inputs in spec order, jnp reference over the same inputs)
CASES = [
    ("y[i,j] := W[k,i]*X[k,j] |> relu(_ + b[j])", (W, X, b4), lambda W, X, b: _relu(W.T @ X + b)),
    ("C[i,j] := A[i,k]*B[k,j] |> _ + b[j]", (A, B, b4), lambda A, B, b: A @ B + b),
    ("m[i] := x[i,j] |> _ / size(x,1)", (x,), lambda x: x.mean(1)),
    ("y[i,j] := A[i,k]*B[k,j] |> max(_, c[i])", (A, B, c3), lambda A, B, c: _max(A @ B, c[:, None])),
    ("y[i] := x[i,k]*w[k] |> a*_ + d", (x, w6, 1.5, -0.25), lambda x, w, a, d: a * (x @ w) + d),
    ("(max) m[i] := x[i,j] |> _ * z[i]", (x, z), lambda x, z: x.max(1) * z),
    ("(logsumexp) l[i] := x[i,j] |> _ - z[i]", (x, z), lambda x, z: _lse(x) - z),
    ("y[i] := x[i,k] |> _ * z[i+1] + i", (x, z), lambda x, z: x.sum(1)[:3] * z[1:] + _arange(3)),
    ("y[i] := x[i,k]^2 |> sqrt(_) / x[i,0]", (x,), lambda x: (x ** 2).sum(1) ** 0.5 / x[:, 0]),
    ("y[i] := x[i,k] |> exp(-_ * _)", (x,), lambda x: _exp(-x.sum(1) ** 2)),
    # f' from the result times the slope of a linear inner expression; with _*z, Δz needs the recomputed pre
    ("y[i] := x[i,k]*w[k] |> tanh(2*_ - z[i])", (x, w6, z), lambda x, w, z: _tanh(2 * (x @ w) - z)),
    ("y[i] := x[i,k]*w[k] |> tanh(_ * z[i])", (x, w6, z), lambda x, w, z: _tanh((x @ w) * z)),
    # a max/min/logsumexp needs its pre-finaliser value (its winners, its exp): never f' from the result alone
    # (the gradient of a (min) with |> sigmoid(_ + b) was the seed at every k, as if it were a sum)
    ("(min) y[i] := x[i,k]*w[k] |> tanh(_ + z[i])", (x, w6, z), lambda x, w, z: _tanh((x * w).min(1) + z)),
    ("(max) y[i] := x[i,k]*w[k] |> tanh(_ - z[i])", (x, w6, z), lambda x, w, z: _tanh((x * w).max(1) - z)),
    ("(logsumexp) y[i] := x[i,k]*w[k] |> tanh(_ + z[i])", (x, w6, z),
     lambda x, w, z: _tanh(_lse(x * w) + z)),
]
IDS = [case[0] for case in CASES]


def _max(a, b):
    import jax.numpy as jnp

    return jnp.maximum(a, b)


def _exp(v):
    import jax.numpy as jnp

    return jnp.exp(v)


def _tanh(v):
    import jax.numpy as jnp

    return jnp.tanh(v)


def _arange(n):
    import jax.numpy as jnp

    return jnp.arange(n, dtype=jnp.float64)


@pytest.fixture(scope="module", autouse=True)
def x64():
    import jax

    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize("backend", ["numba", "xla"])
@pytest.mark.parametrize("spec, inputs, reference", CASES, ids=IDS)
def test_forward_matches_jnp_and_the_naive_evaluator(spec, inputs, reference, backend):
    import jax.numpy as jnp

    kernel = tullax.einsum_kernel(spec, backend=backend)
    want = np.asarray(reference(*[jnp.asarray(v) for v in inputs]))
    np.testing.assert_allclose(kernel(*inputs), want, rtol=1e-12, atol=1e-12)  # NumPy in, eager
    analysed = compile_spec(spec)[1]
    np.testing.assert_allclose(naive_eval(analysed, dict(zip(analysed.input_names, inputs))), want, rtol=1e-12)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("backend", ["numba", "xla"])
@pytest.mark.parametrize("spec, inputs, reference", CASES, ids=IDS)
def test_every_input_gets_the_gradient_of_the_jnp_reference(spec, inputs, reference, backend, jit):
    """Arrays and scalars read by the finaliser get their own gradient kernels; body inputs see ∂fin/∂_."""
    import jax
    import jax.numpy as jnp

    kernel = tullax.einsum_kernel(spec, backend=backend)
    args = [jnp.asarray(v) for v in inputs]
    weights = jnp.asarray(RNG.standard_normal(np.shape(reference(*args))))

    def loss(fn):
        def run(*a):
            return jnp.sum(jnp.sin(fn(*a)) * weights)
        return jax.jit(run) if jit else run

    argnums = tuple(range(len(args)))
    got = jax.grad(loss(kernel), argnums=argnums)(*args)
    want = jax.grad(loss(reference), argnums=argnums)(*args)
    np.testing.assert_allclose(jax.jit(loss(kernel))(*args) if jit else loss(kernel)(*args),
                               loss(reference)(*args), rtol=1e-10)
    for name, g, r in zip(compile_spec(spec)[1].input_names, got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-9, atol=1e-10, err_msg=name)


@pytest.mark.parametrize("backend", ["numba", "xla"])
def test_vmap_batches_the_arrays_the_finaliser_reads(backend):
    import jax
    import jax.numpy as jnp

    kernel = tullax.einsum_kernel("y[i,j] := W[k,i]*X[k,j] |> relu(_ + b[j]) / size(W,0)", backend=backend)
    Ws, bs = jnp.stack([W, -W, 2 * W]), jnp.stack([b4, 2 * b4, -b4])
    want = jnp.stack([jnp.maximum(Ws[n].T @ X + bs[n], 0) / 5 for n in range(3)])
    got = jax.vmap(lambda w, b: kernel(w, X, b), in_axes=(2, 0))(jnp.moveaxis(Ws, 0, 2), bs)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12)


@pytest.mark.parametrize("backend", ["numba", "xla"])
def test_bias_before_and_after_the_reduction(backend):
    """``+ b[i]`` inside the body is summed K times (what the spec says); ``|> relu(_ + b[i])`` adds it once."""
    inside = tullax.einsum_kernel("y[i] := x[i,k] + z[i] |> relu", backend=backend)
    after = tullax.einsum_kernel("y[i] := x[i,k] |> relu(_ + z[i])", backend=backend)
    np.testing.assert_allclose(inside(x, z), np.maximum(x.sum(1) + 6 * z, 0), rtol=1e-12)
    np.testing.assert_allclose(after(x, z), np.maximum(x.sum(1) + z, 0), rtol=1e-12)


def test_an_assignment_into_an_existing_array_finalises_the_same_way():
    for backend in ("numba", "xla"):
        kernel = tullax.einsum_kernel("n[i] = x[i,j]^2 |> sqrt(_ + z[i]^2)", backend=backend)
        np.testing.assert_allclose(kernel(np.zeros(4), x, z), np.sqrt((x ** 2).sum(1) + z ** 2), rtol=1e-12)


def test_size_of_an_input_only_its_shape_is_read():
    import jax
    import jax.numpy as jnp

    for backend in ("numba", "xla"):
        kernel = tullax.einsum_kernel("m[i] := x[i,j] |> _ / size(s,0)", backend=backend)
        shape_only = jnp.ones((7, 2))
        np.testing.assert_allclose(np.asarray(kernel(x, shape_only)), x.sum(1) / 7, rtol=1e-12)
        gx, gs = jax.grad(lambda a, s: jnp.sum(kernel(a, s) ** 2), argnums=(0, 1))(jnp.asarray(x), shape_only)
        np.testing.assert_allclose(np.asarray(gx), np.broadcast_to(2 * x.sum(1)[:, None] / 49, x.shape), rtol=1e-12)
        assert not np.asarray(gs).any()
    with pytest.raises(ShapeError, match="reads axis 1 of s"):
        tullax.einsum_kernel("m[i] := x[i,j] |> _ / size(s,1)", backend="xla")(x, np.ones(3))


def test_explain_shows_the_finaliser_and_a_gradient_per_array_it_reads():
    text = tullax.explain("y[i,j] := W[k,i]*X[k,j] |> relu(_ + b[j])")
    assert "reduction: +, then |> relu(_ + b[j])" in text
    assert "Δb[j] := Δy[i,j]*(y[i,j] > 0)" in text  # from the result: no recomputed pre-finaliser sum
    assert "ΔW[k,i] := Δy[i,j]*(y[i,j] > 0)*X[k,j]" in text
    mean = tullax.explain("m[i] := x[i,j] |> _ / size(x,1)")
    assert "Δx[i,j] := Δm[i]/size(x,1)" in mean


@pytest.mark.parametrize("text, canonical", [
    ("n[i] := x[i,j]^2 |> sqrt", "n[i] := x[i,j]^2 |> sqrt"),
    ("n[i] := x[i,j]^2 |> sqrt(_)", "n[i] := x[i,j]^2 |> sqrt"),
    ("y[i,j] := W[k,i]*X[k,j]  |>  relu( _+b[j] )", "y[i,j] := W[k,i]*X[k,j] |> relu(_ + b[j])"),
    ("m[i] := x[i,j] |> _ / size(x, 1)", "m[i] := x[i,j] |> _/size(x,1)"),
    ("(max) m[i] := x[i,j] |> max(_, a*A[i])", "(max) m[i] := x[i,j] |> max(_, a*A[i])"),
])
def test_canonical_text_round_trips_to_the_same_spec(text, canonical):
    got, spec = compile_spec(text)
    assert got == canonical
    again, respec = compile_spec(got)
    assert again == canonical and respec == spec and format_spec(respec) == format_spec(spec)


def test_a_plain_function_finaliser_still_reads_the_forward_result():
    """``|> sqrt`` keeps its gradient from the output (no recomputed pre-finaliser value)."""
    text = tullax.explain("n[i] := x[i,j]^2 |> sqrt")
    assert "Δx[i,j] := Δn[i]*(0.5/n[i])*(2*x[i,j])" in text and "pre[" not in text


@pytest.mark.parametrize("text, message", [
    ("y[i] := x[i,k] + _", "_ stands for the reduced value"),
    ("y[i] := x[i,k] |> _ + x[i,k]", "the finaliser runs once per result element.*not k"),
    ("y[i] := x[i,k] |> _ + k", "not k"),
    ("y[i] := x[i,k] |> 2*z[i]", "does not use _"),
    ("y[i] := x[i,k] |> foo(_)", "unknown function 'foo'"),
    ("y[i] := x[i,k] |>", "'|>' needs a one-argument function"),
    ("y[i] := x[i,k] |> _ * size(x,2)", r"size\(x,2\) reads axis 2 .* rank 2"),
    ("y[i] := x[i,k] |> _ * size(y,0)", "reads the result being defined"),
    ("y[i] := x[i,k] |> _ * size(x)", "size\\(A, d\\) takes|',' and the axis"),
    ("y[i] := x[i,k] |> _ * size(x,-1)", "non-negative integer"),
    ("y[i] := x[i,k] |> _ * size(i,0)", "names an index"),
    ("y[i+1] += x[i,k] |> _ * 2", "only sums: no reduction or |> finaliser"),
])
def test_mistakes_are_spec_errors(text, message):
    with pytest.raises(SpecError, match=message):
        compile_spec(text)


def test_size_is_an_integer_value_in_the_body_too():
    for backend in ("numba", "xla"):
        kernel = tullax.einsum_kernel("y[i] := x[i,j]*(size(x,1) - j)", backend=backend)
        np.testing.assert_allclose(kernel(x), x @ (6 - np.arange(6.0)), rtol=1e-12)


@pytest.mark.parametrize("backend", ["numba", "xla"])
def test_accumulating_finaliser_gradients_and_second_derivatives(backend):
    """``+=`` passes ΔC through and finalises with a recomputed pre-value; Hessians differentiate the gradient
    kernels (which have no finaliser of their own) again."""
    import jax
    import jax.numpy as jnp

    xs, bs, cs = jnp.asarray(x), jnp.asarray(z), jnp.asarray(RNG.standard_normal(4))
    kernel = tullax.einsum_kernel("C[i] += x[i,k] |> tanh(_ + b[i])", backend=backend)

    def reference(c, a, b):
        return c + jnp.tanh(a.sum(1) + b)

    got = jax.grad(lambda *a: jnp.sum(jnp.sin(kernel(*a))), argnums=(0, 1, 2))(cs, xs, bs)
    want = jax.grad(lambda *a: jnp.sum(jnp.sin(reference(*a))), argnums=(0, 1, 2))(cs, xs, bs)
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-10, atol=1e-12)
    forward = tullax.einsum_kernel("y[i] := x[i,k] |> tanh(_ + b[i])", backend=backend)
    hessian = jax.hessian(lambda b: jnp.sum(forward(xs, b) ** 2))(bs)
    expected = jax.hessian(lambda b: jnp.sum(jnp.tanh(xs.sum(1) + b) ** 2))(bs)
    np.testing.assert_allclose(np.asarray(hessian), np.asarray(expected), rtol=1e-9, atol=1e-12)


def test_a_finaliser_deeper_than_the_limit_is_a_spec_error():
    with pytest.raises(SpecError, match="the finaliser is 1?[0-9]+ operations deep"):
        compile_spec("y[i] := x[i,k] |> _" + " + _" * 100)


@pytest.mark.parametrize("backend", ["numba", "xla"])
@pytest.mark.parametrize("spec, reference", [
    ("y[i] := x[i,j]*(j < size(x,1) - 2)", lambda a: a[:, :-2].sum(1)),
    ("y[i] := x[i,j]*(j >= size(x,0))", lambda a: a[:, 4:].sum(1)),
    ("y[i] := ifelse(j == size(x,1)-1, 0, x[i,j])", lambda a: a[:, :-1].sum(1)),
])
def test_comparisons_with_extents_are_loop_guards(spec, reference, backend):
    """``j < size(x,1) - 2`` is linear in the indices, so it narrows j's loop (guards) instead of a select."""
    import jax
    import jax.numpy as jnp

    kernel = tullax.einsum_kernel(spec, backend=backend)
    np.testing.assert_allclose(kernel(x), reference(x), rtol=1e-12)
    got = jax.grad(lambda a: jnp.sum(kernel(a) ** 2))(jnp.asarray(x))
    want = jax.grad(lambda a: jnp.sum(reference(a) ** 2))(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12)
