"""The deep fuzzer (``tullax.testing.fuzz``): its comparison rules, and a few seeds end to end on the xla backend
(no compiler: milliseconds per spec) and on the c backend, whose float32 products it found overflowing."""
from __future__ import annotations

import json

import numpy as np
import pytest
from loop_backends import c_param

jax = pytest.importorskip("jax")

from tullax.testing import fuzz  # noqa: E402


def test_compare_accepts_what_is_within_the_tolerance_of_the_largest_magnitude():
    expected = np.array([1000.0, 1e-3, -2.0])
    assert fuzz._compare(expected + np.array([1e-5, 1e-5, 0.0]), expected, 1e-7, "float64") == ""
    assert "at flat 0" in fuzz._compare(expected + np.array([1.0, 0.0, 0.0]), expected, 1e-7, "float64")
    assert "at flat 0" in fuzz._compare(np.array(3.0), np.array(2.0), 1e-7, "float64")  # a 0-d result
    assert fuzz._compare(np.array(2.0), np.array(2.0), 1e-7, "float64") == ""


def test_compare_reports_a_nan_the_oracle_does_not_have_and_a_missing_one():
    expected = np.array([1.0, np.nan])
    assert "NaN" in fuzz._compare(np.array([np.nan, np.nan]), expected, 1e-7, "float64")
    assert "NaN" in fuzz._compare(np.array([1.0, 2.0]), expected, 1e-7, "float64")
    assert fuzz._compare(np.array([1.0, np.nan]), expected, 1e-7, "float64") == ""


def test_compare_reports_an_overflow_within_float32s_range_and_skips_values_beyond_it():
    expected = np.array([2.5e36, 1e300, 1.0])
    assert "inf" in fuzz._compare(np.array([np.inf, np.inf, 1.0]), expected, 2e-3, "float32")
    assert fuzz._compare(np.array([2.5e36, np.inf, 1.0]), expected, 2e-3, "float32") == ""
    assert "shape" in fuzz._compare(np.ones(2), np.ones(3), 1e-7, "float64")


def test_compare_matches_a_float64_infinity_exactly():
    expected = np.array([np.inf, -np.inf, 1.0])
    assert fuzz._compare(expected.copy(), expected, 1e-7, "float64") == ""
    assert "at flat 1" in fuzz._compare(np.array([np.inf, np.inf, 1.0]), expected, 1e-7, "float64")
    assert "at flat 0" in fuzz._compare(np.array([1e300, -np.inf, 1.0]), expected, 1e-7, "float64")


def test_a_finaliser_is_allowed_what_it_makes_of_its_reductions_rounding():
    """``|> sin(_)`` of a float32 sum near 7000: a relative error of 2e-6 in the sum (a correct float32 sum) moves
    the result by 0.01, which the plain rule reported as a mismatch (seed 7043 on numba). The allowance is the
    finaliser's own spread over PRE_ERROR of the sum: unbounded (not compared) where it passes ILL_CONDITIONED of
    the scale, and small where sin is well conditioned, so an error there still counts."""
    from tullax.spec.frontend import compile_spec

    spec = compile_spec("y[i] := x[i,j] |> sin(_)")[1]
    error = fuzz.PRE_ERROR["float32"]
    for each, rounding, allowed in ((0.7, 2e-5, True), (7.0, 2e-6, True), (0.001, 0.0, False)):
        x = np.full((1, 1000), each)  # sums of 700, 7000 and 1
        total = x.sum()
        expected = np.sin(x.sum(1))
        spread = fuzz._finaliser_spread(spec, {"x": x}, expected, error)
        step = error * total
        moved = max(abs(np.sin(total + d) - np.sin(total)) for d in (step, -step))
        assert spread[0] == (pytest.approx(moved) if moved <= fuzz.ILL_CONDITIONED else np.inf)
        off = expected + (np.sin(total * (1 + rounding)) - np.sin(total) if allowed else 0.01)
        assert "at flat 0" in fuzz._compare(off, expected, 2e-3, "float32")
        assert (fuzz._compare(off, expected, 2e-3, "float32", spread) == "") == allowed


def test_a_few_seeds_on_the_xla_backend_check_clean():
    with jax.enable_x64(True):
        outcomes = [fuzz.check_seed(seed, "xla", "float64") for seed in range(6)]
    assert sum(o.checked for o in outcomes) >= 3
    assert [f for o in outcomes for f in o.findings] == []


@pytest.mark.parametrize("backend", [c_param()])
def test_the_seed_that_found_the_float32_product_overflow_checks_clean(backend: str):
    outcome = fuzz.check_seed(1074, backend, "float32", grads=False)
    assert outcome.checked and outcome.findings == ()


def test_main_counts_and_writes_its_findings(tmp_path, monkeypatch):
    monkeypatch.setattr(jax.config, "update", lambda *args: None)  # the CLI's x64 would leak into other tests
    out = tmp_path / "fuzz.json"
    with jax.enable_x64(True):
        status = fuzz.main(["--backend", "xla", "--seeds", "0:3", "--no-grad", "--json", str(out)])
    found = json.loads(out.read_text())
    assert status == 0 and found["findings"] == [] and found["checked"] + found["skipped"] == 3


def test_malformed_seeds_and_an_unknown_backend_are_usage_errors(monkeypatch):
    monkeypatch.setattr(jax.config, "update", lambda *args: None)  # the CLI's x64 would leak into other tests
    with pytest.raises(SystemExit) as exited:
        fuzz.main(["--seeds", "0-10"])
    assert exited.value.code == 2
    with pytest.raises(SystemExit) as exited:
        fuzz.main(["--backend", "no-such-backend", "--seeds", "0:2"])
    assert exited.value.code == 2
    assert fuzz.main(["--backend", "auto", "--seeds", "3:3", "--no-grad"]) == 0  # an empty range: 'auto' is taken


@pytest.mark.parametrize("backend, dtype", [("xla", "float64"), pytest.param("c", "float32", marks=c_param().marks),
                                            ("numba", "float64")])
def test_a_few_seeds_with_special_values_check_clean(backend: str, dtype: str):
    """The fuzzer's special-values mode (issue 44): a tenth of the inputs NaN, +-inf or +-0, the forward result
    against the naive evaluator with its NaN and infinities exactly (a few seeds: Numba compiles for seconds)."""
    with jax.enable_x64(True):
        outcomes = [fuzz.check_seed(seed, backend, dtype, grads=False, special=0.1) for seed in range(3)]
    assert sum(o.checked for o in outcomes) >= 2, [o.skipped for o in outcomes]
    assert [f for o in outcomes for f in o.findings] == []


def test_the_special_values_mode_puts_special_values_in_the_inputs():
    from tullax.spec.examples import random_inputs, special_values
    from tullax.spec.frontend import compile_spec

    spec = compile_spec("y[i] := x[i,j]*w[j]")[1]
    env = random_inputs(spec, {"x": (40, 50), "w": (50,)}, seed=0, special=0.2,
                        pool=special_values("float64", extremes=False))
    x = env["x"]
    assert 0.1 < np.mean(np.isnan(x) | np.isinf(x) | (x == 0)) < 0.3
    assert np.isnan(x).any() and np.isposinf(x).any() and np.isneginf(x).any() and (np.signbit(x) & (x == 0)).any()
    plain = random_inputs(spec, {"x": (40, 50), "w": (50,)}, seed=0)["x"]
    assert np.isfinite(plain).all()
    every = special_values("float32")
    assert np.isnan(every).any() and (every == np.finfo(np.float32).max).any()
    assert (np.abs(every) == np.finfo(np.float32).smallest_subnormal).any()
    assert not (np.abs(special_values("float32", subnormals=False)) == np.finfo(np.float32).smallest_subnormal).any()
