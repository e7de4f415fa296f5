"""``end`` in an index is the last position of that axis, as in Julia and Tullio (issue 13): before, ``x[i,end]``
silently summed over an index named ``end``."""
from __future__ import annotations

import numpy as np
import pytest

import tullax
from tullax.errors import SpecError

x = np.random.default_rng(0).random((3, 5))
w = np.arange(1.0, 4.0)

CASES = [
    ("y[i] := x[i,end]", lambda a: a[:, -1]),
    ("y[i] := x[i,end-1]", lambda a: a[:, -2]),
    ("y[i] := x[end-i,0]", lambda a: a[::-1, 0]),
    ("y[i] := x[i,2end-6]", lambda a: a[:, 2]),
    ("y[i] := x[i,mod(end+1)]", lambda a: a[:, 0]),
    ("y[j] := x[end,j] - x[0,j]", lambda a: a[-1] - a[0]),
]


@pytest.mark.parametrize("backend", ["numba", "xla"])
@pytest.mark.parametrize("spec, reference", CASES, ids=[c[0] for c in CASES])
def test_end_is_the_last_position_forward_and_backward(spec, reference, backend):
    import jax
    import jax.numpy as jnp

    kernel = tullax.einsum_kernel(spec, backend=backend)
    np.testing.assert_allclose(kernel(x), reference(x), rtol=1e-12)
    weights = jnp.arange(1.0, 1.0 + len(reference(x)))
    xs = jnp.asarray(x, jnp.float32)
    got = jax.grad(lambda a: (kernel(a) * weights).sum())(xs)
    want = jax.grad(lambda a: (reference(a) * weights).sum())(xs)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)


def test_end_of_an_index_array_and_of_an_existing_output():
    ix = np.array([4, 0, 2])
    got = tullax.einsum_kernel("y[j] := x[ix[end],j]", backend="xla")(x=x, ix=ix)
    np.testing.assert_allclose(np.asarray(got), x[2])
    got = tullax.einsum_kernel("y[end] += 2*w[0]", backend="numba")(np.zeros(3), w)
    np.testing.assert_allclose(got, [0.0, 0.0, 2.0])


def test_the_canonical_text_and_the_gradients_write_end():
    text = tullax.explain("s := x[end]*y[end-1]")
    assert text.splitlines()[0].endswith("s := x[end]*y[end-1]")
    assert "Δx[m] := Δs*y[end-1]" in text


def test_end_on_the_left_of_a_new_result_is_an_error():
    with pytest.raises(SpecError, match="'end' on the left of ':='"):
        tullax.einsum_kernel("y[end] := x[0,0]")
