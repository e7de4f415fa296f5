"""Every kind of user mistake of issue 2 gives the right TullaxError subclass, a message that says what is wrong
and what to do, and (for mistakes in the spec text) a caret under the offending column."""
from __future__ import annotations

import re

import jax
import numpy as np
import pytest

from tullax import backends
from tullax.backends.base import Signature
from tullax.backends.xla.backend import XlaBackend
from tullax.backends.xla.lower import lower
from tullax.errors import (
    BackendUnavailableError,
    ShapeError,
    SpecError,
    TullaxError,
)
from tullax.spec.analyze import analyze
from tullax.spec.parse import parse_spec
from tullax.spec.shapes import check_dtypes, check_index_values, check_shapes
from tullax.testing.oracle import naive_eval

# (spec, message pattern, the text the caret must point at; "" means the end of the spec)
SPEC_MISTAKES = [
    # brackets and parentheses that don't close (or close twice)
    ("C[i,j] := A[i,k]*B[k,j", r"expected ',' or '\]' but found the end of the spec", ""),
    ("C[i,j] := A[i,k]*B[k,j]]", r"unexpected '\]' after the end of the expression", "]"),
    ("C[i,j] := (A[i,k]*B[k,j]", r"expected '\)' but found the end of the spec", ""),
    ("C[i,j] := A[i,k]*B[k,j])", r"unexpected '\)'", ")"),
    ("y[i] := x[mod(i)", r"expected ',' or '\]'", ""),
    ("(max C[i] := A[i,j]", r"expected '\)' closing the reduction", "C[i]"),
    # tokens outside the grammar
    ("y[i] := x[i] $ 2", r"unexpected character '\$'", "$ 2"),
    ("y[i] := x[i] € 2", r"unexpected character '€'", "€ 2"),
    ("y[i] := x[i] +", r"expected a number, a name, an array access or '\('", ""),
    ("y[i] x[i]", r"expected ':=', '=', '\+=' or '\*=' after the left-hand side", "x[i]"),
    (":= x[i]", r"expected the name of the result", ":="),
    ("1y[i] := x[i]", r"expected the name of the result", "1y"),
    ("y[i] := x[i] y[i]", r"unexpected 'y' after the end of the expression", "y[i]"),
    ("y[i] := x[i] := z[i]", r"unexpected ':='", ":= z"),
    ("y[i] := x[]", r"x\[\] has no indices: write x for a scalar input", "]"),
    ("", r"empty spec: write something like", ""),
    # unknown functions and reductions, wrong arity, misplaced wrappers
    ("C[i,j] := foo(A[i,j])", r"unknown function 'foo': allowed are exp, log", "foo("),
    ("y[i] := eval(x[i])", r"unknown function 'eval'", "eval("),
    ("(sum) C[i] := A[i,j]", r"unknown reduction 'sum': use one of \+ \* max min logsumexp", "sum)"),
    ("y[i] := x[i] |> foo", r"'\|>' needs a one-argument function", "foo"),
    ("y[i] := x[i] |> max", r"'\|>' needs a one-argument function", "max"),
    ("y[i] := exp(x[i], 2)", r"exp takes 1 argument, got 2", "exp("),
    ("y[i] := max(x[i])", r"max takes 2 or more arguments, got 1", "max("),
    ("y[i] := atan(x[i], 1, 2)", r"atan takes 1 or 2 arguments, got 3", "atan("),
    ("y[i] := ifelse(x[i], 1)", r"ifelse takes 3 arguments, got 2", "ifelse("),
    ("y[i] := mod(x[i])", r"mod\(...\) wraps an index: use it inside brackets", "mod("),
    ("y[i] := x[i] < z[i] < w[i]", r"chained comparisons are ambiguous: add parentheses", "< w[i]"),
    # index expressions that are not affine
    ("y[i] := x[i*j]", r"an index must be affine: the product of two indices", "*j]"),
    ("y[i] := x[i^2]", r"an index must be affine: no powers", "^2]"),
    ("y[i] := x[1.5]", r"index positions are integers, not 1.5", "1.5]"),
    ("y[i] := x[i/2]", r"a divided index is only allowed inside pad", "i/2]"),
    ("y[i] := x[pad(i/0)]", r"an index can only be divided by a positive integer", "0)]"),
    ("y[i] := x[ix[jx[i]]]", r"an indirect index cannot be nested", "jx[i]"),
    # left-hand sides that repeat or shift an index
    ("y[i,i] = x[i]", r"index i appears twice on the left-hand side of .=.: only a new result", "i] ="),
    ("y[i+1] := x[i]", r"the left-hand side must list plain, distinct indices; .* scatter with \+=", "i+1]"),
    ("y[ix[i]] := x[i]", r"the left-hand side must list plain, distinct indices", "ix[i]"),
    # an index nothing bounds
    ("y[i] := x[j]", r"index i is on the left but nowhere on the right .* ranges=\{'i': 10\}", "i] :="),
    ("y[k] := x[i]", r"index k is on the left but nowhere on the right", "k] :="),
    ("y[i] := x[mod(i+1)]*w[pad(i)]", r"cannot infer the range of index i", "i] :="),
    # names used inconsistently
    ("y[i] := x[i]*x[i,j]", r"x is indexed with 2 indices here but with 1 elsewhere", "x[i,j]"),
    ("y[i] := x[i] + x", r"x is an array: index it, as in x\[i\]", "x"),
    ("y[i] := y[i]", r"y is the result being defined with ':=', it cannot appear on the right", "y[i]"),
    ("y[i] := i[i]", r"i is used both as an index and as an array", "i[i]"),
    # habits from NumPy and Python
    ("y[i] := x[i]**2", r"'\*\*' is not the power operator in a spec: write '\^', as in x\[i\]\^2", "**2"),
    ("y[i] := x[i] * *z[i]", r"expected a number, a name, an array access", "*z"),
    ("y[i] := sum(x[i,j])", r"sum\(...\) is not a function: reductions are implicit: .* y\[i\] := x\[i,j\] "
                            r"sums over j", "sum("),
    ("y[i] := prod(x[i,j])", r"reductions are implicit: .* write \(\*\) y\[i\] := x\[i,j\]", "prod("),
    ("y[i] := mean(x[i,j])", r"reductions are implicit: .* \|> _ / size\(x,1\)", "mean("),
    # a running sum written out by hand: was "s is an array: index it", for a scalar result
    ("s = s + x[i]", r"s is the result being defined; .* implicit: write `s := ...` with only the summed term", "s +"),
    ("s := s + x[i]", r"s is the result being defined; .* implicit: write `s := ...`", "s +"),
]


def caret_column(message: str, spec: str) -> int:
    """The column the rendered message's caret points at, checking the spec is printed just above it."""
    lines = message.splitlines()
    assert lines[-2] == "    " + spec
    assert lines[-1].strip() == "^"
    return lines[-1].index("^") - 4


@pytest.mark.parametrize("text, message, at", SPEC_MISTAKES, ids=[m[0] or "<empty>" for m in SPEC_MISTAKES])
def test_spec_mistakes_point_at_the_column(text, message, at):
    with pytest.raises(SpecError, match=message) as info:
        analyze(parse_spec(text))
    err = info.value
    assert err.column is not None
    assert caret_column(str(err), text) == err.column
    if at == "":
        assert err.column == len(text)
    else:
        assert text[err.column:].startswith(at), (text, err.column, at)


def test_a_scatter_with_another_reduction_is_refused():
    with pytest.raises(SpecError, match=r"a scatter .* only sums: no reduction or \|> finaliser"):
        analyze(parse_spec("(max) y[i+1] += x[i]"))


@pytest.mark.parametrize("value", [None, 3, ["y[i] := x[i]"]])
def test_a_spec_must_be_a_string(value):
    with pytest.raises(SpecError, match="a spec is a string"):
        parse_spec(value)


def test_a_spec_is_one_line():
    with pytest.raises(SpecError, match="a spec is one line"):
        parse_spec("y[i] := x[i]\n+ 1")


@pytest.mark.parametrize("ranges, message", [
    ({"q": 3}, r"ranges names 'q', which is not an index of this spec \(indices: i, k\)"),
    ({"i": (5, 2)}, r"is empty backwards: stop must be >= start"),
    ({"i": "7"}, r"ranges\['i'\] must be an int or a \(start, stop\) pair"),
    ({"i": True}, r"ranges\['i'\] must be an int or a \(start, stop\) pair"),
    ({"i": (1, 2, 3)}, r"ranges\['i'\] must be an int or a \(start, stop\) pair"),
])
def test_bad_explicit_ranges(ranges, message):
    with pytest.raises(SpecError, match=message):
        analyze(parse_spec("y[i] := x[i+k]*w[k]"), ranges)


# ---------------------------------------------------------------------------------------------
# Mistakes in the arrays: ShapeError naming what does not fit
# ---------------------------------------------------------------------------------------------
MATMUL = "C[i,j] := A[i,k]*B[k,j]"


@pytest.mark.parametrize("shapes, message", [
    ({"A": (2, 3), "B": (4, 5)}, r"index k runs along axis 1 of A \(extent 3\) and axis 0 of B \(extent 4\): "
                                 r"these extents must be equal"),
    ({"A": (2, 3, 1), "B": (3, 5)}, r"A has rank 3 \(shape \(2, 3, 1\)\) but the spec indexes it with 2 indices"),
    ({"A": (2, 3)}, r"missing input B"),
])
def test_rank_and_extent_mismatches(shapes, message):
    spec = analyze(parse_spec(MATMUL))
    with pytest.raises(ShapeError, match=message):
        check_shapes(spec, shapes)
    with pytest.raises(ShapeError, match=message):
        lower(spec)({name: np.ones(shape) for name, shape in shapes.items()})


def test_rank_mismatch_also_under_jit():
    spec = analyze(parse_spec(MATMUL))
    with pytest.raises(ShapeError, match="index k runs along axis 1 of A"):
        jax.jit(lower(spec))({"A": np.ones((2, 3)), "B": np.ones((4, 5))})


def test_arrays_too_short_for_the_shifts():
    spec = analyze(parse_spec("y[i] := x[i+k]*w[k]"))
    with pytest.raises(ShapeError, match=r"index i has an empty range: .* is 0 <= i < -2"):
        check_shapes(spec, {"x": (3,), "w": (6,)})


def test_explicit_range_beyond_the_array():
    spec = analyze(parse_spec("C[i,j] := A[i,k]*B[k,j]"), {"k": 5})
    with pytest.raises(ShapeError, match=r"axis 1 of A is indexed by k, which reaches 4 but the axis has extent 3"):
        check_shapes(spec, {"A": (2, 3), "B": (3, 4)})


def test_index_arrays_must_hold_integers_in_range():
    spec = analyze(parse_spec("out[b,d] := W[ix[b],d]"))
    with pytest.raises(ShapeError, match=r"ix is used as an index array .* must hold integers, got dtype float64"):
        check_dtypes(spec, {"W": np.float64, "ix": np.float64})
    with pytest.raises(ShapeError, match=r"ix\[2\] = -1 is outside axis 0 of W \(extent 3"):
        check_index_values(spec, {"W": np.ones((3, 2)), "ix": np.array([0, 1, -1])})
    with pytest.raises(ShapeError, match=r"ix\[2\] = -1 is outside axis 0 of W"):
        naive_eval(spec, {"W": np.ones((3, 2)), "ix": np.array([0, 1, -1])})


def test_scalar_given_an_array():
    spec = analyze(parse_spec("y[i] := a*x[i]"))
    with pytest.raises(ShapeError, match=r"a is a scalar parameter of the spec, but got an array of shape \(3,\)"):
        check_shapes(spec, {"a": (3,), "x": (3,)})


def test_wrong_number_of_inputs_to_a_host_kernel():
    spec = analyze(parse_spec(MATMUL))
    kernel = XlaBackend().build(spec, Signature(("float64", "float64"), "float64"))
    with pytest.raises(ShapeError, match=r"the kernel takes 2 inputs \(A, B\), got 1"):
        kernel(np.zeros((2, 2)), np.ones((2, 3)))


def test_arguments_in_the_wrong_order_show_the_expected_order_and_ranks():
    import tullax

    kernel = tullax.einsum_kernel("W[ix[b],d] += g[b,d]", backend="xla")
    W, g, ix = np.zeros((10, 4)), np.ones((3, 4)), np.array([1, 2, 3])
    expected = (r"the kernel takes W \(rank 2\), g \(rank 2\), ix \(rank 1, integers\), in this order \(or by "
                r"name\); got shapes W=\(3, 4\), g=\(3,\), ix=\(10, 4\)")
    with pytest.raises(ShapeError, match=r"g is indexed with 2 indices in the spec but has rank 1(.|\n)*" + expected):
        kernel(g, ix, W)
    with pytest.raises(ShapeError, match=r"the kernel takes W \(rank 2\), g \(rank 2\), ix \(rank 1, integers\)"):
        jax.jit(kernel)(g, ix, W)
    np.testing.assert_allclose(kernel(W, g, ix)[1:4], g)


def test_equals_for_a_new_array_suggests_colon_equals():
    import tullax

    kernel = tullax.einsum_kernel("C[i,j] = A[i,k]*B[k,j]", backend="xla")
    with pytest.raises(ShapeError, match=r"missing input B: .* with '=' the existing C is the first input, written "
                                         r"into: to create a new C write ':=' instead of '='"):
        kernel(np.ones((2, 3)), np.ones((3, 4)))


def test_the_docstring_and_bench_help_name_every_backend():
    import tullax
    from tullax.cli.bench import build_parser

    listed = tullax.einsum_kernel.__doc__
    help_text = " ".join(build_parser().format_help().split())
    for name in backends.names():
        assert f"'{name}'" in listed, name
    for name in ("auto", "c", "numba", "julia", "julia-cuda", "cuda"):
        assert re.search(rf"[ ,]{re.escape(name)}[,; ]", help_text), name


def test_unknown_backend():
    with pytest.raises(BackendUnavailableError, match=r"unknown backend 'nope': valid names are .*xla"):
        backends.get("nope")


def test_every_error_is_a_value_error():
    for cls in (SpecError, ShapeError, BackendUnavailableError):
        assert issubclass(cls, TullaxError) and issubclass(cls, ValueError)
