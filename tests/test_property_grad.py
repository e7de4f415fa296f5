"""Property test of the gradient derivation: 500 random valid specs per run from the grammar-driven
generator, every derived gradient against ``jax.grad`` of the plain XLA lowering (float64).

Eager jax (no jit) keeps the per-spec cost to tens of milliseconds: compiling 500 x (forward + steps)
programs would dominate the suite. A spec that fails goes into tests/previously_failed.txt once fixed."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tullax.backends.xla import lower
from tullax.errors import TullaxError
from tullax.grad import gradients
from tullax.grad.run import gradient_env, run_gradient
from tullax.spec.analyze import analyze
from tullax.spec.examples import random_inputs
from tullax.spec.parse import parse_spec
from tullax.testing.specgen import random_spec

SHARDS = 2
PER_SHARD = 250  # 500 random specs per run in all
FIXED = settings(derandomize=True, database=None, deadline=None, print_blob=False, max_examples=PER_SHARD,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def _execute(step, step_env):
    return lower(step)(step_env)


def check_gradients(text: str, seed: int) -> bool:
    """Every derived gradient of ``text`` equals jax.grad of its lowering; False when there is nothing to
    compare (no float input, a (*) reduction, a non-finite forward value)."""
    spec = analyze(parse_spec(text))
    if spec.redop == "*":
        return False
    env = random_inputs(spec, seed=seed)
    names = [i.name for i in spec.inputs
             if i.kind in ("array", "scalar") and np.issubdtype(np.asarray(env[i.name]).dtype, np.inexact)]
    plain = lower(spec)
    out = plain(env)
    if not names or not np.all(np.isfinite(np.asarray(out))):
        return False
    cot = np.random.default_rng(seed).standard_normal(np.shape(out))

    def loss(*values):
        return jnp.sum(plain({**env, **dict(zip(names, values))}) * cot)

    expected = jax.grad(loss, argnums=tuple(range(len(names))))(*(env[n] for n in names))
    by_input = {g.wrt: g for g in gradients(spec)}
    genv = gradient_env(spec, env, out, cot)
    for name, want in zip(names, expected):
        got = run_gradient(by_input[name], spec, genv, _execute)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-9,
                                   err_msg=f"gradient wrt {name} of {text}\n(add it to tests/previously_failed.txt)")
    return True


@pytest.mark.parametrize("shard", range(SHARDS))
def test_random_specs_gradients_match_jax(shard: int):
    compared: list[int] = []

    @FIXED
    @given(st.integers(0, 2**30).map(lambda n: n * SHARDS + shard))
    def run(seed: int) -> None:
        text = random_spec(seed)
        with jax.enable_x64(True):
            try:
                if check_gradients(text, seed):
                    compared.append(seed)
            except TullaxError as err:  # a valid spec must never fail to differentiate
                raise AssertionError(f"{text}: {err}") from err

    run()
    assert len(compared) >= PER_SHARD * 0.6, f"only {len(compared)} specs had gradients to compare"
