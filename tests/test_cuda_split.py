"""Which kernels the cuda backend splits (``tullax.compiler.split``, chosen by ``cuda_launch.device_lowering`` with
the call's shapes), how, and that a split float32 sum stays accurate. The split kernels' results against the naive
evaluator, over the whole corpus, run in ``tests/test_cuda_host.py``; their NVRTC compile in
``tests/test_cuda_compile.py``."""
from __future__ import annotations

import numpy as np
import pytest
from cuda_harness import GPP, Launch, build, run

from tullax.backends.base import Signature
from tullax.backends.cuda.launch import SPLIT_ENV, START_ANY, START_ZERO, device_lowering
from tullax.compiler.loops import Loop, Store, walk_stmts
from tullax.compiler.split import CHUNK, SplitPolicy
from tullax.planner.call import kernel_shapes
from tullax.spec.frontend import compile_spec
from tullax.testing.oracle import naive_eval

CONV1D = "y[b,i] := x[b,i+k]*w[k]"
CONV2D = "y[n,o,h,w] := x[n,c,h+p,w+q]*k[o,c,p,q]"
DIST = "D[i,j] := (W[k,i]-X[k,j])^2"


def lowered(text: str, shapes: dict, step: int = 0, dtype: str = "float32", policy: SplitPolicy = SplitPolicy(),
            name: str = "k0"):
    """(kernel, launch plan, step spec, step shapes) of the forward kernel (``step`` 0) or a gradient step, as
    the cuda backend lowers it for these forward input shapes."""
    spec = compile_spec(text)[1]
    _, kernel_spec, its_shapes = kernel_shapes(spec, shapes)[step]
    its_shapes = dict(its_shapes)
    its_shapes[kernel_spec.out] = tuple(s.eval(its_shapes) for s in kernel_spec.out_shape)
    signature = Signature(tuple(dtype if i.kind != "index" else "int64" for i in kernel_spec.inputs), dtype)
    kernel, plan = device_lowering(kernel_spec, signature, its_shapes, name, policy)
    return kernel, plan, kernel_spec, its_shapes


def chunk_length(kernel) -> int | None:
    """The length of the cut loop's pieces (from its stop, ``min(stop, lo + length)``), or None without one."""
    if not any(isinstance(s, Loop) and s.var == CHUNK for s in walk_stmts(kernel.body)):
        return None
    cut = next(s for s in walk_stmts(kernel.body) if isinstance(s, Loop) and not s.parallel)
    return cut.stop.rhs.rhs.value


def test_conv1d_filter_gradient_is_split_over_the_batch_and_chunks_of_the_signal():
    kernel, plan, _, _ = lowered(CONV1D, {"x": (64, 16384), "w": (31,)}, step=2)
    assert kernel.split and plan.start == START_ZERO and plan.out_bytes == 31 * 4
    launch = [s.var for s in walk_stmts(kernel.body) if isinstance(s, Loop) and s.parallel]
    assert launch[:2] == ["i1", CHUNK]  # the batch, then the chunks of the signal; the filter tap innermost
    threads_per_tap = 64 * -(-16354 // chunk_length(kernel))
    assert 2048 <= threads_per_tap <= SplitPolicy().max_pieces and plan.grid * plan.block >= 31 * threads_per_tap
    stores = [s for s in walk_stmts(kernel.body) if isinstance(s, Store)]
    assert [s.mode for s in stores] == ["atomic_add"]


def test_conv2d_filter_gradient_is_split_and_its_input_gradient_is_not(monkeypatch):
    shapes = {"x": (8, 32, 64, 64), "k": (32, 32, 3, 3)}
    # window tiles (tullax.compiler.window_tiles): the filter gradient's 4 tiles cut their chunks over the policy's
    # 128 blocks, adding into the zeroed output (split-K)
    kernel, plan, _, _ = lowered(CONV2D, shapes, step=2)
    assert kernel.tile is not None and kernel.split and plan.start == START_ZERO and plan.grid >= 128
    kernel, plan, _, _ = lowered(CONV2D, shapes, step=1)  # 8x32x64x64 outputs, 288 terms each
    assert kernel.tile is not None and not kernel.split and plan.start == START_ANY
    monkeypatch.setenv("TULLAX_CUDA_TILES", "0")  # without tiles: a split sum over many threads
    kernel, plan, _, _ = lowered(CONV2D, shapes, step=2)
    assert kernel.tile is None and kernel.split and plan.start == START_ZERO and plan.grid * plan.block >= 1 << 17
    kernel, plan, _, _ = lowered(CONV2D, shapes, step=1)
    assert not kernel.split and plan.start == START_ANY


@pytest.mark.parametrize("text, shapes, why", [
    (DIST, {"W": (784, 1024), "X": (784, 512)}, "many output elements"),
    ("y[i] := x[i,j]", {"x": (10, 50)}, "short sums"),
    ("(max) m[i] := x[i,j]", {"x": (8, 100000)}, "not a sum"),
    ("(logsumexp) l[i] := x[i,j]", {"x": (8, 100000)}, "not a plain sum"),
    ("n[i] := x[i,j]^2 |> sqrt", {"x": (8, 100000)}, "a finaliser"),
    ("out[b,d] := W[ix[b],d]", {"W": (50, 4), "ix": (9,)}, "no reduction"),
    ("y[i] := x[i,j]", {"x": (0, 100000)}, "no output element"),
])
def test_what_is_not_split(text, shapes, why):
    kernel, plan, _, _ = lowered(text, shapes)
    assert not kernel.split and plan.start != START_ZERO, why


def test_an_integer_sum_is_not_split():
    spec = compile_spec("y[i] := x[i,j]")[1]
    shapes = {"x": (4, 100000), "y": (4,)}
    kernel, _ = device_lowering(spec, Signature(("int64",), "int64"), shapes, "kernel")
    assert not kernel.split


def test_the_environment_switch_turns_splitting_off(monkeypatch):
    shapes = {"x": (64, 16384), "w": (31,)}
    assert lowered(CONV1D, shapes, step=2)[0].split
    monkeypatch.setenv(SPLIT_ENV, "0")
    assert not lowered(CONV1D, shapes, step=2)[0].split


def test_a_sum_into_a_given_array_starts_from_it():
    """'+=': the host copies the given array into the output; the pieces add onto it."""
    kernel, plan, _, _ = lowered("y[i] += x[i,j]", {"y": (3,), "x": (3, 50000)})
    assert kernel.split and plan.start == "given"


@pytest.mark.skipif(GPP is None, reason="g++ is not installed")
def test_a_long_split_float32_sum_stays_accurate(tmp_path):
    """Each thread sums at most ``max_float32_terms`` float32 terms in a register, the pieces meet in the float32
    output: 2M terms per element end within 1e-5 of the float64 sum (one float32 register over all of them, in
    order, is 5.6e-4 off on such data)."""
    text, shapes = "y[i] := x[i,j]*w[i,j]", {"x": (2, 1 << 21), "w": (2, 1 << 21)}
    kernel, plan, spec, its_shapes = lowered(text, shapes)
    assert kernel.split
    rng = np.random.default_rng(0)
    env = {name: rng.random(shape).astype(np.float32) for name, shape in shapes.items()}
    out = np.zeros(its_shapes["y"], np.float32)
    pointers = [out if source is None else env[spec.input_names[source]] for source in plan.pointers]
    exe = build([(kernel, plan.index_bits)], tmp_path)
    (got,) = run(exe, [(0, Launch(kernel, plan.index_bits, (*pointers, *plan.values)))])
    want = naive_eval(spec, {n: a.astype(np.float64) for n, a in env.items()})
    np.testing.assert_allclose(got, want, rtol=1e-5)
