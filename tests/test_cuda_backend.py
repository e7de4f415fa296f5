"""The cuda backend without a GPU: launch geometry and index width, argument marshalling through the real
``void**`` parameter block, what a launch enqueues (a fake driver records it), cubins loaded once, trace-time
errors, backend selection on a GPU platform, ``tullax doctor``, imports, and what
``jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))`` emits on this CPU machine: buffer_callback's GPU
custom call with the expected operands, results and aliases, for a forward, a gradient and a vmapped kernel.
"""
from __future__ import annotations

import re
import subprocess
import sys
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from corpus import CASES_BY_ID, analysed

import tullax
from tullax import backends
from tullax.backends import gpu_select
from tullax.backends.base import Signature
from tullax.backends.cuda import backend as cuda
from tullax.backends.cuda import compile as cuda_compile
from tullax.backends.cuda import driver as cuda_driver
from tullax.backends.cuda.launch import START_ANY, START_GIVEN, ParamBlock, plan_launch
from tullax.calls import device
from tullax.compiler.interface import ArrayArg, SizeArg
from tullax.compiler.intervals import Interval, fits
from tullax.compiler.loops import INDEX, Const, Loop, LoopKernel, Store, Var, binop
from tullax.compiler.lower import lower
from tullax.errors import BackendUnavailableError, TullaxError
from tullax.printers.cuda import BLOCK_THREADS, parameters
from tullax.spec.sizes import Sym

# on a machine with an NVIDIA driver and NVRTC (tests/test_gpu_device.py runs there), the checks of what happens
# without one do not apply
HAS_CUDA = cuda.CudaBackend().availability()[0]
without_a_gpu = pytest.mark.skipif(HAS_CUDA, reason="this machine has a usable CUDA driver and NVRTC")


# ---------------------------------------------------------------------------------------------
# A driver that records instead of launching
# ---------------------------------------------------------------------------------------------
class FakeDriver:
    def __init__(self):
        self.loads, self.calls = [], []

    def load(self, image: bytes, name: str):
        self.loads.append((image, name))
        return f"function{len(self.loads)}"

    def launch(self, function, grid, block, stream, params):
        import ctypes

        self.calls.append(("launch", function, grid, block, stream, params))
        self.last_params = params
        self.last_decoded = [ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))[k] for k in range(8)]

    def copy(self, target, source, nbytes, stream):
        self.calls.append(("copy", target, source, nbytes, stream))

    def clear(self, target, nbytes, stream):
        self.calls.append(("clear", target, nbytes, stream))


class FakeBuffer:
    def __init__(self, address: int):
        self.__cuda_array_interface__ = {"data": (address, False), "version": 3}


def fake_cubin(source, arch, *, spec_text, dtypes):
    return cuda_compile.Cubin(cuda_compile.cache_key(source=source, arch=arch), source.encode(), 1.0)


@pytest.fixture
def gpu(monkeypatch, tmp_path):
    """The cuda backend as if a GPU were here: a fake driver, sm_90, NVRTC if it loads (else a stand-in)."""
    fake = FakeDriver()
    monkeypatch.setenv("TULLAX_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(cuda_driver.ARCH_ENV, "sm_90")
    monkeypatch.setattr(cuda_driver, "driver", lambda: fake)
    monkeypatch.setattr(cuda.CudaBackend, "availability", lambda self: (True, ""))
    try:
        cuda_compile.nvrtc()
    except BackendUnavailableError:
        monkeypatch.setattr(cuda_compile, "cached_cubin", fake_cubin)
    monkeypatch.setattr(cuda, "_BUILT", {})
    monkeypatch.setattr(cuda, "_LOADED", {})
    return fake


def case_kernel(case_id: str, dtype: str = "float32"):
    case = CASES_BY_ID[case_id]
    spec = analysed(case.spec, case.ranges)
    return spec, lower(spec, Signature.for_dtype(spec, dtype), name="kernel")


# ---------------------------------------------------------------------------------------------
# Launch plans
# ---------------------------------------------------------------------------------------------
def test_plan_of_dist_one_thread_per_2x2_register_tile():
    spec, kernel = case_kernel("dist")
    plan = plan_launch(kernel, spec, {"W": (784, 1024), "X": (784, 512), "D": (1024, 512)}, "float32")
    assert plan.index_bits == 32 and plan.block == BLOCK_THREADS and plan.grid == 1024 * 512 // 4 // BLOCK_THREADS
    names = [p.name for p in parameters(kernel, 32) if not p.pointer]
    assert dict(zip(names, plan.values)) == {"n0": 784, "n1": 512, "n2": 1024, "n3": 784 - 512, "a0_e1": 512,
                                             "a1_e1": 1024, "a2_e1": 512}  # n3: the end of the first block of k
    assert plan.pointers == (None, 0, 1) and plan.start == START_ANY and plan.out_bytes == 1024 * 512 * 4


def test_plan_rounds_small_blocks_to_warps_and_skips_empty_launches():
    spec, kernel = case_kernel("row_sum")
    assert (plan_launch(kernel, spec, {"A": (10, 3), "r": (10,)}, "float32").grid,
            plan_launch(kernel, spec, {"A": (10, 3), "r": (10,)}, "float32").block) == (1, 32)
    assert plan_launch(kernel, spec, {"A": (0, 3), "r": (0,)}, "float32").grid == 0


def test_a_scalar_result_runs_as_one_thread():
    spec, kernel = case_kernel("dot")
    plan = plan_launch(kernel, spec, {"x": (1000,), "y": (1000,), "s": ()}, "float32")
    assert (plan.grid, plan.block, plan.values) == (1, 1, (1000,))


def test_updates_and_scatters_start_from_the_given_array():
    spec, kernel = case_kernel("accumulate_matmul")
    assert plan_launch(kernel, spec, {"C": (2, 3), "A": (2, 4), "B": (4, 3)}, "float64").start == START_GIVEN
    spec, kernel = case_kernel("scatter_indirect")
    assert plan_launch(kernel, spec, {"h": (3,), "ix": (6,), "v": (6,)}, "float64").start == START_GIVEN


def test_index_width_is_64_bits_when_an_array_does_not_fit():
    spec, kernel = case_kernel("dist")
    big = {"W": (64, 2**26), "X": (64, 8), "D": (2**26, 8)}
    assert plan_launch(kernel, spec, big, "float32").index_bits == 64
    spec = analysed("out[b,d] := W[ix[b],d]")
    narrow = lower(spec, tullax.backends.base.Signature(("float32", "int32"), "float32"))
    wide = lower(spec, tullax.backends.base.Signature(("float32", "int64"), "float32"))
    shapes = {"W": (4, 3), "ix": (6,), "out": (6, 3)}
    assert plan_launch(narrow, spec, shapes, "float32").index_bits == 32
    # an int64 index array too: its value is used only under the guard (tests/test_cuda_index_width.py)
    assert plan_launch(wide, spec, shapes, "float32").index_bits == 32


def test_intervals_check_every_intermediate_value():
    i, n = Var("i0", INDEX), Var("n0", INDEX)
    position = binop("-", binop("*", i, Const(3, INDEX)), Const(2**31 - 10, INDEX))  # 3i - big: fits at the end
    kernel = LoopKernel("k", "t", (ArrayArg("a0", "y", 1, "float32", "out"),), (), (SizeArg("n0", Sym.extent("x", 0)),),
                        (Loop("i0", Const(0, INDEX), n, True, (Store("a0", (position,), Const(1.0, "float32")),)),),
                        "float32")
    int32 = Interval(-(2**31), 2**31 - 1)
    assert fits(kernel, {"n0": 10}, int32)
    assert not fits(kernel, {"n0": 2**30}, int32)  # 3i overflows before the subtraction brings it back


# ---------------------------------------------------------------------------------------------
# Marshalling and what a launch enqueues
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [32, 64])
def test_the_parameter_block_holds_the_pointers_then_the_integers(bits):
    spec, kernel = case_kernel("scalar_params")  # y[i] := a*x[i] + b: arrays, two scalars, a size
    plan = plan_launch(kernel, spec, {"x": (7,), "a": (), "b": (), "y": (7,)}, "float32")
    plan = type(plan)(**{**plan.__dict__, "index_bits": bits})
    block = ParamBlock(kernel, plan)
    block.set_pointers([0x1000, 0x2000, 0x3000, 0x4000])
    assert [p.kind for p in parameters(kernel, bits)] == ["array", "array", "scalar", "scalar", "size"]
    assert block.decoded() == [0x1000, 0x2000, 0x3000, 0x4000, 7]
    assert plan.pointers == (None, spec.input_names.index("x"), spec.input_names.index("a"),
                             spec.input_names.index("b"))
    with pytest.raises(ValueError):
        block.set_pointers([1, 2])


def test_a_launch_enqueues_on_xlas_stream_with_the_buffer_addresses(gpu):
    spec = analysed("D[i,j] := (W[k,i] - X[k,j])^2")
    shapes = {"W": (3, 4), "X": (3, 5), "D": (4, 5)}
    kernel = cuda.device_kernel(spec, Signature.for_dtype(spec, "float32"), shapes)
    kernel(77, FakeBuffer(0xD000), (FakeBuffer(0xA000), FakeBuffer(0xB000)))
    ((what, function, grid, block, stream, params),) = gpu.calls
    assert (what, function, grid, block, stream) == ("launch", "function1", 1, 32, 77)
    assert gpu.last_decoded[:3] != [0xD000, 0xA000, 0xB000]  # the slots hold addresses OF the values
    assert kernel._params.decoded() == [0xD000, 0xA000, 0xB000, 3, 5, 4, 3, 5, 4, 5]


def test_updates_copy_the_given_array_unless_xla_aliased_it(gpu):
    spec = analysed("C[i,j] += A[i,k]*B[k,j]")
    shapes = {"C": (2, 3), "A": (2, 4), "B": (4, 3)}
    kernel = cuda.device_kernel(spec, Signature.for_dtype(spec, "float64"), shapes)
    kernel(5, FakeBuffer(0x100), (FakeBuffer(0x200), FakeBuffer(0x300), FakeBuffer(0x400)))
    assert gpu.calls[0] == ("copy", 0x100, 0x200, 2 * 3 * 8, 5) and gpu.calls[1][0] == "launch"
    gpu.calls.clear()
    kernel(5, FakeBuffer(0x200), (FakeBuffer(0x200), FakeBuffer(0x300), FakeBuffer(0x400)))
    assert [c[0] for c in gpu.calls] == ["launch"]


def test_a_split_sum_clears_its_output_on_the_stream_before_the_launch(gpu):
    """Few output elements with long sums: the pieces add into the output, which starts at zero."""
    spec = analysed("y[b,i] := x[b,i+k]*w[k]")
    from tullax.planner.call import kernel_shapes

    label, grad, shapes = kernel_shapes(spec, {"x": (64, 16384), "w": (31,)})[2]
    assert label.endswith("w")
    shapes = {**shapes, grad.out: (31,)}
    kernel = cuda.device_kernel(grad, Signature.for_dtype(grad, "float32"), shapes)
    assert kernel.kernel.split
    kernel(9, FakeBuffer(0x100), tuple(FakeBuffer(0x200 + 0x100 * k) for k in range(len(grad.inputs))))
    assert gpu.calls[0] == ("clear", 0x100, 31 * 4, 9) and gpu.calls[1][0] == "launch"
    assert gpu.calls[1][2] * gpu.calls[1][3] >= 1 << 16  # blocks x threads: far more than 31


def test_nothing_to_compute_launches_nothing(gpu):
    spec = analysed("r[i] := A[i,j]")
    kernel = cuda.device_kernel(spec, Signature.for_dtype(spec, "float32"), {"A": (0, 3), "r": (0,)})
    kernel(1, FakeBuffer(0x10), (FakeBuffer(0x20),))
    assert gpu.calls == []


def test_each_cubin_is_loaded_once_and_each_kernel_built_once(gpu):
    spec = analysed("y[i] := 2*x[i]")
    signature = Signature.for_dtype(spec, "float32")
    # both extents multiples of 4: the same vector-lane kernel (tullax.compiler.vectorize)
    first = cuda.device_kernel(spec, signature, {"x": (12,), "y": (12,)})
    assert cuda.device_kernel(spec, signature, {"x": (12,), "y": (12,)}) is first
    other = cuda.device_kernel(spec, signature, {"x": (20,), "y": (20,)})  # same source: same cubin
    assert other is not first and len(gpu.loads) == 1 and gpu.loads[0][1] == cuda.KERNEL_NAME
    from tullax.runtime.cache import get_cache

    (record,) = [e for e in get_cache().entries() if e.get("backend") == "cuda"]
    assert record["kind"] == "cubin" and ("ttfk_cold_ms" in record or "ttfk_warm_ms" in record)


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------
def test_numpy_inputs_need_a_host_backend():
    with pytest.raises(BackendUnavailableError, match="host backend"):
        cuda.CudaBackend().build(analysed("y[i] := x[i]"), Signature.for_dtype(analysed("y[i] := x[i]"), "float32"))


@without_a_gpu
def test_without_a_driver_the_backend_says_why():
    ok, why = cuda.CudaBackend().availability()
    assert not ok and ("NVRTC" in why or "driver" in why)


def test_a_compile_error_surfaces_at_trace_time(gpu, monkeypatch):
    def broken(source, arch, options=()):
        raise TullaxError("NVRTC could not compile the generated CUDA kernel: the log")

    monkeypatch.setattr(cuda_compile, "cached_cubin", lambda *a, **k: broken(*a))
    k = tullax.einsum_kernel("y[i] := 2*x[i]", backend="cuda")
    with pytest.raises(TullaxError, match="the log"):
        jax.jit(k).trace(jnp.ones(3)).lower(lowering_platforms=("cuda",))


def test_driver_errors_name_the_call():
    class Result:
        CUDA_SUCCESS = 0

    class Cu:
        CUresult = Result

        @staticmethod
        def cuGetErrorName(status):
            return 0, b"CUDA_ERROR_INVALID_IMAGE"

    driver = cuda_driver.Driver.__new__(cuda_driver.Driver)
    driver._cu = Cu
    with pytest.raises(TullaxError, match="cuLibraryLoadData failed: CUDA_ERROR_INVALID_IMAGE"):
        driver._check((1, None), "cuLibraryLoadData")


def test_the_real_bindings_accept_the_arguments_the_driver_passes():
    """Without libcuda the binding fails when it loads the driver, AFTER it has converted the arguments: a
    TypeError would mean the launch, copy or load arguments are of the wrong kind."""
    cu = pytest.importorskip("cuda.bindings.driver")
    driver = cuda_driver.Driver.__new__(cuda_driver.Driver)
    driver._cu, driver._libraries, driver._lock = cu, [], threading.Lock()
    params = ParamBlock(*reversed(case_kernel_and_plan()))
    for call in (lambda: driver.launch(cu.CUfunction(0), 1, 32, 0, params.address),
                 lambda: driver.copy(0x100, 0x200, 64, 0), lambda: driver.load(b"\x7fELF", "kernel")):
        with pytest.raises(Exception) as info:
            call()
        assert not isinstance(info.value, TypeError), info.value


def case_kernel_and_plan():
    spec, kernel = case_kernel("dist")
    return plan_launch(kernel, spec, {"W": (3, 4), "X": (3, 5), "D": (4, 5)}, "float32"), kernel


def test_an_architecture_from_the_environment_must_be_exact(monkeypatch):
    monkeypatch.setenv(cuda_driver.ARCH_ENV, "90")
    with pytest.raises(TullaxError, match="sm_90"):
        cuda_driver.target_arch()


# ---------------------------------------------------------------------------------------------
# Paths and selection
# ---------------------------------------------------------------------------------------------
def test_device_backends_take_the_device_path_host_backends_copy_with_one_warning(monkeypatch):
    monkeypatch.setattr(device, "_warned", set())
    assert device.device_path("cuda", "cuda") == device.DEVICE_PATH
    with pytest.warns(device.HostCopyWarning, match="copies"):
        assert device.device_path("numba", "cuda") == device.HOST_COPY_PATH
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert device.device_path("numba", "cuda") == device.HOST_COPY_PATH


def test_the_lowering_and_the_planners_loop_candidate_take_one_path_choice(monkeypatch):
    """``tullax.calls.path`` decides for both the primitive's lowering and the planner's loop candidate, so
    the planner times the path a planned kernel takes: the device kernel for a GPU backend (here with its call
    recorded instead of launched: no GPU needed), the host callback for a host backend."""
    from tullax.calls import path as loop_path
    from tullax.calls.host import callback_path
    from tullax.planner import candidates
    from tullax.planner.call import Call

    monkeypatch.setattr(device, "_warned", set())
    assert loop_path.lowered_path("xla", "cuda", "cuda") == "xla"
    assert loop_path.lowered_path("buffer", "c", "cpu") == "buffer"
    assert loop_path.lowered_path("buffer", "cuda", "cuda") == device.DEVICE_PATH
    assert loop_path.backend_path("cuda") == device.DEVICE_PATH
    assert loop_path.backend_path("numba") == callback_path()

    launched = []

    def recorded(spec, backend_name, args, out_dtype, emit=None, zero_start=False):
        launched.append(backend_name)
        return jnp.zeros(tuple(s.eval({n: tuple(a.shape) for n, a in zip(spec.input_names, args)})
                               for s in spec.out_shape), out_dtype)

    monkeypatch.setattr(device, "device_call", recorded)
    spec = analysed("y[i] := 2*x[i]")
    candidates._loop_call(Call.of(spec, {"x": (8,)}, {"x": "float32"}, "cuda"), [np.ones(8, np.float32)])()
    assert launched == ["cuda"]


@pytest.mark.parametrize("usable, chosen", [({"julia-cuda", "cuda"}, "julia-cuda"), ({"cuda"}, "cuda"),
                                            (set(), "xla")])
def test_auto_on_a_gpu_races_julia_cuda_then_cuda_against_xla_and_never_a_host_backend(monkeypatch, usable, chosen):
    """On a GPU ``auto`` stays ``auto``: the planner's loop backend is the GPU's (julia-cuda, else cuda); without
    one, XLA's forms run (a host backend would copy every input to the host and back)."""
    from tullax.planner import rules as planner

    class Stub:
        platform = "cuda"
        capabilities = backends.Capabilities()

        def __init__(self, name):
            self.name = name

        def availability(self):
            return (self.name in usable, f"{self.name} is not here")

    real_get = backends.get
    monkeypatch.setattr(backends, "get", lambda name: Stub(name) if name in gpu_select.GPU_ORDER else real_get(name))
    gpu_select.gpu_choice.cache_clear()
    try:
        name, why = gpu_select.gpu_choice()
        assert name == chosen and (chosen != "xla" or "copy" in why)
        monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
        assert tullax.einsum_kernel("y[i] := x[i]")._jax_backend() == "auto"
        assert planner.on_gpu() and planner.loop_backend(("float32",)) == (None if chosen == "xla" else chosen)
        monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
        assert not planner.on_gpu() and planner.loop_backend(("float32",)) not in gpu_select.GPU_ORDER
    finally:
        gpu_select.gpu_choice.cache_clear()


def test_doctor_reports_the_gpu_nvrtc_and_the_gpu_choice():
    from tullax.cli.main import main

    gpu_select.gpu_choice.cache_clear()
    report = subprocess.run([sys.executable, "-c", "from tullax.cli.main import main; main(['doctor'])"],
                            capture_output=True, text=True).stdout
    gpu_line = r"GPU: .+ \(sm_\d+\), driver supports CUDA \d+" if HAS_CUDA else r"GPU: none usable"
    assert re.search(gpu_line, report) and "NVRTC:" in report
    assert "on a GPU, backend='auto' runs" in report and main is not None


def test_importing_tullax_and_the_cuda_modules_loads_no_cuda_library():
    code = ("import sys, tullax, tullax.backends.cuda.backend, tullax.backends.gpu_select, tullax.calls.device\n"
            "tullax.backends.get('cuda')\n"
            "bad = [m for m in sys.modules if m == 'cuda' or m.startswith(('cuda.', 'jax', 'numba'))]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_generate_source_prints_every_kernel_of_the_spec():
    source = tullax.generate_source("y[i] := x[i+k]*w[k]", backend="cuda", dtype="float64")
    assert re.findall(r'extern "C" __global__ void __launch_bounds__\(\d+, \d+\) (\w+)\(', source) == [
        "forward", "grad0_step0", "grad1_step0"]
    kernels = source.split("#endif", 1)[1]
    assert "double* __restrict__ a0" in kernels and "float" not in kernels


# ---------------------------------------------------------------------------------------------
# Lowering for the cuda platform on this CPU machine
# ---------------------------------------------------------------------------------------------
CALL = re.compile(r"stablehlo\.custom_call @xla_buffer_python_gpu_callback\(([^)]*)\) \{(.*?)\} : "
                  r"\(([^)]*)\) -> (tensor<[^>]*>)")


def gpu_calls(fn, *args):
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert "pure_callback" not in text and "xla_python_cpu_callback" not in text
    return [(operands.split(", "), types.split(", "), result, "output_operand_aliases" in attrs)
            for operands, attrs, types, result in CALL.findall(text)]


def test_the_forward_lowers_to_one_gpu_buffer_callback(gpu):
    dist = tullax.einsum_kernel("D[i,j] := (W[k,i] - X[k,j])^2", backend="cuda")
    (call,) = gpu_calls(dist, jnp.ones((3, 4)), jnp.ones((3, 5)))
    assert call == (["%arg0", "%arg1"], ["tensor<3x4xf32>", "tensor<3x5xf32>"], "tensor<4x5xf32>", False)
    assert gpu.calls == []  # lowering launches nothing


def test_a_gradient_lowers_to_one_gpu_buffer_callback_per_gradient_kernel(gpu):
    dist = tullax.einsum_kernel("D[i,j] := (W[k,i] - X[k,j])^2", backend="cuda")
    calls = gpu_calls(jax.grad(lambda w, x: dist(w, x).sum(), argnums=(0, 1)), jnp.ones((3, 4)), jnp.ones((3, 5)))
    assert [(types, result, aliased) for _, types, result, aliased in calls] == [
        (["tensor<4x5xf32>", "tensor<3x4xf32>", "tensor<3x5xf32>"], "tensor<3x4xf32>", False),
        (["tensor<4x5xf32>", "tensor<3x4xf32>", "tensor<3x5xf32>"], "tensor<3x5xf32>", False)]


def test_a_scatter_gradient_clears_its_output_instead_of_taking_xlas_zeros(gpu):
    """The embedding's gradient (``ΔW[ix[b],d] += Δout[b,d]``) starts from zeros: the callback is not handed a
    zero array (which XLA would write, or copy where it cannot alias it); the kernel clears its output on XLA's
    stream."""
    embedding = tullax.einsum_kernel("out[b,d] := W[ix[b],d]", backend="cuda")
    (call,) = gpu_calls(jax.grad(lambda w, ix: embedding(w, ix).sum()), jnp.ones((4, 3)), jnp.arange(5) % 4)
    operands, types, result, aliased = call
    # Δout, ix and W (the step's inputs but the zeros, which came first)
    assert types == ["tensor<5x3xf32>", "tensor<5xi32>", "tensor<4x3xf32>"] and result == "tensor<4x3xf32>"
    assert not aliased


def test_a_zero_start_launch_clears_the_output_then_reads_the_inputs_without_the_zeros(gpu):
    spec = analysed("W[ix[b],d] += v[b,d]")
    shapes = {"W": (4, 3), "ix": (5,), "v": (5, 3)}
    signature = Signature(("float32", "int32", "float32"), "float32")
    kernel = cuda.device_kernel(spec, signature, shapes, zero_start=True)
    kernel(3, FakeBuffer(0x100), (FakeBuffer(0x200), FakeBuffer(0x300)))  # ix, v: no zeros
    assert gpu.calls[0] == ("clear", 0x100, 4 * 3 * 4, 3) and gpu.calls[1][0] == "launch"
    assert sorted(kernel._params.decoded()[:3]) == [0x100, 0x200, 0x300]
    given = cuda.device_kernel(spec, signature, shapes)  # not known to be zeros: the given array is copied
    gpu.calls.clear()
    given(3, FakeBuffer(0x100), (FakeBuffer(0x400), FakeBuffer(0x200), FakeBuffer(0x300)))
    assert gpu.calls[0] == ("copy", 0x100, 0x400, 4 * 3 * 4, 3)
    assert sorted(given._params.decoded()[:3]) == [0x100, 0x200, 0x300]


def test_vmap_lowers_to_one_batched_gpu_buffer_callback(gpu):
    dist = tullax.einsum_kernel("D[i,j] := (W[k,i] - X[k,j])^2", backend="cuda")
    (call,) = gpu_calls(jax.vmap(dist), jnp.ones((2, 3, 4)), jnp.ones((2, 3, 5)))
    assert call[1:] == (["tensor<2x3x4xf32>", "tensor<2x3x5xf32>"], "tensor<2x4x5xf32>", False)


@without_a_gpu
def test_host_backends_cannot_lower_for_a_gpu_this_process_does_not_compute_on(monkeypatch):
    """The host path copies through pure_callback, which needs jax's CUDA plugin to lower for cuda: without it, a
    TullaxError that says so (not jax's bare ValueError, issue 44 item 10; tests/test_cross_platform.py)."""
    from tullax.errors import UnservedPlatformError

    monkeypatch.setattr(device, "_warned", set())
    k = tullax.einsum_kernel("y[i] := 2*x[i]", backend="numba")
    with pytest.raises(UnservedPlatformError, match="cannot be lowered for 'cuda' here"):
        jax.jit(k).trace(np.ones(3, np.float32)).lower(lowering_platforms=("cuda",))


@without_a_gpu
def test_the_gpu_benchmark_refuses_without_a_gpu():
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu.py"
    done = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True)
    assert done.returncode != 0 and "needs an NVIDIA GPU" in done.stderr and "Nothing was measured" in done.stderr


@pytest.mark.parametrize("flag", ["0", "1"])
def test_command_buffers_are_marked_only_when_asked(gpu, monkeypatch, flag):
    """TULLAX_CUDA_COMMAND_BUFFER=1: XLA's command-buffer variant of the GPU callback (it may capture the launch
    into a CUDA graph); off by default until benchmarks/gpu.py shows it faster and correct."""
    monkeypatch.setenv(device.COMMAND_BUFFER_ENV, flag)
    k = tullax.einsum_kernel("y[i] := 2*x[i]", backend="cuda")
    text = jax.jit(k).trace(jnp.ones(3)).lower(lowering_platforms=("cuda",)).as_text()
    assert "@xla_buffer_python_gpu_callback" in text
    assert ("@xla_buffer_python_gpu_callback_cmd_buffer(" in text) == (flag == "1")
