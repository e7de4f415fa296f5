"""A gather from an empty table: under jit every read is outside the axis, so it gives what an out-of-range
gather gives (NaN for floats, the integer type's minimum, 0 under ``pad``) on every backend; eagerly on NumPy
arrays it is the ``ShapeError`` of any out-of-range index. The xla backend raised JAX's own TypeError under jit
(XLA's gather refuses a slice of an empty axis)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tullax
from tests.loop_backends import c_param
from tullax.errors import ShapeError

BACKENDS = [c_param(), "numba", "xla", "auto"]
IX = np.array([0, 2, 1], np.int64)

# (spec, the table's shape, dtype, what each result element is under jit)
CASES = [
    ("y[i,d] := W[ix[i],d]", (0, 3), "float32", np.nan),
    ("y[i] := 2*W[ix[i]] + 1", (0,), "float32", np.nan),
    ("y[i] := W[ix[i],d]", (0, 4), "float32", np.nan),  # a sum over d of NaN reads
    ("y[i,j] := W[ix[i]+j]*w[j]", (0,), "float32", np.nan),  # an index array's value inside affine arithmetic
    ("y[i,d] := W[pad(ix[i]),d] + 1", (0, 2), "float32", 1.0),  # pad reads 0 outside the axis
    ("y[i,d] := W[ix[i],d]", (0, 2), "int32", np.iinfo(np.int32).min),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spec,shape,dtype,expected", CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_a_gather_from_an_empty_table_under_jit(backend, spec, shape, dtype, expected):
    k = tullax.einsum_kernel(spec, backend=backend)
    env = {"W": jnp.zeros(shape, dtype), "ix": jnp.asarray(IX)} | ({"w": jnp.ones(2, dtype)} if "w[j]" in spec else {})
    out = np.asarray(jax.jit(lambda env: k(**env))(env))
    assert out.shape[0] == len(IX) and out.size > 0
    np.testing.assert_array_equal(out, np.full(out.shape, expected, out.dtype))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_gather_from_an_empty_table_eagerly_is_a_shape_error(backend):
    k = tullax.einsum_kernel("y[i,d] := W[ix[i],d]", backend=backend)
    with pytest.raises(ShapeError, match="outside axis 0 of W"):
        k(np.zeros((0, 3), np.float32), IX)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_gradient_of_a_gather_from_an_empty_table(backend):
    """The table's gradient under jit is empty (every read's cotangent dropped), as jnp.take's is."""
    k = tullax.einsum_kernel("y[i,d] := 3*W[ix[i],d]", backend=backend)
    gw = jax.jit(jax.grad(lambda w: jnp.sum(k(w, jnp.asarray(IX)))))(jnp.zeros((0, 3), jnp.float32))
    assert gw.shape == (0, 3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_padded_gather_from_an_empty_table_eagerly_reads_zeros(backend):
    k = tullax.einsum_kernel("y[i,d] := W[pad(ix[i]),d] + 1", backend=backend)
    np.testing.assert_array_equal(k(np.zeros((0, 2), np.float32), IX), np.ones((3, 2), np.float32))
