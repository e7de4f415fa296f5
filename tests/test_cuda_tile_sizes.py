"""Block-tile sizes per CUDA architecture (``tullax.backends.cuda.tile_sizes``): the entry of the highest
compute capability at or below the device's, the default where none is or no architecture is known; the
printed schedule (``generate_source(..., backend="cuda", shapes=...)`` under ``TULLAX_CUDA_ARCH``) follows it.
The entries compile for their architectures in tests/test_cuda_compile_tiles.py and run in the host harness in
tests/test_cuda_tiles.py. Cost: no compile, two lowerings of Dist's three kernels."""
from __future__ import annotations

import pytest

import tullax
from tullax.backends.cuda.tile_sizes import TILE_SIZES, capability, tile_policy
from tullax.compiler.loops import BlockTile
from tullax.compiler.tiles import TilePolicy
from tullax.errors import TullaxError


def test_the_capability_of_an_architecture_name():
    assert [capability(a) for a in ("sm_80", "sm_86", "sm_90", "sm_90a", "sm_100", "sm_120")] == \
        [(8, 0), (8, 6), (9, 0), (9, 0), (10, 0), (12, 0)]
    with pytest.raises(TullaxError, match="sm_90"):
        capability("hopper")


@pytest.mark.parametrize("arch,entry", [("sm_80", (8, 0)), ("sm_86", (8, 0)), ("sm_89", (8, 0)), ("sm_90", (9, 0)),
                                        ("sm_90a", (9, 0)), ("sm_100", (9, 0)), ("sm_120", (9, 0))])
def test_the_tile_follows_the_table(arch, entry):
    policy = tile_policy(arch)
    assert policy.tile == TILE_SIZES[entry]
    assert policy.min_outputs == TilePolicy().min_outputs  # only the geometry changes


def test_no_known_architecture_or_an_older_one_takes_the_default():
    assert tile_policy(None) == TilePolicy()
    assert tile_policy("sm_75") == TilePolicy()


def test_the_architectures_differ():
    assert TILE_SIZES[(8, 0)] != TILE_SIZES[(9, 0)]
    for tile in TILE_SIZES.values():  # within the block the printer launches, dividing evenly
        assert isinstance(tile, BlockTile) and tile.threads <= 256
        assert tile.rows % tile.thread_rows == 0 and tile.cols % tile.thread_cols == 0


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_printed_schedule_follows_the_architecture(monkeypatch, arch):
    monkeypatch.setenv("TULLAX_CUDA_ARCH", arch)
    tile = TILE_SIZES[capability(arch)]
    source = tullax.generate_source("D[i,j] := (W[k,i]-X[k,j])^2", backend="cuda",
                                    shapes={"W": (784, 1024), "X": (784, 512)})
    grid = (1024 // tile.rows) * (512 // tile.cols)
    assert (f"(forward): grid {grid} x block {tile.threads}, a block per {tile.rows}x{tile.cols} tile "
            f"({tile.thread_rows}x{tile.thread_cols} per thread, shared-memory chunks of {tile.chunk})") in source
