"""The ``strided`` XLA form (``tullax.backends.xla.strided``): a sum over window indices read through
``pad((m-p)/s)`` with windows no longer than their stride, one term per element, evaluated on ``m`` split into
``(m div s, m mod s)`` by reshapes. ``auto`` lost a MaxPool's gradient to jnp 0.42x (benchmarks/auto_losses.py):
its input-gradient step ran on the loops, which test each term's divisibility, or on the grid, which gathers."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from kernel_ops import planned_ops

import tullax
from tullax.backends.xla import forms as xla_forms
from tullax.backends.xla import lower as xla
from tullax.backends.xla.strided import strided
from tullax.grad.derive import gradients
from tullax.planner import rules
from tullax.planner.call import Call
from tullax.spec.frontend import compile_spec

jnp = jax.numpy
MAXPOOL = "(max) y[n,c,h,w] := x[n,c,2h+p,2w+q] (p in 0:2) (q in 0:2)"

# (forward spec, its input shapes): the last gradient step of each is in the strided form, and equals the plain
# lowering there, odd extents (an element no window reads) included
CASES = [
    (MAXPOOL, {"x": (2, 3, 9, 8)}),
    ("y[n,h] := x[n,3h+p] (p in 0:2)", {"x": (2, 14)}),  # a gap: one element in three has no term
    ("y[n,h] := x[n,2h+p]*w[p] (p in 0:2)", {"x": (2, 9), "w": (2,)}),  # a weighted window: w read at m mod 2
]


@pytest.mark.parametrize("text, shapes", CASES)
def test_the_strided_form_of_a_window_gradient_equals_the_plain_lowering(text, shapes):
    _, spec = compile_spec(text)
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):  # small integers: ties in the max, exact sums
        env = {name: jnp.asarray(rng.integers(-2, 3, shapes[name]).astype(np.float64)) for name in spec.input_names}
        env[spec.out] = jax.jit(xla.lower(spec))(env)
        env["Δ" + spec.out] = jnp.asarray(rng.normal(size=env[spec.out].shape))
        found = []
        for step in [step for grad in gradients(spec) for step in grad.steps]:  # each step reads those before
            local = {name: env[name] for name in step.input_names}
            env[step.out] = jax.jit(xla.lower(step))(local)
            if "strided" in xla_forms.forms(step):
                got = jax.jit(xla_forms.lower_form(step, "strided"))(local)
                np.testing.assert_allclose(np.asarray(got), np.asarray(env[step.out]), rtol=1e-12, atol=1e-12,
                                           err_msg=str(step))
                found.append(step.out)
        assert found, "no strided gradient step"


@pytest.mark.parametrize("text", [
    "d[m] := exp(g[pad((m-p)/2)]) (p in 0:2)",  # a term with p != m mod 2 is exp(0), not 0
    "d[m] := g[pad((m-p)/2)] + w[p] (p in 0:2)",  # the same: a sum, no vanishing factor
    "d[m] := g[pad((m-p)/2),p] (p in 0:2)",  # p on two axes of one read
    "d[m] := g[pad((m-p)/2)]*w[j] (p in 0:2)",  # another reduced index: a real sum
    "d[m] := g[pad(m-p)] (p in 0:2)",  # no division: a sum of shifts
])
def test_sums_that_are_not_one_term_per_element_are_not_strided(text):
    _, spec = compile_spec(text)
    assert strided(spec) is None and "strided" not in xla_forms.forms(spec)


def test_a_maxpool_input_gradient_is_ruled_strided_and_usable_only_with_windows_within_their_stride():
    _, spec = compile_spec(MAXPOOL)
    step = gradients(spec)[0].steps[-1]
    assert rules.rule_for(step, "c").name == "strided windows" and rules.rule_for(step, "c").default == "xla:strided"
    for window, usable in ((2, True), (3, False)):  # p in 0:3 with stride 2: two terms for some elements
        _, grad = compile_spec(f"d[m] := g[pad((m-p)/2)]*x[m] (p in 0:{window})")
        call = Call.of(grad, {"g": (5,), "x": (10,)}, {"g": "float32", "x": "float32"}, "c")
        assert rules.usable(call, "xla:strided") is usable


def test_auto_runs_a_maxpool_input_gradient_strided_on_xla_equal_to_jnp(rules_without_tiny_calls):
    auto = tullax.einsum_kernel(MAXPOOL)
    x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 3, 8, 10)), jnp.float32)
    x = x.at[0, 0, 0, 1].set(x[0, 0, 1, 0])  # a tie: the two winners share the gradient

    def pool(x):
        n, c, hh, ww = x.shape
        return x.reshape(n, c, hh // 2, 2, ww // 2, 2).max(axis=(3, 5))

    def loss(fn):
        return lambda x: jnp.sum(jnp.sin(fn(x)))

    ops = planned_ops(jax.grad(loss(auto)), x)
    assert ("Δx", "xla", "strided") in {(op.spec.out, op.backend, op.form) for op in ops}
    np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(loss(auto)))(x)), np.asarray(jax.grad(loss(pool))(x)),
                               rtol=1e-6, atol=1e-6)
