"""Recurrences under shard_map over 4 host devices (the batch axis split): the scan kernel, its tangent recurrence
and its gradient kernels run once per shard on the local block, on c; and jit of sharded inputs (the partitioner
splits the batch index, and the initial state with it; before, it gathered the initial state whole and each
device read rows 0.. of it). Checked against a lax.scan oracle in the subprocess (XLA's device count is fixed when
jax initialises: XLA_FLAGS=--xla_force_host_platform_device_count=4)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from loop_backends import c_unavailable

SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    import tullax
    from tullax.runtime import stats

    jax.config.update("jax_enable_x64", True)
    assert jax.device_count() == 4, jax.devices()
    TEXT = "h[b,t,n] := lam[n]*h[b,t-1,n] + x[b,t,n]  (t scan from h0)"
    kernel = tullax.einsum_kernel(TEXT, backend="c")

    def oracle(lam, x, h0):
        def step(h, xt):
            h = lam * h + xt
            return h, h
        return jnp.moveaxis(jax.lax.scan(step, h0, jnp.moveaxis(x, 1, 0))[1], 0, 1)

    mesh = jax.make_mesh((4,), ("x",))
    rng = np.random.default_rng(0)
    lam = jnp.asarray(rng.uniform(0.5, 0.95, 3))
    xh, h0h = rng.standard_normal((8, 6, 3)), rng.standard_normal((8, 3))  # the oracle's, on one device
    x = jax.device_put(jnp.asarray(xh), NamedSharding(mesh, P("x")))
    h0 = jax.device_put(jnp.asarray(h0h), NamedSharding(mesh, P("x")))
    close = lambda got, want: np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-12)
    report = {}

    def sharded(f):
        return jax.shard_map(f, mesh=mesh, in_specs=(P(), P("x"), P("x")), out_specs=P("x"))

    stats.reset()
    close(jax.jit(sharded(kernel))(lam, x, h0), oracle(lam, xh, h0h))
    report["forward"] = stats.by_spec()

    loss = lambda f: (lambda lam, x, h0: jnp.sum(f(lam, x, h0) ** 2))
    stats.reset()
    got = jax.jit(jax.grad(loss(sharded(kernel)), (0, 1, 2)))(lam, x, h0)
    for g, w in zip(got, jax.grad(loss(oracle), (0, 1, 2))(lam, xh, h0h)):
        close(g, w)
    report["grad"] = stats.by_spec()

    tangents = (jnp.ones(3), jnp.ones((8, 6, 3)), jnp.ones((8, 3)))
    stats.reset()
    got = jax.jit(lambda *a: jax.jvp(sharded(kernel), a, tangents))(lam, x, h0)
    close(got[1], jax.jvp(oracle, (lam, xh, h0h), tangents)[1])
    report["jvp"] = stats.by_spec()

    # no shard_map: jit of sharded inputs, split by the partitioner along the batch index
    out = jax.jit(kernel)(lam, x, h0)
    close(out, oracle(lam, xh, h0h))
    report["jit_sharding"] = str(out.sharding.spec)
    # a state that mixes its lanes: split along the batch only (each step reads the whole state along n)
    W = jnp.asarray(rng.standard_normal((3, 3)) / 2)
    elman = tullax.einsum_kernel("h[b,t,n] := W[n,m]*h[b,t-1,m] |> tanh(_ + x[b,t,n])  (t scan)", backend="c")
    def elman_oracle(W, x):
        step = lambda h, xt: (jnp.tanh(h @ W.T + xt),) * 2
        return jnp.moveaxis(jax.lax.scan(step, jnp.zeros((x.shape[0], 3)), jnp.moveaxis(x, 1, 0))[1], 0, 1)
    xn = jax.device_put(jnp.asarray(xh), NamedSharding(mesh, P("x", None, None)))
    close(jax.jit(elman)(W, xn), elman_oracle(W, xh))
    print("REPORT" + json.dumps(report))
""")


@pytest.fixture(scope="module")
def report() -> dict:
    if c_unavailable():
        pytest.skip(f"c backend: {c_unavailable()}")
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
               TULLAX_PLAN_TIMING="0")
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("REPORT"))
    return json.loads(line[len("REPORT"):])


SCAN = "h[b,t,n] := lam[n]*h[b,t-1,n] + x[b,t,n]  (t scan from h0)"


def test_shard_map_runs_the_scan_kernel_once_per_shard(report):
    assert report["forward"] == {SCAN: 4}


def test_shard_map_runs_the_adjoint_recurrence_and_each_gradient_kernel_once_per_shard(report):
    assert report["grad"][SCAN] == 4
    assert len(report["grad"]) >= 3 and set(report["grad"].values()) == {4}, report["grad"]


def test_shard_map_runs_the_tangent_recurrence_once_per_shard(report):
    tangent = "dh[b,t,n] := ifelse(t >= 1, h[b,pad(t-1),n], h0[b,n])*dlam[n] + lam[n]*dh[b,t-1,n] + dx[b,t,n]  " \
              "(t scan from dh0)"
    assert report["jvp"] == {SCAN: 4, tangent: 4}, report["jvp"]


def test_jit_of_inputs_sharded_along_the_batch_keeps_the_result_sharded(report):
    assert report["jit_sharding"].split("(", 1)[1].startswith("'x'"), report["jit_sharding"]
