"""IEEE special values through every function and operator of the registry, on every target (issue 44).

NaN, +-inf, +-0, the extreme normal magnitudes and subnormals (``tullax.spec.examples.special_values``) go
through ONE kernel per family, each element a function of the registry or an operator picked by an index
(``y[f,i] := ifelse(f == 0, exp(x[i]), ifelse(f == 1, ...))``), so the net costs a handful of compilations per
target: every function of one argument, every operator and function of two (on all pairs of special values), and
every reduction over rows that hold them (long enough for the vector and lane paths of the loop backends).

Targets: every backend of the registry that runs here (``c``, ``numba``, ``xla``; ``julia``, ``cuda`` where they
are installed; a new backend joins by registering) and ``auto``, eagerly; the printed CUDA C through the host
harness (tests/cuda_harness.py) and the printed Julia through the subset evaluator (tests/julia_subset.py).
The oracle is the naive evaluator (``tullax.testing.oracle``: NumPy float64 loops over the registry's NumPy
implementations, no lowering), rounded to the kernel's dtype; NaN positions and infinities must match exactly.
XLA on the CPU flushes subnormals to zero, so its inputs hold none (documented in ``special_values``).
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
from loop_backends import every_backend, unavailable

import tullax
from tullax.spec import functions
from tullax.spec.examples import special_values
from tullax.spec.frontend import compile_spec
from tullax.testing.oracle import naive_eval

DTYPES = ("float32", "float64")
HARNESSES = ("cuda-host-harness", "julia-evaluator")
TARGETS = (*every_backend(), *HARNESSES)
FLUSHES_SUBNORMALS = ("xla",)
TOLERANCE = {"float32": dict(rtol=2e-5, atol=1e-37), "float64": dict(rtol=1e-12, atol=1e-300)}
SUM_TOLERANCE = {"float32": dict(rtol=1e-4, atol=1e-4), "float64": dict(rtol=1e-10, atol=1e-10)}

# every function of one argument, then operators on one value, IEEE's corner cases among them
UNARY = [f"{name}(x[i])" for name in functions.UNARY] + [
    "-x[i]", "x[i]*0", "0*x[i]", "x[i]*(x[i] > 2)", "(x[i] <= 2)*x[i] + 1", "x[i]/x[i]", "1/x[i]", "x[i]/0",
    "x[i] - x[i]", "x[i] + 0", "x[i]^2", "x[i]^3", "x[i]^(-1)", "x[i]^(-2)", "x[i]^0.5", "2^x[i]",
    "max(x[i], 0)", "min(x[i], 0)", "max(0, x[i])", "ifelse(x[i] > 0, x[i], 0)", "x[i]*1e-30*1e30"]
# every operator and function of two arguments, on every pair of values
BINARY = ["x[i] + z[j]", "x[i] - z[j]", "x[i]*z[j]", "x[i]/z[j]", "x[i]^z[j]", "x[i] < z[j]", "x[i] <= z[j]",
          "x[i] > z[j]", "x[i] >= z[j]", "x[i] == z[j]", "x[i] != z[j]", "x[i]*(z[j] > 0)",
          "ifelse(x[i] > z[j], x[i], z[j])"] + [
    f"{name}(x[i], z[j])" for name, f in functions.FUNCTIONS.items() if f.arity == 2 and name != "ifelse"]
# reductions of rows holding special values; finalisers, relu's among them (issue 44)
REDUCTIONS = ["s[i] := x[i,j]", "(*) s[i] := x[i,j]", "(max) s[i] := x[i,j]", "(min) s[i] := x[i,j]",
              "(logsumexp) s[i] := x[i,j]", "s[i] := x[i,j] |> relu", "(max) s[i] := x[i,j] |> relu",
              "s[i] := x[i,j]*w[j]"]


def selected(terms: list[str], index: str) -> str:
    """``ifelse(index == 0, terms[0], ifelse(index == 1, terms[1], ... terms[-1]))``."""
    text = terms[-1]
    for k in range(len(terms) - 2, -1, -1):
        text = f"ifelse({index} == {k}, {terms[k]}, {text})"
    return text


def values(dtype: str, target: str) -> np.ndarray:
    if target == "numba" and _numba_flushes_here(dtype):
        # seen once in a full run (one xdist worker, after hundreds of other tests): numba's kernels returned
        # subnormals as 0 there while NumPy in the same process did not; the cause is not found yet (a thread whose
        # MXCSR has FTZ/DAZ set, inherited from XLA's?): not a silent pass, an expected failure that says so
        pytest.xfail("numba flushes subnormals to zero in this process (FTZ/DAZ state, open: see the closing note)")
    return special_values(dtype, subnormals=target not in FLUSHES_SUBNORMALS)


def _numba_flushes_here(dtype: str) -> bool:
    tiny = np.asarray([np.finfo(dtype).smallest_subnormal], dtype)
    return float(np.asarray(tullax.einsum_kernel("ftz_probe[i] := x[i]*1", backend="numba")(tiny))[0]) == 0.0


JULIA_TARGETS = ("julia", "julia-cuda", "julia-evaluator")
# what a target does not compute as IEEE says, and why: the oracle there is jnp's own result
KNOWN = {("xla", "x[i]/z[j]"): "XLA divides by a broadcast operand as a multiply by its reciprocal (jnp's "
                               "x[:, None] / z[None, :] too): x/huge is 0, inf/huge NaN"}


def terms_for(terms: list[str], target: str) -> list[str]:
    """``terms`` as ``target`` can print them: a function the Julia backends refuse (erf, which Base Julia lacks)
    is the plain argument there, so the rows stay aligned."""
    if target not in JULIA_TARGETS:
        return terms
    refused = [name for name, f in functions.FUNCTIONS.items() if f.lowering == "call" and f.julia is None]
    return ["x[i]" if any(term.startswith(f"{name}(") for name in refused) else term for term in terms]


def unary_case(dtype: str, target: str):
    x = values(dtype, target)
    terms = terms_for(UNARY, target)
    return f"y[f,i] := {selected(terms, 'f')}", {"f": len(terms)}, {"x": x}


def binary_case(dtype: str, target: str):
    x = values(dtype, target)
    terms = terms_for(BINARY, target)
    return f"y[f,i,j] := {selected(terms, 'f')}", {"f": len(terms)}, {"x": x, "z": x.copy()}


def _jnp_division(x: np.ndarray, z: np.ndarray) -> np.ndarray:
    import jax

    with jax.enable_x64(x.dtype == np.float64):
        return np.asarray(jax.jit(lambda x, z: x[:, None] / z[None, :])(x, z))


def reduction_case(text: str, dtype: str, target: str):
    """Rows of 37 values +-1 (4 lanes of 8 and a remainder; exact in every order of summing or multiplying)
    holding one special value each at a position that moves from row to row, then rows holding two of NaN, +-inf
    and +-0 (whose sum and product do not depend on the order either; two huge finite values would)."""
    special = values(dtype, target)
    rng = np.random.default_rng(0)
    width = 37
    pairs = [(a, b) for a in (np.nan, np.inf, -np.inf, 0.0, -0.0) for b in (np.nan, np.inf, -np.inf, 0.0, -0.0)]
    rows = rng.choice([-1.0, 1.0], (len(special) + len(pairs), width))
    for r, value in enumerate(special):
        rows[r, (7 * r) % width] = value
    for r, (a, b) in enumerate(pairs, start=len(special)):
        rows[r, (7 * r) % width], rows[r, (13 * r + 5) % width] = a, b
    env = {"x": rows.astype(dtype)}
    if "w[" in text:
        env["w"] = rng.choice([-1.0, 1.0], width).astype(dtype)
    return text, None, env


def expected(text: str, ranges, env: dict, dtype: str) -> np.ndarray:
    spec = compile_spec(text, ranges)[1]
    with np.errstate(all="ignore"):
        return naive_eval(spec, {k: np.asarray(v, np.float64) for k, v in env.items()}).astype(dtype)


@functools.cache
def _available(target: str) -> str:
    """Why ``target`` cannot run here ("" when it can)."""
    if target == "cuda-host-harness":
        from cuda_harness import GPP

        return "" if GPP else "g++ is not installed"
    if target == "julia-evaluator":
        try:
            import tree_sitter_julia  # noqa: F401
        except ImportError:
            return "tree_sitter_julia is not installed"
        return ""
    return unavailable(target)


def run(target: str, text: str, ranges, env: dict, dtype: str) -> np.ndarray:
    """The result of ``text`` on ``env`` computed by ``target``, eagerly."""
    why = _available(target)
    if why:
        pytest.skip(f"{target}: {why}")
    if target == "julia-evaluator":
        from test_julia_printer import run_julia

        return run_julia(compile_spec(text, ranges)[1], env)
    if target == "cuda-host-harness":
        return _cuda_results()[(text, dtype, tuple(sorted((k, v.tobytes()) for k, v in env.items())))]
    kernel = tullax.einsum_kernel(text, backend=target, ranges=ranges)
    return np.asarray(kernel(**env))


def _cases(dtype: str, target: str):
    yield unary_case(dtype, target)
    yield binary_case(dtype, target)
    for text in REDUCTIONS:
        yield reduction_case(text, dtype, target)


@functools.cache
def _cuda_results() -> dict:
    """Every case of this module run by the printed CUDA C on the host harness: ONE g++ build for all."""
    import tempfile
    from pathlib import Path

    from cuda_harness import build
    from cuda_harness import run as run_launches
    from test_cuda_host import launch_for

    jobs = []
    for dtype in DTYPES:
        for text, ranges, env in _cases(dtype, "cuda-host-harness"):
            key = (text, dtype, tuple(sorted((k, v.tobytes()) for k, v in env.items())))
            jobs.append((key, launch_for(compile_spec(text, ranges)[1], env, f"k{len(jobs)}", False)))
    directory = Path(tempfile.mkdtemp(prefix="tullax-special-cuda-"))
    exe = build([(launch.kernel, launch.index_bits) for _, launch in jobs], directory)
    outputs = run_launches(exe, list(enumerate(launch for _, launch in jobs)))
    return {key: out for (key, _), out in zip(jobs, outputs)}


def _check(got: np.ndarray, want: np.ndarray, terms: list[str] | None, tolerance: dict, what: str) -> None:
    """``got`` is ``want`` within ``tolerance``, NaN where it is NaN and the same infinities; every row (one
    function or operator each) that is not, reported together."""
    got = np.asarray(got)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    failures = []
    for row in range(len(terms)) if terms else [None]:
        g, w = (got[row], want[row]) if row is not None else (got, want)
        try:
            with np.errstate(invalid="ignore"):
                np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), equal_nan=True, **tolerance)
        except AssertionError:
            wrong = ~np.isclose(g.astype(np.float64), w.astype(np.float64), equal_nan=True, **tolerance)
            at = np.flatnonzero(wrong)[:6]
            failures.append(f"{terms[row] if row is not None else ''}: got {g.ravel()[at].tolist()}, expected "
                            f"{w.ravel()[at].tolist()} at flat {at.tolist()}")
    assert not failures, f"{what}:\n" + "\n".join(failures)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("target", TARGETS)
def test_every_function_of_one_argument_on_special_values(target: str, dtype: str):
    text, ranges, env = unary_case(dtype, target)
    got = run(target, text, ranges, env, dtype)
    _check(got, expected(text, ranges, env, dtype), terms_for(UNARY, target), TOLERANCE[dtype],
           f"{target} {dtype} on {env['x'].tolist()}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("target", TARGETS)
def test_every_operator_and_function_of_two_arguments_on_special_values(target: str, dtype: str):
    text, ranges, env = binary_case(dtype, target)
    got = run(target, text, ranges, env, dtype)
    want = expected(text, ranges, env, dtype)
    if (target, "x[i]/z[j]") in KNOWN:
        want[BINARY.index("x[i]/z[j]")] = _jnp_division(env["x"], env["z"])
    _check(got, want, BINARY, TOLERANCE[dtype], f"{target} {dtype} on {env['x'].tolist()}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("text", REDUCTIONS)
def test_reductions_and_finalisers_of_rows_holding_special_values(text: str, target: str, dtype: str):
    text, ranges, env = reduction_case(text, dtype, target)
    got = run(target, text, ranges, env, dtype)
    _check(got, expected(text, ranges, env, dtype), None, SUM_TOLERANCE[dtype], f"{target} {dtype} {text}")
