"""One of the processes tests/test_distributed.py starts: ``jax.distributed`` on localhost, 2 host devices per
process, a mesh over every process's devices. Runs a sharded Dist (split along a free and along the summed index)
and a row logsumexp split along its summed index, and their gradients, on the c backend; checks them against
NumPy float64 and prints OK.

Usage: python tests/distributed_script.py PORT PROCESS_ID PROCESS_COUNT
"""
from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import tullax  # noqa: E402


def main(port: int, process: int, count: int) -> None:
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"localhost:{port}", num_processes=count, process_id=process,
                               initialization_timeout=60)
    assert jax.device_count() == 2 * count and jax.local_device_count() == 2, jax.devices()
    mesh = jax.make_mesh((jax.device_count(),), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    rng = np.random.default_rng(0)  # the same data in every process
    W, X, R = rng.standard_normal((8, 16)), rng.standard_normal((8, 12)), rng.standard_normal((16, 12))

    def place(value: np.ndarray, spec: P) -> jax.Array:
        sharding = NamedSharding(mesh, spec)
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

    def whole(value: jax.Array) -> np.ndarray:
        return np.asarray(multihost_utils.process_allgather(value, tiled=True))

    dist = tullax.einsum_kernel("D[i,j] := (W[k,i] - X[k,j])^2", backend="c")
    rows = tullax.einsum_kernel("(logsumexp) r[i] := x[i,j]", backend="c")
    diff = W[:, :, None] - X[:, None, :]
    D = (diff ** 2).sum(0)
    for specs in ((P(None, "x"), P()), (P("x"), P("x"))):  # i split; k (summed) split
        Wd, Xd = place(W, specs[0]), place(X, specs[1])
        np.testing.assert_allclose(whole(jax.jit(dist)(Wd, Xd)), D, rtol=1e-12)
        gW, gX = jax.jit(jax.grad(lambda W, X: jnp.sum(dist(W, X) ** 2), (0, 1)))(Wd, Xd)
        np.testing.assert_allclose(whole(gW), (4 * D[None] * diff).sum(2), rtol=1e-10)
        np.testing.assert_allclose(whole(gX), -(4 * D[None] * diff).sum(1), rtol=1e-10)
    Rd = place(R, P(None, "x"))  # j (summed) split across both processes
    top = R.max(1, keepdims=True)
    lse = (top + np.log(np.exp(R - top).sum(1, keepdims=True)))[:, 0]
    np.testing.assert_allclose(whole(jax.jit(rows)(Rd)), lse, rtol=1e-12)
    grad = jax.jit(jax.grad(lambda x: jnp.sum(rows(x) ** 2)))(Rd)
    np.testing.assert_allclose(whole(grad), 2 * lse[:, None] * np.exp(R - lse[:, None]), rtol=1e-10)
    jax.distributed.shutdown()
    print("OK", process)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:4]))
