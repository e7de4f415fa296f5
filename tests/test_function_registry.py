"""Every function of the registry (``tullax.spec.functions``), forward and backward, on the xla and numba
backends: a registered function is tested without anyone writing a test for it.

One small spec per function (``y[i] := f(x1[i], ...)``, and for a one-argument function also the finaliser
form ``y[i] := x[i] |> f``, whose gradient may read the forward result through ``from_output``). Forward:
against the naive evaluator, which runs the registry's NumPy implementation. Backward: ``jax.grad`` through
the tullax kernel (the derived gradient kernels, from the registry's derivative texts) against ``jax.grad``
of the plain jnp lowering (the registry's jax implementation, differentiated by jax itself).

The inputs are fixed points away from the kinks of abs and relu; each argument keeps only the points inside
the function's domain, as its NumPy implementation says (``log`` keeps the positive ones).
"""
from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tullax
from tullax.backends.xla.lower import lower
from tullax.spec import functions
from tullax.spec.frontend import compile_spec
from tullax.testing.oracle import naive_eval

BACKENDS = ("xla", "numba")
POINTS = np.array([-1.4, -0.9, -0.35, 0.3, 0.75, 1.3])
RTOL, ATOL = 1e-9, 1e-12


def in_domain(function: functions.Function, points: np.ndarray) -> np.ndarray:
    """The points where the function (and so its derivative, away from the domain's edge) is finite."""
    if function.numpy is None:  # structural (max, min, ifelse): defined everywhere
        return points
    with np.errstate(all="ignore"):
        finite = np.array([np.isfinite(function.numpy(*[p] * function.arity)) for p in points])
    assert finite.any(), f"no point of {points} is in the domain of {function.name}"
    return points[finite]


def call_spec(function: functions.Function) -> tuple[str, list[np.ndarray]]:
    """``y[i] := f(x1[i], ..., xn[i])``; the arguments are the points in different orders, so no two
    arguments of max/min tie."""
    points = in_domain(function, POINTS)
    names = [f"x{n}" for n in range(1, function.arity + 1)]
    args = ", ".join(f"{name}[i]" for name in names)
    return f"y[i] := {function.name}({args})", [np.roll(points, shift) for shift in range(function.arity)]


def finaliser_spec(function: functions.Function) -> tuple[str, list[np.ndarray]]:
    """``y[i] := x[i] |> f``: the finaliser's gradient reads the forward result (``from_output``) or, without
    one, recomputes the argument (``derivative``)."""
    return f"y[i] := x[i] |> {function.name}", [in_domain(function, POINTS)]


def variadic_spec(function: functions.Function) -> tuple[str, list[np.ndarray]]:
    """``y[i] := f(x1[i], x2[i], x3[i])`` for a variadic function (folded into nested calls by the parser)."""
    points = in_domain(function, POINTS)
    return f"y[i] := {function.name}(x1[i], x2[i], x3[i])", [np.roll(points, shift) for shift in range(3)]


def overload_spec(function: functions.Function) -> tuple[str, list[np.ndarray]]:
    """The function under the name it overloads: ``atan(x1[i], x2[i])`` is ``atan2``."""
    text, inputs = call_spec(function)
    return text.replace(f"{function.name}(", f"{function.overloads}(", 1), inputs


CASES = [pytest.param(call_spec, name, id=f"{name}-call") for name in functions.FUNCTIONS] + [
    pytest.param(finaliser_spec, name, id=f"{name}-finaliser") for name in functions.UNARY] + [
    pytest.param(variadic_spec, name, id=f"{name}-3-arguments")
    for name, f in functions.FUNCTIONS.items() if f.variadic] + [
    pytest.param(overload_spec, name, id=f"{name}-as-{f.overloads}")
    for name, f in functions.FUNCTIONS.items() if f.overloads]


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("make_spec, name", CASES)
def test_registered_function_forward_and_backward(make_spec, name: str, backend: str):
    text, inputs = make_spec(functions.get(name))
    kernel = tullax.einsum_kernel(text, backend=backend)
    spec = compile_spec(text)[1]
    expected = naive_eval(spec, dict(zip(spec.input_names, inputs)))
    np.testing.assert_allclose(kernel(*inputs), expected, rtol=RTOL, atol=ATOL, err_msg=f"forward of {text}")

    plain = lower(spec)
    cotangent = np.linspace(0.5, 1.5, expected.size).reshape(expected.shape)

    def loss(run):
        return lambda *values: jnp.sum(run(*values) * cotangent)

    # jitted: one compile each, where eager jax would compile every small op of the gradient on its own
    positions = tuple(range(len(inputs)))
    got = jax.jit(jax.grad(loss(kernel), argnums=positions))(*map(jnp.asarray, inputs))
    want = jax.jit(jax.grad(loss(lambda *values: plain(dict(zip(spec.input_names, values)))), argnums=positions))(
        *map(jnp.asarray, inputs))
    for name_of_input, g, w in zip(spec.input_names, got, want):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"gradient wrt {name_of_input} of {text}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("backend", BACKENDS)
def test_round_is_half_to_even_and_sign_keeps_zero_and_nan(backend: str, dtype):
    """``round`` rounds ties to the even neighbour on every backend, as NumPy's rint, jnp.round and Julia's round
    do (printed Julia: tests/test_julia_printer.py); sign(0) is 0 and sign(NaN) NaN, as jnp.sign."""
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 0.49999997, 0.0, np.nan], dtype)
    got = tullax.einsum_kernel("y[i] := round(x[i])", backend=backend)(x)
    np.testing.assert_array_equal(got, np.rint(x))
    np.testing.assert_array_equal(got, jnp.round(x))
    got = tullax.einsum_kernel("y[i] := sign(x[i])", backend=backend)(x)
    np.testing.assert_array_equal(got, np.sign(x))


def test_functions_of_several_arguments_parse_by_their_count():
    """``atan`` with two arguments is atan2 (as in Julia); max/min fold left; a wrong count says what fits."""
    assert compile_spec("y[i] := atan(a[i], b[i])")[1].body.fn == "atan2"
    assert compile_spec("y[i] := atan(a[i])")[1].body.fn == "atan"
    nested = compile_spec("y[i] := max(a[i], b[i], c[i])")[1].body
    assert nested.fn == "max" and nested.args[0].fn == "max" and nested.args[1].array == "c"
    with pytest.raises(tullax.SpecError, match="atan takes 1 or 2 arguments, got 3"):
        compile_spec("y[i] := atan(a[i], b[i], c[i])")
    with pytest.raises(tullax.SpecError, match="max takes 2 or more arguments, got 1"):
        compile_spec("y[i] := max(a[i])")
    with pytest.raises(tullax.SpecError, match="hypot takes 2 arguments, got 1"):
        compile_spec("y[i] := hypot(a[i])")


# Added as registry entries alone (issue 13): no product module outside the registry names any of them, which
# is the architecture's promise that a function every target spells as a call is one entry in one file.
ONE_ENTRY_FUNCTIONS = ("cbrt", "exp2", "log2", "log10", "atan", "atan2", "hypot", "floor", "ceil", "trunc", "round",
                       "erf")


def test_call_functions_are_named_only_in_the_registry():
    package = Path(tullax.__file__).parent
    registry = package / "spec" / "functions.py"
    for name in ONE_ENTRY_FUNCTIONS:
        assert functions.get(name).lowering == "call"
        assert re.search(rf"""["']{name}["']|\b{name}\b *=""", registry.read_text()), name
        named_in = [str(path.relative_to(package)) for path in package.rglob("*.py")
                    if path != registry and "testing" not in path.parts
                    and re.search(rf"""["']{name}["']""", path.read_text(encoding="utf-8"))]
        assert named_in == [], f"{name} is special-cased outside the registry, in {named_in}"
