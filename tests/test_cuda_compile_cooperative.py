"""NVRTC compiles the block-cooperative kernels (``tullax.compiler.cooperate``: every corpus kernel it accepts
when every row counts as long) for sm_90 and sm_80, float32 and float64: no register spill, and in the SASS the
warp shuffles and barriers of the block merge, and the shared array of the warps' partials."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from corpus import CORPUS
from test_cuda_compile import ARCHS, BITS, CUOBJDUMP, NVDISASM, NVRTC_MISSING

from tullax.backends.base import Signature
from tullax.backends.cuda.launch import device_lowering
from tullax.compiler.cooperate import FORCE_BLOCK, FORCE_WARP
from tullax.planner.decide import kernel_shapes
from tullax.printers.cuda import BLOCK_THREADS
from tullax.spec.examples import shapes_for
from tullax.spec.frontend import compile_spec

pytestmark = [pytest.mark.skipif(bool(NVRTC_MISSING), reason=f"NVRTC cannot be loaded: {NVRTC_MISSING}"),
              pytest.mark.slow]


def cooperative_kernels(dtype: str):
    """Every corpus kernel the stage accepts, a block per element and a warp per element."""
    kernels = []
    for case in CORPUS:
        spec = compile_spec(case.spec, case.ranges)[1]
        shapes = {**shapes_for(spec, seed=0), **(case.shapes or {})}
        for number, (_, step, its_shapes) in enumerate(kernel_shapes(spec, shapes)):
            its_shapes = {**its_shapes, step.out: tuple(s.eval(its_shapes) for s in step.out_shape)}
            for unit, cooperation in (("block", FORCE_BLOCK), ("warp", FORCE_WARP)):
                kernel, _ = device_lowering(step, Signature.for_dtype(step, dtype), its_shapes,
                                            f"{case.id}_{unit}{number}", cooperation=cooperation)
                if kernel.cooperative:
                    kernels.append(kernel)
    return kernels


@pytest.fixture(scope="module", params=[(arch, dtype) for arch in ARCHS for dtype in BITS],
                ids=lambda p: f"{p[0]}-{p[1]}")
def cubin(request, tmp_path_factory):
    from tullax.backends.cuda import compile as cuda_compile
    from tullax.printers.cuda import print_module

    arch, dtype = request.param
    kernels = cooperative_kernels(dtype)
    image, report = cuda_compile.compile_with_report(print_module([(k, BITS[dtype]) for k in kernels]), arch)
    path = tmp_path_factory.mktemp("cubin") / f"cooperative-{arch}-{dtype}.cubin"
    path.write_bytes(image)
    return kernels, path, report


def test_no_cooperative_kernel_spills(cubin):
    kernels, _, report = cubin
    assert len(kernels) >= 20
    spills = re.findall(r"Function properties for (\w+)\n.*?(\d+) bytes spill stores, (\d+) bytes spill loads",
                        report)
    names = {k.name for k in kernels}
    assert names <= {name for name, *_ in spills}
    assert not [s for s in spills if s[0] in names and s[1:] != ("0", "0")]


@pytest.mark.skipif(CUOBJDUMP is None or NVDISASM is None,
                    reason="cuobjdump and nvdisasm are not installed (pip install nvidia-cuda-cuobjdump "
                           "nvidia-cuda-nvdisasm)")
def test_the_sass_shuffles_synchronises_and_uses_shared_memory(cubin):
    kernels, path, _ = cubin
    env = {"PATH": str(Path(NVDISASM).parent)}
    sass = subprocess.run([CUOBJDUMP, "-sass", str(path)], capture_output=True, text=True, check=True,
                          env=env).stdout
    bodies = dict(re.findall(r"Function : (\w+)\n(.*?)(?=\n\s*Function : |\Z)", sass, re.S))
    assert set(bodies) == {k.name for k in kernels}
    warp = {k.name for k in kernels if k.warp}
    assert warp and len(warp) < len(bodies)
    for name, body in bodies.items():
        assert re.search(r"\bSHFL\.BFLY\b", body), name
        block = name not in warp  # a warp's merge is the shuffle tree alone
        assert bool(re.search(r"\bBAR\.SYNC\b", body)) == block, name
        assert bool(re.search(r"\bSTS\b", body) and re.search(r"\bLDS\b", body)) == block, name


def test_registers_barriers_and_shared_memory_fit_a_block(cubin):
    """ptxas's report: a block per element uses one barrier and 512 bytes of shared memory (64 doubles of
    partials, nothing else), a warp per element neither; registers let a block of BLOCK_THREADS fit an SM."""
    kernels, _, report = cubin
    used = {}
    for chunk in report.split("Function properties for ")[1:]:  # ptxas leaves out a zero barrier or smem count
        name = chunk.split()[0]
        counts = [re.search(pattern, chunk.split("Compiling entry function")[0])
                  for pattern in (r"Used (\d+) registers", r"used (\d+) barriers", r"(\d+) bytes smem")]
        used[name] = tuple(int(c.group(1)) if c else 0 for c in counts)
    names = {k.name for k in kernels}
    assert names <= set(used)
    want = {k.name: (0, 0) if k.warp else (1, 512) for k in kernels}
    assert all(used[n][0] <= 65536 // BLOCK_THREADS and used[n][1:] == want[n] for n in names), \
        {n: used[n] for n in names}
