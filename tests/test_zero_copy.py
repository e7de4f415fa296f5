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
