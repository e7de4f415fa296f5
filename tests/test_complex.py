"""Complex numbers (issue 13): complex64/complex128 forward and backward on every backend that runs here.

Forward results against NumPy (with the dtype NumPy gives: real where the body is real-valued, ``real(z*conj(z))``
on complex64 is float32), gradients against ``jax.grad`` of the same jnp code, eagerly and under jit, for a real
loss ``sum(real(y*conj(w)))``: the cotangent of a real loss w.r.t. a complex input is what jax.grad returns (jax's
convention, ``conj`` of the steepest-ascent direction times 2 for ``|z|^2``). Before the fix the xla backend's
gradients through conj/real/imag/abs were O(1) wrong and the loop backends refused complex inputs.
"""
from __future__ import annotations

import numpy as np
import pytest

import tullax
from tullax.errors import SpecError, TullaxError

# spec, {input: kind} (c: complex array, r: real array, s: complex scalar; shapes below), reference over xp
CORPUS = [
    ("y[i,j] := x[i]*conj(x[j])", {"x": "c4"}, lambda xp, x: x[:, None] * xp.conj(x[None, :])),
    ("y[i] := abs(x[i] + 2 + c)^2", {"x": "c5", "c": "s"}, lambda xp, x, c: xp.abs(x + 2 + c) ** 2),
    ("(max) X[i] := abs(T[j,i,d])^2", {"T": "c3,4,2"}, lambda xp, T: xp.max(xp.abs(T) ** 2, axis=(0, 2))),
    ("y[i] := real(z[i]*conj(z[i]))", {"z": "c5"}, lambda xp, z: xp.real(z * xp.conj(z))),
    ("s := x[i]*y[i]", {"x": "c6", "y": "c6"}, lambda xp, x, y: xp.sum(x * y)),
    ("y[i] := conj(x[i]) + 2*x[i]", {"x": "c5"}, lambda xp, x: xp.conj(x) + 2 * x),
    ("y[i] := imag(x[i])*w[i]", {"x": "c5", "w": "r5"}, lambda xp, x, w: xp.imag(x) * w),
    ("y[i] := abs(x[i])", {"x": "c5"}, lambda xp, x: xp.abs(x)),
    ("y[i] := exp(x[i])*conj(x[i])", {"x": "c5"}, lambda xp, x: xp.exp(x) * xp.conj(x)),
    ("C[i,j] := A[i,k]*B[k,j]", {"A": "c3,4", "B": "c4,2"}, lambda xp, A, B: A @ B),
    ("y[i] := w[i]*x[i] + real(x[i])", {"w": "r5", "x": "c5"}, lambda xp, w, x: w * x + xp.real(x)),
    ("n[i] := abs(x[i,j])^2 |> sqrt", {"x": "c3,4"}, lambda xp, x: xp.sqrt(xp.sum(xp.abs(x) ** 2, axis=1))),
    ("s[i] := x[i,j] |> abs", {"x": "c3,4"}, lambda xp, x: xp.abs(xp.sum(x, axis=1))),
    ("y[i] := x[i]/(1 + abs(x[i]))", {"x": "c5"}, lambda xp, x: x / (1 + xp.abs(x))),
    ("y[i] := x[i+k]*conj(v[k])", {"x": "c6", "v": "c3"},
     lambda xp, x, v: xp.stack([xp.sum(x[i:i + 3] * xp.conj(v)) for i in range(4)])),
    ("y[i] := imag(x[i]*c) + real(exp(x[i]))", {"x": "c5", "c": "s"},
     lambda xp, x, c: xp.imag(x * c) + xp.real(xp.exp(x))),
]
IDS = [text for text, _, _ in CORPUS]
RTOL = {"complex64": 2e-4, "complex128": 1e-10}


def _inputs(kinds: dict[str, str], dtype: str, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    real = np.finfo(np.dtype(dtype)).dtype
    out = []
    for kind in kinds.values():
        shape = tuple(int(n) for n in kind[1:].split(",")) if kind[1:] else ()
        values = rng.standard_normal(shape) + 1j * rng.standard_normal(shape) + 0.25
        out.append(np.asarray(values.real if kind[0] == "r" else values, real if kind[0] == "r" else dtype))
    return out


def _weights(reference: np.ndarray, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(reference.shape) + 1j * rng.standard_normal(reference.shape)
    return np.asarray(w if np.iscomplexobj(reference) else w.real, reference.dtype)


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
@pytest.mark.parametrize("backend", ["c", "numba", "xla"])
@pytest.mark.parametrize("text,kinds,reference", CORPUS, ids=IDS)
def test_forward_and_gradients_match_numpy_and_jax_grad(text, kinds, reference, backend, dtype):
    import jax
    import jax.numpy as jnp

    args = _inputs(kinds, dtype)
    kernel = tullax.einsum_kernel(text, backend=backend)
    expected = reference(np, *args)
    got = kernel(*args)
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)  # real where the body is real-valued
    np.testing.assert_allclose(got, expected, rtol=RTOL[dtype], atol=RTOL[dtype])

    weights = _weights(expected)
    with jax.enable_x64(dtype == "complex128"):
        def loss(f):
            return lambda *a: jnp.sum(jnp.real(f(*a) * jnp.conj(weights)))

        ours, theirs = loss(kernel), loss(lambda *a: reference(jnp, *a))
        np.testing.assert_allclose(jax.jit(kernel)(*args), expected, rtol=RTOL[dtype], atol=RTOL[dtype])
        positions = tuple(range(len(args)))
        want = jax.grad(theirs, argnums=positions)(*args)
        for grads in (jax.grad(ours, argnums=positions)(*args), jax.jit(jax.grad(ours, argnums=positions))(*args)):
            for name, g, w in zip(kinds, grads, want):
                assert g.dtype == w.dtype, (name, g.dtype, w.dtype)
                np.testing.assert_allclose(g, w, rtol=10 * RTOL[dtype], atol=10 * RTOL[dtype], err_msg=name)


@pytest.mark.parametrize("backend", ["c", "numba", "xla"])
def test_abs_of_a_complex_zero_has_a_zero_gradient_as_in_jax(backend):
    """|u|' divides by |u|: at u = 0 jax's rule divides by 1 instead (a zero gradient, not NaN), and so do we."""
    import jax
    import jax.numpy as jnp

    x = np.array([0, 1 + 1j, 0, -2j], np.complex64)
    kernel = tullax.einsum_kernel("y[i] := abs(x[i])^2 + abs(x[i])", backend=backend)
    got = jax.grad(lambda x: jnp.sum(kernel(x)))(x)
    want = jax.grad(lambda x: jnp.sum(jnp.abs(x) ** 2 + jnp.abs(x)))(x)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert np.all(np.isfinite(got))


@pytest.mark.parametrize("backend", ["c", "numba", "xla"])
def test_real_of_a_complex_product_is_real(backend):
    """The issue's example: ``real(z[i]*conj(z[i]))`` returned complex64."""
    z = (np.arange(4) + 1j).astype(np.complex64)
    y = tullax.einsum_kernel("y[i] := real(z[i]*conj(z[i]))", backend=backend)(z)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, np.abs(z) ** 2, rtol=1e-6)


@pytest.mark.parametrize("text", ["(max) m[i] := x[i,j]", "y[i] := max(x[i], 0)", "y[i] := x[i] > 0",
                                  "y[i] := relu(x[i])", "y[i] := ifelse(x[i], 1, 2)", "y[i] := hypot(x[i], 1)",
                                  "y[i] := floor(x[i])", "s[i] := x[i,j] |> relu"])
def test_orderings_of_complex_values_are_a_spec_error(text):
    x = np.ones((3, 3) if "j" in text else 3, np.complex64)
    with pytest.raises(SpecError, match="complex values is not defined"):
        tullax.einsum_kernel(text, backend="xla")(x)


def test_a_finaliser_expression_on_complex_values_is_a_spec_error_the_function_form_works():
    x = np.ones((2, 3), np.complex64)
    with pytest.raises(SpecError, match="finaliser expression on complex values"):
        tullax.einsum_kernel("s[i] := x[i,j] |> abs(_) + 1", backend="xla")(x)
    np.testing.assert_allclose(tullax.einsum_kernel("s[i] := x[i,j] |> abs", backend="xla")(x), [3, 3])


@pytest.mark.parametrize("backend", ["c", "numba", "xla"])
def test_a_finaliser_linear_in_the_hole_on_complex_values_and_its_gradient(backend):
    """``_ + y[i]``, ``y[i] - _``, ``_ * y[i]``: holomorphic, so the finaliser's gradient is complex-correct
    (the adjoint of a recurrence that mixes its lanes is one); ``abs(_) + 1`` stays refused above."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3)) + 1j * rng.normal(size=(2, 3))
    y, w = (rng.normal(size=2) + 1j * rng.normal(size=2) for _ in range(2))
    kernel = tullax.einsum_kernel("s[i] := x[i,j] |> -(y[i] - _ * y[i]) + _", backend=backend)

    def loss(f):
        return lambda x, y: jnp.sum(jnp.real(w * f(x, y)) + jnp.abs(f(x, y)) ** 2)

    def want(x, y):
        return -(y - x.sum(1) * y) + x.sum(1)
    with jax.enable_x64(True):
        np.testing.assert_allclose(kernel(x=x, y=y), want(x, y), rtol=1e-12)
        for got, exp in zip(jax.grad(loss(lambda x, y: kernel(x=x, y=y)), (0, 1))(x, y),
                            jax.grad(loss(want), (0, 1))(x, y)):
            np.testing.assert_allclose(got, exp, rtol=1e-12)


def test_the_cuda_printer_prints_complex_and_the_backend_refuses_to_launch_it():
    """The printed CUDA C has complex structs (run by the host harness: tests/test_cuda_complex.py); until a GPU
    has run them the cuda backend refuses a complex launch with a clear error."""
    from tullax.backends import get
    from tullax.spec.frontend import compile_spec
    from tullax.spec.signature import Signature

    source = tullax.generate_source("y[i] := abs(x[i])^2 + real(exp(x[i])*x[i])", backend="cuda", dtype="complex64")
    assert "const tx_c64* __restrict__ a1" in source and "tx_cexp(" in source and "tx_cabs(" in source
    spec = compile_spec("y[i] := exp(x[i])")[1]
    with pytest.raises(TullaxError, match="does not launch complex kernels"):
        get("cuda").device_kernel(spec, Signature.for_dtype(spec, "complex64"), {"x": (3,), "y": (3,)})


def test_julia_prints_complex_types_and_literals():
    """No Julia here: the printed module uses ComplexF32, complex literals, conj/real/imag/abs and no NaN helper
    (Julia's complex log/sqrt/^ never throw)."""
    source = tullax.generate_source("y[i] := real(log(x[i])*conj(x[i])) + imag(x[i]^x[i]) + abs(x[i])",
                                    backend="julia", dtype="complex64")
    assert "ComplexF32(" in source and "conj(" in source and "imag(" in source and "real(" in source
    assert "_nan_" not in source


def test_gradient_specs_follow_jax_convention():
    from tullax.grad import gradient_texts
    from tullax.spec.frontend import compile_spec

    _, spec = compile_spec("y[i] := x[i]*conj(x[i])")
    assert gradient_texts(spec, frozenset({"x"})) == ("Δx[i] := Δy[i]*conj(x[i]) + conj(Δy[i]*x[i])",)
    assert gradient_texts(spec) == ("Δx[i] := Δy[i]*(conj(x[i]) + x[i])",)  # real inputs: as before


@pytest.mark.parametrize("backend", ["c", "numba", "xla"])
@pytest.mark.parametrize("text,reference", [
    ("y[i] := abs(z[i])^2 + real(z[i])", lambda z: jnp_module().abs(z) ** 2 + jnp_module().real(z)),
    ("y[i] := z[i]*conj(z[i]) + exp(z[i])", lambda z: z * jnp_module().conj(z) + jnp_module().exp(z)),
])
def test_forward_mode_vmap_and_second_order(text, reference, backend):
    """jax.jvp (the transpose of the gradient kernels), vmap (one batched kernel), grad of vmap and grad of grad
    of complex specs, against jnp."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    z, t = (np.asarray(rng.standard_normal(5) + 1j * rng.standard_normal(5), np.complex64) for _ in range(2))
    kernel = tullax.einsum_kernel(text, backend=backend)
    np.testing.assert_allclose(jax.jvp(kernel, (z,), (t,))[1], jax.jvp(reference, (z,), (t,))[1], rtol=1e-5)
    batch = np.stack([z, 2 * z])
    np.testing.assert_allclose(jax.vmap(kernel)(batch), jax.vmap(reference)(batch), rtol=1e-5)

    def loss(f):
        return lambda b: jnp.sum(jnp.real(jax.vmap(f)(b) * (1 - 2j)))

    np.testing.assert_allclose(jax.grad(loss(kernel))(batch), jax.grad(loss(reference))(batch), rtol=1e-5)

    def second(f):
        return jax.grad(lambda z: jnp.sum(jnp.abs(jax.grad(lambda z: jnp.sum(jnp.real(f(z))))(z)) ** 2))

    np.testing.assert_allclose(second(kernel)(z), second(reference)(z), rtol=1e-4)


def jnp_module():
    import jax.numpy as jnp

    return jnp


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
@pytest.mark.parametrize("text,kinds,reference", [c for c in CORPUS if "(max)" not in c[0]],
                         ids=[t for t in IDS if "(max)" not in t])
def test_printed_julia_runs_in_the_subset_evaluator(text, kinds, reference, dtype):
    """No Julia here: the printed Julia module of the forward kernel and of every complex gradient step runs in
    the evaluator of the Julia subset (tests/julia_subset.py, which models ComplexF32/ComplexF64 as Julia does:
    no ordering, no DomainError), against NumPy and against the xla backend's gradient steps."""
    import jax
    from test_julia_printer import run_julia

    from tullax.backends.xla.lower import lower
    from tullax.grad import gradients
    from tullax.grad.run import gradient_env, run_gradient
    from tullax.spec.frontend import compile_spec
    from tullax.spec.valuetype import complex_inputs

    _, spec = compile_spec(text)
    args = _inputs(kinds, dtype)
    env = dict(zip(spec.input_names, args))
    expected = reference(np, *args)
    got = run_julia(spec, env)
    np.testing.assert_allclose(got, expected, rtol=RTOL[dtype], atol=RTOL[dtype])
    genv = gradient_env(spec, env, expected, np.conj(_weights(expected)))
    names = complex_inputs(spec, {n: a.dtype for n, a in env.items()})
    for grad in gradients(spec, names):
        ours = run_gradient(grad, spec, genv, run_julia)
        with jax.enable_x64(dtype == "complex128"):
            xla = run_gradient(grad, spec, genv, lambda step, e: np.asarray(lower(step)(e)))
        np.testing.assert_allclose(ours, xla, rtol=10 * RTOL[dtype], atol=10 * RTOL[dtype], err_msg=grad.wrt)


def test_gradients_of_complex_products_are_refused_with_a_reason():
    """The exact (*) gradient counts zero factors, a comparison complex values do not have: a SpecError that says
    so, not one about a comparison the user never wrote."""
    from tullax.grad import gradients
    from tullax.spec.frontend import compile_spec

    spec = compile_spec("(*) p[i] := z[i,j]", None)[1]
    with pytest.raises(SpecError, match="products of complex values"):
        gradients(spec, frozenset({"z"}))
    assert len(gradients(spec)) == 1  # real factors: the exact gradient
