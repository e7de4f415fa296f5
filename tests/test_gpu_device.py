"""On a real NVIDIA GPU: the cuda backend inside jit, grad (second order too), vmap and shard_map, against XLA
on the same GPU; results stay on the device; a host backend copies with its one warning. Skipped where jax has
no GPU (CI); run on a GPU machine with ``pytest tests/test_gpu_device.py``."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import tullax  # noqa: E402
from tullax.calls import device  # noqa: E402


def _gpu_and_cuda() -> str | None:
    """None when this machine can run the cuda backend on a GPU, else why not."""
    try:
        if jax.default_backend() != "gpu":
            return f"jax runs on {jax.default_backend()!r}, not a GPU"
    except RuntimeError as err:
        return str(err)
    from tullax import backends

    ok, why = backends.get("cuda").availability()
    return None if ok else why


pytestmark = pytest.mark.skipif(_gpu_and_cuda() is not None, reason=f"needs a GPU: {_gpu_and_cuda()}")

DIST = "D[i,j] := (W[k,i]-X[k,j])^2"
SPECS = [
    (DIST, {"W": (7, 33), "X": (7, 20)}),
    ("C[i,j] := W[k,i]*X[k,j]", {"W": (5, 9), "X": (5, 11)}),
    ("y[b,i] := x[b,i+k]*w[k]", {"x": (3, 40), "w": (5,)}),
    ("out[b,d] := W[ix[b],d]", {"W": (30, 6), "ix": (50,)}),
    ("(logsumexp) l[i] := x[i,j]", {"x": (13, 70)}),
    ("(max) m[i] := x[i,j]", {"x": (13, 70)}),
    ("y[n,o,h,w] := x[n,c,h+p,w+q]*k[o,c,p,q]", {"x": (2, 3, 9, 9), "k": (4, 3, 3, 3)}),
]
# Long sums over few output elements, which the cuda backend splits over more threads (tullax.compiler.split):
# conv1d's filter gradient, conv2d's, a sum to one element, row sums
SPLIT_SPECS = [
    ("y[b,i] := x[b,i+k]*w[k]", {"x": (16, 3000), "w": (7,)}),
    ("y[n,o,h,w] := x[n,c,h+p,w+q]*k[o,c,p,q]", {"x": (4, 3, 40, 40), "k": (4, 3, 3, 3)}),
    ("s := x[i,j]*y[i,j]", {"x": (300, 500), "y": (300, 500)}),
    ("r[i] := x[i,j]", {"x": (3, 100000)}),
]
SPECS += SPLIT_SPECS
# Shapes where the cuda backend runs Dist's and Linear's kernels as 64 x 64 block tiles (tullax.compiler.tiles):
# ragged tiles (130 = 2 x 64 + 2, 70 = 64 + 6) and a ragged last chunk (100 = 6 x 16 + 4) in every kernel
TILED_SHAPES = {"W": (100, 130), "X": (100, 70)}  # tests/test_cuda_tiles.py checks that every kernel tiles
TILED_SPECS = [(DIST, TILED_SHAPES), ("C[i,j] := W[k,i]*X[k,j]", TILED_SHAPES)]
SPECS += TILED_SPECS


def _inputs(kernel, shapes: dict, dtype) -> list:
    from tullax.spec.examples import random_inputs

    env = random_inputs(kernel.ir, shapes, seed=3, dtype=dtype)
    return [jnp.asarray(env[name]) for name in kernel.ir.input_names]


@pytest.fixture(autouse=True)
def x64():
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-4), (np.float64, 1e-10)])
@pytest.mark.parametrize("text, shapes", SPECS)
def test_forward_and_gradients_match_xla_on_the_gpu(text, shapes, dtype, rtol):
    cuda = tullax.einsum_kernel(text, backend="cuda")
    xla = tullax.einsum_kernel(text, backend="xla")
    args = _inputs(cuda, shapes, dtype)
    got = jax.jit(cuda)(*args)
    assert got.devices() == {jax.devices()[0]} and jax.devices()[0].platform == "gpu"
    np.testing.assert_allclose(got, jax.jit(xla)(*args), rtol=rtol, atol=rtol)
    live = tuple(k for k, a in enumerate(args) if jnp.issubdtype(a.dtype, jnp.floating))
    cot = jnp.asarray(np.random.default_rng(0).standard_normal(got.shape), got.dtype)

    def grads(kernel):
        return jax.jit(jax.grad(lambda *a: (kernel(*a) * cot).sum(), argnums=live))(*args)

    for g, w in zip(grads(cuda), grads(xla)):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol)


def test_second_order_gradients_match_xla():
    cuda, xla = (tullax.einsum_kernel(DIST, backend=b) for b in ("cuda", "xla"))
    W, X = _inputs(cuda, SPECS[0][1], np.float64)

    def hvp(kernel):
        inner = jax.grad(lambda w, x: jnp.sum(kernel(w, x) ** 2))
        return jax.jit(jax.grad(lambda w, x: jnp.sum(inner(w, x) * jnp.sin(w))))(W, X)

    np.testing.assert_allclose(hvp(cuda), hvp(xla), rtol=1e-9)


def test_vmap_matches_xla():
    cuda, xla = (tullax.einsum_kernel(DIST, backend=b) for b in ("cuda", "xla"))
    rng = np.random.default_rng(1)
    Wb = jnp.asarray(rng.standard_normal((4, 7, 33)))
    X = jnp.asarray(rng.standard_normal((7, 20)))
    for f in (lambda k: jax.vmap(k, in_axes=(0, None)),
              lambda k: jax.grad(lambda w, x: jnp.sum(jax.vmap(k, in_axes=(0, None))(w, x) ** 2))):
        np.testing.assert_allclose(jax.jit(f(cuda))(Wb, X), jax.jit(f(xla))(Wb, X), rtol=1e-10)


def test_shard_map_over_the_gpus_matches_xla():
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    cuda, xla = (tullax.einsum_kernel(DIST, backend=b) for b in ("cuda", "xla"))
    n = jax.device_count()
    mesh = jax.make_mesh((n,), ("x",))
    rng = np.random.default_rng(2)
    W = jax.device_put(jnp.asarray(rng.standard_normal((5, 8 * n))), NamedSharding(mesh, P(None, "x")))
    X = jax.device_put(jnp.asarray(rng.standard_normal((5, 6))), NamedSharding(mesh, P()))

    def loss(k):
        sharded = jax.shard_map(k, mesh=mesh, in_specs=(P(None, "x"), P()), out_specs=P("x", None))
        return lambda w, x: jnp.sum(sharded(w, x) ** 2)

    np.testing.assert_allclose(jax.jit(loss(cuda))(W, X), jax.jit(loss(xla))(W, X), rtol=1e-10)
    for g, w in zip(jax.jit(jax.grad(loss(cuda), (0, 1)))(W, X), jax.jit(jax.grad(loss(xla), (0, 1)))(W, X)):
        np.testing.assert_allclose(g, w, rtol=1e-10)


def test_auto_runs_without_the_copy_warning():
    from tullax.planner import rules as planner

    assert planner.on_gpu() and planner.loop_backend(("float32",)) in ("cuda", "julia-cuda")
    x = jnp.asarray(np.arange(12.0).reshape(3, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error", device.HostCopyWarning)
        out = jax.jit(tullax.einsum_kernel("s[i] := x[i,j]^2"))(x)
    np.testing.assert_allclose(out, (np.arange(12.0).reshape(3, 4) ** 2).sum(1))


@pytest.mark.parametrize("text, shapes", [
    ("C[i,j] := W[k,i]*X[k,j]", {"W": (256, 384), "X": (256, 320)}),  # a contraction: cuBLAS, by rule
    ("y[b,i] := x[b,i+k]*w[k]", {"x": (64, 8192), "w": (31,)}),  # timed: slices, cuDNN or cuda
    (DIST, {"W": (128, 1024), "X": (128, 512)}),  # timed: cuda, XLA's factored form or its broadcast
])
def test_auto_plans_each_kernel_on_the_gpu_and_matches_xla(text, shapes):
    """On a GPU ``auto`` races the cuda kernels against XLA's forms on the GPU, per kernel; whatever wins, the
    forward and the gradients match XLA and stay on the GPU."""
    from tullax.planner import decide as planner

    auto, xla = (tullax.einsum_kernel(text, backend=b) for b in ("auto", "xla"))
    args = _inputs(auto, shapes, np.float32)
    got = jax.jit(auto)(*args)
    assert got.devices() == {jax.devices()[0]}
    np.testing.assert_allclose(got, jax.jit(xla)(*args), rtol=1e-4, atol=1e-4)
    cot = jnp.asarray(np.random.default_rng(0).standard_normal(got.shape), got.dtype)

    def grads(kernel):
        return jax.jit(jax.grad(lambda *a: (kernel(*a) * cot).sum(), argnums=(0, 1)))(*args)

    for g, w in zip(grads(auto), grads(xla)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-3)
    plans = [found for key, found in planner._MEMO.items() if key[0] == auto.ir]
    assert plans and all(p.backend in ("xla", "cuda", "julia-cuda") for p in plans)
    if text.startswith("C[i,j]"):
        assert plans[0].backend == "xla" and plans[0].rule == "contraction"


def test_a_host_backend_on_the_gpu_copies_with_a_warning_and_is_right():
    x = jnp.asarray(np.arange(12.0).reshape(3, 4))
    kernel = tullax.einsum_kernel("t[i] := x[i,j]*3", backend="c")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        out = jax.jit(kernel)(x)
    np.testing.assert_allclose(out, np.arange(12.0).reshape(3, 4).sum(1) * 3)


def test_long_sums_over_few_outputs_run_split():
    from tullax.backends.cuda import backend as cuda_backend

    kernel = tullax.einsum_kernel(SPLIT_SPECS[0][0], backend="cuda")
    x, w = _inputs(kernel, SPLIT_SPECS[0][1], np.float32)
    jax.block_until_ready(jax.jit(jax.grad(lambda a, b: kernel(a, b).sum(), argnums=1))(x, w))
    assert any(built.kernel.split for built in cuda_backend._BUILT.values())


def test_a_split_sum_clears_its_output_on_every_call():
    """A split sum adds its pieces into the output, which the launch zeroes first on XLA's stream: without that,
    a buffer XLA hands out again would keep the last call's sum."""
    cuda = jax.jit(tullax.einsum_kernel("r[i] := x[i,j]", backend="cuda"))
    key = jax.random.PRNGKey(1)
    for _ in range(30):
        key, a = jax.random.split(key)
        x = jax.random.normal(a, (3, 100000), jnp.float32)
        np.testing.assert_allclose(cuda(x), np.asarray(x, np.float64).sum(1), rtol=1e-4, atol=1e-2)


def test_a_zero_start_gradient_clears_its_output_on_every_call():
    """The embedding's gradient starts from zeros that XLA no longer hands over: the launch clears the output on
    XLA's stream first (tullax.calls.device); without that, a reused buffer would keep the last call's sums. Its
    int64 indices (x64 on) index in 32 bits under their guard."""
    embedding = tullax.einsum_kernel("out[b,d] := W[ix[b],d]", backend="cuda")
    grad = jax.jit(jax.grad(lambda w, ix, c: (embedding(w, ix) * c).sum()))
    rng = np.random.default_rng(2)
    W = jnp.asarray(rng.standard_normal((300, 40)), jnp.float32)
    for _ in range(20):
        ix = rng.integers(0, 300, size=500)
        cot = rng.standard_normal((500, 40)).astype(np.float32)
        want = np.zeros((300, 40))
        np.add.at(want, ix, cot)
        np.testing.assert_allclose(grad(W, jnp.asarray(ix, jnp.int64), jnp.asarray(cot)), want, rtol=1e-4,
                                   atol=1e-4)


def test_many_calls_on_fresh_buffers_stay_right():
    """XLA reuses buffers in stream order: a launch on another stream, or a stale address, shows here."""
    cuda = jax.jit(tullax.einsum_kernel(DIST, backend="cuda"))
    xla = jax.jit(tullax.einsum_kernel(DIST, backend="xla"))
    key = jax.random.PRNGKey(0)
    outs = []
    for _ in range(50):
        key, a, b = jax.random.split(key, 3)
        W, X = jax.random.normal(a, (64, 300)), jax.random.normal(b, (64, 200))
        outs.append((cuda(W, X), xla(W, X)))
    for got, want in outs:
        np.testing.assert_allclose(got, want, rtol=1e-10)
