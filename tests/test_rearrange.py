"""The ``rearrange`` XLA form (``tullax.backends.xla.rearrange``): a spec whose every result element is one input
element (a patchify, its gradient, a broadcast) as a reshape, a transpose and a broadcast, as jnp code writes it.
``auto`` lost a patchify's gradient to jnp 0.15x (benchmarks/auto_losses.py) with only the grid form to race
against its loops."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from kernel_ops import planned_ops

import tullax
from tullax.backends.xla import forms as xla_forms
from tullax.backends.xla import lower as xla
from tullax.backends.xla.rearrange import rearrangement
from tullax.grad.derive import gradients
from tullax.planner import decide as planner
from tullax.planner import rules, tuning
from tullax.planner.call import Call
from tullax.spec.examples import make_inputs
from tullax.spec.frontend import compile_spec

jnp = jax.numpy
PATCHIFY = "P[b,h,w,c,i,j] := x[b,c,4h+i,4w+j] (i in 0:4) (j in 0:4)"

# (spec, input shapes): each spec, and each gradient step of it, in the rearrange form equals the plain lowering
CASES = [
    (PATCHIFY, {"x": (2, 3, 10, 9)}),  # 10 and 9 not multiples of 4: the gradient is 0 past the last patch
    ("P[a,b,i] := x[16a+4b+i] (i in 0:4) (b in 0:4)", {"x": (50,)}),  # a radix of three digits
    ("P[a,b,i] := x[b+4i+16a] (b in 0:4) (i in 0:4)", {"x": (50,)}),  # the digits in another order
    ("P[h,i] := x[4h+i] (i in 0:3)", {"x": (13,)}),  # windows with gaps: 3 of each 4 read, the gradient pads
    ("y[i,j,k] := x[k,i] (j in 0:3)", {"x": (4, 5)}),  # a broadcast and a transpose (its gradient sums over j)
]


@pytest.mark.parametrize("text, shapes", CASES)
def test_the_rearrange_form_of_a_spec_and_of_its_gradients_equals_the_plain_lowering(text, shapes):
    _, spec = compile_spec(text)
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        env = {name: jnp.asarray(v) for name, v in zip(spec.input_names, make_inputs(spec, shapes, "float64"))}
        out = np.asarray(xla.lower(spec)(env))
        env["Δ" + spec.out] = jnp.asarray(rng.normal(size=out.shape))
        steps = [spec] + [step for grad in gradients(spec) for step in grad.steps]
        assert all(rearrangement(step) is not None for step in steps[:-1 if "j in 0:3" in text else None])
        for step in [step for step in steps if "rearrange" in xla_forms.forms(step)]:
            local = {name: env[name] for name in step.input_names}
            want = np.asarray(xla.lower(step)(local))
            got = np.asarray(jax.jit(xla_forms.lower_form(step, "rearrange"))(local))
            np.testing.assert_array_equal(got, want, err_msg=step.out)


@pytest.mark.parametrize("text", [
    "y[i] := x[i,j]",  # a real sum
    "y[i] := x[2i]",  # a strided read: no reshape gives it
    "y[i] := x[i] |> exp",  # computes
    "y[i] := x[i+1] (i in 0:3)",  # an offset
    "(max) y[m] := x[h,pad(m-4h)]",  # a max over windows is no copy
    "y[i,i2] := x[i]*(i == i2)",
])
def test_specs_that_compute_or_sum_are_not_rearrangements(text):
    _, spec = compile_spec(text, {"i2": 3} if "i2" in text else None)
    assert rearrangement(spec) is None and "rearrange" not in xla_forms.forms(spec)


def test_overlapping_windows_are_raced_on_the_loops_alone():
    """``x[2h+i]`` with ``i in 0:3``: windows overlap, the gradient sums two terms per element: the form would
    only fall back to the grid, so the planner does not time it."""
    for text, usable in (("P[h,i] := x[2h+i] (i in 0:3)", False), ("P[h,i] := x[4h+i] (i in 0:3)", True)):
        _, spec = compile_spec(text)
        assert rules.usable(Call.of(spec, {"x": (13,)}, {"x": "float32"}, "c"), "xla:rearrange") is usable
        grad = gradients(spec)[0].steps[-1]
        shapes = {"ΔP": (6 if not usable else 3, 3), "x": (13,)}
        call = Call.of(grad, shapes, {name: "float32" for name in shapes}, "c")
        assert rules.usable(call, "xla:rearrange") is usable


def test_auto_runs_a_patchify_and_its_gradient_as_xla_rearrangements_equal_to_jnp(rules_without_tiny_calls):
    auto = tullax.einsum_kernel(PATCHIFY)
    x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 3, 8, 12)), jnp.float32)

    def patchify(x):
        b, c, hh, ww = x.shape
        return x.reshape(b, c, hh // 4, 4, ww // 4, 4).transpose(0, 2, 4, 1, 3, 5)

    def loss(fn):
        return lambda x: jnp.sum(jnp.sin(fn(x)))

    ops = planned_ops(jax.grad(loss(auto)), x)
    assert {(op.spec.out, op.backend, op.form) for op in ops} == {("P", "xla", "rearrange"),
                                                                  ("Δx", "xla", "rearrange")}
    np.testing.assert_array_equal(np.asarray(jax.jit(auto)(x)), np.asarray(patchify(x)))
    np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(loss(auto)))(x)), np.asarray(jax.grad(loss(patchify))(x)),
                               rtol=1e-6, atol=1e-6)


def test_a_tiny_rearrangement_runs_on_xla(monkeypatch):
    """Below the serial threshold the rule's default, XLA's transpose, which fuses into the program around it."""
    monkeypatch.setenv(tuning.TIMING_ENV, "0")
    _, spec = compile_spec(PATCHIFY)
    found = planner.plan(spec, {"x": (2, 3, 8, 8)}, {"x": "float32"}, timing=False)
    assert (found.backend, found.form, found.rule) == ("xla", "rearrange", "tiny")
