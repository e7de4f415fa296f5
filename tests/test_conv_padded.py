"""Padded, strided and dilated convolutions written with ``pad()`` (issue 45): the output runs as lax's and
PyTorch's padded convolution gives it (``floor((N + 2p - d(K-1) - 1)/s) + 1``, the offset ``p`` padded on both
sides), the planner offers ``lax.conv_general_dilated`` with that padding, stride and dilation for the forward
and its gradient steps, and every backend computes what ``lax.conv_general_dilated`` does (forward and
gradients, float64)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from loop_backends import c_param

import tullax
from tullax.backends.xla import forms as xla_forms
from tullax.backends.xla.recognise import conv_shape
from tullax.grad import gradients
from tullax.spec.frontend import compile_spec
from tullax.spec.shapes import eval_shapes

EQX_CONV1D = "y[n,o,i] := x[n,c,pad(2i+2k-1)]*w[o,c,k]"  # equinox Conv1d(stride=2, padding=1, dilation=2)
STRIDED_CONV2D = "y[n,o,h,w] := x[n,c,pad(2h+p-1),pad(2w+q-1)]*k[o,c,p,q]"  # 3x3, stride 2, padding 1
SAME_CONV2D = "y[n,o,h,w] := x[n,c,pad(h+p-1),pad(w+q-1)]*k[o,c,p,q]"  # 3x3 "same"

# (spec, image shape, kernel shape, strides, padding, dilation)
LAYERS = [
    (EQX_CONV1D, (2, 3, 17), (4, 3, 3), (2,), 1, (2,)),
    (EQX_CONV1D, (2, 3, 16), (4, 3, 2), (2,), 1, (2,)),
    (STRIDED_CONV2D, (2, 3, 9, 8), (4, 3, 3, 3), (2, 2), 1, (1, 1)),
    (SAME_CONV2D, (2, 3, 7, 6), (4, 3, 3, 3), (1, 1), 1, (1, 1)),
    ("y[n,o,h,w] := x[n,c,pad(h+p-2),pad(w+q-2)]*k[o,c,p,q]", (1, 2, 6, 7), (3, 2, 5, 5), (1, 1), 2, (1, 1)),
]
BACKENDS = ("numba", "xla", "auto", c_param())


def _oracle(xs, ks, strides, pad, dilation):
    dims = ("NCH", "OIH", "NCH") if len(xs) == 3 else ("NCHW", "OIHW", "NCHW")

    def conv(x, k):
        return lax.conv_general_dilated(x, k, strides, [(pad, pad)] * len(strides), rhs_dilation=dilation,
                                        dimension_numbers=dims, precision=lax.Precision.HIGHEST)
    return conv


@pytest.mark.parametrize("text, xs, ks, strides, pad, dilation", LAYERS)
def test_a_padded_window_ranges_as_the_padded_convolution(text, xs, ks, strides, pad, dilation):
    """``x[n,c,pad(2h+p-1),..]`` once let ``h`` run over all of x's axis: a 32x32 output, three quarters of it
    padding, where the layer gives 16x16."""
    _, spec = compile_spec(text)
    ranges = eval_shapes(spec, {spec.inputs[0].name: xs, spec.inputs[1].name: ks})
    expected = [(len_ + 2 * pad - d * (k - 1) - 1) // s + 1
                for len_, k, s, d in zip(xs[2:], ks[2:], strides, dilation)]
    spatial = [n for n in spec.free if n not in ("n", "o")]
    assert [ranges[n] for n in spatial] == [(0, e) for e in expected]


def test_a_plain_padded_window_still_runs_over_the_axis():
    """Without a stride or an offset the padding only guards the reads: ``pad(i+k)`` and ``pad(i-k)`` run over
    x's axis as before."""
    for text in ("y[i] := x[pad(i+k)]*w[k]", "y[i] := x[pad(i-k)]*w[k]"):
        _, spec = compile_spec(text)
        assert eval_shapes(spec, {"x": (10,), "w": (3,)})["i"] == (0, 10)


@pytest.mark.parametrize("text", [EQX_CONV1D, STRIDED_CONV2D, SAME_CONV2D])
def test_the_planner_offers_lax_conv_for_a_padded_convolution_and_its_gradients(text):
    """The forward and both gradient steps of each layer are convolutions with padding, stride and dilation
    (the input gradient reads the cotangent through ``pad((m - d*k + p)/s)``: lax.conv's lhs dilation): once
    they ran on the loops or XLA's broadcast lowering only (3-50x slower than lax.conv)."""
    _, spec = compile_spec(text)
    assert conv_shape(spec) is not None and "conv" in xla_forms.forms(spec)
    steps = {step.out: step for grad in gradients(spec) for step in grad.steps}
    weight = next(name for name in steps if name != "Δx")
    assert "conv" in xla_forms.forms(steps[weight]), weight
    assert "conv" in xla_forms.forms(steps["Δx"])  # derived as pad((m-p+1)/2): lax.conv's lhs dilation


@pytest.mark.parametrize("text, xs, ks, strides, pad, dilation", LAYERS)
def test_every_conv_form_of_a_padded_layer_equals_lax_conv(text, xs, ks, strides, pad, dilation):
    """Each XLA form of the forward and of every gradient step, against lax.conv_general_dilated's own value
    and VJP."""
    _, spec = compile_spec(text)
    rng = np.random.default_rng(1)
    names = spec.input_names
    with jax.enable_x64(True):
        x, k = jnp.asarray(rng.standard_normal(xs)), jnp.asarray(rng.standard_normal(ks))
        conv = _oracle(xs, ks, strides, pad, dilation)
        y, vjp = jax.vjp(conv, x, k)
        dy = jnp.asarray(rng.standard_normal(y.shape))
        want = dict(zip(names, vjp(dy)))
        for form in xla_forms.forms(spec):
            got = xla_forms.lower_form(spec, form)({names[0]: x, names[1]: k})
            np.testing.assert_allclose(np.asarray(got), np.asarray(y), rtol=1e-10, atol=1e-10, err_msg=form)
        values = {names[0]: x, names[1]: k, "Δ" + spec.out: dy, spec.out: y}
        for grad in gradients(spec):
            step = grad.steps[-1]
            env = {name: values[name] for name in step.input_names}
            for form in xla_forms.forms(step):
                got = xla_forms.lower_form(step, form)(env)
                np.testing.assert_allclose(np.asarray(got), np.asarray(want[step.out[1:]]), rtol=1e-10,
                                           atol=1e-10, err_msg=f"{step.out} {form}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("text, xs, ks, strides, pad, dilation", LAYERS[:4])
def test_a_padded_layer_and_its_gradients_on_every_backend(backend, text, xs, ks, strides, pad, dilation):
    rng = np.random.default_rng(2)
    with jax.enable_x64(True):
        x, k = jnp.asarray(rng.standard_normal(xs)), jnp.asarray(rng.standard_normal(ks))
        conv = _oracle(xs, ks, strides, pad, dilation)
        kernel = tullax.einsum_kernel(text, backend=backend)
        np.testing.assert_allclose(np.asarray(kernel(x, k)), np.asarray(conv(x, k)), rtol=1e-10, atol=1e-10)
        got = jax.grad(lambda a, b: jnp.sum(jnp.tanh(kernel(a, b))), argnums=(0, 1))(x, k)
        want = jax.grad(lambda a, b: jnp.sum(jnp.tanh(conv(a, b))), argnums=(0, 1))(x, k)
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-10, atol=1e-10)


def test_a_padded_shift_without_a_window_keeps_the_axis_length():
    """``pad(i-1)`` alone is a shift, not a window: y as long as x (the padded-window rule once made it N+1)."""
    for text in ("y[i] := x[pad(i-1)]", "y[i] := x[pad(i-1, 2.5)]"):
        _, spec = compile_spec(text)
        assert eval_shapes(spec, {"x": (10,)})["i"] == (0, 10)
