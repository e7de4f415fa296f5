"""``julia-cuda`` inside jax on an NVIDIA GPU, without a GPU or a Julia (issue 11, item 5): the device path.

A fake juliacall (``test_julia_runtime``'s) stands in for Julia. Checked here: julia-cuda takes the device path
(buffer_callback: XLA's device buffers and stream, no pure_callback copy), what the bridge's
``run_launcher_cuda_device!`` receives for a call (the buffers' addresses in the printed launcher's parameter
order, Julia element types, dims reversed, the array ``+=`` starts from, device scalars, sizes: plain tuples that
juliacall hands over as Julia ``Tuple``s), that the Julia method declares exactly that form, and that the GPU
launcher returns without synchronising. What is NOT checked here, for want of a GPU and a Julia: that CUDA.jl
runs the kernel on those buffers; the julia-marked tests and ``benchmarks/gpu.py`` do, where both exist.
"""
from __future__ import annotations

import re
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from test_cuda_backend import FakeBuffer  # buffer_callback's Buffer: an address
from test_julia_runtime import FakeBridge, assert_plain, fake, julia_arrival  # noqa: F401 - the fixture

import tullax
from tullax.backends.base import Signature
from tullax.backends.julia import backend as julia
from tullax.backends.julia.backend import CUDA, JuliaCudaBackend, device_plan, kernel_module
from tullax.calls import device
from tullax.spec.frontend import compile_spec

EXT = Path(__file__).resolve().parent.parent / "tullax" / "julia" / "TullaxBridge" / "ext" / "TullaxBridgeCUDAExt.jl"


def _device_calls(bridge: FakeBridge) -> list[tuple]:
    return [args for name, args, _ in bridge.calls if name == "run_launcher_cuda_device!"]


@pytest.fixture
def cuda_fake(fake, monkeypatch):  # noqa: F811 - the imported fixture
    runtime, bridge, library = fake

    def run_launcher_cuda_device_b(module, launcher, *args):
        bridge._record("run_launcher_cuda_device!", launcher, *args)

    bridge.run_launcher_cuda_device_b = run_launcher_cuda_device_b
    monkeypatch.setattr(JuliaCudaBackend, "availability", lambda self: (True, "a fake Julia with CUDA.jl"))
    monkeypatch.setattr(JuliaCudaBackend, "_start", lambda self: runtime.start(lambda: (True, "a fake Julia")))
    return runtime, bridge


def test_julia_cuda_takes_the_device_path_without_the_copy_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert device.device_path("julia-cuda", "cuda") == device.DEVICE_PATH


def test_the_plan_reverses_dims_and_names_julia_types_in_parameter_order():
    spec = compile_spec("D[i,j] := (W[k,i] - X[k,j])^2", None)[1]
    signature = Signature(("float32", "float32"), "float32")
    kernel, _ = kernel_module(spec, signature, CUDA)
    plan = device_plan(kernel, spec, {"W": (3, 4), "X": (3, 5), "D": (4, 5)})
    sources = [None if a.role != "in" else spec.input_names.index(a.source) for a in kernel.arrays]
    dims = {None: (5, 4), 0: (4, 3), 1: (5, 3)}
    assert plan.arrays == tuple((s, "Float32", dims[s]) for s in sources)
    assert plan.given is None and plan.scalars == ()
    assert len(plan.sizes) == len(kernel.sizes) and set(plan.sizes) <= {3, 4, 5}


def test_a_call_hands_the_bridge_xlas_stream_and_buffer_addresses_as_plain_tuples(cuda_fake):
    runtime, bridge = cuda_fake
    spec = compile_spec("out[b,d] := W[ix[b],d]*s", None)[1]
    signature = Signature(("float64", "uint64", "float32"), "float64")
    shapes = {"W": (7, 3), "ix": (5,), "s": (), "out": (5, 3)}
    kernel = JuliaCudaBackend().device_kernel(spec, signature, shapes)
    buffers = [FakeBuffer(0x1000), FakeBuffer(0x2000), FakeBuffer(0x3000)]
    kernel(0xABC, FakeBuffer(0x9000), buffers)
    (call,) = _device_calls(bridge)
    launcher, stream, ordinal, given, arrays, scalars, sizes = call
    assert_plain(call)
    assert (stream, ordinal, given) == (0xABC, 0, ())
    assert arrays[0] == (0x9000, "Float64", (3, 5))  # the output first, dims reversed
    assert set(arrays[1:]) == {(0x1000, "Float64", (3, 7)), (0x2000, "Int64", (5,))}  # uint64 as its Int64 view
    assert scalars == ((0x3000, "Float32", "Float64"),)  # read on the device, converted to the declared type
    assert all(isinstance(n, int) for n in sizes)
    assert julia_arrival(arrays).startswith("Tuple{Tuple{Int64,String,Tuple{Int64,Int64}}")
    assert julia_arrival((stream, ordinal)) == "Tuple{Int64,Int64}"


def test_an_update_starts_from_the_given_buffer(cuda_fake):
    runtime, bridge = cuda_fake
    spec = compile_spec("y[i] += x[i,j]", None)[1]
    kernel = JuliaCudaBackend().device_kernel(spec, Signature(("float32", "float32"), "float32"),
                                              {"y": (4,), "x": (4, 6), spec.out: (4,)})
    kernel(1, FakeBuffer(0x9000), [FakeBuffer(0x4000), FakeBuffer(0x5000)])
    (call,) = _device_calls(bridge)
    assert call[3] == (0x4000, "Float32", (4,))  # copied into the output on CUDA.jl's stream unless aliased


def test_the_julia_method_declares_the_form_python_sends():
    text = EXT.read_text()
    assert re.search(r"function TullaxBridge\.run_launcher_cuda_device!\(mod::Module, launcher::Union\{Symbol,"
                     r"AbstractString\},\s+xla_stream::Integer, device::Integer, given::Tuple,\s+arrays::Tuple, "
                     r"scalars::Tuple, sizes::Tuple\)", text)
    body = text[text.index("function TullaxBridge.run_launcher_cuda_device!"):]
    body = body[:body.index("\nend\n")]
    # ordered both ways by events on the streams, never by waiting on the host
    assert "cuStreamWaitEvent(ours, ready" in body and "cuStreamWaitEvent(theirs, done" in body
    assert "synchronize" not in body and "CuArray(" not in body.replace("unsafe_wrap(CuArray", "")


def test_the_gpu_launcher_returns_without_synchronising():
    spec = compile_spec("y[i] := 2*x[i]", None)[1]
    signature = Signature(("float32",), "float32")
    assert "synchronize" not in kernel_module(spec, signature, CUDA)[1]
    assert "KernelAbstractions.synchronize(backend)" in kernel_module(spec, signature, julia.CPU)[1]


def test_jit_lowers_julia_cuda_to_a_gpu_buffer_callback(cuda_fake):
    k = tullax.einsum_kernel("D[i,j] := (W[k,i] - X[k,j])^2", backend="julia-cuda")
    text = jax.jit(k).trace(jnp.ones((3, 4)), jnp.ones((3, 5))).lower(lowering_platforms=("cuda",)).as_text()
    assert "xla_buffer_python_gpu_callback" in text and "pure_callback" not in text
    names = [name for name, _, _ in cuda_fake[1].calls]
    assert "load_kernels" in names  # built at trace time, so a compile error is raised there
    assert "run_launcher_cuda_device!" not in names  # lowering launches nothing


# -- the schedules the cuda backend picks (tiles, cooperative reductions), on julia-cuda ----------------------
SCHEDULED = (
    ("D[i,j] := (W[k,i]-X[k,j])^2", {"W": (70, 70), "X": (70, 65)}, "tile"),  # block tiles 64 x 64
    ("y[n,o,h,w] := x[n,c,h+p,w+q]*k[o,c,p,q]", {"x": (1, 8, 6, 130), "k": (8, 8, 3, 3)}, "tile"),  # window tiles
    ("(logsumexp) l[i] := x[i,j]", {"x": (3, 4096)}, "cooperative"),  # a block per row
    ("D[i,j] := (W[k,i]-X[k,j])^2", {"W": (3, 4), "X": (3, 5)}, None),  # too small: the default lowering
)


def _full(spec, shapes: dict) -> dict:
    return {**shapes, spec.out: tuple(s.eval(shapes) for s in spec.out_shape)}


@pytest.mark.parametrize("text,shapes,schedule", SCHEDULED)
def test_julia_cuda_loads_the_kernel_the_cuda_backend_picks(cuda_fake, text, shapes, schedule):
    """julia-cuda's device kernel for these shapes is the cuda backend's choice (``device_schedule``): the module
    Julia loads holds its work-groups, local memory and barriers, and the plan passes that kernel's sizes."""
    runtime, bridge = cuda_fake
    spec = compile_spec(text)[1]
    full = _full(spec, shapes)
    kernel = JuliaCudaBackend().device_kernel(spec, Signature.for_dtype(spec, "float32"), full)
    (source,) = [args[0] for name, args, _ in bridge.calls if name == "load_kernels"]
    scheduled = julia.device_schedule(spec, Signature.for_dtype(spec, "float32"), full)
    if schedule is None:
        assert scheduled is None and "@localmem" not in source and "@synchronize" not in source
        return
    assert getattr(scheduled, schedule) and not scheduled.split
    assert "@localmem" in source and "@synchronize()" in source and "@index(Group, Linear)" in source
    assert kernel.plan.sizes == tuple(int(s.size.eval(full)) for s in scheduled.sizes)


def test_the_chosen_cooperative_kernel_runs_in_the_julia_subset():
    """The block-per-row logsumexp julia-cuda picks at (3, 4096), printed for KernelAbstractions and run by the
    Julia-subset evaluator, against NumPy float64 (the tiles' printed form is run by tests/test_julia_groups.py)."""
    import numpy as np
    from julia_subset import CPU_BACKEND, load_module

    from tullax.printers.julia import GPU_FLAVOUR, launcher_name, print_module
    from tullax.spec.examples import random_inputs
    from tullax.testing.oracle import naive_eval

    spec = compile_spec(SCHEDULED[2][0])[1]
    env = random_inputs(spec, SCHEDULED[2][1], seed=1, dtype=np.float64)
    full = _full(spec, SCHEDULED[2][1])
    kernel = julia.device_schedule(spec, Signature.for_dtype(spec, "float64"), full)
    out = np.zeros(full[spec.out])
    load_module(print_module([kernel], flavour=GPU_FLAVOUR)).call(
        launcher_name(kernel), CPU_BACKEND, out, env["x"], *(int(s.size.eval(full)) for s in kernel.sizes))
    np.testing.assert_allclose(out, naive_eval(spec, env), rtol=1e-12)
