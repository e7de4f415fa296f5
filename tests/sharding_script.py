"""Run by tests/test_sharding.py in a subprocess with 4 host devices (XLA's device count is fixed when jax starts):
each kernel under jax.jit with its inputs split along each index in turn, against its jnp formulation. Results
and gradients are checked here (float64, to the collective's summation order); the shardings and the collectives
of the compiled programs go to the JSON report printed last, which the test reads.

Usage: python tests/sharding_script.py BACKEND [BACKEND ...]    (the named cases, on each backend)
       python tests/sharding_script.py corpus                  (every corpus spec, split along each axis)
"""
from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import tullax  # noqa: E402
from tullax.testing.hlo import collective_bytes  # noqa: E402

jax.config.update("jax_enable_x64", True)
MESH = jax.make_mesh((4,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
rng = np.random.default_rng(0)


def r(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape)


# name: (spec, jnp formulation, inputs, {index: the inputs' PartitionSpecs splitting that index})
CASES = {
    "dist": ("D[i,j] := (W[k,i] - X[k,j])^2", lambda W, X: ((W[:, :, None] - X[:, None, :]) ** 2).sum(0),
             (r(8, 16), r(8, 12)), {"i": (P(None, "x"), P()), "j": (P(), P(None, "x")), "k": (P("x"), P("x"))}),
    "linear": ("y[b,o] := x[b,i]*w[o,i]", lambda x, w: jnp.einsum("bi,oi->bo", x, w),
               (r(16, 8), r(12, 8)), {"b": (P("x"), P()), "o": (P(), P("x")), "i": (P(None, "x"), P(None, "x"))}),
    "logsumexp": ("(logsumexp) r[i] := x[i,j]", lambda x: jax.nn.logsumexp(x, axis=1), (r(16, 12),),
                  {"i": (P("x"),), "j": (P(None, "x"),)}),
    "rowmax": ("(max) r[i] := x[i,j]", lambda x: x.max(1), (r(16, 12),), {"i": (P("x"),), "j": (P(None, "x"),)}),
    "conv1d": ("y[i] := x[i+k]*w[k]", lambda x, w: jnp.correlate(x, w, "valid"), (r(36), r(5)),
               {"i": (P("x"), P())}),
    # padded windows over the array's own extent, several on one index, read plainly too; and a "same"
    # convolution, whose gradient for w splits the summed index with its padded window
    "stencil": ("y[i] := x[pad(i-1)] - 2*x[i] + x[pad(i+1)]",
                lambda x: jnp.pad(x, (1, 0))[:-1] - 2 * x + jnp.pad(x, (0, 1))[1:], (r(32),), {"i": (P("x"),)}),
    "conv_same": ("y[i] := x[pad(i+k-2)]*w[k]", lambda x, w: jnp.correlate(x, w, "same"), (r(32), r(5)),
                  {"i": (P("x"), P())}),
    # that gradient written by hand: k's range reads x's extent, i is the longer index and is split
    "wgrad": ("Δw[k] := Δy[i]*x[pad(i+k-2)]",
              lambda dy, x: jax.grad(lambda w: jnp.vdot(dy, jnp.correlate(x, w, "same")))(jnp.zeros(5, dy.dtype)),
              (r(32), r(32)), {"i": (P("x"), P("x"))}),
    "embedding": ("out[b,d] := W[ix[b],d]", lambda W, ix: W[ix], (r(16, 8), rng.integers(0, 16, 12)),
                  {"b": (P(), P("x")), "d": (P(None, "x"), P()), "row": (P("x"), P())}),
    # its gradient's scatter, the table split by rows: each device adds only into the rows it holds
    "scatter": ("ΔW[ix[b],d] += Δout[b,d]", lambda G, D, ix: jnp.asarray(G).at[ix].add(D),
                (r(16, 8), r(12, 8), rng.integers(0, 16, 12)), {"row": (P("x"), P(), P())}),
    "dot": ("s := x[i]*y[i]", lambda x, y: jnp.dot(x, y), (r(16), r(16)), {"i": (P("x"), P("x"))}),
}


def collectives(text: str) -> list[str]:
    found = re.findall(r"\b(all-gather|all-reduce|reduce-scatter|collective-permute|all-to-all)(?:-start)?\(", text)
    return sorted(set(found))


def squared(f):
    return lambda *a: jnp.sum(f(*a) ** 2)


def run_case(backend: str, name: str, report: dict) -> None:
    text, ref, args, splits = CASES[name]
    kernel = tullax.einsum_kernel(text, backend=backend)
    floats = [k for k, a in enumerate(args) if np.issubdtype(a.dtype, np.floating)]
    for index, specs in splits.items():
        placed = [jax.device_put(a, NamedSharding(MESH, s)) for a, s in zip(args, specs)]
        f, g = jax.jit(kernel), jax.jit(ref)
        out, want = f(*placed), g(*placed)
        where = f"{backend}: {name} split along {index}"
        np.testing.assert_allclose(out, want, rtol=1e-11, atol=1e-12, err_msg=where)
        grad, grad_ref = jax.jit(jax.grad(squared(kernel), floats)), jax.jit(jax.grad(squared(ref), floats))
        for got, expected in zip(grad(*placed), grad_ref(*placed)):
            np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-11, err_msg="gradient, " + where)
        texts = {key: h.lower(*placed).compile().as_text()
                 for key, h in (("", f), ("ref_", g), ("grad_", grad), ("ref_grad_", grad_ref))}
        report[f"{backend}/{name}/{index}"] = dict(
            same_sharding=out.sharding.is_equivalent_to(want.sharding, out.ndim),
            sharding=str(out.sharding.spec), ref_sharding=str(want.sharding.spec),
            **{key + "collectives": collectives(text) for key, text in texts.items()},
            **{key + "bytes": collective_bytes(text) for key, text in texts.items()},
            local=list(out.addressable_shards[0].data.shape), shape=list(out.shape))


# vmapped cases: (the CASES entry, in_axes, batched input shapes); the batch index split along the mesh
VMAPPED = {"batch": ("dist", (0, None), ((4, 8, 16), (8, 12))), "logsumexp": ("logsumexp", (0,), ((4, 16, 12),)),
           "conv1d": ("conv1d", (0, None), ((4, 36), (5,)))}


def run_vmap(backend: str, report: dict) -> None:
    """The batch index of vmap is a free index like any other: split along it, forward and gradient, against
    the vmapped jnp formulation (row logsumexp and conv1d too: the gradient for conv1d's shared w sums over the
    batch, one all-reduce)."""
    for key, (name, in_axes, shapes) in VMAPPED.items():
        text, ref = CASES[name][:2]
        batched = jax.vmap(tullax.einsum_kernel(text, backend=backend), in_axes=in_axes)
        want = jax.vmap(ref, in_axes=in_axes)
        placed = [jax.device_put(r(*shape), NamedSharding(MESH, P("x") if axis == 0 else P()))
                  for shape, axis in zip(shapes, in_axes)]
        floats = tuple(range(len(placed)))
        forward, grad = jax.jit(batched), jax.jit(jax.grad(squared(batched), floats))
        out = forward(*placed)
        np.testing.assert_allclose(out, want(*placed), rtol=1e-11, atol=1e-12, err_msg=f"{backend}: vmap {name}")
        grads = grad(*placed)
        for got, expected in zip(grads, jax.grad(squared(want), floats)(*placed)):
            np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-11, err_msg=f"{backend}: vmap {name} grad")
        texts = {key_: h.lower(*placed).compile().as_text() for key_, h in (
            ("", forward), ("ref_", jax.jit(want)), ("grad_", grad),
            ("ref_grad_", jax.jit(jax.grad(squared(want), floats))))}
        report[f"{backend}/vmap/{key}"] = dict(
            sharding=str(out.sharding.spec), grad_sharding=str(grads[0].sharding.spec),
            **{k + "collectives": collectives(t) for k, t in texts.items()},
            **{k + "bytes": collective_bytes(t) for k, t in texts.items()},
            local=list(out.addressable_shards[0].data.shape), shape=list(out.shape))


def run_conv2d(backend: str, report: dict) -> None:
    """A window in two split indices: conv2d on a 2x2 mesh, x split along both spatial axes (a halo exchanged
    along each in turn, the corner coming with the second), forward and gradient, against lax's convolution."""
    mesh = jax.make_mesh((2, 2), ("a", "b"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    kernel = tullax.einsum_kernel("y[i,j] := x[i+k,j+l]*w[k,l]", backend=backend)

    def ref(x, w):
        return jax.lax.conv_general_dilated(x[None, None], w[None, None], (1, 1), "VALID")[0, 0]

    args = (jax.device_put(r(18, 20), NamedSharding(mesh, P("a", "b"))),
            jax.device_put(r(3, 5), NamedSharding(mesh, P())))
    f, g = jax.jit(kernel), jax.jit(ref)
    out = f(*args)
    np.testing.assert_allclose(out, g(*args), rtol=1e-11, atol=1e-12, err_msg=f"{backend}: conv2d")
    grad, grad_ref = jax.jit(jax.grad(squared(kernel), (0, 1))), jax.jit(jax.grad(squared(ref), (0, 1)))
    for got, expected in zip(grad(*args), grad_ref(*args)):
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-11, err_msg=f"{backend}: conv2d gradient")
    texts = {key: h.lower(*args).compile().as_text() for key, h in (("", f), ("ref_", g), ("grad_", grad),
                                                                     ("ref_grad_", grad_ref))}
    report[f"{backend}/conv2d/i+j"] = dict(
        sharding=str(out.sharding.spec), local=list(out.addressable_shards[0].data.shape),
        **{key + "collectives": collectives(text) for key, text in texts.items()},
        **{key + "bytes": collective_bytes(text) for key, text in texts.items()})


def run_explicit(backends: list[str], report: dict) -> None:
    """Under explicit sharding (AxisType.Explicit: shardings in the types), on each backend: the kernel's result
    is typed by its rule and computed split, its gradient too; what the rule cannot run split is a TullaxError
    at trace time."""
    from jax.sharding import AxisType

    from tullax.errors import TullaxError

    mesh = jax.make_mesh((4,), ("x",), axis_types=(AxisType.Explicit,))
    cases = {"dist/i": ("dist", (P(None, "x"), P())), "dist/k": ("dist", (P("x"), P("x"))),
             "conv1d/i": ("conv1d", (P("x"), P())), "embedding/b": ("embedding", (P(), P("x"))),
             "dist/i+j": ("dist", (P(None, "x"), P(None, "x"))), "embedding/row": ("embedding", (P("x"), P())),
             "conv1d/uneven": ("conv1d", (P("x"), P()))}  # a window of 4: a result of 33
    uneven = {"conv1d/uneven": (r(36), r(4))}
    with jax.set_mesh(mesh):
        for backend in backends:
            for case, (name, specs) in cases.items():
                text, ref, args, _ = CASES[name]
                args = uneven.get(case, args)
                kernel = tullax.einsum_kernel(text, backend=backend)
                placed = [jax.device_put(a, s) for a, s in zip(args, specs)]
                f = jax.jit(lambda *a: kernel(*a) * 2)  # noqa: B023 - called in this iteration
                try:
                    out = f(*placed)
                except TullaxError as err:
                    report[f"explicit/{backend}/{case}"] = {"error": str(err)}
                    continue
                np.testing.assert_allclose(out, 2 * np.asarray(ref(*args)), rtol=1e-11, atol=1e-12, err_msg=case)
                found = {"type": str(jax.typeof(out)), "collectives": collectives(f.lower(*placed).compile().as_text())}
                if name == "dist":
                    grad = jax.jit(jax.grad(squared(kernel)))(*placed)
                    np.testing.assert_allclose(grad, jax.grad(squared(ref))(*args), rtol=1e-10, err_msg=case)
                    found["grad_type"] = str(jax.typeof(grad))
                report[f"explicit/{backend}/{case}"] = found


def run_corpus(report: dict) -> None:
    """Every corpus spec on the c backend, each input split along each axis that 4 divides, in turn: the result
    equals the unsplit call's on one device (the rule keeps whole what cannot run on blocks)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__))))
    from corpus import CORPUS, analysed

    from tullax.spec.examples import random_inputs, shapes_for

    checked, wrong, graded = 0, [], 0
    for case in CORPUS:
        if case.id == "real_conj":  # complex inputs: random_inputs gives reals
            continue
        spec = analysed(case.spec, case.ranges)
        env = random_inputs(spec, dict(case.shapes) if case.shapes else shapes_for(spec, low=4, high=4), seed=1)
        args = [np.asarray(env[name]) for name in spec.input_names]
        kernel = jax.jit(tullax.einsum_kernel(case.spec, backend="c", ranges=case.ranges))
        want = np.asarray(kernel(*[jax.device_put(a, jax.devices()[0]) for a in args]))
        for k, value in enumerate(args):
            for axis in [a for a in range(value.ndim) if value.shape[a] % 4 == 0]:
                specs = [P()] * len(args)
                specs[k] = P(*([None] * axis + ["x"]))
                checked += 1
                try:
                    got = kernel(*[jax.device_put(a, NamedSharding(MESH, s)) for a, s in zip(args, specs)])
                    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-11, atol=1e-12, equal_nan=True)
                    if case.id in GRADED:
                        graded += 1
                        _corpus_gradient(kernel, spec, args, specs, k, axis)
                except Exception as err:  # noqa: BLE001 - reported, with the case, to the test
                    wrong.append(f"{case.id}: input {k} split along axis {axis}: {type(err).__name__}: "
                                 f"{str(err)[:300]}")
    report["corpus"] = {"checked": checked, "wrong": wrong, "graded": graded}


# a handful of corpus specs (a contraction, a summed reduction, logsumexp, a finaliser, a function of the read,
# padded windows) whose gradients are checked split too, and whose programs' HLO is read
GRADED = ("matmul", "dist", "row_logsumexp", "matmul_bias", "softplus_sum", "pad_stencil")


def _corpus_gradient(kernel, spec, args: list, specs: list, k: int, axis: int) -> None:
    """The gradient (of the sum of squares) split equals the unsplit one; an input split along a free index
    leaves no all-gather in the compiled forward or gradient program (the partitioner gathered nothing)."""
    from tullax.jaxop.partition_rule import factors

    floats = tuple(n for n, a in enumerate(args) if np.issubdtype(a.dtype, np.floating))
    grad = jax.jit(jax.grad(lambda *a: jnp.sum(kernel(*a) ** 2), floats))
    want = grad(*[jax.device_put(a, jax.devices()[0]) for a in args])
    placed = [jax.device_put(a, NamedSharding(MESH, s)) for a, s in zip(args, specs)]
    for got, expected in zip(grad(*placed), want):
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-10, atol=1e-11)
    rule = factors(spec, {item.name: a.shape for item, a in zip(spec.inputs, args)})
    if rule.operands[k][axis] in rule.free:
        for what, program in (("forward", kernel), ("gradient", grad)):
            found = collective_bytes(program.lower(*placed).compile().as_text())
            assert "all-gather" not in found, f"{what} gathers an input split along a free index: {found}"


def main(backends: list[str]) -> dict:
    assert jax.device_count() == 4, jax.devices()
    report: dict = {}
    start = time.perf_counter()
    if backends == ["corpus"]:
        run_corpus(report)
        backends = []
    for backend in backends:
        for name in CASES:
            run_case(backend, name, report)
        run_vmap(backend, report)
        run_conv2d(backend, report)
    run_explicit(backends, report)
    report["seconds"] = time.perf_counter() - start
    return report


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:] or ["c"])))
