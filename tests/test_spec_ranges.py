"""Ranges inside the spec, Tullio style: ``y[i] := x[i+k]*w[k]  (k in 0:3)`` (issue 13).

Ranges are half-open and 0-based as everywhere in tullax: ``(k in 0:3)`` is ``ranges={"k": (0, 3)}``, k = 0, 1, 2.
Bounds may be symbolic (``size(x,1)-1``), written as ``explain`` prints them, so the canonical text (which
appends ``(k in lo:hi)`` for a reduced index the body never mentions) parses back to the same spec.
"""
from __future__ import annotations

import numpy as np
import pytest
from loop_backends import every_backend, skip_unavailable

import tullax
from tullax.errors import SpecError
from tullax.grad import gradients
from tullax.spec.analyze import analyze
from tullax.spec.frontend import compile_spec
from tullax.spec.parse import parse_spec
from tullax.spec.text import format_spec
from tullax.testing.oracle import naive_eval

RNG = np.random.default_rng(3)
x1, w4 = RNG.standard_normal(9), RNG.standard_normal(4)
x2 = RNG.standard_normal((3, 5))


def conv3(x, w):
    """y[i] = sum over k < 3 of x[i+k]*w[k] (w may be longer: only its first 3 entries are read)."""
    n = x.shape[0] - 2
    return sum(x[k:k + n] * w[k] for k in range(3))


CASES = [
    ("y[i] := x[i+k]*w[k]  (k in 0:3)", (x1, w4), conv3),
    ("y[i] := x[i,k]  (k in 1:size(x,1)-1)", (x2,), lambda x: x[:, 1:-1].sum(1)),
    ("s[i] := x[i]  (k in 0:4)", (x1,), lambda x: 4 * x),
    ("(max) m[i] := x[i,k]  (k in 2:size(x,1))", (x2,), lambda x: x[:, 2:].max(1)),
    ("y[i] := x[i,k]*(k in 0:2)", None, None),  # not a clause: a clause comes after the expression
]


@pytest.fixture(scope="module", autouse=True)
def x64():
    import jax

    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize("backend", ["numba", "xla"])
@pytest.mark.parametrize("spec, inputs, reference", CASES[:4], ids=[c[0] for c in CASES[:4]])
def test_forward_and_gradients_match_jnp(spec, inputs, reference, backend):
    import jax
    import jax.numpy as jnp

    kernel = tullax.einsum_kernel(spec, backend=backend)
    want = reference(*inputs)
    np.testing.assert_allclose(kernel(*inputs), want, rtol=1e-12)
    analysed = compile_spec(spec)[1]
    np.testing.assert_allclose(naive_eval(analysed, dict(zip(analysed.input_names, inputs))), want, rtol=1e-12)
    args = [jnp.asarray(v) for v in inputs]
    weights = jnp.asarray(RNG.standard_normal(np.shape(want)))
    argnums = tuple(range(len(args)))
    for jit in (False, True):
        def loss(fn, jit=jit):
            run = lambda *a: jnp.sum(jnp.cos(fn(*a)) * weights)  # noqa: E731
            return jax.jit(run) if jit else run
        got = jax.grad(loss(kernel), argnums=argnums)(*args)
        ref = jax.grad(loss(reference), argnums=argnums)(*args)
        for g, r in zip(got, ref):
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-10, atol=1e-12)


def test_a_clause_is_the_same_spec_as_ranges():
    assert compile_spec("y[i] := x[i+k]*w[k]  (k in 0:3)")[1] == compile_spec("y[i] := x[i+k]*w[k]", {"k": 3})[1]
    assert compile_spec("y[i] := x[i+k-1]*w[k] (k in range(1, 3))")[1] == \
        compile_spec("y[i] := x[i+k-1]*w[k]", {"k": (1, 3)})[1]
    both = compile_spec("y[i] := x[i+k]*w[k]  (k in 0:3)", {"k": range(0, 3)})[1]
    assert both == compile_spec("y[i] := x[i+k]*w[k]", {"k": 3})[1]


def test_a_clause_and_ranges_that_disagree_is_a_spec_error():
    with pytest.raises(SpecError, match="k has the range 0:3 in the spec but ranges= gives 0:4"):
        compile_spec("y[i] := x[i+k]*w[k]  (k in 0:3)", {"k": 4})


def test_half_open_like_python_and_explain():
    """``(k in 0:3)`` is three values, as ``ranges={'k': (0, 3)}`` and ``range(0, 3)``; explain prints it back."""
    got = tullax.einsum_kernel("s := x[k]  (k in 0:3)", backend="numba")(x1)
    np.testing.assert_allclose(got, x1[:3].sum())
    text = tullax.explain("y[i] := x[i+k]*w[k]  (k in 0:3)")
    assert "spec:      y[i] := x[i+k]*w[k]  (k in 0:3)" in text and "  k in 0:3 -> k = 0, 1, 2\n" in text


@pytest.mark.parametrize("text, line", [
    ("y[i] := x[i+k]*w[k]  (k in 0:3)", "  k in 0:3 -> k = 0, 1, 2\n"),
    ("y[i] := x[i+k-1]*w[k]  (k in range(1, 3))", "  k in 1:3 -> k = 1, 2\n"),
    ("s := x[k]  (k in 2:12)", "  k in 2:12 -> k = 2, 3, ..., 11\n"),
    ("y[i] := x[i,k]  (k in 1:size(x,1)-1)", "  k in 1:size(x,1)-1 -> k = 1, ..., size(x,1)-2\n"),
    ("C[i,j] := A[i,k]*B[k,j]", "  k in 0:size(A,1) -> k = 0, ..., size(A,1)-1\n"),
])
def test_explain_spells_out_the_values_of_every_range(text, line):
    """The half-open reading cannot be missed: explain lists the values each range gives."""
    assert line in tullax.explain(text)


def test_julia_style_one_based_clause_is_a_spec_error_that_says_what_to_write():
    """A Tullio user's (k in 1:3) means the first three positions (1-based, inclusive): (k in 0:3) here. Read
    half-open it would silently be k = 1, 2, so it is refused; range(1, 3) or ranges= says k = 1, 2 plainly."""
    with pytest.raises(SpecError, match=r"\(k in 1:3\) reads differently in Julia.*k = 1, 2.*\(k in 0:3\) here.*"
                                        r"\(k in range\(1, 3\)\).*ranges=\{'k': \(1, 3\)\}"):
        compile_spec("y[i] := x[i+k]*w[k]  (k in 1:3)")
    x, w = RNG.standard_normal(9), RNG.standard_normal(4)
    got = tullax.einsum_kernel("y[i] := x[i+k-1]*w[k]  (k in range(1, 3))", backend="numba")(x, w)
    # i runs over every value where each x[i+k-1] is in bounds for all k in 1, 2: i = 0, ..., 7
    np.testing.assert_allclose(got, [sum(x[i + k - 1] * w[k] for k in (1, 2)) for i in range(8)], rtol=1e-12)
    # the Tullio port: the first three positions
    got = tullax.einsum_kernel("s := w[k]  (k in 0:3)", backend="xla")(w)
    np.testing.assert_allclose(got, w[:3].sum(), rtol=1e-12)


@pytest.mark.parametrize("text", ["y[i] := x[i+k]  (k in 0:end)", "y[i] := x[i+k]  (k in 0:end-1)",
                                  "y[i] := x[i+k]  (k in end-2:3)"])
def test_end_in_a_range_clause_is_a_spec_error_that_says_what_to_write(text):
    with pytest.raises(SpecError, match=r"end is not a range bound.*0:size\(x,d\) runs to the last position"):
        compile_spec(text)


def test_clauses_combine_with_a_finaliser_and_several_indices():
    spec = "y[i] := x[i+k]*x[i+l] |> _ / size(x,0)  (k in 0:2) (l in range(1,3))"
    canonical, analysed = compile_spec(spec)
    assert canonical == "y[i] := x[i+k]*x[i+l] |> _/size(x,0)  (k in 0:2) (l in range(1, 3))"
    n = 9 - 2
    want = sum(x1[k:k + n] * x1[q:q + n] for k in range(2) for q in range(1, 3)) / 9
    for backend in ("numba", "xla"):
        np.testing.assert_allclose(tullax.einsum_kernel(spec, backend=backend)(x1), want, rtol=1e-12)


ROUND_TRIP = [
    "y[i] := x[i+k]*w[k]  (k in 0:3)",
    "y[i] := x[i,k]  (k in 1:size(x,1)-1)",
    "s[i] := x[i]  (k in 0:4)",
    "y[i] := x[i,k]  (k in 0:fld(size(x,1),2))",
    "y[i] := x[i,k]  (k in max(0, size(x,1)-4):min(3, size(x,1)))",
    "y[i] := 2*x[i]  (k in 0:2*size(x,0)+1)",
    "y[i] := x[i+k-1]*w[k]  (k in range(1, 3))",
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_canonical_text_parses_back_to_the_same_spec(text):
    canonical, spec = compile_spec(text)
    assert canonical == text
    again, respec = compile_spec(canonical)
    assert again == canonical and respec == spec


@pytest.mark.parametrize("forward", ["y[i] := x[i,k] + b[i]", "y[i,j] := x[i] + 0*z[j,k]",
                                     "y[i] := x[i,k] + b[i]  (k in range(1, 3))"])
def test_gradient_steps_with_unseen_reductions_parse_back_and_compute_the_same(forward):
    """A gradient step that sums over an index its body never mentions prints ``(k in lo:hi)``; that text is a
    spec of its own, and it computes what the derived step computes."""
    spec = compile_spec(forward)[1]
    steps = [s for g in gradients(spec) for s in g.steps if "  (" in format_spec(s)]
    assert steps, "expected a step with an unseen reduction"
    for step in steps:
        text = format_spec(step)
        reparsed = analyze(parse_spec(text))
        assert format_spec(reparsed) == text
        shapes = {"x": (3, 4), "b": (3,), "z": (2, 5), "Δy": (3,) if "j" not in forward else (3, 2)}
        env = {i.name: RNG.standard_normal(shapes[i.name]) for i in step.inputs}
        np.testing.assert_allclose(naive_eval(reparsed, env), naive_eval(step, env), rtol=1e-12)
        got = tullax.einsum_kernel(text, backend="numba")(*[env[n] for n in reparsed.input_names])
        np.testing.assert_allclose(got, naive_eval(step, env), rtol=1e-12)


@pytest.mark.parametrize("text, message", [
    ("y[i] := x[i+k]*w[k]  (k in 3:1)", "empty backwards"),
    ("y[i] := x[i+k]*w[k]  (k in 0:3) (k in 0:3)", "k is given two ranges"),
    ("y[i] := x[i+k]*w[k]  (k in 0)", "':' between the bounds"),
    ("y[i] := x[i+k]*w[k]  (k in 0:n)", "a range bound is an integer, size"),
    ("y[i] := x[i+k]*w[k]  (k in 0:size(x,0)*size(w,0))", "product of two sizes"),
    ("y[i] := x[i+k]*w[k]  (k in 0:size(x,3))", r"size\(x,3\) reads axis 3"),
    ("y[i] := x[i+k]*w[k]  (k in 0:3) + 1", "unexpected"),
    ("y[i] := x[i,k]*(k in 0:2)", "expected"),
])
def test_clause_mistakes_are_spec_errors(text, message):
    with pytest.raises(SpecError, match=message):
        compile_spec(text)


def test_cli_explain_cache_warm_and_bench_accept_clauses(tmp_path, monkeypatch, capsys):
    from tullax.cli import main

    spec = "y[i] := x[i+k]*w[k]  (k in 0:3)"
    monkeypatch.setenv("TULLAX_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["explain", spec]) == 0
    assert "  k in 0:3" in capsys.readouterr().out
    assert main(["cache", "warm", spec, "--backend", "numba", "--dtype", "float64"]) == 0
    assert "warmed 1 spec" in capsys.readouterr().out
    out = tmp_path / "bench.json"
    assert main(["bench", spec, "--shape", "x=40", "--shape", "w=3", "--backends", "xla", "--repeat", "1",
                 "--no-ttfk", "--quiet", "--json", str(out)]) == 0
    import json

    row = json.loads(out.read_text())["cases"][0]["results"]["xla"]
    assert row["status"] == "ok", row
    assert main(["bench", spec, "--shape", "x=40", "--shape", "w=3", "--range", "k=4", "--quiet"]) == 2
    assert "k has the range 0:3 in the spec but ranges= gives 0:4" in capsys.readouterr().err


def test_a_scalar_before_a_range_clause_is_not_a_call():
    """`... |> _*a  (z in 0:2)`: `a (z in 0:2)` read as a call of a function `a` (found by the property test)."""
    from tullax.spec.frontend import compile_spec

    spec = compile_spec("y[i] := x[i] |> _*a  (z in 0:2)", None)[1]
    assert "z" in spec.reduced


@pytest.mark.parametrize("backend", every_backend())
@pytest.mark.parametrize("ranges", [None, {"k": 5}], ids=["clause", "keyword"])
def test_a_ranged_index_that_indexes_no_array_is_summed_not_taken_as_a_scalar(backend, ranges):
    # `k` was taken as a scalar argument as well as summed over: the kernel wanted two arguments and its
    # gradient specs named a gradient for k; k's values are 0..4, so y = 10 x and dy/dx = 10
    import jax

    skip_unavailable(backend)
    text = "y[i] := x[i]*k" + ("  (k in 0:5)" if ranges is None else "")
    spec = analyze(parse_spec(text), ranges)
    assert [i.name for i in spec.inputs] == ["x"]
    assert [g.wrt for g in gradients(spec)] == ["x"]
    assert format_spec(gradients(spec)[0].steps[-1]).endswith("(k in 0:5)")  # the text parses back to the same
    kernel = tullax.einsum_kernel(text, backend=backend, ranges=ranges)
    np.testing.assert_allclose(np.asarray(kernel(x1)), 10 * x1, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.grad(lambda x: kernel(x).sum())(x1)), np.full_like(x1, 10), rtol=1e-6)
