"""NVRTC compiles every corpus kernel (forward and every gradient step, float32 and float64) to sm_90 and sm_80
cubins; cuobjdump (PyPI nvidia-cuda-cuobjdump, with nvidia-cuda-nvdisasm for the SASS) shows no register
spill, and an atomic instruction exactly in the kernels that have an ``atomic_add`` store (scatters, and the
sums split over several threads per output element). The cache and the compile errors of
``tullax.backends.cuda.compile``."""
from __future__ import annotations

import base64
import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from corpus import CORPUS
from cuda_harness import SPLIT_EVERYTHING

from tullax.backends.base import Signature
from tullax.backends.cuda.launch import device_lowering
from tullax.backends.host import kernel_steps
from tullax.compiler.loops import Store, walk_stmts
from tullax.compiler.lower import lower
from tullax.errors import BackendUnavailableError, TullaxError
from tullax.planner.call import kernel_shapes
from tullax.printers.cuda import BLOCK_THREADS, print_module
from tullax.spec.examples import shapes_for
from tullax.spec.frontend import compile_spec

try:
    from tullax.backends.cuda import compile as cuda_compile

    cuda_compile.nvrtc()
    NVRTC_MISSING = ""
except BackendUnavailableError as err:
    NVRTC_MISSING = str(err)

pytestmark = [pytest.mark.skipif(bool(NVRTC_MISSING), reason=f"NVRTC cannot be loaded: {NVRTC_MISSING}"),
              pytest.mark.slow]

ARCHS = ("sm_90", "sm_80")
BITS = {"float32": 32, "float64": 64}
def _tool(name: str) -> str | None:
    """On PATH, else in the bin/ of the PyPI wheels (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)."""
    found = shutil.which(name)
    if found:
        return found
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for candidate in sorted(Path(root).glob(f"cu*/bin/{name}")):
            return str(candidate)
    return None


CUOBJDUMP = _tool("cuobjdump")
NVDISASM = _tool("nvdisasm")


def corpus_kernels(dtype: str):
    """Every corpus kernel, and each plain sum among them split as the cuda backend splits long ones (at the
    corpus's small sizes, by a policy that splits from two terms per output element)."""
    kernels = []
    for case in CORPUS:
        spec = compile_spec(case.spec, case.ranges)[1]
        for number, step in enumerate(kernel_steps(spec)):
            kernels.append(lower(step.spec, Signature.for_dtype(step.spec, dtype), name=f"{case.id}_{number}"))
        shapes = {**shapes_for(spec, seed=0), **(case.shapes or {})}
        for number, (_, step, its_shapes) in enumerate(kernel_shapes(spec, shapes)):
            its_shapes = {**its_shapes, step.out: tuple(s.eval(its_shapes) for s in step.out_shape)}
            cut, _ = device_lowering(step, Signature.for_dtype(step, dtype), its_shapes, f"{case.id}_split{number}",
                                     SPLIT_EVERYTHING)
            if cut.split:
                kernels.append(cut)
    return kernels


@pytest.fixture(scope="module", params=[(arch, dtype) for arch in ARCHS for dtype in BITS],
                ids=lambda p: f"{p[0]}-{p[1]}")
def cubin(request, tmp_path_factory):
    arch, dtype = request.param
    kernels = corpus_kernels(dtype)
    image, report = cuda_compile.compile_with_report(print_module([(k, BITS[dtype]) for k in kernels]), arch)
    path = tmp_path_factory.mktemp("cubin") / f"corpus-{arch}-{dtype}.cubin"
    path.write_bytes(image)
    return arch, kernels, path, report


def test_every_corpus_kernel_compiles_to_a_cubin_for_the_architecture(cubin):
    arch, kernels, path, _ = cubin
    assert len(kernels) > 150
    assert path.read_bytes()[:4] == b"\x7fELF"
    if CUOBJDUMP:
        listing = subprocess.run([CUOBJDUMP, "-lelf", str(path)], capture_output=True, text=True).stdout
        assert arch in listing or path.name in listing


def test_no_kernel_spills_registers(cubin):
    """ptxas's own count of spill stores and loads (a stack frame alone is no spill: sin/cos/tan keep their
    argument reduction's table there)."""
    _, kernels, _, report = cubin
    spills = re.findall(r"Function properties for (\w+)\n.*?(\d+) bytes spill stores, (\d+) bytes spill loads",
                        report)
    names = {k.name for k in kernels}
    assert names <= {name for name, *_ in spills}
    spilled = [(name, stores, loads) for name, stores, loads in spills
               if name in names and (stores, loads) != ("0", "0")]
    assert not spilled, spilled


@pytest.mark.skipif(CUOBJDUMP is None, reason="cuobjdump is not installed (pip install nvidia-cuda-cuobjdump)")
def test_resource_usage_fits_the_launch_bounds(cubin):
    _, kernels, path, _ = cubin
    usage = subprocess.run([CUOBJDUMP, "-res-usage", str(path)], capture_output=True, text=True, check=True).stdout
    functions = re.findall(r"Function (\w+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", usage)
    assert {name for name, *_ in functions} == {k.name for k in kernels}
    registers_per_thread = 65536 // BLOCK_THREADS  # one block of BLOCK_THREADS must fit an SM's register file
    assert all(int(reg) <= registers_per_thread and shared == local == "0" for _, reg, _, shared, local in functions)


@pytest.mark.skipif(CUOBJDUMP is None or NVDISASM is None,
                    reason="cuobjdump and nvdisasm are not installed (pip install nvidia-cuda-cuobjdump "
                           "nvidia-cuda-nvdisasm)")
def test_atomics_only_where_the_loop_ir_asks_for_them(cubin):
    _, kernels, path, _ = cubin
    env = {"PATH": str(Path(NVDISASM).parent)}
    sass = subprocess.run([CUOBJDUMP, "-sass", str(path)], capture_output=True, text=True, check=True,
                          env=env).stdout
    bodies = dict(re.findall(r"Function : (\w+)\n(.*?)(?=\n\s*Function : |\Z)", sass, re.S))
    assert set(bodies) == {k.name for k in kernels}
    atomic = {name for name, body in bodies.items() if re.search(r"\b(RED|ATOM)G?\.", body)}
    asked = {k.name for k in kernels if any(isinstance(s, Store) and s.mode == "atomic_add"
                                            for s in walk_stmts(k.body))}
    assert asked and atomic == asked
    assert all(k.is_scatter or k.split for k in kernels if k.name in asked)
    assert any(k.split for k in kernels) and any(k.is_scatter for k in kernels)


# ---------------------------------------------------------------------------------------------
# Compile errors and the cache
# ---------------------------------------------------------------------------------------------
def test_a_compile_error_is_a_tullax_error_with_nvrtc_log():
    with pytest.raises(TullaxError, match=r"(?s)NVRTC could not compile.*undefined_thing"):
        cuda_compile.compile_cubin('extern "C" __global__ void k() { undefined_thing(); }', "sm_90")


@pytest.mark.parametrize("arch", ["sm90", "compute_90", "sm_", 90])
def test_architectures_must_be_exact(arch):
    with pytest.raises(TullaxError, match="not a CUDA architecture"):
        cuda_compile.compile_cubin("", arch)


SOURCE = 'extern "C" __global__ void k(float* a) { a[threadIdx.x] = 1.0f; }'


def test_cubins_are_cached_by_source_arch_and_nvrtc_version(tmp_path, monkeypatch):
    from tullax.runtime.cache import get_cache

    monkeypatch.setenv("TULLAX_CACHE_DIR", str(tmp_path))
    first = cuda_compile.cached_cubin(SOURCE, "sm_90", spec_text="a[i] := 1", dtypes=["float32"])
    assert first.compile_ms is not None and first.image[:4] == b"\x7fELF"
    again = cuda_compile.cached_cubin(SOURCE, "sm_90", spec_text="a[i] := 1", dtypes=["float32"])
    assert again == cuda_compile.Cubin(first.key, first.image, None)
    other_arch = cuda_compile.cached_cubin(SOURCE, "sm_80", spec_text="a[i] := 1", dtypes=["float32"])
    assert other_arch.key != first.key and other_arch.compile_ms is not None
    assert cuda_compile.cubin_key(SOURCE + "\n", "sm_90") != first.key
    cache = get_cache()
    record = next(e for e in cache.entries() if e["key"] == first.key)
    assert record["backend"] == "cuda" and record["hits"] == 1 and record["compile_ms"] > 0
    assert cache.read_text(first.key, cuda_compile.SOURCE_FILE) == SOURCE
    assert base64.b64decode(cache.read_text(first.key, cuda_compile.CUBIN_FILE)) == first.image


def test_the_key_includes_the_nvrtc_version(monkeypatch):
    key = cuda_compile.cubin_key(SOURCE, "sm_90")
    monkeypatch.setattr(cuda_compile, "nvrtc_wheel", lambda: "99.0.1")  # the wheel's version
    assert cuda_compile.cubin_key(SOURCE, "sm_90") != key
    monkeypatch.setattr(cuda_compile, "nvrtc_wheel", lambda: None)  # a toolkit's: the loaded library's version
    toolkit = cuda_compile.cubin_key(SOURCE, "sm_90")
    monkeypatch.setattr(cuda_compile, "nvrtc_version", lambda: (99, 0))
    assert cuda_compile.cubin_key(SOURCE, "sm_90") != toolkit


@pytest.mark.skipif(cuda_compile.nvrtc_wheel() is None or not Path("/proc/self/maps").exists(),
                    reason="needs the nvidia-cuda-nvrtc wheel and /proc")
def test_a_cached_cubin_is_read_without_loading_nvrtc(tmp_path):
    """A warm process finds its cubins by the wheel's version: libnvrtc stays unloaded (it costs a tenth of a
    second and more of every warm first call)."""
    import os
    import sys

    code = ("import sys\nfrom tullax.backends.cuda import compile as cuda_compile\n"
            f"cubin = cuda_compile.cached_cubin({SOURCE!r}, 'sm_90', spec_text='a', dtypes=['float32'])\n"
            "maps = open('/proc/self/maps').read()\n"
            "print(cubin.compile_ms is None, 'libnvrtc' in maps)\n")
    env = {**os.environ, "TULLAX_CACHE_DIR": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
            for _ in range(2)]
    assert runs == ["False True\n", "True False\n"]  # cold: compiled with NVRTC; warm: read, NVRTC never loaded
