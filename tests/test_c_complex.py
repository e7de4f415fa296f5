"""The c backend's complex numbers (``tullax.printers.c_complex``): every function the registry allows on complex
arguments against jnp (one kernel, a column per function), IEEE special values through products and quotients
against jnp (the textbook product, not C99 Annex G's; Annex G division, as XLA's), and the printed source.

Cost: three compiled C kernels (forward only), shared compile cache."""
from __future__ import annotations

import numpy as np
import pytest
from loop_backends import c_param

import tullax
from tullax.backends import ffi
from tullax.runtime import stats
from tullax.spec import functions

pytestmark = pytest.mark.parametrize("backend", [c_param()])

# every function the registry computes on complex values: one column of the kernel each
COMPLEX_FUNCTIONS = [name for name, f in functions.FUNCTIONS.items()
                     if f.on_complex != "real-only" and f.lowering != "structural" or name in ("conj", "real", "imag")]
_JNP = {"atan": "arctan"}


def _column_spec(names: list[str], extra: list[str]) -> str:
    """``y[i,k] := ifelse(k == 0, f0(x[i]), ifelse(k == 1, ...))``: one kernel, a column per expression."""
    terms = [f"{name}(x[i])" for name in names] + extra
    body = terms[-1]
    for k in range(len(terms) - 2, -1, -1):
        body = f"ifelse(k == {k}, {terms[k]}, {body})"
    return f"y[i,k] := {body}  (k in 0:{len(terms)})"


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_every_complex_function_matches_jnp(backend, dtype):
    """Including small arguments, where log1p and expm1 must keep the digits ``clog(1 + z)`` loses, and the
    integer and complex powers. The reference is jnp in complex128 (its sinh of a small complex64 argument loses
    digits to cancellation: glibc's csinhf keeps them)."""
    import jax
    import jax.numpy as jnp

    assert set(COMPLEX_FUNCTIONS) >= {"exp", "log", "log1p", "expm1", "sqrt", "abs", "tan", "atan", "log10", "conj"}
    extra = ["x[i]^3", "x[i]^-2", "x[i]^x[i]", "x[i]/(x[i] - 2)"]
    kernel = tullax.einsum_kernel(_column_spec(COMPLEX_FUNCTIONS, extra), backend=backend)
    x = np.array([0.3 + 0.2j, -1 + 2j, 1e-5 + 1e-6j, 2 - 3j, -0.4 + 1e-3j, 1e-3 - 2e-3j], dtype)
    with jax.enable_x64(True):
        wide = jnp.asarray(x, jnp.complex128)
        columns = [getattr(jnp, _JNP.get(name, name))(wide) for name in COMPLEX_FUNCTIONS]
        columns += [wide ** 3, wide ** -2, wide ** wide, wide / (wide - 2)]
        want = np.stack([np.asarray(c, np.complex128) for c in columns], axis=1)
    got = np.asarray(kernel(x))
    rtol = 5e-6 if dtype == "complex64" else 1e-9
    for k, name in enumerate(COMPLEX_FUNCTIONS + extra):
        scale = np.maximum(np.abs(want[:, k]), np.finfo(np.dtype(dtype)).tiny)
        err = np.abs(got[:, k] - want[:, k]) / scale
        assert np.all(err < rtol), (name, got[:, k], want[:, k], err)


def test_special_values_of_products_and_quotients_follow_jnp(backend):
    """``*`` is the textbook ``(ac - bd) + (ad + bc)i`` as jnp, NumPy and Numba compute it: ``(inf+inf i)*1`` is
    NaN+NaN i (C's ``*``, C99 Annex G, recovers inf+inf i); ``/`` recovers infinities as XLA does (``(1+2i)/0``
    is inf+inf i, NumPy gives NaN+NaN i there). Each element's NaN pattern and infinities as jnp's."""
    import jax

    inf, nan = np.inf, np.nan
    a = np.array([complex(inf, inf), complex(inf, 0), complex(nan, inf), complex(1, 2), complex(inf, nan),
                  complex(0, 0), complex(inf, 1), complex(2, 3), complex(-inf, 2)], np.complex64)
    b = np.array([complex(1, 0), complex(1, 0), complex(2, 1), complex(0, 0), complex(1, 1), complex(0, 0),
                  complex(0, inf), complex(inf, inf), complex(3, 0)], np.complex64)
    kernel = tullax.einsum_kernel("y[i,k] := ifelse(k == 0, a[i]*b[i], a[i]/b[i])  (k in 0:2)", backend=backend)
    got = np.asarray(kernel(a, b))
    want = np.stack([np.asarray(jax.jit(lambda a, b: a * b)(a, b)), np.asarray(jax.jit(lambda a, b: a / b)(a, b))],
                    axis=1)
    for part in (np.real, np.imag):
        np.testing.assert_array_equal(part(got), part(want), err_msg=f"{part.__name__}: {got} vs {want}")
    assert np.isnan(got[0, 0].real) and np.isnan(got[0, 0].imag)  # not Annex G's inf+inf i


def test_printed_complex_module(backend):
    """C99 complex types and literals in the printed C, the products through ``tx_cmul``, no float lanes for a
    complex sum; a complex scalar passed by value."""
    source = tullax.generate_source("s[i] := c*x[i,j]*conj(x[i,j]) + 2.5", backend=backend, dtype="complex128")
    forward = source[source.index("void forward("):source.index("void forward_packed(")]
    assert "#include <complex.h>" in source
    assert "const double _Complex s0" in forward and "double _Complex* restrict a0" in forward
    assert "tx_cmul_c128(" in forward and "conj(" in forward
    assert "omp simd" not in forward and "tx_v4_f64" not in forward and "tx_vfold" not in forward
    real = tullax.generate_source("s[i] := x[i,j]^2", backend=backend, dtype="float64")
    assert "complex.h" not in real  # real modules are unchanged


def test_complex_scalar_and_literal_reach_the_kernel(backend):
    """A complex scalar through ctypes (by value, as the C ABI passes ``double _Complex``) and under jit (the FFI
    handler, by address), and a gradient step's complex literal (``-0.5im``, a derived rule of ``imag``)."""
    import jax
    import jax.numpy as jnp

    x = np.array([1 + 2j, -0.5 + 0.25j, 3 - 1j], np.complex128)
    c = np.complex128(0.5 - 1.5j)
    with jax.enable_x64(True):
        kernel = tullax.einsum_kernel("y[i] := c*x[i] + imag(x[i])", backend=backend)
        want = c * x + x.imag
        np.testing.assert_allclose(kernel(c, x), want, rtol=1e-14)
        stats.reset()
        np.testing.assert_allclose(jax.jit(kernel)(c, x), want, rtol=1e-14)
        if ffi.available()[0]:  # complex buffers through XLA's FFI, as any others (the handler never reads a dtype)
            assert stats.paths["ffi"] == stats.total() == 1, dict(stats.paths)

        def loss(f):
            return lambda c, x: jnp.sum(jnp.abs(f(c, x)) ** 2)

        got = jax.grad(loss(kernel), (0, 1))(c, x)
        expected = jax.grad(loss(lambda c, x: c * x + jnp.imag(x)), (0, 1))(c, x)
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-12)
