"""The Julia backend itself: end to end with a real Julia (issue 5, layer 4: tests marked ``julia``, skipped with
the reason where no Julia is found), and what it does on every machine (no Julia: a clear error and no juliacall
import; availability of julia-cuda; the Julia thread; the precompile workload; the numba warning).

Each end-to-end scenario runs in its own process (``tests/julia_e2e.py``): Julia and numba must not share one
(numba issue 7857), and pytest's faulthandler must not see the SIGSEGVs Julia's garbage collector uses.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

from tullax.backends.base import Signature
from tullax.backends.host import ALLOW_BOTH_ENV, warn_if_other_llvm_loaded
from tullax.backends.julia import detect as julia_detect
from tullax.backends.julia.backend import (
    cuda_availability,
    kernel_module,
    workload_call,
)
from tullax.backends.julia.runtime import JuliaThread
from tullax.errors import TullaxError
from tullax.spec.frontend import compile_spec

ROOT = Path(__file__).resolve().parent.parent
E2E = Path(__file__).resolve().parent / "julia_e2e.py"
SCENARIO_TIMEOUT_S = 3600  # the first start resolves, downloads and precompiles the Julia environment


# ---------------------------------------------------------------------------------------------
# Layer 4: the real backend, whenever a Julia is found
# ---------------------------------------------------------------------------------------------
# Julia >= 1.12 warns when code reads a binding in a world older than its definition (audit N6).
WORLD_AGE_WARNING = "world prior to its definition"


def run_scenario(name: str, cache_dir: Path, **extra_env: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    env.update(TULLAX_CACHE_DIR=str(cache_dir), **extra_env)
    result = subprocess.run([sys.executable, str(E2E), name], capture_output=True, text=True, env=env,
                            timeout=SCENARIO_TIMEOUT_S, cwd=ROOT)
    lines = result.stdout.strip().splitlines()
    if result.returncode == 0 and lines and lines[-1].startswith("SKIP:"):
        pytest.skip(lines[-1])
    assert result.returncode == 0 and lines and lines[-1] == "OK", (
        f"scenario {name} failed (exit {result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}")
    assert WORLD_AGE_WARNING not in result.stderr, result.stderr[-8000:]
    return result.stdout


@pytest.mark.julia
def test_forward_kernels_match_the_naive_evaluator(tmp_path):
    run_scenario("forward", tmp_path / "cache")


@pytest.mark.julia
def test_jit_grad_and_vmap_through_the_jax_op_match_xla(tmp_path):
    run_scenario("jax", tmp_path / "cache")


@pytest.mark.julia
def test_cache_cold_then_warm_from_the_precompiled_package(tmp_path):
    cache = tmp_path / "cache"
    run_scenario("cache_cold", cache)
    run_scenario("cache_warm", cache)


@pytest.mark.julia
def test_the_bridge_julia_test_suite(tmp_path):
    run_scenario("bridge", tmp_path / "cache")


@pytest.mark.julia
def test_julia_cuda_when_a_gpu_and_cuda_jl_are_there(tmp_path):
    run_scenario("cuda", tmp_path / "cache")


@pytest.mark.julia
def test_the_bridge_takes_the_precompile_workload_as_python_sends_it(tmp_path):
    """Audit B1: tuples reach write_precompile_package as Julia Tuples; lists (PyList{Py}) are refused."""
    run_scenario("bridge_arguments", tmp_path / "cache")


@pytest.mark.julia
def test_cpu_launches_give_every_julia_thread_work_groups(tmp_path):
    """Audit G1, on the real KernelAbstractions, with 4 Julia threads."""
    assert "Julia threads: 4" in run_scenario("geometry", tmp_path / "cache", TULLAX_JULIA_THREADS="4")


@pytest.mark.julia
def test_tiled_cpu_kernels_over_several_tiles_match_the_references(tmp_path):
    """Audit R1 (the @Const alias-scope miscompile needs Julia 1.11/1.12; the scenario prints the version)."""
    run_scenario("tiled", tmp_path / "cache", TULLAX_JULIA_THREADS="4")


@pytest.mark.julia
@pytest.mark.parametrize("threads", ["1", "4"])
def test_the_interpreter_exits_cleanly_after_running_julia(tmp_path, threads):
    """Audit R4: Julia's exit hook runs on the Julia thread at exit; a crash there fails the exit status."""
    for _ in range(5):
        run_scenario("exit_child", tmp_path / "cache", TULLAX_JULIA_THREADS=threads)


@pytest.mark.julia
def test_julia_collects_garbage_while_the_julia_thread_waits_in_python(tmp_path):
    """Audit R5: the Julia thread is GC-safe between calls."""
    run_scenario("gc_idle", tmp_path / "cache", TULLAX_JULIA_THREADS="2")


@pytest.mark.julia
def test_julia_starts_after_jax_loaded_its_cpp_runtime(tmp_path):
    """Audit R6: the libstdc++ load order of tullax's lazy start works on this host."""
    run_scenario("after_jax", tmp_path / "cache")


@pytest.mark.julia
def test_the_pow_helper_on_julia_matches_xla_bit_for_bit(tmp_path):
    """Audit G4, on the real Julia (the evaluator's model of Julia's ^ is checked with it)."""
    run_scenario("pow", tmp_path / "cache")


# ---------------------------------------------------------------------------------------------
# Without a Julia
# ---------------------------------------------------------------------------------------------
def _no_julia_environment(tmp_path: Path) -> dict[str, str]:
    hidden = ("PYTHON_JULIACALL_EXE", "PYTHON_JULIAPKG_EXE", "PYTHON_JULIACALL_BINDIR", "PYTHON_JULIACALL_PROJECT",
              "PYTHONFAULTHANDLER")
    env = {k: v for k, v in os.environ.items() if k not in hidden}
    (tmp_path / "bin").mkdir(exist_ok=True)
    env.update(PATH=f"{tmp_path / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin",
               HOME=str(tmp_path / "home"), JULIA_DEPOT_PATH=str(tmp_path / "depot"),
               JULIAUP_DEPOT_PATH=str(tmp_path / "juliaup"), PYTHON_JULIAPKG_PROJECT=str(tmp_path / "project"),
               TULLAX_CACHE_DIR=str(tmp_path / "cache"))
    return env


NO_JULIA_SCRIPT = """
import sys
import numpy as np
from tullax.backends.julia.detect import find_julia
if find_julia() is not None:
    print("SKIP: a Julia is installed where this test cannot hide it:", find_julia())
    raise SystemExit
import tullax
from tullax import backends
for name in ("julia", "julia-cuda"):
    try:
        tullax.einsum_kernel("y[i] := 2*x[i]", backend=name)(np.ones(3))
    except tullax.BackendUnavailableError as err:
        print(name, "|", str(err).replace(chr(10), " "))
    else:
        raise AssertionError(name + " ran without a Julia")
print("auto", "|", backends.resolve("auto").name)
print("juliacall imported:", "juliacall" in sys.modules)
"""


def test_without_julia_the_backend_is_unavailable_and_juliacall_is_never_imported(tmp_path):
    result = subprocess.run([sys.executable, "-c", NO_JULIA_SCRIPT], capture_output=True, text=True,
                            env=_no_julia_environment(tmp_path), timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    if result.stdout.startswith("SKIP:"):
        pytest.skip(result.stdout.strip())
    lines = dict(line.split(" | ", 1) for line in result.stdout.splitlines() if " | " in line)
    for name in ("julia", "julia-cuda"):
        message = lines[name]
        assert f"backend '{name}' is not usable here" in message
        assert "No Julia >= 1.10.3 was found" in message and "PYTHON_JULIAPKG_EXE" in message
        assert "juliaup" in message
    assert lines["auto"] != "julia"
    assert "juliacall imported: False" in result.stdout


def test_the_registry_loads_the_julia_backends_without_juliacall():
    from tullax import backends

    assert backends.get("julia").name == "julia" and backends.get("julia-cuda").name == "julia-cuda"
    assert "juliacall" not in sys.modules


@pytest.fixture
def fake_julia(tmp_path, monkeypatch):
    """Only a scripted `julia` that answers --version (never started: availability only probes it)."""
    monkeypatch.setattr(julia_detect.sys, "prefix", sys.base_prefix)
    for key in ("PYTHON_JULIACALL_EXE", "PYTHON_JULIAPKG_EXE", "PYTHON_JULIACALL_BINDIR"):
        monkeypatch.delenv(key, raising=False)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "julia"
    exe.write_text("#!/bin/sh\necho 'julia version 1.11.2'\n")
    exe.chmod(0o755)
    julia_detect._probe_cached.cache_clear()
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("JULIA_DEPOT_PATH", str(tmp_path / "depot"))
    monkeypatch.setenv("PYTHON_JULIAPKG_PROJECT", str(tmp_path / "project"))
    yield tmp_path
    julia_detect._probe_cached.cache_clear()


def test_julias_availability_is_looked_up_once_per_environment(fake_julia, monkeypatch):
    """``auto`` asks at every plan; the search runs again only when what it reads changes (here the PATH)."""
    from tullax.backends.julia import backend as julia

    searches = []
    search = julia_detect.availability
    monkeypatch.setattr(julia_detect, "availability", lambda: searches.append(1) or search())
    assert julia.cpu_availability()[0] and julia.cpu_availability()[0] and len(searches) == 1
    empty = fake_julia / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    ok, why = julia.cpu_availability()
    assert not ok and "Julia" in why and len(searches) == 2
    monkeypatch.setenv("PATH", str(fake_julia / "bin"))
    assert julia.cpu_availability()[0] and len(searches) == 2


def test_julia_cuda_needs_a_gpu_and_cuda_jl(fake_julia, monkeypatch):
    from tullax.backends.julia import backend as julia

    monkeypatch.setattr(julia, "_nvidia_device", lambda: False)
    ok, why = cuda_availability()
    assert not ok and "no NVIDIA GPU" in why
    monkeypatch.setattr(julia, "_nvidia_device", lambda: True)
    ok, why = cuda_availability()
    assert not ok and "tullax julia install-cuda" in why
    project = fake_julia / "project"
    project.mkdir()
    (project / "Project.toml").write_text('[deps]\nCUDA = "052768ef-5323-5732-b1bb-66c8b64840ba"\n')
    ok, why = cuda_availability()
    assert ok and "Julia 1.11.2" in why


# ---------------------------------------------------------------------------------------------
# The Julia thread, the numba warning, the precompile workload
# ---------------------------------------------------------------------------------------------
def test_julia_thread_runs_every_job_on_its_one_thread_and_reraises():
    worker = JuliaThread(name="tullax-julia-test")
    seen = []

    def job(k):
        seen.append(threading.get_ident())
        return k * 2

    results = []
    callers = [threading.Thread(target=lambda k=k: results.append(worker.run(job, k))) for k in range(8)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert sorted(results) == [2 * k for k in range(8)]
    assert set(seen) == {worker.ident} and worker.ident != threading.get_ident()
    assert worker.run(lambda: worker.run(job, 5)) == 10  # a job may call run again without deadlocking

    def fail():
        raise TullaxError("from the Julia thread")

    with pytest.raises(TullaxError, match="from the Julia thread"):
        worker.run(fail)


def test_starting_julia_next_to_numba_warns_unless_allowed(monkeypatch):
    monkeypatch.setitem(sys.modules, "numba", sys.modules.get("numba") or object())
    monkeypatch.delenv(ALLOW_BOTH_ENV, raising=False)
    with pytest.warns(RuntimeWarning, match="numba issue 7857"):
        warn_if_other_llvm_loaded("Julia")
    monkeypatch.setenv(ALLOW_BOTH_ENV, "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_other_llvm_loaded("Julia")


def test_loading_numba_next_to_julia_warns_unless_allowed(monkeypatch):
    monkeypatch.setitem(sys.modules, "juliacall", sys.modules.get("juliacall") or object())
    monkeypatch.delenv(ALLOW_BOTH_ENV, raising=False)
    with pytest.warns(RuntimeWarning, match="starting numba .* already loaded Julia.*numba issue 7857"):
        warn_if_other_llvm_loaded("numba")
    monkeypatch.setenv(ALLOW_BOTH_ENV, "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_other_llvm_loaded("numba")


def test_precompile_workload_calls_the_launcher_with_tiny_valid_arguments():
    spec = compile_spec("out[b,d] := W[ix[b],d]*s", None)[1]
    signature = Signature(("float32", "int32", "float32"), "float32")
    kernel, source = kernel_module(spec, signature)
    call = workload_call(kernel, spec, "TullaxKernels_x")
    assert call["kernel"] == "TullaxKernels_x.run_kernel!" and call["launcher"] is True
    types = [a["type"] for a in call["args"]]
    assert types == ["Float32", "Float32", "Int32", "Float64"] + ["Int64"] * len(kernel.sizes)
    out, w, ix = (a["dims"] for a in call["args"][:3])
    assert out == [w[0], ix[0]]  # Julia order: out (b, d) is (d, b); W (rows, d) is (d, rows)
    assert all(a["value"] > 0 for a in call["args"][4:])
    json.dumps(call)  # what the cache stores


def test_launch_arguments_pass_numpy_arrays_through_without_copies():
    from tullax.backends.julia.backend import launch_arguments

    spec = compile_spec("y[i] := a*x[i] + b", None)[1]
    kernel, _ = kernel_module(spec, Signature(("float32", "float32", "float32"), "float32"))
    x, out = np.arange(4, dtype=np.float32), np.empty(4, np.float32)
    args, copy_back = launch_arguments(kernel, spec, out, [np.float32(2.0), x, np.float32(0.5)])
    assert copy_back is None and args[0] is out and args[1] is x
    assert args[2:] == [2.0, 0.5, 4] and all(type(a) in (float, int) for a in args[2:])
