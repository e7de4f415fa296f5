"""The result read on the right at another position than the one written is a SpecError naming the recurrence
trap (issue 44): ``h[t] = lam*h[t-1] + x[t]`` computed one step of a map from the ``h`` passed in (``[0, 1, 1,
...]`` on ``h = 0, lam = 0.5, x = 1``), not the recurrence it reads as. Reads at the written position stay."""
from __future__ import annotations

import numpy as np
import pytest
from loop_backends import c_param

import tullax
from tullax.errors import SpecError
from tullax.spec.analyze import analyze
from tullax.spec.parse import parse_spec

BACKENDS = [c_param(), "numba", "xla", "auto"]

# (spec, the read the caret points at)
SHIFTED_SELF_READS = [
    ("h[t] = lam*h[t-1] + x[t]", "h[t-1]"),
    ("h[t] += h[t-1]", "h[t-1]"),
    ("y[i] *= y[i+1]", "y[i+1]"),
    ("y[i] += A[i,j]*y[j]", "y[j]"),
    ("C[i,j] = C[j,i] + A[i,j]", "C[j,i]"),
    ("y[i] = y[0]*x[i]", "y[0]"),
    ("n[i] = x[i,j]^2 |> sqrt(_ + n[mod(i+1)])", "n[mod(i+1)]"),
    ("W[ix[b],d] += W[jx[b],d]*g[b,d]", "W[jx[b],d]"),
]


@pytest.mark.parametrize("text, at", SHIFTED_SELF_READS, ids=[s[0] for s in SHIFTED_SELF_READS])
def test_a_read_of_the_result_at_another_position_is_refused_as_a_recurrence(text, at):
    with pytest.raises(SpecError) as info:
        analyze(parse_spec(text))
    err = info.value
    message = str(err)
    assert f"{at} reads the result" in message and "would be a recurrence" in message
    assert "one step of a map" in message and "with " + at + " read from the input" in message
    assert "a recurrence is written with ':=' and a scan clause" in message
    assert text[err.column:].startswith(at), (text, err.column, at)
    for entry in (tullax.explain, tullax.einsum_kernel):
        with pytest.raises(SpecError, match="would be a recurrence"):
            entry(text)


@pytest.mark.parametrize("text, example", [("y[i] := y[i-1] + x[i]", ", as y[i-1] beside y[i],"),
                                           ("y[i] := y[i]*x[i]", "")])
def test_the_new_result_on_the_right_says_which_update_is_allowed_and_which_is_a_recurrence(text, example):
    """':=' used to say "use '=' or '+='", which led straight into the one-step map."""
    with pytest.raises(SpecError) as info:
        analyze(parse_spec(text))
    message = str(info.value)
    assert "y is the result being defined with ':=', it cannot appear on the right" in message
    assert "from its value at the same position, write y[i] = ... y[i] ... (or +=)" in message
    assert f"a read at another position{example} is a recurrence: add its scan clause" in message
    assert "docs/recurrences.md" in message
    assert info.value.column == text.index("y[", 2)


RNG = np.random.default_rng(4)
A, B = RNG.standard_normal((3, 4)), RNG.standard_normal((4, 5))
C0, Y, X = RNG.standard_normal((3, 5)), RNG.standard_normal(6), RNG.standard_normal(6)
UPDATES = [
    ("C[i,j] += A[i,k]*B[k,j]", {"C": C0, "A": A, "B": B}, C0 + A @ B),
    ("y[i] = y[i]*x[i] + 1", {"y": Y, "x": X}, Y * X + 1),
    ("h[t] = lam*h[t] + x[t]", {"h": Y, "lam": 0.5, "x": X}, 0.5 * Y + X),
    ("y[i] *= y[i]*x[i+1]", {"y": Y, "x": X}, np.concatenate([Y[:5] * Y[:5] * X[1:], Y[5:]])),
    ("n[i] = x[i,j]^2 |> sqrt(_ + n[i])", {"n": np.abs(Y[:3]), "x": A}, np.sqrt((A ** 2).sum(1) + np.abs(Y[:3]))),
]


@pytest.mark.parametrize("text, args, want", UPDATES, ids=[u[0] for u in UPDATES])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_read_of_the_result_at_the_written_position_is_an_update(backend, text, args, want):
    got = tullax.einsum_kernel(text, backend=backend)(**args)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)
