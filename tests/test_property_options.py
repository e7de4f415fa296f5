"""Property test of what ``einsum_kernel`` takes beside the text (issue 13): random specs from
``tullax.testing.specgen.random_call`` with ``(&)``/``(|)`` reductions over comparisons, ``init=`` and
``nograd=``, through the public kernel on the numba and xla backends, in float64.

Oracles, none of them the code under test:
* forward: the naive evaluator (``tullax.testing.oracle``) on the spec, with ``init`` combined in NumPy; a
  boolean reduction is checked against a COUNT of the false (``&``) or true (``|``) terms, which the evaluator
  sums in Python loops (no min/max rewrite involved);
* gradients: ``jax.grad`` of the plain XLA lowering with ``init`` combined in jnp, for the inputs not in
  ``nograd``; zeros for those in it.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rotation

import tullax
from tullax.backends.xla.lower import lower
from tullax.errors import TullaxError
from tullax.spec.examples import random_inputs
from tullax.spec.frontend import compile_spec
from tullax.spec.parse import parse_spec
from tullax.testing.oracle import naive_eval
from tullax.testing.specgen import random_call

SPECS = {"xla": 15, "numba": 6}  # per run, other ones every day (tests/rotation.py)
RTOL, ATOL = 1e-7, 1e-9


def _written(text: str, shape) -> np.ndarray:
    """Where a ':=' result is written: a diagonal write (a repeated index on the left, as the text writes it:
    the analysed spec renames the repeat) only where the repeated axes agree; everywhere else the result is 0,
    and init= does not reach it."""
    mask = np.ones(shape, bool)
    lhs = parse_spec(text).lhs
    names = [getattr(idx, "plain", None) for idx in lhs] if lhs is not None else []
    for a, name in enumerate(names):
        for b in range(a + 1, len(names)):
            if name is not None and names[b] == name:
                grid = np.indices(shape)
                mask &= grid[a] == grid[b]
    return mask


def _with_init(redop: str, init, value, xp):
    if redop == "+":
        return init + value
    if redop == "*":
        return init * value
    if redop == "max":
        return xp.maximum(init, value)
    if redop == "min":
        return xp.minimum(init, value)
    assert redop == "logsumexp", redop
    return xp.logaddexp(init, value)


def _boolean_oracle(text: str, env: dict, init) -> np.ndarray:
    """``(&) O := c`` is all(c != 0): no term is zero, so the count of ``c == 0`` terms is 0; ``(|)`` counts
    ``c != 0``. The counts are plain sums of the naive evaluator."""
    head, lhs, body = re.fullmatch(r"\((.)\) (.*?) := (.*)", text).groups()
    count = naive_eval(compile_spec(f"{lhs} := (({body}) {'==' if head == '&' else '!='} 0)")[1], env)
    value = count == 0 if head == "&" else count > 0
    if init is not None:
        value = (value & init) if head == "&" else (value | init)
    return value


def _check(text: str, options: dict, backend: str, seed: int) -> None:
    canonical, spec = compile_spec(text)
    env = random_inputs(spec, seed=seed)
    args = [env[n] for n in spec.input_names]
    kernel = tullax.einsum_kernel(text, backend=backend, **options)
    init = options.get("init")
    got = np.asarray(kernel(*args))
    if canonical.startswith(("(&)", "(|)")):
        assert got.dtype == np.bool_, text
        np.testing.assert_array_equal(got, _boolean_oracle(text, env, init), err_msg=f"{text} {options}")
        return
    want = naive_eval(spec, env)
    if init is not None:
        mask = _written(text, want.shape) if spec.assign == ":=" else True
        want = np.where(mask, _with_init(spec.redop, init, want, np), want)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"{text} {options}")
    if not np.all(np.isfinite(want)):
        return
    names = [i.name for i in spec.inputs if i.kind in ("array", "scalar")]
    if not names:
        return
    nograd = options.get("nograd", ())
    nograd = (nograd,) if isinstance(nograd, str) else tuple(nograd)
    cot = np.random.default_rng(seed).standard_normal(want.shape)
    plain = lower(spec)

    def reference(*values):
        out = plain({**env, **dict(zip(names, values))})
        if init is not None:
            mask = _written(text, out.shape) if spec.assign == ":=" else True
            out = jnp.where(mask, _with_init(spec.redop, init, out, jnp), out)
        return jnp.sum(out * cot)

    def ours(*values):
        return jnp.sum(kernel(**{**env, **dict(zip(names, values))}) * cot)

    argnums = tuple(range(len(names)))
    values = [env[n] for n in names]
    expected = jax.grad(reference, argnums)(*values)
    for name, g, w in zip(names, jax.grad(ours, argnums)(*values), expected):
        w = np.zeros_like(np.asarray(w)) if name in nograd else np.asarray(w)
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6, atol=1e-8,
                                   err_msg=f"gradient wrt {name} of {text} {options}")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["xla", "numba"])
def test_random_calls_with_boolean_reductions_init_and_nograd(backend):
    rng = np.random.default_rng((13, rotation.rotation()))
    kinds: set[str] = set()
    wanted = {"init", "nograd", "boolean"} if backend == "xla" else set()
    with jax.enable_x64(True):
        for n in range(4 * SPECS[backend]):  # past SPECS only until every kind came up (about one day in a hundred)
            if n >= SPECS[backend] and kinds >= wanted:
                break
            text, options = random_call(rng)
            kinds |= set(options) | ({"boolean"} if text.startswith(("(&)", "(|)")) else set())
            try:
                _check(text, options, backend, seed=n)
            except (AssertionError, TullaxError) as err:
                raise AssertionError(f"call {n} {rotation.label()}: {err}") from err
    assert kinds >= wanted, kinds
