"""The memory-traffic tracer's shared-memory bank counter (tests/cuda_trace.py, ``SharedTraffic``): a kernel of
one warp that stages 32 x 32 float32 values and reads them back at a known stride, so each pattern's bank
conflicts are known by construction (32 banks of 4 bytes): a broadcast and a unit stride take one pass, stride 2
two, stride 32 thirty-two (every lane in bank 0), stride 33 one (the padding trick). Then the counts of the tiled
kernels of the GPU benchmark's Dist and conv2d, printed for the record and held below a bound.

Cost: one small tracer build (five kernels of one warp), three of one tiled kernel each (block 0), two of Dist's
three block-tiled kernels (every warp of block 0)."""
from __future__ import annotations

import numpy as np
import pytest
from cuda_harness import GPP, Launch
from cuda_trace import bank_passes, trace
from trace_cases import CASES, launches

from tullax.compiler.interface import ArrayArg
from tullax.compiler.loops import (
    INDEX,
    THREAD,
    Barrier,
    BlockTile,
    Let,
    Load,
    Loop,
    LoopKernel,
    Shared,
    Store,
    Var,
    binop,
    const,
)
from tullax.printers.cuda import parameters

pytestmark = pytest.mark.skipif(GPP is None, reason="g++ is not installed")

STRIDES = {0: 1, 1: 1, 2: 2, 32: 32, 33: 1}  # read stride -> passes the banks take for the warp's request


def strided(stride: int) -> LoopKernel:
    """y[t] = s[(t * stride) mod 1024] after every lane stored x[t] into s[32 r + t] for r < 32."""
    t = Var(THREAD, INDEX)
    body = (Shared("s", 32 * 32, "float32"),
            Loop("r", const(0), const(32), False, (
                Store("s", (binop("+", binop("*", Var("r", INDEX), const(32)), t),), Load("a1", (t,), "float32")),)),
            Barrier(),
            Let("v", Load("s", (binop("mod", binop("*", t, const(stride)), const(32 * 32)),), "float32")),
            Store("a0", (t,), Var("v", "float32")))
    arrays = (ArrayArg("a0", "y", 1, "float32", "out"), ArrayArg("a1", "x", 1, "float32", "in"))
    return LoopKernel(f"bank{stride}", "bank conflicts", arrays, (), (), (Loop("b", const(0), const(1), True, body),),
                      "float32", tile=BlockTile(32, 1, 1, 1, 1))


def test_the_bank_counter_sees_the_known_patterns():
    jobs = []
    for stride in STRIDES:
        kernel = strided(stride)
        args = tuple(np.full(32, np.nan, np.float32) if p.name == "a0" else np.arange(32, dtype=np.float32)
                     for p in parameters(kernel, 32))
        jobs.append((Launch(kernel, 32, args), 1, 32))
    for (stride, passes), counted in zip(STRIDES.items(), trace(jobs)):
        assert counted.outputs == 32
        assert (counted.shared.requests, counted.shared.wavefronts, counted.shared.max_ways) == (1, passes, passes)
        assert counted.shared.conflicts == passes - 1, stride
        writes = counted.shared_writes  # 32 rows stored by consecutive lanes: one pass each
        assert (writes.requests, writes.wavefronts, writes.conflicts) == (32, 32, 0)


def test_wide_elements_take_two_passes_without_conflict():
    # 32 lanes reading consecutive float64: 64 words over 32 banks, two passes, both needed
    assert bank_passes([(8, 8 * lane) for lane in range(32)]) == (2, 2)
    assert bank_passes([(8, 256 * lane) for lane in range(32)]) == (32, 2)  # every lane's two words in banks 0, 1


@pytest.mark.parametrize("name,step", [("Dist", 0), ("conv2d", 0), ("conv2d", 2)])
def test_the_tiled_kernels_shared_reads(name, step):
    """The register tile's shared reads of the block-tiled Dist forward and of conv2d's window-tiled forward and
    kernel gradient are conflict-free: a warp reads consecutive columns of one staged row (threads along j, or
    along w of the x patch), or one value for all its lanes (a broadcast). The kernel gradient's lanes read
    x[c, h+p, w+q] at 3 x 3 window offsets: with 34-wide patch rows those fell 2 or 3 to a bank (2.62 passes per
    request); the rows padded to an odd pitch (35) spread them over distinct banks. Dist's register tile reads
    16 bytes per lane (float4): two passes per request are its ideal, not a conflict."""
    case = next(c for c in CASES if c[0] == name)
    label, launch, plan = launches(*case)[step]
    (counted,) = trace([(launch, plan.grid, plan.block)], warps=None)
    shared = counted.shared
    print(label, shared, f"{shared.wavefronts / shared.requests:.3f} passes per request")
    assert shared.requests and shared.conflicts == 0 and shared.max_ways <= 2


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_the_block_tiles_copy_and_read_shared_memory_without_bank_conflicts(dtype):
    """Dist's block-tiled forward and both gradients (the GPU benchmark's shapes, every warp of block 0): the
    copy's stores and the register tile's reads take no pass beyond their ideal, and the copy's global loads
    take the sectors of 32 consecutive elements (4 in float32, 8 in float64). The gradients' copies read
    ΔD along k: lanes at consecutive k stored 64 elements apart, 16 to a bank, before their rows were padded;
    float64 register-tile rows laid 4 to a thread took 4 passes for 2 of data."""
    case = next(c for c in CASES if c[0] == "Dist")
    found = launches(*case, dtype=dtype)
    counted = trace([(launch, plan.grid, plan.block) for _, launch, plan in found], warps=None)
    for (label, launch, _), traffic in zip(found, counted, strict=True):
        assert launch.kernel.tile is not None, label
        assert traffic.shared.requests and traffic.shared.conflicts == 0, (label, traffic.shared)
        assert traffic.shared_writes.requests and traffic.shared_writes.conflicts == 0, (label, traffic.shared_writes)
        sectors = 32 * np.dtype(dtype).itemsize // 32
        assert all(a.max_sectors == sectors for a in traffic.arrays), (label, traffic.summary())
