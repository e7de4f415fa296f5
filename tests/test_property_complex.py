"""Property test of complex numbers (issue 13): random valid specs on complex128 inputs from the generator's
complex grammar (``random_spec(..., complex_values=True)``: sums, conj/real/imag/abs, holomorphic functions, no
orderings). The XLA lowering's forward against the naive evaluator, and every derived gradient (jax's convention
for complex gradients) against ``jax.grad`` of the plain lowering for the real loss ``sum(real(y*conj(w)))``,
whose cotangent w.r.t. y is ``conj(w)``. 40 specs per run, other ones every day (tests/rotation.py); and 2-4
more on every registry backend that computes with complex numbers (c, numba), through ``einsum_kernel``."""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rotation
from loop_backends import every_backend, skip_unavailable

import tullax
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


def _program(spec, grads: dict, names: list[str], env: dict, w):
    """(forward result, the derived gradients w.r.t. ``names``, jax.grad's), eager or traced under jit."""
    plain = lower(spec)
    out = plain(env)

    def loss(*values):
        return jnp.sum(jnp.real(plain({**env, **dict(zip(names, values))}) * jnp.conj(w)))

    expected = jax.grad(loss, argnums=tuple(range(len(names))))(*(env[n] for n in names))
    genv = gradient_env(spec, env, out, jnp.conj(w))
    return out, [run_gradient(grads[n], spec, genv, lambda step, e: lower(step)(e)) for n in names], list(expected)


def _check(text: str, seed: int) -> bool:
    """The forward against the naive evaluator and every derived gradient against jax.grad; False where the
    forward is not finite. ONE jitted program per spec (an XLA compile costs far less than dispatching its small
    ops eagerly, each compiled on its own); where it disagrees, the eager run of the same program is the verdict
    (a fusion may round differently)."""
    spec = analyze(parse_spec(text))
    env = random_inputs(spec, seed=seed, dtype=np.complex128)
    names = [i.name for i in spec.inputs
             if i.kind in ("array", "scalar") and np.issubdtype(np.asarray(env[i.name]).dtype, np.inexact)]
    shape = jax.eval_shape(lower(spec), env)
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape.shape) + 1j * rng.standard_normal(shape.shape)
    w = w if np.iscomplexobj(np.empty((), shape.dtype)) else w.real
    dtypes = {n: np.asarray(v).dtype for n, v in env.items()}
    grads = {g.wrt: g for g in gradients(spec, complex_inputs(spec, dtypes))}
    run = partial(_program, spec, grads, names)
    out, got, expected = jax.jit(run)(env, w)
    if not np.all(np.isfinite(np.asarray(out))):
        return False
    if not _agrees(text, names, out, got, expected, spec, env):
        out, got, expected = run(env, w)
        _agrees(text, names, out, got, expected, spec, env, verdict=True)
    return True


def _agrees(text: str, names: list[str], out, got, expected, spec, env, verdict: bool = False) -> bool:
    try:
        np.testing.assert_allclose(np.asarray(out), naive_eval(spec, env), rtol=RTOL, atol=ATOL,
                                   err_msg=f"forward of {text}")
        for name, g, want in zip(names, got, expected):
            np.testing.assert_allclose(np.asarray(g), np.asarray(want), rtol=1e-6, atol=1e-8,
                                       err_msg=f"gradient wrt {name} of {text}")
    except AssertionError:
        if verdict:
            raise
        return False
    return True


@pytest.mark.slow
def test_random_complex_specs_forward_and_gradients():
    compared = 0
    with jax.enable_x64(True):
        for seed in rotation.seeds(SPECS):
            text = random_spec(seed, complex_values=True)
            try:
                compared += _check(text, seed)
            except TullaxError as err:  # a valid complex spec must never be refused
                raise AssertionError(f"{text} (seed {seed}): {err} {rotation.label()}") from err
            except AssertionError as err:
                raise AssertionError(f"seed {seed} {rotation.label()}: {err}") from err
    assert compared >= SPECS * 0.6, f"only {compared} specs compared"


# random specs per loop backend and run: each compiles its forward and gradient modules (Numba's take ~25 s a spec
# on 2 busy cores, C's ~6 s)
LOOP_SPECS = {"c": 4}


@pytest.mark.slow
@pytest.mark.parametrize("backend", every_backend())
def test_random_complex_specs_on_every_loop_backend(backend):
    """The same random complex specs (fewer: each compiles) through a registry backend that computes with complex
    numbers, as a user calls it: the forward against the naive evaluator, ``jax.grad`` of the real loss through
    the kernel (its own derived gradient steps) against ``jax.grad`` through the plain XLA lowering, eager."""
    from tullax import backends

    if backend in ("xla", "auto"):
        pytest.skip("xla is the reference (test_random_complex_specs_forward_and_gradients); auto picks one of them")
    skip_unavailable(backend)
    if not backends.takes(backends.get(backend), ["complex128"]):
        pytest.skip(f"{backend} has no complex numbers")
    compared = 0
    with jax.enable_x64(True):
        for seed in rotation.seeds(LOOP_SPECS.get(backend, 2), shard=1, shards=2):
            text = random_spec(seed, complex_values=True)
            try:
                compared += _check_backend(text, seed, backend)
            except (TullaxError, AssertionError) as err:
                raise AssertionError(f"{backend}: {text} (seed {seed}) {rotation.label()}: {err}") from err
    assert compared >= 1, "no spec compared"


def _check_backend(text: str, seed: int, backend: str) -> bool:
    spec = analyze(parse_spec(text))
    env = random_inputs(spec, seed=seed, dtype=np.complex128)
    names = [i.name for i in spec.inputs
             if i.kind in ("array", "scalar") and np.issubdtype(np.asarray(env[i.name]).dtype, np.inexact)]
    want = naive_eval(spec, env)
    if not np.all(np.isfinite(want)):
        return False
    kernel = tullax.einsum_kernel(text, backend=backend)
    args = [env[name] for name in spec.input_names]
    np.testing.assert_allclose(np.asarray(kernel(*args)), want, rtol=RTOL, atol=ATOL, err_msg="forward")
    plain = lower(spec)
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(want.shape) + 1j * rng.standard_normal(want.shape)
    w = w if np.iscomplexobj(want) else w.real
    positions = tuple(spec.input_names.index(name) for name in names)

    def loss(f):
        return lambda *a: jnp.sum(jnp.real(f(*a) * jnp.conj(w)))

    got = jax.grad(loss(kernel), positions)(*args)
    expected = jax.grad(loss(lambda *a: plain(dict(zip(spec.input_names, a)))), positions)(*args)
    for name, g, e in zip(names, got, expected):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-6, atol=1e-8, err_msg=f"gradient wrt {name}")
    return True
