"""32-bit index arithmetic where a guard bounds a loaded index: the embedding's gather and its scatter gradient
with an int64 index array run in 32 bits (``tullax.compiler.intervals``: the loaded index is declared in its own
type and only used under the guard that checks it against its axis), and an index past 2^31 fails the guard
instead of wrapping into range, through the host harness against the naive evaluator."""
from __future__ import annotations

import numpy as np
import pytest
from cuda_harness import GPP, Launch, build, run

from tullax.backends.base import Signature
from tullax.backends.cuda.launch import START_GIVEN, device_lowering, plan_launch
from tullax.compiler.intervals import dtype_interval, fits
from tullax.compiler.lower import lower
from tullax.printers.cuda import print_module
from tullax.spec.frontend import compile_spec

GATHER = "out[b,d] := W[ix[b],d]"
SCATTER = "h[ix[b],d] += v[b,d]"
INT32 = dtype_interval("int32")
# in range, negative, past the axis, and int64 values that a 32-bit truncation would wrap to 1, 0 and -1
INDICES = np.array([0, 3, -1, 4, 2**32 + 1, 2**32, 2**32 - 1, 2**31, 1], np.int64)


def _spec(text):
    return compile_spec(text)[1]


def test_a_guarded_int64_gather_and_scatter_index_in_32_bits():
    spec = _spec(GATHER)
    kernel = lower(spec, Signature(("float32", "int64"), "float32"))
    shapes = {"W": (5000, 256), "ix": (16384,), "out": (16384, 256)}
    assert plan_launch(kernel, spec, shapes, "float32").index_bits == 32
    source = print_module([(kernel, 32)])
    assert "tx_i64 t0 = a2[" in source  # exact in its own type until the guard
    scatter = _spec(SCATTER)
    kernel = lower(scatter, Signature(("float32", "float32", "int64"), "float32"))  # h, v, ix
    assert plan_launch(kernel, scatter, {"h": (5000, 256), "ix": (16384,), "v": (16384, 256)},
                       "float32").index_bits == 32


def test_an_unguarded_loaded_index_keeps_64_bits():
    spec = _spec("y[b] := x[ix[b]+1]")  # the guard checks ix[b]+1: arithmetic on the raw index comes first
    kernel = lower(spec, Signature(("float32", "int64"), "float32"))
    assert not fits(kernel, {s.name: 8 for s in kernel.sizes}, INT32)
    guarded = lower(_spec("y[b] := x[ix[b]]"), Signature(("float32", "int64"), "float32"))
    assert fits(guarded, {s.name: 8 for s in guarded.sizes}, INT32)


def _launch(spec, env, name):
    """The backend's kernel and launch plan for ``env``, its output filled as the plan says (no call checks: the
    indices are out of range on purpose, where a GPU kernel gives NaN or skips the element)."""
    arrays = [env[n] for n in spec.input_names]
    shapes = {n: np.shape(a) for n, a in zip(spec.input_names, arrays)}
    shapes[spec.out] = tuple(s.eval(shapes) for s in spec.out_shape)
    signature = Signature(tuple(np.dtype(a.dtype).name for a in arrays), "float32")
    kernel, plan = device_lowering(spec, signature, shapes, name)
    out = np.array(arrays[0], copy=True) if plan.start == START_GIVEN else np.full(shapes[spec.out], np.nan,
                                                                                     np.float32)
    pointers = [out if source is None else arrays[source] for source in plan.pointers]
    return Launch(kernel, plan.index_bits, (*pointers, *plan.values))


@pytest.mark.skipif(GPP is None, reason="g++ is not installed")
def test_indices_past_int32_fail_the_guard_in_a_32_bit_kernel(tmp_path):
    rng = np.random.default_rng(0)
    W = rng.standard_normal((4, 3)).astype(np.float32)
    v = rng.standard_normal((len(INDICES), 3)).astype(np.float32)
    launches = [_launch(_spec(GATHER), {"W": W, "ix": INDICES}, "gather"),
                _launch(_spec(SCATTER), {"h": np.zeros((4, 3), np.float32), "v": v, "ix": INDICES}, "scatter")]
    assert [launch.index_bits for launch in launches] == [32, 32]
    exe = build([(launch.kernel, launch.index_bits) for launch in launches], tmp_path, sanitize=False)
    got_gather, got_scatter = run(exe, list(enumerate(launches)))
    valid = (INDICES >= 0) & (INDICES < 4)
    want = np.full((len(INDICES), 3), np.nan, np.float32)
    want[valid] = W[INDICES[valid]]
    np.testing.assert_array_equal(got_gather, want)
    want = np.zeros((4, 3), np.float64)
    np.add.at(want, INDICES[valid], v[valid])
    np.testing.assert_allclose(got_scatter, want, rtol=1e-6)


def test_the_embeddings_sass_has_no_64_bit_division(tmp_path):
    """NVRTC for sm_90, the gather and its scatter gradient as the host plans them at the GPU benchmark's shapes
    with int64 indices: 32-bit index arithmetic, so no 64-bit division (its I2F.U64 and the call into the
    division routine) in the SASS, which each had at 64 bits."""
    import re
    import subprocess
    from dataclasses import replace
    from pathlib import Path

    from test_cuda_compile import CUOBJDUMP, NVDISASM, NVRTC_MISSING

    if NVRTC_MISSING or CUOBJDUMP is None or NVDISASM is None:
        pytest.skip("NVRTC, cuobjdump or nvdisasm is not installed")
    from tullax.backends.cuda import compile as cuda_compile

    kernels = []
    for text, dtypes, shapes in ((GATHER, ("float32", "int64"), {"W": (50000, 256), "ix": (16384,)}),
                                 (SCATTER, ("float32", "float32", "int64"),
                                  {"h": (50000, 256), "v": (16384, 256), "ix": (16384,)})):
        spec = _spec(text)
        shapes[spec.out] = tuple(s.eval(shapes) for s in spec.out_shape)
        kernel, plan = device_lowering(spec, Signature(dtypes, "float32"), shapes, text.split("[")[0] + "_k")
        kernels.append((replace(kernel, name=f"k{len(kernels)}"), plan.index_bits))
    assert [bits for _, bits in kernels] == [32, 32]
    path = tmp_path / "embedding.cubin"
    path.write_bytes(cuda_compile.compile_with_report(print_module(kernels), "sm_90")[0])
    sass = subprocess.run([CUOBJDUMP, "-sass", str(path)], capture_output=True, text=True, check=True,
                          env={"PATH": str(Path(NVDISASM).parent)}).stdout
    bodies = dict(re.findall(r"Function : (\w+)\n(.*?)(?=\n\s*Function : |\Z)", sass, re.S))
    assert set(bodies) == {"k0", "k1"}
    for name, body in bodies.items():
        assert "I2F.U64" not in body and not re.search(r"\bCALL\b", body), name
