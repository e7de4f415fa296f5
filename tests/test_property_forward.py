"""Property tests: random valid specs (grammar-driven) forward through the XLA lowering vs the naive evaluator,
and random garbage through parse + analyze (only TullaxError may come out).

The valid specs are a slice of seeds that moves every UTC day (tests/rotation.py); the garbage examples are
derandomized: every run tries the same ones. A spec that ever fails goes into tests/previously_failed.txt, which
test_previously_failed replays on every run.
"""
from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
import rotation
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tullax.backends.xla.lower import lower
from tullax.errors import TullaxError
from tullax.spec.analyze import analyze
from tullax.spec.examples import random_inputs
from tullax.spec.frontend import compile_spec
from tullax.spec.parse import parse_spec
from tullax.testing.oracle import naive_eval
from tullax.testing.specgen import random_garbage, random_spec

VALID_SHARDS = 2  # separate tests, so pytest-xdist can run them side by side
VALID_PER_SHARD = 100  # 200 random valid specs per run in all, other ones every day
GARBAGE_EXAMPLES = 2000
PREVIOUSLY_FAILED = Path(__file__).with_name("previously_failed.txt")

FIXED = settings(derandomize=True, database=None, deadline=None, print_blob=False,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def check_forward(text: str, seed: int) -> None:
    """Analyse ``text`` (it must be valid), run it on small random inputs through the jitted lowering and the
    naive evaluator, and compare."""
    spec = analyze(parse_spec(text))
    parse_spec(compile_spec(text)[0])  # the canonical text (the cache key) is parsed again by einsum_kernel
    env = random_inputs(spec, seed=seed)
    expected = naive_eval(spec, env)
    with jax.enable_x64(True):
        got = np.asarray(jax.jit(lower(spec))(env))
    assert got.shape == expected.shape, text
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-10,
                               err_msg=f"{text}\n(add it to tests/previously_failed.txt once fixed)")


@pytest.mark.slow
@pytest.mark.parametrize("shard", range(VALID_SHARDS))
def test_random_valid_specs_match_naive(shard: int):
    for seed in rotation.seeds(VALID_PER_SHARD, shard, VALID_SHARDS):
        try:
            check_forward(random_spec(seed), seed)
        except (AssertionError, TullaxError) as err:  # a valid spec must never be refused either
            raise AssertionError(f"seed {seed} {rotation.label()}: {err}") from err


def assert_only_tullax_errors(text: str, ranges=None) -> None:
    try:
        analyze(parse_spec(text), ranges)
    except TullaxError as err:
        assert str(err), f"empty message for {text!r}"


@settings(FIXED, max_examples=GARBAGE_EXAMPLES)
@given(st.integers(0, 2**31))
def test_mutated_specs_give_only_tullax_errors(seed: int):
    assert_only_tullax_errors(random_garbage(seed))


TOKENS = list("ijkxyAB[](),:=+-*/^<>|!. 0123456789") + ["mod(", "ix[", "α", "√", "(max) ", "exp(", ":=", "|>"]


@settings(FIXED, max_examples=500)
@given(st.lists(st.sampled_from(TOKENS), max_size=30).map("".join))
def test_random_text_gives_only_tullax_errors(text: str):
    assert_only_tullax_errors(text)


@settings(FIXED, max_examples=300)
@given(st.integers(0, 2**31),
       st.dictionaries(st.sampled_from(["i", "j", "k", "zz"]),
                       st.one_of(st.integers(-3, 5), st.tuples(st.integers(-3, 5), st.integers(-3, 5)),
                                 st.just("7"), st.just(None), st.just(2.5), st.just(True),
                                 st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3))),
                       max_size=3))
def test_random_explicit_ranges_give_only_tullax_errors(seed: int, ranges):
    assert_only_tullax_errors(random_spec(seed), ranges)


def previously_failed() -> list[str]:
    lines = PREVIOUSLY_FAILED.read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.parametrize("text", previously_failed())
def test_previously_failed(text: str):
    """Every line: parse + analyse give a Spec or a TullaxError; a valid spec also runs forward."""
    try:
        analyze(parse_spec(text))
    except TullaxError:
        return
    check_forward(text, seed=0)
