"""The memory-traffic tracer (tests/cuda_trace.py) on the GPU benchmark cases: one warp of each printed kernel,
forward and gradients, run on the CPU through traced pointers at trace shapes with the host's own launch plan.

The counts are printed (``pytest -s``) for the record; the assertions pin what the tracer must see in kernels
whose access pattern is known by construction, so a tracer that miscounts fails here."""
from __future__ import annotations

import pytest
from cuda_harness import GPP
from cuda_trace import trace
from trace_cases import CASES, launches

from tullax.compiler.tiles import TilePolicy

pytestmark = pytest.mark.skipif(GPP is None, reason="g++ is not installed")


@pytest.fixture(scope="module")
def traffic():
    jobs, labels = [], []
    for case in CASES:
        for label, launch, plan in launches(*case):
            labels.append(label)
            jobs.append((launch, plan.grid, plan.block))
    # Dist's forward without block tiles: one thread per register tile, W read as a broadcast
    for label, launch, plan in launches(*CASES[0], tiles=TilePolicy(min_outputs=1 << 62))[:1]:
        labels.append(f"{label} untiled")
        jobs.append((launch, plan.grid, plan.block))
    found = dict(zip(labels, trace(jobs)))
    for label, counted in found.items():
        print(f"{label}: {counted.summary()}")
    return found


def test_broadcast_and_contiguous_loads_are_counted_exactly(traffic):
    # Dist forward: W[k,i] is one address for the warp (i is fixed across a row of threads... all lanes share k
    # and their i tile), X[k,j] is read by lanes along j
    forward = traffic["Dist forward untiled"]
    assert forward.array("W").broadcasts == forward.array("W").requests
    assert forward.array("W").sectors == 1.0
    # the elementwise row logsumexp gradient reads x along its rows in vector lanes (tullax.compiler.vectorize):
    # 32 lanes x 16 bytes = 16 sectors, four lines, each request covering 128 elements (the ideal)
    grad = traffic["row logsumexp gradient wrt x"]
    assert grad.array("x").sectors == 16.0 and grad.array("x").lines == 4.0
    # its row's l[i] and Δl[i] are read once for the thread's 4 lanes: one broadcast request each per warp
    assert grad.array("l").requests == grad.array("l").broadcasts == 1 and grad.array("Δl").requests == 1


# The hot loads still over 4 sectors per request (the row reductions' 32 sectors per request went with the
# block- and warp-cooperative kernels, Dist's and Linear's with the block tiles, conv2d's with the window tiles).
# Held exactly, so a kernel that gets better or worse shows here.
UNCOALESCED = {
    "Dist forward untiled": ["X"],
}


def test_every_hot_load_of_the_benchmark_cases_is_coalesced_but_the_known_ones(traffic):
    """At most 4 sectors per warp request (or a broadcast) for every global load a thread repeats (more
    requests than lanes: inside a loop), in every kernel of the benchmark cases but ``UNCOALESCED``."""
    bad = {label: [a.source for a in counted.arrays if a.requests > 32 and not a.coalesced]
           for label, counted in traffic.items()}
    bad = {label: arrays for label, arrays in bad.items() if arrays}
    assert bad == UNCOALESCED


@pytest.mark.parametrize("label,array", [("row logsumexp forward", "x"), ("row max forward", "x"),
                                         ("row norm forward", "x"), ("row max gradient wrt x, step 1", "x")])
def test_the_cooperative_reductions_read_whole_lines(traffic, label, array):
    """A block per row (the row reductions): each warp request reads 32 consecutive elements, one line, 4 sectors
    (it was 32 sectors on 32 lines)."""
    counted = traffic[label].array(array)
    assert counted.sectors == 4.0 and counted.lines == 1.0 and counted.requests == 16


@pytest.mark.parametrize("label", ["Dist forward", "Dist gradient wrt W", "Dist gradient wrt X", "Linear forward",
                                   "Linear gradient wrt W", "Linear gradient wrt X"])
def test_the_block_tiles_copy_whole_sectors(traffic, label):
    """Dist's and Linear's kernels run as 64 x 64 block tiles at the benchmark shapes; the first warp's copies
    of each staged operand read 4 sectors per request (ΔD and ΔC too, which one thread per output read down
    their columns at 32 sectors per request)."""
    counted = traffic[label]
    assert counted.block == 256 and all(a.sectors == 4.0 and a.max_sectors == 4 for a in counted.arrays)
