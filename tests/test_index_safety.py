"""No position the generated code computes is out of range or overflows int64 (issue 15, memory safety), and an
explicit range never silently truncates a reduction.

Each case either raises a TullaxError naming the problem or computes exactly what an exact (Python integer)
reference computes. The property test runs the Numba kernels in a child process with ``NUMBA_BOUNDSCHECK=1``, so
a read outside an array is an IndexError there instead of a silent read of foreign memory."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from loop_backends import c_param

import tullax
from tullax.errors import ShapeError, SpecError

BACKENDS = ("numba", "xla", c_param())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("extent", [17, 100])
def test_explicit_range_never_truncates_a_reduction(backend, extent):
    x, w = np.arange(20, dtype=np.float32), np.ones(5, np.float32)
    kernel = tullax.einsum_kernel("y[i] := x[i+k]*w[k]", ranges={"i": extent}, backend=backend)
    with pytest.raises(ShapeError, match="axis 0 of x is indexed by i\\+k"):
        kernel(x, w)


def test_explicit_range_that_fits_still_narrows_nothing():
    x, w = np.arange(20, dtype=np.float64), np.ones(5)
    y = tullax.einsum_kernel("y[i] := x[i+k]*w[k]", ranges={"i": 16}, backend="numba")(x, w)
    np.testing.assert_allclose(y, [x[i:i + 5].sum() for i in range(16)])


OVERFLOW_CASES = [
    ("s := x[k - 9223372036854775800]", None, {"x": np.ones(10)}, "index k runs over"),
    ("y[i] := x[clamp(i + 9223372036854775807)] * z[i]", None, {"x": np.arange(10.), "z": np.ones(10)},
     "can reach magnitude"),
    ("y[i] := x[mod(i + 9223372036854775807)] * z[i]", None, {"x": np.arange(10.), "z": np.ones(10)},
     "can reach magnitude"),
    ("y[i] := x[pad(1000000000000000*i)] * z[i]", None, {"x": np.ones(10), "z": np.ones(10_000)},
     "can reach magnitude"),
    ("s := x[1000000*i] * w[j]", {"i": 1000}, {"x": np.ones(10), "w": np.ones(0)}, "reaches 999000000"),
]


@pytest.mark.parametrize("spec, ranges, inputs, match", OVERFLOW_CASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_positions_that_could_overflow_or_escape_are_shape_errors(spec, ranges, inputs, match, backend):
    kernel = tullax.einsum_kernel(spec, ranges=ranges, backend=backend)
    with pytest.raises(ShapeError, match=match):
        kernel(**inputs)


@pytest.mark.parametrize("spec, ranges, inputs, match", OVERFLOW_CASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_overflow_is_caught_at_trace_time_under_jit(spec, ranges, inputs, match, backend):
    """The same cases under jit: refused while tracing, before any kernel could run (the segfaults were eager
    and under jit)."""
    import jax

    kernel = tullax.einsum_kernel(spec, ranges=ranges, backend=backend)
    with pytest.raises(ShapeError, match=match):
        jax.jit(kernel).lower(**{name: value.astype(np.float32) for name, value in inputs.items()})


@pytest.mark.parametrize("ranges, error, match", [
    ({"i": range(0, 6, 2)}, SpecError, "has a step"),
    ({"i": 2**70}, SpecError, "beyond the 2\\^62"),
    ({"i": (0, 2**70)}, SpecError, "beyond the 2\\^62"),
    ({"i": 2.0}, SpecError, "must be an int"),
    ({"i": True}, SpecError, "must be an int"),
])
def test_bad_explicit_ranges_are_spec_errors(ranges, error, match):
    with pytest.raises(error, match=match):
        tullax.einsum_kernel("y[i] := x[i]", ranges=ranges, backend="xla")(np.ones(8))


@pytest.mark.parametrize("value", [np.int64(3), np.int32(3), range(0, 3), (np.int64(0), 3)])
def test_numpy_integers_and_unit_ranges_are_accepted(value):
    y = tullax.einsum_kernel("y[i] := x[i]", ranges={"i": value}, backend="xla")(np.arange(8.0))
    np.testing.assert_array_equal(np.asarray(y), [0.0, 1.0, 2.0])


# ---------------------------------------------------------------------------------------------
# Property test: affine positions with coefficients and constants near the int64 limits, tiny and empty ranges,
# run by Numba with bounds checking on
# ---------------------------------------------------------------------------------------------
_EDGES = [0, 1, -1, 2, -3, 7, 2**31, -(2**31), 2**40 + 3, 2**61, 2**62 - 1, 2**62, 2**62 + 1, 2**63 - 1,
          -(2**63) + 1, 2**64]
_KINDS = ("pad", "clamp", "mod", "plain")


def property_cases(count: int, seed: int = 0, *, reduced: bool = False) -> list[dict]:
    """``count`` random cases of ``y[i] := x[pos(i)] * z[i]``; ``reduced``: of ``s := x[pos(i)] * z[i] * w[j]``
    with a tiny or empty ``w`` (loads of x hoisted above an empty j loop once read past x)."""
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(count):
        kind = _KINDS[int(rng.integers(len(_KINDS)))]
        coef = int(rng.choice([1, 2, -1, 3]) if rng.random() < 0.5 else _EDGES[int(rng.integers(len(_EDGES)))])
        const = int(_EDGES[int(rng.integers(len(_EDGES)))] * (1 if rng.random() < 0.5 else -1))
        n_x = int(rng.choice([0, 1, 3, 10]))
        n_i = int(rng.choice([0, 1, 2, 5, 1000]))
        cases.append({"kind": kind, "coef": coef, "const": const, "n_x": n_x, "n_i": n_i})
        if reduced:
            cases[-1]["n_w"] = int(rng.choice([0, 0, 1, 2]))
    return cases


def expected(case: dict) -> list[float] | None:
    """The exact result with Python integers (None: the access leaves the array, an error is expected)."""
    x = np.arange(1, case["n_x"] + 1, dtype=np.float64)
    out = []
    for i in range(case["n_i"]):
        pos = case["coef"] * i + case["const"]
        if case["kind"] == "pad":
            out.append(x[pos] if 0 <= pos < len(x) else 0.0)
        elif len(x) == 0:
            return None
        elif case["kind"] == "clamp":
            out.append(x[min(max(pos, 0), len(x) - 1)])
        elif case["kind"] == "mod":
            out.append(x[pos % len(x)])
        elif 0 <= pos < len(x):
            out.append(x[pos])
        else:
            return None
    if "n_w" in case:  # s := sum over i, j of x[pos(i)] * 1 * 1
        return [float(sum(out)) * case["n_w"]]
    return out


_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tullax
    from tullax.errors import TullaxError
    results = []
    for case in json.loads(sys.argv[1]):
        pos = f"{case['coef']}*i + {case['const']}" if case["const"] >= 0 else f"{case['coef']}*i - {-case['const']}"
        index = pos if case["kind"] == "plain" else f"{case['kind']}({pos})"
        reduced = "n_w" in case
        spec = f"s := x[{index}] * z[i] * w[j]" if reduced else f"y[i] := x[{index}] * z[i]"
        x = np.arange(1, case["n_x"] + 1, dtype=np.float64)
        z = np.ones(case["n_i"])
        try:
            y = tullax.einsum_kernel(spec, backend=sys.argv[2])(x, z, *([np.ones(case["n_w"])] if reduced else []))
            results.append({"spec": spec, "value": [float(v) for v in np.atleast_1d(y)]})
        except TullaxError as err:
            results.append({"spec": spec, "error": type(err).__name__ + ": " + str(err).splitlines()[0]})
        except BaseException as err:  # an IndexError from the bounds check is a memory-safety bug
            results.append({"spec": spec, "crash": type(err).__name__ + ": " + str(err)})
    print("RESULTS" + json.dumps(results))
""")


@pytest.mark.slow
def test_affine_positions_near_int64_limits_under_numba_boundscheck(tmp_path):
    cases = property_cases(40) + property_cases(16, seed=1, reduced=True)
    env = dict(os.environ, NUMBA_BOUNDSCHECK="1", TULLAX_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(cases), "numba"], capture_output=True,
                          text=True, env=env, timeout=900)
    check_affine_results(cases, proc)


def check_affine_results(cases: list[dict], proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS"))
    results = json.loads(line[len("RESULTS"):])
    assert len(results) == len(cases)
    for case, result in zip(cases, results):
        assert "crash" not in result, (case, result)
        want = expected(case)
        if "value" in result:
            assert want is not None, f"{result['spec']} read outside x yet returned {result['value']}"
            np.testing.assert_array_equal(result["value"], want, err_msg=result["spec"])
        else:  # refused: only when the exact answer is an error or the arithmetic would leave +-2^62, or a plain
            # shifted read moves the result's start off 0 (refused whatever the data: tests/test_offsets.py)
            magnitude = abs(case["const"]) + abs(case["coef"]) * case["n_i"]
            shifted = case["kind"] == "plain" and "does not start at 0" in result["error"]
            assert want is None or magnitude > 2**62 or case["n_i"] == 0 and "empty" in result["error"] \
                or shifted, (case, result)



# ---------------------------------------------------------------------------------------------
# Property test: indirect positions inside affine arithmetic (scale*ix[i] + const), index values and factors
# near the int64 limits, under jit (values unknown when the kernel is built), numba (bounds checking on) and xla
# ---------------------------------------------------------------------------------------------
def indirect_cases(count: int, seed: int = 1) -> list[dict]:
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(count):
        scale = int(rng.choice([1, 2, -1, 3]) if rng.random() < 0.6 else _EDGES[int(rng.integers(7, 13))])
        const = int(rng.choice([0, 1, -2, 5]) if rng.random() < 0.6 else
                    _EDGES[int(rng.integers(6, 12))] * (1 if rng.random() < 0.5 else -1))
        values = [int(rng.integers(-3, 8)) if rng.random() < 0.7 else
                  int(_EDGES[int(rng.integers(6, 14))] * (1 if rng.random() < 0.5 else -1)) for _ in range(5)]
        cases.append({"scale": scale, "const": const, "values": values, "n_x": int(rng.choice([1, 4, 10]))})
    return cases


def indirect_expected(case: dict) -> list[float]:
    """Exact positions with Python integers; a position outside x reads NaN (under jit)."""
    x = np.arange(1, case["n_x"] + 1, dtype=np.float64)
    out = []
    for v in case["values"]:
        pos = case["scale"] * v + case["const"]
        out.append(x[pos] if 0 <= pos < len(x) else np.nan)
    return out


_INDIRECT_CHILD = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp
    import numpy as np
    import tullax
    from tullax.errors import TullaxError
    jax.config.update("jax_enable_x64", True)
    results = []
    for case in json.loads(sys.argv[1]):
      for backend in sys.argv[2].split(","):
        const = f"+{case['const']}" if case["const"] >= 0 else f"-{-case['const']}"
        spec = f"y[i] := x[{case['scale']}*ix[i]{const}] * z[i]"
        x = jnp.arange(1, case["n_x"] + 1, dtype=jnp.float64)
        ix = jnp.asarray(case["values"], dtype=jnp.int64)
        z = jnp.ones(len(case["values"]))
        try:
            y = jax.jit(tullax.einsum_kernel(spec, backend=backend))(x, ix, z)
            results.append({"spec": spec + " on " + backend, "value": [float(v) for v in y]})
        except TullaxError as err:
            results.append({"spec": spec, "error": type(err).__name__ + ": " + str(err).splitlines()[0]})
        except BaseException as err:  # an IndexError from the bounds check is a memory-safety bug
            results.append({"spec": spec + " on " + backend, "crash": type(err).__name__ + ": " + str(err)})
    print("RESULTS" + json.dumps(results))
""")


@pytest.mark.slow
def test_indirect_affine_positions_near_int64_limits_under_numba_boundscheck(tmp_path):
    # products that wrap around int64 into the array: 3*6148914691236517206 = 2^64 + 2, 2^62*4 = 2^64
    cases = indirect_cases(12) + [{"scale": 3, "const": 0, "values": [6148914691236517206, 1, 0, 2, 3], "n_x": 4},
                                  {"scale": 2**62, "const": 1, "values": [4, 0, -4, 1, 0], "n_x": 4}]
    env = dict(os.environ, NUMBA_BOUNDSCHECK="1", TULLAX_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", _INDIRECT_CHILD, json.dumps(cases), "numba,xla"],
                          capture_output=True, text=True, env=env, timeout=900)
    check_indirect_results(cases, proc, 2)


def check_indirect_results(cases: list[dict], proc: subprocess.CompletedProcess, backends: int) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS"))
    results = json.loads(line[len("RESULTS"):])
    assert len(results) == backends * len(cases)
    for case, result in zip([c for c in cases for _ in range(backends)], results):  # in the child's order
        assert "crash" not in result, (case, result)
        if "value" in result:
            np.testing.assert_array_equal(result["value"], indirect_expected(case), err_msg=result["spec"])
        else:  # refused only when the constant or the factor leaves the int64 arithmetic's +-2^62
            assert max(abs(case["const"]), abs(case["scale"])) > 2**62, (case, result)
