"""A constant offset on a shifted result index is never erased (issue 44): a ':=' result starts at position 0, so a
result index whose INFERRED range starts elsewhere (``y[i] := x[i-1]``: i in 1:size(x,0)+1) is a SpecError with a
caret under the access that moved it, saying what it would compute and what to write; a range the user wrote keeps
the shift (position 0 of the result is its start). Before, ``y[i] := x[i-1]`` returned ``x`` and
``x[i+k-1]*w[k]``, ``x[i+k]*w[k]``, ``x[i+k+1]*w[k]`` gave one result."""
from __future__ import annotations

import numpy as np
import pytest
from loop_backends import c_param

import tullax
from tullax.errors import SpecError
from tullax.spec.analyze import analyze
from tullax.spec.frontend import compile_spec
from tullax.spec.parse import parse_spec
from tullax.testing.specgen import random_call, random_spec

BACKENDS = [c_param(), "numba", "xla", "auto"]
RNG = np.random.default_rng(44)
X = RNG.standard_normal(9)
W = RNG.standard_normal(3)

# (spec, the access the caret points at, what the message says it would compute, the suggested pad read, clause)
REFUSED = [
    ("y[i] := x[i-1]", "x[i-1]", "y[i] := x[i]", "x[pad(i-1)]", "(i in 1:size(x,0)+1)"),
    ("y[i] := x[i+k-1]*w[k]", "x[i+k-1]", "y[i] := x[i+k]*w[k]", "x[pad(i+k-1)]",
     "(i in 1:-size(w,0)+size(x,0)+2)"),
    ("y[i] := x[i+k+1]*w[k]", "x[i+k+1]", "y[i] := x[i+k]*w[k]", "x[pad(i+k+1)]",
     "(i in -1:-size(w,0)+size(x,0))"),
    ("y[i] := x[i] - x[i-1]", "x[i-1]", "y[i] := x[i+1] - x[i]", "x[pad(i-1)]", "(i in 1:size(x,0))"),
    ("y[i] := x[-i]", "x[-i]", "y[i] := x[-i+end]", "x[pad(-i)]", "(i in -size(x,0)+1:1)"),
    ("y[i] := x[i-k]*w[k]", "x[i-k]", "y[i] := x[i-k+(size(w,0)-1)]*w[k]", "x[pad(i-k)]",
     "(i in size(w,0)-1:size(x,0))"),
    # a range written for the reduced index moves the free one: the clause is part of what it would compute
    ("y[i] := x[i+k]*w[k]  (k in range(1, 3))", "x[i+k]", "y[i] := x[i+k-1]*w[k]  (k in range(1, 3))",
     "x[pad(i+k)]", "(i in -1:size(x,0)-2)"),
    ("O[i,j] := A[i,j]*B[j-1]", "B[j-1]", "O[i,j] := A[i,j+1]*B[j]", "B[pad(j-1)]", "(j in 1:"),
]


@pytest.mark.parametrize("text, at, computes, pad, clause", REFUSED, ids=[r[0] for r in REFUSED])
def test_an_inferred_start_other_than_0_is_a_spec_error_under_the_access(text, at, computes, pad, clause):
    with pytest.raises(SpecError) as info:
        analyze(parse_spec(text))
    err = info.value
    message = str(err)
    assert "does not start at 0" in message and "the offset would be dropped" in message
    assert f"this would compute {computes} (position 0" in message
    assert f"Write what you mean: {pad} for a shifted read with 0 outside" in message
    assert clause in message and "ranges=" in message
    assert text[err.column:].startswith(at), (text, err.column, at)
    lines = message.splitlines()
    assert lines[-2] == "    " + text and lines[-1].index("^") - 4 == err.column
    for entry in (tullax.explain, tullax.einsum_kernel):  # every entry point: analysis is backend independent
        with pytest.raises(SpecError, match="does not start at 0"):
            entry(text)


def test_a_shifted_read_of_an_index_array_points_at_it_and_suggests_no_pad_inside_it():
    with pytest.raises(SpecError) as info:
        compile_spec("y[b] := x[ix[b+1]]")
    message = str(info.value)
    assert "where ix[b+1] stays inside ix" in message and "this would compute y[b] := x[ix[b]]" in message
    assert "pad" not in message
    assert info.value.column == len("y[b] := x[")


def test_a_diagonal_write_is_refused_without_printing_its_rewritten_form():
    with pytest.raises(SpecError, match=r"index i of the result would run over 1:.*the offset would be dropped "
                                        r"\(position 0 holding i = 1\)\. Write what you mean: B\[pad\(i-1\)\]"):
        compile_spec("(logsumexp) O[i,i] := A[i] + B[i-1]")


def _numpy(text: str) -> np.ndarray:
    """What a NumPy reader takes each accepted spec to mean (positions from 0; pad reads 0 outside)."""
    n, k = len(X), len(W)
    padded = np.concatenate([np.zeros(k), X, np.zeros(k)])  # padded[p + k] is x[p], 0 outside
    return {
        "y[i] := x[pad(i-1)]": np.concatenate([[0.0], X[:-1]]),
        "y[i] := x[i+k]*w[k]": np.array([X[i:i + k] @ W for i in range(n - k + 1)]),
        "y[i] := x[pad(i+k-1)]*w[k]": np.array([padded[i - 1 + k:i - 1 + 2 * k] @ W for i in range(n)]),
        "y[i] := x[pad(i+k+1)]*w[k]": np.array([padded[i + 1 + k:i + 1 + 2 * k] @ W for i in range(n)]),
        "y[i] := x[i] - x[pad(i-1)]": X - np.concatenate([[0.0], X[:-1]]),
        "y[i] := x[i+1] - x[i]": np.diff(X),
        # a written range keeps the shift: position 0 of the result holds i = 1
        "y[i] := x[i-1]  (i in 1:size(x,0)+1)": X,
        "y[i] := x[i+k-1]*w[k]  (i in 1:size(x,0)-size(w,0)+2)": np.array([X[i:i + k] @ W for i in range(n - k + 1)]),
        "y[i] := i*x[i-1]  (i in 1:size(x,0)+1)": np.arange(1, n + 1) * X,
    }[text]


ACCEPTED = ["y[i] := x[pad(i-1)]", "y[i] := x[i+k]*w[k]", "y[i] := x[pad(i+k-1)]*w[k]", "y[i] := x[pad(i+k+1)]*w[k]",
            "y[i] := x[i] - x[pad(i-1)]", "y[i] := x[i+1] - x[i]", "y[i] := x[i-1]  (i in 1:size(x,0)+1)",
            "y[i] := x[i+k-1]*w[k]  (i in 1:size(x,0)-size(w,0)+2)", "y[i] := i*x[i-1]  (i in 1:size(x,0)+1)"]


@pytest.mark.parametrize("text", ACCEPTED)
@pytest.mark.parametrize("backend", BACKENDS)
def test_what_to_write_instead_computes_what_numpy_reads(backend, text):
    kernel = tullax.einsum_kernel(text, backend=backend)
    args = [X, W] if "w[k]" in text else [X]
    np.testing.assert_allclose(np.asarray(kernel(*args)), _numpy(text), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_three_offsets_of_a_convolution_never_give_one_result(backend):
    """``x[i+k-1]``, ``x[i+k]``, ``x[i+k+1]`` (times ``w[k]``): each is refused or is what NumPy reads; before,
    all three returned the valid convolution."""
    results = []
    for offset in ("-1", "", "+1"):
        try:
            results.append(np.asarray(tullax.einsum_kernel(f"y[i] := x[i+k{offset}]*w[k]", backend=backend)(X, W)))
        except SpecError:
            continue
    assert len(results) == 1
    np.testing.assert_allclose(results[0], _numpy("y[i] := x[i+k]*w[k]"), rtol=1e-12)


def test_ranges_given_by_ranges_keep_the_shift_as_a_clause_does():
    clause = compile_spec("y[i] := x[i-1]  (i in 1:size(x,0)+1)")[1]
    assert compile_spec("y[i] := x[i-1]", {"i": (1, 10)})[1].out_shape[0].const == 9
    assert str(clause.out_shape[0]) == "size(x,0)"


def test_random_specs_write_the_ranges_that_do_not_start_at_0():
    """The fuzzer's specs stay valid: where a result index would not start at 0, the generator writes every result
    index's inferred range as a clause (the same result, through the explicit-range path)."""
    written = 0
    for seed in range(400):
        text = random_spec(seed)
        compile_spec(text)
        compile_spec(random_call(seed)[0])
        written += "  (i in " in text or "  (j in " in text or "  (k in " in text
    assert written  # some seeds need it: the check above covers them


def test_a_start_that_is_0_for_every_shape_is_not_a_shift():
    """``x[-i-3]`` starts ``i`` at max(-size(x,0)-2, 0), which no extent makes anything but 0: no shift to refuse
    (the int64-limit property tests of the c and numba backends meet it with an empty x)."""
    text = tullax.explain("y[i] := x[-1*i - 3] * z[i]")
    assert "i in 0:" in text
    with pytest.raises(tullax.SpecError, match="does not start at 0"):
        tullax.explain("y[i] := x[i-3] * z[i]")
