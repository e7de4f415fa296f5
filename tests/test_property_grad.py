"""Property test of the gradient derivation: 200 random valid specs per run from the grammar-driven
generator, a new slice of seeds every day (tests/rotation.py), every derived gradient against ``jax.grad`` of the
plain XLA lowering (float64).

Each spec is ONE jitted program (forward, jax's gradient, every derived gradient step): one XLA compile per
spec costs far less than dispatching its hundreds of small ops eagerly, each compiled on its own. A spec that
fails goes into tests/previously_failed.txt once fixed."""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rotation

from tullax.backends.xla.lower import lower
from tullax.errors import TullaxError
from tullax.grad import gradients
from tullax.grad.run import gradient_env, run_gradient
from tullax.spec.analyze import analyze
from tullax.spec.examples import random_inputs
from tullax.spec.parse import parse_spec
from tullax.testing.specgen import random_spec

SHARDS = 2
PER_SHARD = 100  # 200 random specs per run in all, other ones every day
RTOL, ATOL = 1e-6, 1e-9


def _execute(step, step_env):
    return lower(step)(step_env)


def both_gradients(spec, grads: dict, names: list[str], env: dict, cotangent):
    """(forward result, the derived gradients w.r.t. ``names``, jax.grad's): eager, or traced under jit."""
    plain = lower(spec)
    out = plain(env)

    def loss(*values):
        return jnp.sum(plain({**env, **dict(zip(names, values))}) * cotangent)

    expected = jax.grad(loss, argnums=tuple(range(len(names))))(*(env[n] for n in names))
    genv = gradient_env(spec, env, out, cotangent)
    return out, [run_gradient(grads[name], spec, genv, _execute) for name in names], list(expected)


def _close(got, expected) -> bool:
    return all(np.allclose(np.asarray(g), np.asarray(w), rtol=RTOL, atol=ATOL) for g, w in zip(got, expected))


def check_gradients(text: str, seed: int) -> bool:
    """Every derived gradient of ``text`` equals jax.grad of its lowering; False when there is nothing to
    compare (no float input, a non-finite forward value)."""
    spec = analyze(parse_spec(text))
    env = random_inputs(spec, seed=seed)
    names = [i.name for i in spec.inputs
             if i.kind in ("array", "scalar") and np.issubdtype(np.asarray(env[i.name]).dtype, np.inexact)]
    if not names:
        return False
    run = partial(both_gradients, spec, {g.wrt: g for g in gradients(spec)}, names)
    cot = np.random.default_rng(seed).standard_normal(jax.eval_shape(lower(spec), env).shape)
    out, got, expected = jax.jit(run)(env, cot)
    if np.all(np.isfinite(np.asarray(out))) and not _close(got, expected):
        # One program may compute a body in two fusions that round differently (a max reduction and the
        # comparison in jax's own gradient of it), so jax's jitted gradient can miss the winner. Eagerly
        # every op runs once: the eager comparison is the verdict.
        out, got, expected = run(env, cot)
    if not np.all(np.isfinite(np.asarray(out))):
        return False
    for name, g, want in zip(names, got, expected):
        np.testing.assert_allclose(np.asarray(g), np.asarray(want), rtol=RTOL, atol=ATOL,
                                   err_msg=f"gradient wrt {name} of {text}\n(add it to tests/previously_failed.txt)")
    return True


@pytest.mark.slow
@pytest.mark.parametrize("shard", range(SHARDS))
def test_random_specs_gradients_match_jax(shard: int):
    compared: list[int] = []
    for seed in rotation.seeds(PER_SHARD, shard, SHARDS):
        text = random_spec(seed)
        with jax.enable_x64(True):
            try:
                if check_gradients(text, seed):
                    compared.append(seed)
            except TullaxError as err:  # a valid spec must never fail to differentiate
                raise AssertionError(f"{text} (seed {seed}): {err} {rotation.label()}") from err
            except AssertionError as err:
                raise AssertionError(f"seed {seed} {rotation.label()}: {err}") from err
    assert len(compared) >= PER_SHARD * 0.6, f"only {len(compared)} specs had gradients to compare"
