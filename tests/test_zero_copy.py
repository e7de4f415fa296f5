"""Zero copy on the buffer_callback path: the host kernel reads XLA's input buffers and writes XLA's output
buffer. A backend registered here wraps the real Numba kernels and records the addresses they receive."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tullax
from tullax import backends
from tullax.runtime import stats
from tullax.runtime.exchange import data_pointer


class RecordingBackend:
    """The Numba backend, noting the data address of every array its kernels are called with."""

    name = "numba-recording"

    def __init__(self):
        self.calls: list[dict] = []

    def availability(self):
        return backends.get("numba").availability()

    def generate_source(self, spec, signature):
        return backends.get("numba").generate_source(spec, signature)

    def build(self, spec, signature):
        inner = backends.get("numba").build(spec, signature)

        def kernel(out, *inputs):
            self.calls.append({"out": data_pointer(out),
                               "inputs": [data_pointer(a) if isinstance(a, np.ndarray) else None for a in inputs]})
            inner(out, *inputs)

        return kernel


@pytest.fixture
def recording(monkeypatch):
    monkeypatch.delenv("TULLAX_CALLBACK", raising=False)
    backend = RecordingBackend()
    backends.register(backend.name, backend)
    return backend


def _inputs():
    rng = np.random.default_rng(0)
    return jnp.asarray(rng.standard_normal((8, 256), dtype=np.float32)), jnp.asarray(
        rng.standard_normal((8, 128), dtype=np.float32))


def test_kernel_sees_xla_buffers_eagerly(recording):
    kernel = tullax.einsum_kernel("D[i,j] := (W[k,i] - X[k,j])^2", backend=recording.name)
    W, X = _inputs()
    out = kernel(W, X)
    (call,) = recording.calls
    assert call["inputs"] == [W.unsafe_buffer_pointer(), X.unsafe_buffer_pointer()]
    assert call["out"] == out.unsafe_buffer_pointer()


def test_kernel_sees_xla_buffers_under_jit(recording):
    kernel = tullax.einsum_kernel("o[i] := x[0,i]", backend=recording.name)
    x = jnp.ones((512, 1024), jnp.float32)  # 2 MiB: a copy would be at another address
    out = jax.jit(lambda v: kernel(v))(x)
    (call,) = recording.calls
    assert call["inputs"] == [x.unsafe_buffer_pointer()]
    assert call["out"] == out.unsafe_buffer_pointer()
    assert stats.paths["buffer"] >= 1


def test_pure_callback_path_copies_the_output(recording, monkeypatch):
    """The contrast that makes the test above meaningful: pure_callback returns a NumPy array that XLA copies."""
    monkeypatch.setenv("TULLAX_CALLBACK", "pure")
    kernel = tullax.einsum_kernel("o[i] := x[0,i]", backend=recording.name)
    x = jnp.ones((512, 1024), jnp.float32)
    out = jax.jit(lambda v: kernel(v))(x)
    (call,) = recording.calls
    assert call["out"] != out.unsafe_buffer_pointer()
    np.testing.assert_array_equal(out, np.ones(1024, np.float32))


def test_scatter_gradient_adds_into_its_zeros_in_place(recording):
    """The embedding gradient's scatter step ``ΔW[ix[b],d] += Δout[b,d]`` starts from zeros in its own output:
    XLA's zeros given AS its output (input_output_aliases), or, where huge pages can be had, its fresh output
    cleared by the callback (tests/test_zero_start.py). Nothing copies 50 MB of zeros into a fresh output."""
    kernel = tullax.einsum_kernel("out[b,d] := W[ix[b],d]", backend=recording.name)
    rng = np.random.default_rng(1)
    W = jnp.asarray(rng.standard_normal((300, 64), dtype=np.float32))
    ix = jnp.asarray(rng.integers(0, 300, 200))
    cotangent = jnp.asarray(rng.standard_normal((200, 64), dtype=np.float32))
    grad = jax.jit(lambda c, W: jax.vjp(lambda W: kernel(W, ix), W)[1](c)[0])(cotangent, W)
    scatter = recording.calls[-1]
    assert scatter["out"] == scatter["inputs"][0]  # the zeros and the result are one buffer
    expected = np.zeros((300, 64), np.float32)
    np.add.at(expected, np.asarray(ix), np.asarray(cotangent))
    np.testing.assert_allclose(np.asarray(grad), expected, rtol=1e-5, atol=1e-5)


def test_an_aliased_given_array_stays_untouched(recording):
    """'+=' into a given array that is still used afterwards: XLA copies it before the kernel writes."""
    kernel = tullax.einsum_kernel("y[ix[b]] += x[b]", backend=recording.name)
    y, x, ix = jnp.arange(6.0, dtype=jnp.float32), jnp.ones(4, jnp.float32), jnp.asarray([0, 2, 2, 5])
    new, old = jax.jit(lambda y, x, ix: (kernel(y, x, ix), y * 1))(y, x, ix)
    np.testing.assert_array_equal(np.asarray(new), [1.0, 1.0, 4.0, 3.0, 4.0, 6.0])
    np.testing.assert_array_equal(np.asarray(old), np.arange(6.0))
    np.testing.assert_array_equal(np.asarray(y), np.arange(6.0))


def test_a_body_that_reads_the_given_array_is_never_aliased(recording):
    """``y[i] += y[i]*x[i]`` reads the values from before the update: the output must be another buffer."""
    kernel = tullax.einsum_kernel("y[i] += y[i]*x[i]", backend=recording.name)
    y, x = jnp.arange(5.0, dtype=jnp.float32), jnp.full(5, 2.0, jnp.float32)
    out = jax.jit(kernel)(y, x)
    (call,) = recording.calls
    assert call["out"] != call["inputs"][0]
    np.testing.assert_array_equal(np.asarray(out), np.arange(5.0) * 3)
