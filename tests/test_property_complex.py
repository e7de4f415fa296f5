"""Property test of complex numbers (issue 13): random valid specs on complex128 inputs from the generator's
complex grammar (``random_spec(..., complex_values=True)``: sums, conj/real/imag/abs, holomorphic functions, no
orderings). The XLA lowering's forward against the naive evaluator, and every derived gradient (jax's convention
for complex gradients) against ``jax.grad`` of the plain lowering for the real loss ``sum(real(y*conj(w)))``,
whose cotangent w.r.t. y is ``conj(w)``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tullax.backends.xla.lower import lower
from tullax.errors import TullaxError
from tullax.grad import gradients
from tullax.grad.run import gradient_env, run_gradient
from tullax.spec.analyze import analyze
from tullax.spec.examples import random_inputs
from tullax.spec.parse import parse_spec
from tullax.spec.valuetype import complex_inputs
from tullax.testing.oracle import naive_eval
from tullax.testing.specgen import random_spec

SPECS = 40
RTOL, ATOL = 1e-7, 1e-9


def _check(text: str, seed: int) -> bool:
    spec = analyze(parse_spec(text))
    env = random_inputs(spec, seed=seed, dtype=np.complex128)
    names = [i.name for i in spec.inputs
             if i.kind in ("array", "scalar") and np.issubdtype(np.asarray(env[i.name]).dtype, np.inexact)]
    plain = lower(spec)
    out = np.asarray(plain(env))
    if not np.all(np.isfinite(out)):
        return False
    np.testing.assert_allclose(out, naive_eval(spec, env), rtol=RTOL, atol=ATOL, err_msg=f"forward of {text}")
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(out.shape) + 1j * rng.standard_normal(out.shape)
    w = w if np.iscomplexobj(out) else w.real

    def loss(*values):
        return jnp.sum(jnp.real(plain({**env, **dict(zip(names, values))}) * jnp.conj(w)))

    expected = jax.grad(loss, argnums=tuple(range(len(names))))(*(env[n] for n in names))
    dtypes = {n: np.asarray(v).dtype for n, v in env.items()}
    grads = {g.wrt: g for g in gradients(spec, complex_inputs(spec, dtypes))}
    genv = gradient_env(spec, env, out, np.conj(w))
    for name, want in zip(names, expected):
        got = run_gradient(grads[name], spec, genv, lambda step, e: lower(step)(e))
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-8,
                                   err_msg=f"gradient wrt {name} of {text}")
    return True


@pytest.mark.slow
def test_random_complex_specs_forward_and_gradients():
    compared = 0
    with jax.enable_x64(True):
        for seed in range(SPECS):
            text = random_spec(seed, complex_values=True)
            try:
                compared += _check(text, seed)
            except TullaxError as err:  # a valid complex spec must never be refused
                raise AssertionError(f"{text}: {err}") from err
    assert compared >= SPECS * 0.6, f"only {compared} specs compared"
