"""Random recurrences (``tullax.testing.scangen``) against their lax.scan oracles, built from the same random
choices but not from tullax's parser or lowering: forward, the gradient of every input (a VJP) and a JVP of
every input, in float64, on xla (6 seeds: no compiler), c (4), auto (2) and numba (1)."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from loop_backends import c_param

import tullax
from tullax.spec.frontend import compile_spec
from tullax.testing.scangen import random_scan

SEEDS = {"xla": range(6), "c": range(8, 12), "auto": range(14, 16), "numba": range(18, 19)}


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def _close(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    scale = max(1.0, float(np.abs(want).max(initial=0)))
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * scale, err_msg=what)


def _params():
    c_marks = c_param().marks
    for backend, seeds in SEEDS.items():
        for seed in seeds:
            yield pytest.param(backend, seed, id=f"{backend}-{seed}", marks=c_marks if backend == "c" else ())


@pytest.mark.parametrize("backend,seed", list(_params()))
def test_a_random_recurrence_matches_its_lax_scan_oracle(backend, seed):
    case = random_scan(seed)
    names = compile_spec(case.text)[1].input_names
    args = tuple(case.inputs[n] for n in names)
    kernel = tullax.einsum_kernel(case.text, backend=backend)
    oracle = lambda *a: case.oracle(dict(zip(names, a)))  # noqa: E731
    rng = np.random.default_rng(seed + 1000)
    cotangent = rng.normal(size=jax.eval_shape(oracle, *args).shape)
    tangents = tuple(rng.normal(size=np.shape(a)) for a in args)

    # jitted: one program per subject (eagerly, every jnp op of the oracle dispatches alone)
    got = jax.jit(lambda a, c, t: _triple(kernel, a, c, t))(args, cotangent, tangents)
    want = jax.jit(lambda a, c, t: _triple(oracle, a, c, t))(args, cotangent, tangents)
    _close(got[0], want[0], f"forward of {case.text}")
    for name, g, w in zip(names, got[1], want[1]):
        _close(g, w, f"gradient of {name} in {case.text}")
    _close(got[2], want[2], f"jvp of {case.text}")


def _triple(fn, args, cotangent, tangents):
    """The result, the VJP of every input at ``cotangent`` and the JVP along ``tangents``."""
    out, pullback = jax.vjp(fn, *args)
    return out, pullback(cotangent), jax.jvp(fn, args, tangents)[1]
