"""The juliacall runtime and what the Julia backend hands the bridge, without a Julia: a fake juliacall (its bridge
and libjulia handle record every call) stands in for the real one.

What reaches Julia is checked against juliacall's documented conversion of arguments (PythonCall's "Conversion to
Julia", T=Any): ``julia_arrival`` says which Julia type each Python value becomes, and no bridge entry point may
receive a ``PyList``/``PyDict``/``Py`` (the audit's B1: a list of workloads arrived as ``PyList{Py}``).
"""
from __future__ import annotations

import atexit
import ctypes
import gc
import json
import re
import threading
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from julia_subset import CPU_BACKEND, load_module

from tullax.backends import host
from tullax.backends.base import Signature
from tullax.backends.julia import backend as julia
from tullax.backends.julia import runtime as julia_runtime
from tullax.backends.julia.backend import (
    JuliaBackend,
    JuliaCudaBackend,
    bridge_workload,
    index_view,
    kernel_module,
    launch_arguments,
    workload_call,
)
from tullax.backends.julia.runtime import (
    LIBSTDCXX_HINT,
    Juliacall,
    JuliaRuntime,
    JuliaThread,
    gpu_memory_warning,
    julia_env_vars,
    portable,
    run_exit_hook_here,
)
from tullax.errors import BackendUnavailableError, TullaxError
from tullax.printers.julia import JULIA_TYPES, launcher_name, name_of_module
from tullax.spec.frontend import compile_spec

ROOT = Path(__file__).resolve().parent.parent
BRIDGE_SRC = ROOT / "tullax" / "julia" / "TullaxBridge" / "src"


# ---------------------------------------------------------------------------------------------
# juliacall's conversion of arguments, and fakes
# ---------------------------------------------------------------------------------------------
def julia_arrival(value: Any) -> str:
    """The Julia type juliacall makes of a Python argument (PythonCall, docs/src/conversion-to-julia.md: arguments
    are converted with T=Any; a tuple's items likewise, src/Convert/rules.jl)."""
    if isinstance(value, np.ndarray):
        return "PyArray"
    if value is None:
        return "Nothing"
    if isinstance(value, bool):
        return "Bool"
    if isinstance(value, int):
        return "Int64"
    if isinstance(value, float):
        return "Float64"
    if isinstance(value, str):
        return "String"
    if isinstance(value, tuple):
        return "Tuple{" + ",".join(julia_arrival(v) for v in value) + "}"
    if isinstance(value, dict):
        return "PyDict{Py,Py}"
    if isinstance(value, list):
        return "PyList{Py}"
    return "Py"


def assert_plain(value: Any) -> None:
    arrival = julia_arrival(value)
    assert not re.search(r"\bPy(List|Dict)?\b", arrival), f"{value!r} reaches Julia as {arrival}"


def accepted_by_workload_call(call: Any) -> bool:
    """The argument type of TullaxBridge's ``WorkloadCall(::Tuple{AbstractString,Bool,Tuple{Vararg{Integer}},Tuple})``
    and ``WorkloadArg(::Tuple{AbstractString,Tuple{Vararg{Integer}}})`` / ``(::Tuple{AbstractString,Real})``, as
    the value arrives (``test_the_bridge_declares_the_workload_form_python_sends`` ties them to the Julia file)."""
    def integers(t: Any) -> bool:
        return isinstance(t, tuple) and all(isinstance(n, int) and not isinstance(n, bool) for n in t)

    def arg(a: Any) -> bool:
        return (isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], str)
                and (integers(a[1]) or isinstance(a[1], (int, float))))

    return (isinstance(call, tuple) and len(call) == 4 and isinstance(call[0], str) and isinstance(call[1], bool)
            and integers(call[2]) and isinstance(call[3], tuple) and all(arg(a) for a in call[3]))


class FakeModule:
    """A Julia kernel module as juliacall hands it back (a wrapper)."""

    def __init__(self, name: str):
        self.name = name


class FakeBridge:
    """TullaxBridge: records (entry point, arguments, thread) and answers as the real one would."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, int]] = []

    def _record(self, name: str, *args: Any) -> None:
        self.calls.append((name, args, threading.get_ident()))

    def load_kernels(self, source: str, modname: str) -> FakeModule:
        self._record("load_kernels", source, modname)
        return FakeModule(modname)

    def run_launcher_cpu_b(self, module: FakeModule, launcher: str, *args: Any) -> float:
        self._record("run_launcher_cpu!", launcher, *args)
        return 0.001

    def write_precompile_package(self, directory: str, name: str, sources: Any, workloads: Any) -> str:
        self._record("write_precompile_package", directory, name, sources, workloads)
        return str(Path(directory) / name)

    def precompile_package(self, path: str) -> float:
        self._record("precompile_package", path)
        return 0.5


class FakeFunction:
    """A ctypes function of libjulia: records its calls (with the calling thread)."""

    def __init__(self, library: "FakeLibrary", name: str):
        self.library, self.name = library, name
        self.argtypes: Any = None
        self.restype: Any = None

    def __call__(self, *args: Any) -> int:
        self.library.calls.append((self.name, args, threading.get_ident()))
        return 0


class FakeLibrary:
    """libjulia's ctypes handle as juliacall opened it: functions are attributes, created on first access and
    kept (as ctypes.CDLL does)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, int]] = []

    def __getattr__(self, name: str) -> FakeFunction:
        if not name.startswith("jl_"):
            raise AttributeError(name)
        function = FakeFunction(self, name)
        setattr(self, name, function)
        return function


def juliacall_exit(library: Any) -> None:
    """juliacall 0.9.37's own atexit function (``at_jl_exit`` in juliacall/__init__.py), line for line."""
    jl_atexit_hook = library.jl_atexit_hook
    jl_atexit_hook.argtypes = [ctypes.c_int]
    jl_atexit_hook.restype = None
    jl_atexit_hook(0)


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """A JuliaRuntime over a fake juliacall, installed as the process's runtime, with a fresh compile cache and
    build table; its atexit function is unregistered afterwards."""
    monkeypatch.setenv("TULLAX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(host.ALLOW_BOTH_ENV, "1")  # numba may be loaded by other tests; nothing starts here
    for key, value in {"PYTHON_JULIACALL_THREADS": "2", "PYTHON_JULIACALL_HANDLE_SIGNALS": "yes",
                       "PYTHON_JULIAPKG_EXE": str(tmp_path / "julia")}.items():
        monkeypatch.setenv(key, value)  # julia_env_vars then adds nothing to os.environ
    bridge, library = FakeBridge(), FakeLibrary()
    runtime = JuliaRuntime(Juliacall(start=lambda: (object(), bridge), library=lambda: library))
    monkeypatch.setattr(julia_runtime, "_RUNTIME", runtime)
    monkeypatch.setattr(julia, "_BUILDER", host.HostBuilder())
    monkeypatch.setattr(julia, "cpu_availability", lambda: (True, "a fake Julia"))
    yield runtime, bridge, library
    atexit.unregister(runtime._shutdown)


# ---------------------------------------------------------------------------------------------
# What the bridge receives (B1, N5)
# ---------------------------------------------------------------------------------------------
def test_julia_arrival_follows_juliacalls_documented_rules():
    assert julia_arrival((("Float32", (3, 2)), ("Int64", 4), ("Bool", True), ("Float64", 1.5))) == (
        "Tuple{Tuple{String,Tuple{Int64,Int64}},Tuple{String,Int64},Tuple{String,Bool},Tuple{String,Float64}}")
    assert julia_arrival([1, 2]) == "PyList{Py}" and julia_arrival({"a": 1}) == "PyDict{Py,Py}"
    assert julia_arrival(np.zeros(2)) == "PyArray" and julia_arrival(np.float32(1)) == "Py"


def test_launches_and_the_precompiled_package_hand_the_bridge_only_plain_data(fake):
    runtime, bridge, library = fake
    specs = [("D[i,j] := (W[k,i] - X[k,j])^2", ("float32", "float32")), ("out[b,d] := W[ix[b],d]*s",
             ("float64", "int32", "float64")), ("h[ix[b]] += v[b]", ("float64", "int64", "float64"))]
    for text, dtypes in specs:
        spec = compile_spec(text, None)[1]
        signature = Signature(dtypes, dtypes[0])
        built = JuliaBackend().build(spec, signature)
        inputs = [np.ones((3, 2) if i.rank == 2 else (3,), np.dtype(d)) if i.kind != "scalar" else np.dtype(d).type(2)
                  for i, d in zip(spec.inputs, dtypes)]
        inputs = [np.zeros(a.shape, a.dtype) if i.kind == "index" else a for i, a in zip(spec.inputs, inputs)]
        out_shape = tuple(int(s.eval(host.call_shapes(spec, np.zeros(0), inputs))) for s in spec.out_shape)
        built(np.zeros(out_shape, dtypes[0]), *inputs)
    launches = [args for name, args, _ in bridge.calls if name == "run_launcher_cpu!"]
    assert len(launches) == 3
    for args in launches:
        assert_plain(args)
        assert {julia_arrival(a) for a in args} <= {"String", "PyArray", "Float64", "Int64", "Bool"}
    result = julia.warm_package()
    (write,) = [args for name, args, _ in bridge.calls if name == "write_precompile_package"]
    directory, name, sources, workloads = write
    assert_plain(write)
    assert julia_arrival(sources) == "Tuple{" + ",".join(["String"] * 3) + "}"
    assert len(workloads) == 3 and all(accepted_by_workload_call(w) for w in workloads)
    assert result["modules"] == sorted(name_of_module(s) for s in sources) and result["precompile_ms"] == 500.0
    julia_thread = {ident for _, _, ident in bridge.calls}
    assert len(julia_thread) == 1 and julia_thread != {threading.get_ident()}


def test_stored_workloads_become_tuples_the_bridge_reads():
    spec = compile_spec("out[b,d] := W[ix[b],d]*s", None)[1]
    signature = Signature(("float32", "uint64", "float32"), "float32")
    kernel, source = kernel_module(spec, signature)
    stored = json.loads(json.dumps(workload_call(kernel, spec, name_of_module(source))))
    call = bridge_workload(stored)
    assert accepted_by_workload_call(call) and call[0].endswith(".run_kernel!") and call[1] is True
    # uint64 index arrays reach Julia as their int64 view, so the workload allocates Int64 ones
    assert [a[0] for a in call[3][:3]] == ["Float32", "Float32", "Int64"]
    assert not accepted_by_workload_call(stored) and not accepted_by_workload_call(list(call))


def test_the_bridge_declares_the_workload_form_python_sends():
    """The Julia side of ``accepted_by_workload_call``: the constructors python's tuples are dispatched to, and
    no constructor from a Dict (juliacall never delivers one)."""
    text = (BRIDGE_SRC / "precompile_package.jl").read_text()
    assert ("function WorkloadCall((kernel, launcher, ndrange, args)::"
            "Tuple{AbstractString,Bool,Tuple{Vararg{Integer}},Tuple})") in text
    assert "function WorkloadArg((type, dims)::Tuple{AbstractString,Tuple{Vararg{Integer}}})" in text
    assert "WorkloadArg((type, value)::Tuple{AbstractString,Real})" in text
    assert "AbstractDict" not in text
    assert re.search(r"function write_precompile_package\(dir::AbstractString, name::AbstractString, "
                     r"sources::Tuple\{Vararg\{AbstractString\}\},\s+signatures::Tuple\)", text)
    eltypes = re.search(r"const WORKLOAD_ELTYPES = \(([^)]*)\)", text).group(1)
    assert set(JULIA_TYPES.values()) <= {name.strip().lstrip(":") for name in eltypes.split(",")}


def test_python_lists_reach_the_bridge_as_pylist_so_launch_dims_convert_them():
    """G3: ``launch!``'s ndrange/workgroupsize may come from Python lists (PyList{Py} of Py items)."""
    text = (BRIDGE_SRC / "launch.jl").read_text()
    assert "as_dims(x::PyList) = Tuple(pyconvert(Vector{Int}, x))" in text
    assert "as_dims(x) = " not in text  # no fallback calling Int(::Py)


def test_uint64_index_values_reach_julia_as_int64_views_and_out_of_range_ones_are_skipped():
    """N5: Int64(::UInt64) throws InexactError at 2^63 and above; the int64 view makes such a value negative,
    out of range, and the gather's guard gives NaN as the other backends do."""
    spec = compile_spec("out[b,d] := W[ix[b],d]", None)[1]
    kernel, source = kernel_module(spec, Signature(("float64", "uint64"), "float64"))
    ix = np.array([1, 2**63 + 5, 0], np.uint64)
    W = np.arange(6.0).reshape(3, 2)
    out = np.zeros((3, 2))
    args, _ = launch_arguments(kernel, spec, out, [W, ix])
    assert args[2].dtype == np.int64 and np.shares_memory(args[2], ix) and args[1] is W
    load_module(source).call(launcher_name(kernel), CPU_BACKEND, *args)
    np.testing.assert_array_equal(out, [[2.0, 3.0], [np.nan, np.nan], [0.0, 1.0]])
    data = np.array([2**63 + 5], np.uint64)
    assert index_view(data).dtype == np.int64 and index_view(W) is W


# ---------------------------------------------------------------------------------------------
# The Julia thread: exceptions (N9), GC state (R5), exit (R4)
# ---------------------------------------------------------------------------------------------
def frames(error: BaseException) -> list[str]:
    names, tb = [], error.__traceback__
    while tb is not None:
        names.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return names


def test_exceptions_leave_the_julia_thread_as_text_only():
    worker = JuliaThread(name="tullax-julia-test")

    class Wrapper:  # stands in for a juliacall object held by a frame of the traceback
        pass

    held = Wrapper()
    alive = weakref.ref(held)

    def fail(wrapper: Wrapper) -> None:
        try:
            raise KeyError("inner")
        except KeyError:
            raise TypeError("cannot convert argument") from None

    def fail_tullax() -> None:
        raise BackendUnavailableError("no Julia here")

    with pytest.raises(TullaxError, match="Julia raised TypeError: cannot convert argument") as caught:
        worker.run(fail, held)
    error = caught.value
    assert type(error) is TullaxError and error.__cause__ is None and error.__context__ is None
    assert "fail" not in frames(error)  # only the caller's own frames, re-raising it
    with pytest.raises(BackendUnavailableError, match="no Julia here") as caught:
        worker.run(fail_tullax)
    assert "fail_tullax" not in frames(caught.value)
    del held, error, caught  # the caller's own traceback holds run()'s frame, which holds its arguments
    worker.run(lambda: None)  # the Julia thread has dropped the failed job's arguments
    gc.collect()
    assert alive() is None  # nothing that reached this thread keeps it
    assert portable(ValueError("x")).__traceback__ is None


def test_the_julia_thread_is_gc_safe_after_start_and_runs_the_exit_hook_itself(fake):
    runtime, bridge, library = fake
    runtime.start(lambda: (True, "fake"))
    julia_thread = runtime._thread.ident
    assert library.calls == [("jl_gc_safe_enter", (), julia_thread)]
    runtime.load_source("M", "module M end")
    runtime._shutdown()  # what atexit runs, before juliacall's own function
    assert library.calls[1:] == [("jl_gc_unsafe_enter", (), julia_thread), ("jl_atexit_hook", (0,), julia_thread)]
    juliacall_exit(library)  # juliacall's exit function now calls a no-op
    assert [name for name, _, _ in library.calls].count("jl_atexit_hook") == 1
    assert not runtime.started and not runtime.has_module("M")  # Julia objects dropped on the Julia thread
    with pytest.raises(TullaxError, match="shut down"):
        runtime.launch("M", "run_kernel!", [], "cpu")
    with pytest.raises(TullaxError, match="shut down"):
        runtime.start(lambda: (True, "fake"))


def test_the_exit_hook_replacement_works_on_a_real_ctypes_library():
    """ctypes keeps a library's functions as attributes, so juliacall's later ``lib.jl_atexit_hook`` lookup
    finds the replacement (libc stands in for libjulia; its getpid stands in for the hook)."""
    library = ctypes.PyDLL(None)
    real = library.getpid
    library.getpid = julia_runtime._HookAlreadyRun()
    assert library.getpid is not real and library.getpid() is None


def test_an_exit_hook_that_cannot_be_replaced_is_left_to_juliacall():
    class Sealed:
        __slots__ = ()
        jl_atexit_hook = staticmethod(lambda code: pytest.fail("ran the hook"))

    assert run_exit_hook_here(Sealed()) is False
    assert run_exit_hook_here(object()) is False


# ---------------------------------------------------------------------------------------------
# Start-up messages and settings (R6, R7, N3, N4)
# ---------------------------------------------------------------------------------------------
def test_a_failed_start_points_at_libstdcxx_when_that_is_the_likely_cause(monkeypatch):
    def broken(message: str) -> JuliaRuntime:
        def start() -> tuple[Any, Any]:
            raise RuntimeError(message)

        return JuliaRuntime(Juliacall(start=start, library=FakeLibrary))

    for key in ("PYTHON_JULIACALL_THREADS", "PYTHON_JULIACALL_HANDLE_SIGNALS", "PYTHON_JULIAPKG_EXE",
                host.ALLOW_BOTH_ENV):
        monkeypatch.setenv(key, "1")
    for message, hinted in (("PythonCall.jl did not start properly", True),
                            ("version `GLIBCXX_3.4.30' not found", True), ("no network", False)):
        with pytest.raises(BackendUnavailableError) as caught:
            broken(message).start(lambda: (True, "fake"))
        assert message in str(caught.value) and (LIBSTDCXX_HINT in str(caught.value)) == hinted


def test_julia_cuda_next_to_jax_on_a_gpu_warns_about_preallocation(monkeypatch):
    monkeypatch.setattr(julia_runtime, "_JAX_CUDA_PLUGINS", ("json",))  # "installed"
    jax_loaded = {"jax": object()}
    assert "XLA_PYTHON_CLIENT_PREALLOCATE=false" in gpu_memory_warning({}, jax_loaded)
    assert gpu_memory_warning({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, jax_loaded) is None
    assert gpu_memory_warning({"XLA_PYTHON_CLIENT_MEM_FRACTION": ".3"}, jax_loaded) is None
    assert gpu_memory_warning({}, {}) is None
    monkeypatch.setattr(julia_runtime, "_JAX_CUDA_PLUGINS", ("no_such_jax_plugin",))
    assert gpu_memory_warning({}, jax_loaded) is None


def test_threads_and_offline_mode_for_starting_julia(tmp_path):
    base = {"PATH": str(tmp_path), "HOME": str(tmp_path), "PYTHON_JULIAPKG_EXE": str(tmp_path / "julia")}
    assert julia_env_vars(base)["PYTHON_JULIACALL_THREADS"].isdigit()
    assert julia_env_vars({**base, "JULIA_NUM_THREADS": "3"})["PYTHON_JULIACALL_THREADS"] == "3"
    both = {**base, "JULIA_NUM_THREADS": "3", "TULLAX_JULIA_THREADS": "5"}
    assert julia_env_vars(both)["PYTHON_JULIACALL_THREADS"] == "5"
    assert "PYTHON_JULIAPKG_OFFLINE" not in julia_env_vars(base)
    assert julia_env_vars({**base, "TULLAX_JULIA_OFFLINE": "1"})["PYTHON_JULIAPKG_OFFLINE"] == "yes"


# ---------------------------------------------------------------------------------------------
# `tullax cache warm` (G2)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend, precompiles", [("julia", True), ("julia-cuda", False)])
def test_cache_warm_precompiles_only_where_the_backend_declares_it(backend, precompiles, monkeypatch, tmp_path):
    import tullax
    from tullax.cli import main

    monkeypatch.setenv("TULLAX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tullax, "warm", lambda spec, backend, dtype: None)
    called = []
    package = {"path": "p", "modules": [], "precompile_ms": 1.0}
    monkeypatch.setattr(JuliaBackend, "warm_package", lambda self: called.append(self.name) or package)
    monkeypatch.setattr(JuliaCudaBackend, "warm_package", lambda self: pytest.fail("CUDA has no package"))
    assert main(["cache", "warm", "--backend", backend, "y[i] := x[i]"]) == 0
    assert called == ([backend] if precompiles else [])
