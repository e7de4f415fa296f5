"""vmap of a kernel = ONE kernel of the batched spec (tullax.jaxop.batching), for any in_axes.

Three layers: the spec transform alone against the naive evaluator (no jax), the batching rule on the xla
backend against vmap of the plain lowering (every in_axes, cheap), and the Numba backend with launch counts
(vmap, vmap of grad, grad of vmap, jit of both, the embedding seed case).
"""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tullax
from tests.corpus import CASES_BY_ID, CORPUS, Case
from tullax.backends.xla.lower import lower
from tullax.errors import ShapeError
from tullax.grad import gradients
from tullax.grad.run import gradient_env
from tullax.jaxop.batching import batch_spec, fresh_index
from tullax.runtime import stats
from tullax.spec.examples import random_inputs, shapes_for
from tullax.spec.frontend import compile_spec
from tullax.spec.shapes import check_shapes
from tullax.spec.text import format_spec
from tullax.testing.oracle import naive_eval

BATCH = 3


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def spec_of(case: Case):
    return compile_spec(case.spec, case.ranges)[1]


# =============================================================================================
# The transform alone
# =============================================================================================
@pytest.mark.parametrize("text, axes, extents, expected", [
    ("D[i,j] := (W[k,i] - X[k,j])^2", (0, None), {}, "D[b,i,j] := (W[b,k,i] - X[k,j])^2"),
    ("D[i,j] := (W[k,i] - X[k,j])^2", (2, 1), {}, "D[b,i,j] := (W[k,i,b] - X[k,b,j])^2"),
    ("y[i] := a*x[i] + b", (0, None, 0), {}, "y[b1,i] := a[b1]*x[i] + b[b1]"),
    ("out[d] := W[ix[0],d]", (None, 0), {"ix": 1}, "out[b,d] := W[ix[b],d]"),
    ("out[j,d] := W[ix[j],d]", (None, 0), {"ix": 4}, "out[b,j,d] := W[ix[j+4b],d]"),
    ("dW[ix[j],d] += g[j,d]", (0, 0, None), {}, "dW[b,ix[j],d] += g[b,j,d]"),
    ("s := x[i]^2", (1,), {}, "s[b] := x[i,b]^2"),
    ("C[i,j] = C[i,j] + A[i,k]*B[k,j]", (0, None, 1), {}, "C[b,i,j] = C[b,i,j] + A[i,k]*B[k,b,j]"),
])
def test_batched_spec_text(text, axes, extents, expected):
    assert format_spec(batch_spec(compile_spec(text)[1], axes, extents)) == expected


def test_batch_index_is_the_first_output_axis_and_binds_to_a_batched_axis():
    spec = batch_spec(compile_spec("y[i] := x[i+k]*w[k]")[1], (1, 0))
    shapes = {"x": (7, BATCH), "w": (BATCH, 3)}
    assert spec.free[0] == "b" and spec.ranges[0][0] == "b"
    assert tuple(s.eval(shapes) for s in spec.out_shape) == (BATCH, 5)
    with pytest.raises(ShapeError, match="extents must be equal"):
        check_shapes(spec, {"x": (7, BATCH), "w": (BATCH + 1, 3)})


def test_scatter_batch_index_is_iterated_not_free():
    spec = batch_spec(compile_spec("h[ix[j]] += v[j]")[1], (0, 0, None))
    assert spec.is_scatter and spec.free == () and spec.reduced[0] == "b"


def test_fresh_index_avoids_every_name():
    spec = compile_spec("y[b] := b1*x[b] + b2")[1]
    assert fresh_index(spec) == "b3"


@pytest.mark.parametrize("axes, message", [
    ((None, None), "at least one batched input"),
    ((0,), "one batch axis"),
    ((3, None), "outside 0..2"),
])
def test_bad_batch_axes(axes, message):
    with pytest.raises(ShapeError, match=message):
        batch_spec(compile_spec("D[i,j] := (W[k,i] - X[k,j])^2")[1], axes)


def _axes_draws(spec, rng) -> list[tuple]:
    """Two in_axes per spec: every input batched at a random axis, and a random batched/unbatched mix."""
    def axis(item, mixed):
        if mixed and rng.random() < 0.5:
            return None
        if item.kind in ("scalar", "index"):
            return 0
        return int(rng.integers(0, item.rank + 1))
    draws = []
    for mixed in (False, True):
        axes = [axis(item, mixed) for item in spec.inputs]
        if spec.assign != ":=":
            axes[0] = 0
        if all(a is None for a in axes):
            axes[-1] = axis(spec.inputs[-1], False)
        draws.append(tuple(axes))
    return draws


def _batched_env(spec, axes, examples):
    """Stack per-example inputs along their batch axes; unbatched inputs are example 0's for everyone."""
    env, extents = {}, {}
    for item, axis in zip(spec.inputs, axes):
        values = [np.asarray(ex[item.name]) for ex in examples]
        if axis is None:
            env[item.name] = values[0]
            for ex in examples:
                ex[item.name] = values[0]
        elif item.kind == "index":
            env[item.name] = np.stack(values).reshape(-1)
            extents[item.name] = values[0].shape[0]
        else:
            env[item.name] = np.stack(values, axis=axis)
    return env, extents


def _check_against_naive(spec, axes, examples):
    examples = [dict(ex) for ex in examples]
    env, extents = _batched_env(spec, axes, examples)
    batched = batch_spec(spec, axes, extents)
    got = naive_eval(batched, env)
    want = np.stack([naive_eval(spec, ex) for ex in examples])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=format_spec(batched))


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.id)
def test_batched_spec_computes_every_example(case):
    spec = spec_of(case)
    shapes = dict(case.shapes) if case.shapes else shapes_for(spec)
    for n, axes in enumerate(_axes_draws(spec, np.random.default_rng(len(case.id)))):
        _check_against_naive(spec, axes, [random_inputs(spec, shapes, seed=10 * n + k) for k in range(BATCH)])


GRADIENT_CASES = ("dist", "conv1d", "strided", "embedding", "row_max", "scalar_params", "pad_stencil",
                  "upsample_pad_div", "accumulate_matmul", "scatter_embedding_grad")


def _gradient_steps(case: Case):
    """(step spec, one step environment per example) for every step of every gradient of ``case``."""
    spec = spec_of(case)
    shapes = dict(case.shapes) if case.shapes else shapes_for(spec)
    envs = []
    for n in range(BATCH):
        env = random_inputs(spec, shapes, seed=n)
        out = naive_eval(spec, env)
        cot = np.random.default_rng(50 + n).standard_normal(np.shape(out))
        envs.append(gradient_env(spec, env, out, cot))
    for grad in gradients(spec):
        local = [dict(env) for env in envs]
        for step in grad.steps:
            for env in local:
                if step.assign == "+=" and step.out not in env:
                    env[step.out] = np.zeros(np.shape(env[grad.wrt]))
            yield step, [{name: env[name] for name in step.input_names} for env in local]
            for env in local:
                env[step.out] = naive_eval(step, {name: env[name] for name in step.input_names})


@pytest.mark.parametrize("case_id", GRADIENT_CASES)
def test_batched_gradient_specs_compute_every_example(case_id):
    """Gradient specs bring 'shape' inputs, guards, pad with division and scatter steps."""
    for step, examples in _gradient_steps(CASES_BY_ID[case_id]):
        for axes in _axes_draws(step, np.random.default_rng(7)):
            _check_against_naive(step, axes, examples)


# =============================================================================================
# The batching rule on the xla backend: every in_axes, against vmap of the plain lowering
# =============================================================================================
XLA_CASES = ("dist", "conv1d", "scalar_params", "embedding", "accumulate_matmul", "scatter_embedding_grad",
             "row_logsumexp", "sum_all")


def _in_axes_options(spec) -> list[tuple]:
    """Each input alone batched at each of its axes, then everything batched at axis 0."""
    options = []
    for pos, item in enumerate(spec.inputs):
        for axis in range(item.rank + 1 if item.kind != "scalar" else 1):
            axes = [None] * len(spec.inputs)
            axes[pos] = axis
            if spec.assign == ":=" or pos == 0:
                options.append(tuple(axes))
    options.append(tuple(0 for _ in spec.inputs))
    return options


def _stacked(value, axis, rng):
    arr = np.asarray(value)
    copies = [arr + (0 if np.issubdtype(arr.dtype, np.integer) else rng.standard_normal(arr.shape))
              for _ in range(BATCH)]
    return np.stack(copies, axis=axis)


@pytest.mark.parametrize("case_id", XLA_CASES)
def test_vmap_any_in_axes_matches_vmap_of_the_lowering(case_id, x64):
    case = CASES_BY_ID[case_id]
    spec = spec_of(case)
    kernel = tullax.einsum_kernel(case.spec, backend="xla", ranges=case.ranges)
    env = random_inputs(spec, dict(case.shapes) if case.shapes else None)
    rng = np.random.default_rng(3)
    plain = lower(spec)
    for axes in _in_axes_options(spec):
        args = [env[n] if a is None else _stacked(env[n], a, rng) for n, a in zip(spec.input_names, axes)]
        args = [jnp.asarray(a) for a in args]
        got = jax.jit(jax.vmap(kernel, in_axes=axes))(*args)
        # the oracle jitted too: one compile instead of one per small op
        want = jax.jit(jax.vmap(lambda *v: plain(dict(zip(spec.input_names, v))), in_axes=axes))(*args)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=str(axes))


def test_nested_vmap_batches_twice(x64):
    kernel = tullax.einsum_kernel("D[i,j] := (W[k,i] - X[k,j])^2", backend="xla")
    W = jnp.asarray(np.random.default_rng(0).standard_normal((2, 3, 4, 5)))
    X = jnp.asarray(np.random.default_rng(1).standard_normal((4, 3, 6)))
    got = jax.vmap(jax.vmap(kernel, in_axes=(0, 1)), in_axes=(0, None))(W, X)
    want = ((W[:, :, :, :, None] - jnp.moveaxis(X, 1, 0)[None, :, :, None, :]) ** 2).sum(2)
    np.testing.assert_allclose(got, want, rtol=1e-12)


# =============================================================================================
# Numba: one kernel launch per kernel call
# =============================================================================================
DIST = "D[i,j] := (W[k,i] - X[k,j])^2"


def _dist_data():
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.standard_normal((BATCH, 3, 4))), jnp.asarray(rng.standard_normal((3, 5))),
            jnp.asarray(rng.standard_normal((BATCH, 3, 5))))


def _loss(f):
    return lambda W, X: jnp.sum(f(W, X) ** 2)


def _oracle(text):
    spec = compile_spec(text)[1]
    return lambda *args: lower(spec)(dict(zip(spec.input_names, args)))


@pytest.mark.parametrize("in_axes", [(0, None), (None, 1), (2, 0), (1, 2)])
def test_vmap_runs_one_kernel_for_any_in_axes(in_axes, x64):
    kernel = tullax.einsum_kernel(DIST, backend="numba")
    rng = np.random.default_rng(1)
    W = jnp.asarray(rng.standard_normal(np.insert((3, 4), in_axes[0], BATCH)) if in_axes[0] is not None
                    else rng.standard_normal((3, 4)))
    X = jnp.asarray(rng.standard_normal(np.insert((3, 5), in_axes[1], BATCH)) if in_axes[1] is not None
                    else rng.standard_normal((3, 5)))
    stats.reset()
    got = jax.vmap(kernel, in_axes=in_axes)(W, X)
    assert stats.total() == 1
    np.testing.assert_allclose(got, jax.vmap(_oracle(DIST), in_axes=in_axes)(W, X), rtol=1e-12)


def _launches_per_spec():
    return sorted(stats.by_spec().values())


def test_vmap_of_grad_one_kernel_per_call(x64):
    kernel = tullax.einsum_kernel(DIST, backend="numba")
    Wb, X, _ = _dist_data()
    for wrap in (lambda f: f, jax.jit):
        stats.reset()
        got = wrap(jax.vmap(jax.grad(_loss(kernel), (0, 1)), in_axes=(0, None)))(Wb, X)
        assert stats.total() == 3 and _launches_per_spec() == [1, 1, 1]  # D, ΔW, ΔX: each batched once
        want = jax.vmap(jax.grad(_loss(_oracle(DIST)), (0, 1)), in_axes=(0, None))(Wb, X)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-10)


def test_grad_of_vmap_one_kernel_per_call(x64):
    kernel = tullax.einsum_kernel(DIST, backend="numba")
    Wb, X, _ = _dist_data()

    def batched_loss(f):
        return lambda W, X: jnp.sum(jax.vmap(f, in_axes=(0, None))(W, X) ** 2)

    for wrap in (lambda f: f, jax.jit):
        stats.reset()
        got = wrap(jax.grad(batched_loss(kernel), (0, 1)))(Wb, X)
        assert stats.total() == 3
        # the unbatched X's gradient sums over the batch INSIDE its kernel: no per-example gradients
        assert ("ΔX[k,j] := -(ΔD[b,i,j]*(2*(W[b,k,i] - X[k,j])))", "numba") in stats.launches
        want = jax.grad(batched_loss(_oracle(DIST)), (0, 1))(Wb, X)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-10)


def test_vmap_with_both_inputs_batched_under_grad(x64):
    kernel = tullax.einsum_kernel(DIST, backend="numba")
    Wb, _, Xb = _dist_data()
    stats.reset()
    got = jax.jit(jax.grad(lambda W, X: jnp.sum(jax.vmap(kernel)(W, X) ** 2), (0, 1)))(Wb, Xb)
    assert stats.total() == 3
    want = jax.grad(lambda W, X: jnp.sum(jax.vmap(_oracle(DIST))(W, X) ** 2), (0, 1))(Wb, Xb)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10)


# -- the seed case: a batch of embedding lookups ------------------------------------------------
LOOKUP = "out[d] := W[ix[0],d]"


def _table():
    return jnp.asarray(np.random.default_rng(2).standard_normal((10, 4)))


def test_vmap_of_one_lookup_is_one_gather_matching_take(x64):
    lookup = tullax.einsum_kernel(LOOKUP, backend="numba")
    W, ids = _table(), jnp.array([3, 1, 4, 1, 5, 9, 2, 6])
    stats.reset()
    got = jax.jit(jax.vmap(lookup, in_axes=(None, 0)))(W, ids)  # ids[n] is a 0-d index: shape (1,)
    assert dict(stats.launches) == {("out[b,d] := W[ix[b],d]", "numba"): 1}
    np.testing.assert_array_equal(got, jnp.take(W, ids, axis=0))
    np.testing.assert_array_equal(lookup(W, ids[2]), W[4])  # one lookup, unbatched


def test_gradient_of_batched_lookups_is_one_scatter(x64):
    lookup = tullax.einsum_kernel(LOOKUP, backend="numba")
    W, ids = _table(), jnp.array([3, 1, 4, 1, 5, 9, 2, 6])
    weights = jnp.arange(32.0).reshape(8, 4)
    stats.reset()
    got = jax.jit(jax.grad(lambda W: jnp.sum(jax.vmap(lookup, in_axes=(None, 0))(W, ids) * weights)))(W)
    # the loss is linear in the lookups: jit drops the forward kernel, the gradient is the scatter alone
    assert dict(stats.launches) == {("ΔW[ix[b],d] += Δout[b,d]", "numba"): 1}
    want = jax.grad(lambda W: jnp.sum(jnp.take(W, ids, axis=0) * weights))(W)
    np.testing.assert_array_equal(got, want)


def test_lookups_batched_twice(x64):
    lookup = tullax.einsum_kernel(LOOKUP, backend="numba")
    W, ids = _table(), jnp.array([[3, 1, 4], [1, 5, 9]])
    stats.reset()
    got = jax.vmap(jax.vmap(lookup, in_axes=(None, 0)), in_axes=(None, 0))(W, ids)
    assert stats.total() == 1
    np.testing.assert_array_equal(got, jnp.take(W, ids, axis=0))


def test_every_combination_of_batched_table_and_indices(x64):
    lookup = tullax.einsum_kernel(LOOKUP, backend="xla")
    Wb = jnp.stack([_table() * (n + 1) for n in range(4)])
    ids = jnp.array([3, 1, 4, 1])
    for axes in itertools.product((None, 0), (None, 0)):
        if axes == (None, None):
            continue
        W_arg, id_arg = (Wb if axes[0] == 0 else Wb[0]), (ids if axes[1] == 0 else ids[0])
        got = jax.vmap(lookup, in_axes=axes)(W_arg, id_arg)
        want = jax.vmap(lambda W, i: W[i], in_axes=axes)(W_arg, id_arg)
        np.testing.assert_array_equal(got, want)
