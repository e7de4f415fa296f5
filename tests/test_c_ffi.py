"""The c backend's kernels as XLA custom calls (``tullax.backends.ffi``): one compiled FFI handler calls each
kernel's packed entry inside XLA's program, with no Python per call.

Checked against independent oracles: every corpus spec under jit against the naive evaluator, and bit for bit
against the same kernel through the buffer callback; gradients and vmap through the custom call; the launches
the handler counts; the '+=' update XLA aliases; and the refusals: a program naming a kernel this process never
registered fails with an error instead of calling into other code, and without a handler every kernel keeps the
buffer callback."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from corpus import CORPUS, Case
from loop_backends import c_unavailable

import tullax
from tullax.backends import ffi
from tullax.calls.host import updates_in_place
from tullax.errors import TullaxError
from tullax.runtime import stats
from tullax.spec.examples import random_inputs, shapes_for
from tullax.spec.frontend import compile_spec
from tullax.testing.oracle import naive_eval

pytestmark = pytest.mark.skipif(bool(c_unavailable()), reason=f"c backend: {c_unavailable()}")

DIST = "D[i,j] := (W[k,i] - X[k,j])^2"


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


@pytest.fixture
def path(monkeypatch):
    """Set TULLAX_CALLBACK for what a test traces next."""
    def choose(name: str) -> None:
        monkeypatch.setenv("TULLAX_CALLBACK", name)

    monkeypatch.delenv("TULLAX_CALLBACK", raising=False)
    return choose


def _inputs(case: Case):
    spec = compile_spec(case.spec, case.ranges)[1]
    env = random_inputs(spec, dict(case.shapes) if case.shapes else shapes_for(spec), seed=3)
    return spec, env, [jnp.asarray(env[name]) for name in spec.input_names]


def _custom_calls(fn, *args) -> int:
    return jax.jit(fn).lower(*args).as_text().count(ffi.TARGET)


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.id)
def test_every_corpus_spec_runs_as_a_custom_call_and_matches_the_oracle_and_the_callback(case, path, x64):
    spec, env, args = _inputs(case)
    kernel = tullax.einsum_kernel(case.spec, backend="c", ranges=case.ranges)
    try:
        kernel(*[env[name] for name in spec.input_names])
    except TullaxError as err:  # a spec the c backend refuses (complex numbers) refuses the same way under jit
        pytest.skip(f"c refuses {case.id}: {err}")
    result = jax.eval_shape(kernel, *args)
    served = spec.assign == ":=" or updates_in_place(spec, args, result)
    assert _custom_calls(kernel, *args) == served, "the custom call serves ':=' and updates XLA aliases"
    stats.reset()
    got = np.asarray(jax.jit(kernel)(*args))
    assert stats.paths["ffi" if served else "buffer"] == 1 and stats.total() == 1
    np.testing.assert_allclose(got, naive_eval(spec, env), rtol=1e-10, atol=1e-12)
    path("buffer")
    kernel = tullax.einsum_kernel(case.spec, backend="c", ranges=case.ranges)  # traced afresh, on that path
    assert _custom_calls(kernel, *args) == 0
    np.testing.assert_array_equal(got, np.asarray(jax.jit(kernel)(*args)))  # the very same compiled kernel


def test_gradients_and_vmap_run_as_custom_calls_one_launch_each(path, x64):
    kernel = tullax.einsum_kernel(DIST, backend="c")
    rng = np.random.default_rng(0)
    W, X = jnp.asarray(rng.standard_normal((5, 7))), jnp.asarray(rng.standard_normal((5, 9)))
    Ws = jnp.stack([W, 2 * W, W - 1])

    def loss(Ws, X):
        return jnp.sum(jax.vmap(kernel, in_axes=(0, None))(Ws, X) ** 2)

    def oracle(Ws, X):
        return jnp.sum(jnp.sum((Ws[:, :, :, None] - X[None, :, None, :]) ** 2, axis=1) ** 2)

    grad = jax.jit(jax.grad(loss, (0, 1)))
    assert _custom_calls(jax.grad(loss, (0, 1)), Ws, X) == 3  # the batched forward and one step per gradient
    stats.reset()
    got = grad(Ws, X)
    assert stats.paths["ffi"] == stats.total() == 3 and stats.paths["buffer"] == 0
    assert stats.launches[("D[b,i,j] := (W[b,k,i] - X[k,j])^2", "c")] == 1
    for g, w in zip(got, jax.grad(oracle, (0, 1))(Ws, X)):
        np.testing.assert_allclose(g, w, rtol=1e-10)
    grad(Ws, X)
    assert stats.total() == 6  # counted by the handler on every call, not only the first


def test_an_update_runs_in_xlas_aliased_buffer_and_leaves_the_given_array_as_it_was(x64):
    kernel = tullax.einsum_kernel("y[ix[i],d] += exp(v[i,d])", backend="c")
    y, v, ix = jnp.ones((4, 3)), jnp.linspace(-1.0, 1.0, 15).reshape(5, 3), jnp.array([0, 2, 3, 0, 2])
    assert _custom_calls(kernel, y, v, ix) == 1

    @jax.jit
    def twice(y, v, ix):
        return kernel(y, v, ix), y + 0  # y is read after the update: XLA must copy it first

    got, kept = twice(y, v, ix)
    want = np.ones((4, 3))
    np.add.at(want, np.asarray(ix), np.exp(np.asarray(v)))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_array_equal(kept, np.ones((4, 3)))


def test_a_program_naming_a_kernel_this_process_never_registered_fails_instead_of_calling_it(x64):
    """What an executable compiled by another process (JAX's persistent compilation cache) would hold: a slot
    whose identity is not the kernel registered here."""
    assert ffi.available()[0]
    x = jnp.arange(6.0)
    kernel = tullax.einsum_kernel("y[i] := 2*x[i]", backend="c")
    np.testing.assert_array_equal(jax.jit(kernel)(x), 2 * np.arange(6.0))  # registers at least one slot
    result = jax.ShapeDtypeStruct((6,), jnp.float64)
    for slot, identity in ((0, 12345), (ffi.SLOTS - 1, 1), (-1, 1)):
        meta = ffi.meta(slot, identity, 1, [0, 1], [6])
        with pytest.raises(Exception, match="not loaded in this process"):
            jax.block_until_ready(jax.jit(lambda x, meta=meta: ffi.call(meta, [x], result, None, ""))(x))


def test_a_malformed_meta_attribute_is_an_error_not_a_wild_call(x64):
    x = jnp.arange(6.0)
    kernel = tullax.einsum_kernel("y[i] := 3*x[i]", backend="c")
    jax.jit(kernel)(x)
    slot, identity = next(iter(ffi._SLOTS.items()))[1], next(iter(ffi._SLOTS))[1]
    result = jax.ShapeDtypeStruct((6,), jnp.float64)
    bad = {"operand out of range": ffi.meta(slot, identity, 1, [0, 5], [6]),
           "too many pointers": ffi.meta(slot, identity, 1, [0] * (ffi.MAX_POINTERS + 1), [6]),
           "counts that disagree": ffi.meta(slot, identity, 1, [0, 1], [6])[:-1]}
    for what, meta in bad.items():
        with pytest.raises(Exception, match="tullax: a c kernel"):
            jax.block_until_ready(jax.jit(lambda x, meta=meta: ffi.call(meta, [x], result, None, ""))(x))


def test_without_a_handler_every_kernel_keeps_the_buffer_callback(monkeypatch, path, x64):
    monkeypatch.setattr(ffi, "available", lambda: (False, "no handler in this test"))
    kernel = tullax.einsum_kernel("(max) m[i] := x[i,j]", backend="c")
    x = jnp.asarray(np.random.default_rng(1).standard_normal((6, 5)))
    assert _custom_calls(kernel, x) == 0
    stats.reset()
    np.testing.assert_array_equal(jax.jit(kernel)(x), np.max(np.asarray(x), axis=1))
    assert stats.paths["buffer"] == 1 and stats.paths["ffi"] == 0


def test_scalars_reach_the_kernel_in_the_type_it_reads(x64):
    """A scalar input goes by address: an integer given for a float parameter is converted by XLA first."""
    kernel = tullax.einsum_kernel("y[i] := a*x[i] + b", backend="c")
    x = jnp.arange(5.0)
    got = jax.jit(kernel)(3, x, jnp.float32(0.5))
    np.testing.assert_array_equal(got, 3 * np.arange(5.0) + 0.5)


def test_the_default_path_is_ffi_and_buffer_or_pure_can_be_forced(path):
    from tullax.calls.host import callback_path

    assert callback_path() == "ffi"
    path("buffer")
    assert callback_path() == "buffer"
    path("pure")
    assert callback_path() == "pure"


@pytest.mark.parametrize("dtypes", [("int32", "int32"), ("uint8", "int8")])
def test_a_kernel_of_wider_dtypes_than_the_calls_buffers_never_runs_as_a_custom_call(dtypes):
    """A narrow integer result is computed by a kernel of int64 (``host.WidenedKernel``, which forwards
    attributes to it): handed XLA's int32 buffers as a custom call, it wrote int64 into them (a heap overflow that
    crashed a test worker). It keeps the buffer callback, which widens; and a kernel asked for buffers of other
    dtypes than its own refuses."""
    from tullax import backends
    from tullax.backends.base import Signature

    rng = np.random.default_rng(4)
    a = rng.integers(-9, 9, (5, 4)).astype(dtypes[0])
    b = rng.integers(-9, 9, (4, 3)).astype(dtypes[1])
    kernel = tullax.einsum_kernel("C[i,j] := A[i,k]*B[k,j]", backend="c")
    assert _custom_calls(kernel, a, b) == 0
    got = jax.jit(kernel)(a, b)
    want = a.astype(np.int64) @ b.astype(np.int64)
    np.testing.assert_array_equal(np.asarray(got), want.astype(got.dtype))
    spec = compile_spec("C[i,j] := A[i,k]*B[k,j]")[1]
    wide = backends.resolve("c").build(spec, Signature(("int64", "int64"), "int64"))
    narrow = jax.ShapeDtypeStruct((5, 3), np.dtype(got.dtype))
    assert wide.ffi_call([jnp.asarray(a), jnp.asarray(b)], narrow, {"A": (5, 4), "B": (4, 3), "C": (5, 3)},
                         None) is None


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "float16", "complex128", "bool"])
@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4), (2, 3, 4, 5), (1, 4, 1, 3), (2, 0, 3), (2, 3, 1, 2, 3)])
def test_the_layout_change_is_numpys_transpose_of_the_flipped_cut_array(shape, dtype, x64):
    """``ffi.permute``: every order of the axes (every one up to rank 3, a sample beyond), each with no axis,
    the first, the last or every other one reversed, whole or cut to fewer elements per axis, against NumPy."""
    import itertools

    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 10).astype(dtype)
    orders = list(itertools.permutations(range(len(shape))))
    if len(shape) > 3:
        orders = [orders[i] for i in rng.choice(len(orders), 6, replace=False)]
    cut = tuple(max(0, n - axis % 2) for axis, n in enumerate(shape))
    for axes in orders:
        for reversed_axes in {(), (0,), (len(shape) - 1,), tuple(range(0, len(shape), 2))}:
            for extents in (shape, cut):
                expected = np.transpose(np.flip(x[tuple(slice(0, n) for n in extents)], reversed_axes), axes)
                got = jax.jit(lambda v: ffi.permute(v, axes, extents, reversed_axes))(x)
                assert got.dtype == x.dtype and got.shape == expected.shape
                np.testing.assert_array_equal(np.asarray(got), expected, err_msg=f"{axes} {reversed_axes} {extents}")


def test_a_large_layout_change_runs_on_a_team_and_gives_the_same_array():
    x = np.random.default_rng(0).standard_normal((8, 32, 64, 64)).astype(np.float32)
    assert x.size >= ffi.PARALLEL_ELEMENTS
    got = jax.jit(lambda v: ffi.permute(v, (0, 2, 3, 1), None, (2,)))(x)
    np.testing.assert_array_equal(np.asarray(got), np.transpose(np.flip(x, 2), (0, 2, 3, 1)))


def test_a_layout_change_that_does_not_fit_its_array_is_a_tullax_error():
    x = jnp.zeros((2, 3), jnp.float32)
    for axes, extents in (((0, 0), None), ((1, 0), (3, 3))):
        with pytest.raises(TullaxError, match="internal: permute"):
            jax.jit(lambda v, axes=axes, extents=extents: ffi.permute(v, axes, extents))(x)
