"""The xla backend's entry points share one evaluation context (``xla._context``): ``evaluate_fixed`` (the slices
form's per-window reduction) and ``finalize_value`` (the finaliser of a form that reduces its own way) compute
half precision in float32 and read complex inputs as complex, as the plain lowering does. Each case against jnp
of the same formula. Before the shared context, float16 products overflowed to inf in the slices form and the
imaginary parts of complex inputs were dropped."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tullax.backends.xla import forms as xla_forms
from tullax.backends.xla import lower as xla
from tullax.spec.frontend import compile_spec


def _spec(text: str):
    return compile_spec(text)[1]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_slices_form_and_finaliser_compute_half_precision_in_float32(dtype):
    # 300*300 = 90000 overflows float16 (max 65504); float32 arithmetic rounded once gives 271
    spec = _spec("y[i] := x[i+k]*w[k] |> _/1000 + b[i]")
    assert "slices" in xla_forms.forms(spec)
    x, w, b = (jnp.full(n, v, dtype) for n, v in ((10, 300.0), (3, 300.0), (8, 1.0)))
    x32, w32, b32 = (a.astype(jnp.float32) for a in (x, w, b))
    want = (sum(x32[k:k + 8] * w32[k] for k in range(3)) / 1000 + b32).astype(dtype)
    env = {"x": x, "w": w, "b": b}
    got = xla_forms.lower_form(spec, "slices")(env)
    assert got.dtype == jnp.dtype(dtype)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    fixed = xla.evaluate_fixed(spec, env, {"k": 0})
    np.testing.assert_array_equal(np.asarray(fixed, np.float32), np.asarray(x32[:8] * w32[0]))
    finalised = xla.finalize_value(spec, env, jnp.full(8, 90000.0, jnp.float32))
    np.testing.assert_allclose(np.asarray(finalised, np.float32), 91.0)


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_slices_form_and_finaliser_read_complex_inputs_as_complex(dtype):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(10) + 1j * rng.standard_normal(10)).astype(dtype)
    w = (rng.standard_normal(3) + 1j * rng.standard_normal(3)).astype(dtype)
    want = sum(x[k:k + 8] * np.conj(w[k]) for k in range(3))
    spec = _spec("y[i] := x[i+k]*conj(w[k])")
    assert "slices" in xla_forms.forms(spec)
    got = xla_forms.lower_form(spec, "slices")({"x": x, "w": w})
    assert got.dtype == jax.dtypes.canonicalize_dtype(dtype)  # complex64 unless x64 is on
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(xla.evaluate_fixed(spec, {"x": x, "w": w}, {"k": 1})),
                               x[1:9] * np.conj(w[1]), rtol=1e-6)
    # a finaliser on complex values: conj of the reduced value, through the form's own reduction
    spec = _spec("y[i] := x[i+k]*w[k] |> conj")
    got = xla_forms.lower_form(spec, "slices")({"x": x, "w": w})
    np.testing.assert_allclose(np.asarray(got), np.conj(sum(x[k:k + 8] * w[k] for k in range(3))), rtol=1e-5)
