"""Block-tile sizes per CUDA architecture: the cuda backend picks the shared-memory block tile
(``tullax.compiler.tiles``) from the compute capability of the device it compiles for (``target_arch``).

An architecture takes the entry of the highest capability at or below its own (sm_86 and sm_89 take sm_80's,
sm_100 and sm_120 take sm_90's); below every entry, or with no architecture known (printing without a device),
the default ``TilePolicy``. Every entry fits ``BLOCK_THREADS`` threads, the 48 KiB of static shared memory and
the ``__launch_bounds__`` register budget (tests/test_cuda_compile_tiles.py compiles each for its architecture).
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Mapping

from tullax.compiler.loops import BlockTile
from tullax.compiler.tiles import TilePolicy
from tullax.errors import TullaxError

# (major, minor) -> tile. sm_80: 64 x 64 outputs per block, 4 x 4 per thread. sm_90 has about 40% more shared
# memory and L1 per SM for the same 64K registers: 64 x 128 per block, 4 x 8 per thread, a third fewer staged
# reads per FMA (12 for 32 FMAs, against 8 for 16). (8 x 4 per thread would leave conv2d's kernel gradient
# without a window tile: its 3 x 3 window cannot spread 8 rows per thread.)
TILE_SIZES: Mapping[tuple[int, int], BlockTile] = {
    (8, 0): BlockTile(64, 64, 4, 4, 16),
    (9, 0): BlockTile(64, 128, 4, 8, 16),
}

_ARCH = re.compile(r"sm_(\d+?)(\d)[a-z]?\Z")


def capability(arch: str) -> tuple[int, int]:
    """The compute capability of an architecture name: sm_90 -> (9, 0), sm_86 -> (8, 6), sm_100a -> (10, 0)."""
    found = _ARCH.match(arch)
    if found is None:
        raise TullaxError(f"{arch!r} is not a CUDA architecture: use the form sm_90")
    return int(found.group(1)), int(found.group(2))


def tile_policy(arch: str | None, base: TilePolicy = TilePolicy()) -> TilePolicy:
    """``base`` with the block tile of ``arch`` (None: no device known, ``base`` unchanged)."""
    if arch is None:
        return base
    have = capability(arch)
    below = [c for c in TILE_SIZES if c <= have]
    return replace(base, tile=TILE_SIZES[max(below)]) if below else base


__all__ = ["TILE_SIZES", "capability", "tile_policy"]
