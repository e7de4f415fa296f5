"""NVRTC compiles the block-tiled kernels (``tullax.compiler.tiles``: Dist's and Linear's forward and gradients at
the GPU benchmark's shapes, 64 x 64 tiles) for sm_90 and sm_80, float32 and float64: no register spill, one
barrier, the two staged operands' shared arrays (a row the copy reads along k padded by one vector) and nothing
else in shared memory, and in the SASS the shared stores, the barrier and the register tile's shared reads as
128-bit loads (LDS.128) only; registers let one block of 256 threads fit an SM."""
from __future__ import annotations

import re
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_cuda_compile import ARCHS, BITS, CUOBJDUMP, NVDISASM, NVRTC_MISSING
from trace_cases import CASES, launches

from tullax.compiler.loops import Shared, walk_stmts

pytestmark = [pytest.mark.skipif(bool(NVRTC_MISSING), reason=f"NVRTC cannot be loaded: {NVRTC_MISSING}"),
              pytest.mark.slow]


@pytest.fixture(scope="module", params=[(arch, dtype) for arch in ARCHS for dtype in BITS],
                ids=lambda p: f"{p[0]}-{p[1]}")
def cubin(request, tmp_path_factory):
    from tullax.backends.cuda import compile as cuda_compile
    from tullax.printers.cuda import print_module

    arch, dtype = request.param
    found = [launch.kernel for case in CASES[:2] for _, launch, _ in launches(*case, dtype=np.dtype(dtype).type)]
    kernels = [replace(k, name=f"tiled{n}") for n, k in enumerate(found)]  # unique names in one module
    assert len(kernels) == 6 and all(k.tile is not None for k in kernels)
    image, report = cuda_compile.compile_with_report(print_module([(k, BITS[dtype]) for k in kernels]), arch)
    path = tmp_path_factory.mktemp("cubin") / f"tiles-{arch}-{dtype}.cubin"
    path.write_bytes(image)
    return kernels, path, report, np.dtype(dtype).itemsize


def test_no_spill_one_barrier_and_the_staged_operands_in_shared_memory(cubin):
    kernels, _, report, itemsize = cubin
    used = {}
    for chunk in report.split("Function properties for ")[1:]:
        name = chunk.split()[0]
        head = chunk.split("Compiling entry function")[0]
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", head)
        counts = [re.search(p, head) for p in (r"Used (\d+) registers", r"used (\d+) barriers", r"(\d+) bytes smem")]
        used[name] = (spill.groups(), *(int(c.group(1)) if c else 0 for c in counts))
    for kernel in kernels:
        spills, registers, barriers, smem = used[kernel.name]
        assert spills == ("0", "0"), kernel.name
        assert registers <= 255 and registers * 256 <= 65536, (kernel.name, registers)
        staged = sum(s.length for s in walk_stmts(kernel.body) if isinstance(s, Shared)) * itemsize
        # two 16 x 64 chunks; a row the copy reads along k is padded by one vector (its bank spread)
        assert 2 * 16 * 64 * itemsize <= staged <= 2 * 16 * (64 + 16 // itemsize) * itemsize, kernel.name
        assert barriers == 1 and smem == staged, (kernel.name, used[kernel.name])


@pytest.mark.skipif(CUOBJDUMP is None or NVDISASM is None, reason="cuobjdump and nvdisasm are not installed")
def test_the_sass_stages_through_shared_memory(cubin):
    kernels, path, _, _ = cubin
    env = {"PATH": str(Path(NVDISASM).parent)}
    sass = subprocess.run([CUOBJDUMP, "-sass", str(path)], capture_output=True, text=True, check=True,
                          env=env).stdout
    bodies = dict(re.findall(r"Function : (\w+)\n(.*?)(?=\n\s*Function : |\Z)", sass, re.S))
    assert set(bodies) == {k.name for k in kernels}
    for name, body in bodies.items():
        assert re.search(r"\bBAR\.SYNC", body) and re.search(r"\bSTS\b", body) and re.search(r"\bLDS\b", body), name
        # the register tile's shared reads are 16-byte vector reads (float4, double2: ``VectorLoad``), not scalar
        assert re.search(r"\bLDS\.128\b", body), name
        assert not re.search(r"\bLDS\s", body) and not re.search(r"\bLDS\.(64|U8|S8|U16|S16)\b", body), name


@pytest.mark.parametrize("arch", ARCHS)
def test_the_window_tiles_compile_without_spills(arch, tmp_path):
    """conv2d's forward and both gradients as window tiles (``tullax.compiler.window_tiles``) at the benchmark's
    shapes, float32: no spill, one barrier, registers that fit the block on an SM, shared memory within the
    48 KiB static limit; in the SASS, the patches' shared stores, loads and the barrier."""
    from tullax.backends.cuda import compile as cuda_compile
    from tullax.printers.cuda import print_module

    conv = next(case for case in CASES if case[0] == "conv2d")
    kernels = [replace(launch.kernel, name=f"window{n}") for n, (_, launch, _) in enumerate(launches(*conv))]
    assert all(k.tile is not None for k in kernels)
    image, report = cuda_compile.compile_with_report(print_module([(k, 32) for k in kernels]), arch)
    for chunk in report.split("Function properties for ")[1:]:
        name = chunk.split()[0]
        head = chunk.split("Compiling entry function")[0]
        threads = next(k.tile.threads for k in kernels if k.name == name)
        assert re.search(r"0 bytes spill stores, 0 bytes spill loads", head), name
        registers = int(re.search(r"Used (\d+) registers", head).group(1))
        assert registers <= 255 and registers * threads <= 65536, (name, registers)
        assert int(re.search(r"used (\d+) barriers", head).group(1)) == 1, name
        assert 0 < int(re.search(r"(\d+) bytes smem", head).group(1)) <= 48 * 1024, name
    if CUOBJDUMP is not None and NVDISASM is not None:
        path = tmp_path / "window.cubin"
        path.write_bytes(image)
        sass = subprocess.run([CUOBJDUMP, "-sass", str(path)], capture_output=True, text=True, check=True,
                              env={"PATH": str(Path(NVDISASM).parent)}).stdout
        for body in re.findall(r"Function : \w+\n(.*?)(?=\n\s*Function : |\Z)", sass, re.S):
            assert re.search(r"\bBAR\.SYNC", body) and re.search(r"\bSTS\b", body) and re.search(r"\bLDS\b", body)


@pytest.mark.parametrize("arch", ARCHS)
def test_each_architectures_tiles_compile_for_it(arch, tmp_path):
    """The tiles the cuda backend picks for ``arch`` (``tullax.backends.cuda.tile_sizes``): Dist's and Linear's
    block tiles in float32 and float64, conv2d's window tiles in float32, in one module: no spill, one barrier,
    registers that fit the block on an SM, static shared memory within 48 KiB; the block tiles' register tile
    read as LDS.128."""
    from tullax.backends.cuda import compile as cuda_compile
    from tullax.backends.cuda.tile_sizes import tile_policy
    from tullax.printers.cuda import print_module

    policy = tile_policy(arch)
    found = [(launch.kernel, BITS[np.dtype(dtype).name]) for dtype in (np.float32, np.float64) for case in CASES[:2]
             for _, launch, _ in launches(*case, dtype=dtype, tiles=policy)]
    conv = next(case for case in CASES if case[0] == "conv2d")
    found += [(launch.kernel, 32) for _, launch, _ in launches(*conv, tiles=policy)]
    kernels = [(replace(k, name=f"arch{n}"), bits) for n, (k, bits) in enumerate(found)]
    assert all(k.tile is not None for k, _ in kernels)
    assert all(k.tile == policy.tile for k, _ in kernels[:12])
    image, report = cuda_compile.compile_with_report(print_module(kernels), arch)
    threads = {k.name: k.tile.threads for k, _ in kernels}
    for chunk in report.split("Function properties for ")[1:]:
        name = chunk.split()[0]
        head = chunk.split("Compiling entry function")[0]
        assert re.search(r"0 bytes spill stores, 0 bytes spill loads", head), name
        registers = int(re.search(r"Used (\d+) registers", head).group(1))
        assert registers <= 255 and registers * threads[name] <= 65536, (name, registers)
        assert int(re.search(r"used (\d+) barriers", head).group(1)) == 1, name
        assert 0 < int(re.search(r"(\d+) bytes smem", head).group(1)) <= 48 * 1024, name
    if CUOBJDUMP is not None and NVDISASM is not None:
        path = tmp_path / "arch.cubin"
        path.write_bytes(image)
        sass = subprocess.run([CUOBJDUMP, "-sass", str(path)], capture_output=True, text=True, check=True,
                              env={"PATH": str(Path(NVDISASM).parent)}).stdout
        bodies = dict(re.findall(r"Function : (\w+)\n(.*?)(?=\n\s*Function : |\Z)", sass, re.S))
        for kernel, _ in kernels[:12]:
            assert re.search(r"\bLDS\.128\b", bodies[kernel.name]), kernel.name
