"""shard_map over 4 host devices: the kernel runs once per shard on its local block, forward and gradients.

XLA's device count is fixed when jax initialises, so the check runs in a subprocess with
XLA_FLAGS=--xla_force_host_platform_device_count=4.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    import tullax
    from tullax.backends.xla.lower import lower
    from tullax.spec.frontend import compile_spec
    from tullax.runtime import stats

    jax.config.update("jax_enable_x64", True)
    assert jax.device_count() == 4, jax.devices()
    TEXT = "D[i,j] := (W[k,i] - X[k,j])^2"
    kernel = tullax.einsum_kernel(TEXT, backend="numba")
    spec = compile_spec(TEXT)[1]
    plain = lambda W, X: lower(spec)(dict(W=W, X=X))
    mesh = jax.make_mesh((4,), ("x",))
    rng = np.random.default_rng(0)
    W = jax.device_put(jnp.asarray(rng.standard_normal((3, 8))), NamedSharding(mesh, P(None, "x")))
    X = jax.device_put(jnp.asarray(rng.standard_normal((3, 5))), NamedSharding(mesh, P()))
    report = {}

    def sharded(f):
        return jax.shard_map(f, mesh=mesh, in_specs=(P(None, "x"), P()), out_specs=P("x", None))

    stats.reset()
    out = jax.jit(sharded(kernel))(W, X)
    np.testing.assert_allclose(out, plain(W, X), rtol=1e-12)
    report["forward"] = stats.by_spec()

    loss = lambda f: (lambda W, X: jnp.sum(sharded(f)(W, X) ** 2))
    stats.reset()
    grads = jax.jit(jax.grad(loss(kernel), (0, 1)))(W, X)
    for got, want in zip(grads, jax.jit(jax.grad(loss(plain), (0, 1)))(W, X)):
        np.testing.assert_allclose(got, want, rtol=1e-10)
    report["grad"] = stats.by_spec()

    # gradients taken inside each shard, and a vmapped kernel per shard (one batched launch per shard)
    local_grad = jax.shard_map(jax.grad(lambda W, X: jnp.sum(kernel(W, X) ** 2)), mesh=mesh,
                               in_specs=(P(None, "x"), P()), out_specs=P(None, "x"))
    np.testing.assert_allclose(jax.jit(local_grad)(W, X), jax.jit(jax.grad(loss(plain)))(W, X), rtol=1e-10)
    Wb = jax.device_put(jnp.asarray(rng.standard_normal((8, 3, 4))), NamedSharding(mesh, P("x")))
    per_shard_vmap = jax.shard_map(jax.vmap(kernel, in_axes=(0, None)), mesh=mesh, in_specs=(P("x"), P()),
                                   out_specs=P("x"))
    stats.reset()
    np.testing.assert_allclose(jax.jit(per_shard_vmap)(Wb, X), jax.vmap(plain, in_axes=(0, None))(Wb, X),
                               rtol=1e-12)
    report["vmap"] = stats.by_spec()
    print("REPORT" + json.dumps(report))
""")


def run_on_four_devices() -> dict:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("REPORT"))
    return json.loads(line[len("REPORT"):])


def test_shard_map_runs_the_kernel_per_shard_forward_and_backward():
    report = run_on_four_devices()
    assert report["forward"] == {"D[i,j] := (W[k,i] - X[k,j])^2": 4}
    assert report["grad"] == {"D[i,j] := (W[k,i] - X[k,j])^2": 4,
                              "ΔW[k,i] := ΔD[i,j]*(2*(W[k,i] - X[k,j]))": 4,
                              "ΔX[k,j] := -(ΔD[i,j]*(2*(W[k,i] - X[k,j])))": 4}
    assert report["vmap"] == {"D[b,i,j] := (W[b,k,i] - X[k,j])^2": 4}
