"""How the host launches one printed CUDA kernel for one call's static shapes: which kernel (a plain sum over few
output elements split over more threads, ``device_lowering``), the index width, the grid, the values of the
integer parameters, what the output must hold first, and the packed parameter block.

Pure Python and ctypes, no CUDA library: everything here is decided at trace time (shapes are static under
``jax.jit``) and tested without a GPU.
"""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from tullax import settings
from tullax.compiler.cooperate import Cooperation, cooperate
from tullax.compiler.intervals import dtype_interval, fits
from tullax.compiler.loops import FLOATS, LoopKernel, eval_int
from tullax.compiler.lower import lower
from tullax.compiler.scan_block import block_per_row as scan_block_per_row
from tullax.compiler.scan_chunks import chunked_scan
from tullax.compiler.split import SplitPolicy, split_sums
from tullax.compiler.tiles import TilePolicy, block_tiles
from tullax.compiler.vectorize import ENV as VECTORS_ENV
from tullax.compiler.vectorize import vectorize
from tullax.compiler.window_tiles import window_tiles
from tullax.printers.cuda import BLOCK_THREADS, Parameter, parameters
from tullax.printers.launch import ndrange_extents
from tullax.spec.ir import Spec
from tullax.spec.shapes import eval_shapes

INT32 = dtype_interval("int32")
WARP_THREADS = 32  # a block smaller than BLOCK_THREADS is rounded up to whole warps
MAX_GRID_BLOCKS = 2**31 - 1  # CUDA's limit on gridDim.x; the grid-stride loop covers anything beyond

# What the output buffer must hold before the kernel runs
START_ANY = "any"  # ':=': the kernel writes every element
START_GIVEN = "given"  # '=' and '+=' (scatters too): the given array (input 0), unless XLA aliased it
START_ZERO = "zero"  # ':=' split over threads that add into the output (tullax.compiler.split)
SPLIT_ENV = "TULLAX_CUDA_SPLIT"  # 0: never split a sum (benchmarks/gpu.py compares both)
TILES_ENV = "TULLAX_CUDA_TILES"  # 0: never block-tile (benchmarks/gpu_device.py compares both)
SCAN_CHUNKS_ENV = "TULLAX_CUDA_SCAN_CHUNKS"  # the fewest steps a linear scan over few lanes runs chunked (0: never)


@dataclass(frozen=True)
class LaunchPlan:
    """``values``: the size and extent parameters, in parameter order. ``pointers``: for each pointer parameter,
    the spec input whose buffer it gets (None: the output). ``grid`` is 0 when there is nothing to compute."""

    index_bits: int
    grid: int
    block: int
    values: tuple[int, ...]
    pointers: tuple[int | None, ...]
    start: str
    out_bytes: int


def plan_launch(kernel: LoopKernel, spec: Spec, shapes: Mapping[str, tuple[int, ...]], out_dtype: str) -> LaunchPlan:
    """The launch of ``kernel`` (lowered from ``spec``) for the input and output shapes of one call
    (``shapes``: input name -> shape, plus ``spec.out`` -> the result's shape)."""
    array_shapes = {a.name: tuple(shapes[a.source]) for a in kernel.arrays}
    sizes = size_values(kernel, shapes)
    extents = [max(eval_int(e, sizes), 0) for e in ndrange_extents(kernel)]
    total = math.prod(extents)
    if not extents:  # a scalar result: one thread
        grid, block = 1, 1
    elif kernel.cooperative and kernel.warp:  # a warp per element (tullax.compiler.cooperate)
        block = BLOCK_THREADS
        grid = min(-(-total * WARP_THREADS // block), MAX_GRID_BLOCKS)
    elif kernel.cooperative:  # a block per element
        grid, block = min(total, MAX_GRID_BLOCKS), BLOCK_THREADS
    elif kernel.tile is not None:  # a block per tile, exactly the threads of its register tiles
        grid, block = min(total, MAX_GRID_BLOCKS), kernel.tile.threads
    elif total == 0:
        grid, block = 0, BLOCK_THREADS
    else:
        block = min(BLOCK_THREADS, -(-total // WARP_THREADS) * WARP_THREADS)
        grid = min(-(-total // block), MAX_GRID_BLOCKS)
    # an integer kernel computes its values in int64, the printer's index type: they must not be narrowed
    narrow = (kernel.compute_dtype != "int64"
              and all(math.prod(shape) <= INT32.hi for shape in array_shapes.values())
              and total + grid * block <= INT32.hi  # the grid-stride counter's last value
              and fits(kernel, sizes, INT32))
    bits = 32 if narrow else 64
    values, pointers = [], []
    for param in parameters(kernel, bits):
        if param.kind == "size":
            values.append(sizes[param.name])
        elif param.kind == "extent":
            values.append(array_shapes[param.array][param.axis])
        else:
            pointers.append(_source_position(kernel, spec, param))
    start = START_GIVEN  # the parser has no ':=' into computed places
    if spec.assign == ":=":
        start = START_ZERO if kernel.split else START_ANY
    return LaunchPlan(bits, grid, block, tuple(values), tuple(pointers), start,
                      math.prod(shapes[spec.out]) * np.dtype(out_dtype).itemsize)


def size_values(kernel: LoopKernel, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """The value of each of ``kernel``'s size parameters for a call with these shapes."""
    return {s.name: int(s.size.eval(shapes)) for s in kernel.sizes}


def device_lowering(spec: Spec, signature: Any, shapes: Mapping[str, tuple[int, ...]], name: str,
                    policy: SplitPolicy = SplitPolicy(),
                    cooperation: Cooperation = Cooperation(),
                    tiles: TilePolicy = TilePolicy()) -> tuple[LoopKernel, LaunchPlan]:
    """The kernel the cuda backend launches for one call's shapes (inputs by name plus ``spec.out``), and its
    launch, the first that applies: shared-memory block tiles for a matmul-like kernel
    (``tullax.compiler.tiles``, as ``tiles`` says; off under ``TULLAX_CUDA_TILES=0``); a block per output element
    for long rows over enough elements, a warp per element for medium rows over many
    (``tullax.compiler.cooperate``, as ``cooperation`` says); a plain sum over few output elements split over
    more threads (``tullax.compiler.split``); a block per element for long rows over few; the default lowering,
    one thread per output element (or per register tile), or for an elementwise kernel per run of 16 bytes
    (``tullax.compiler.vectorize``; off under ``TULLAX_CUDA_VECTORS=0``); for a recurrence, a thread per lane
    walking ``t``, or where its state mixes the lanes a block per batch row (``tullax.compiler.scan_block``), or
    where it is linear, long and over few lanes a block per lane with ``t`` in chunks
    (``tullax.compiler.scan_chunks``)."""
    plain: LoopKernel | None = None
    sizes: dict[str, int] = {}
    # a recurrence's reductions run inside each sequential step of its one thread per lane
    may_cooperate = spec.reduced and signature.out_dtype in FLOATS and not spec.is_scatter and spec.scan is None

    def together(min_length: int, min_outputs: int, warp: bool) -> LoopKernel | None:
        nonlocal plain, sizes
        if not may_cooperate:
            return None
        if plain is None:
            plain = lower(spec, signature, name=name, share=False, block_sums=False)
            sizes = size_values(plain, shapes)
        # a float32 sum: each thread's share in one register no longer than a split piece's
        width = WARP_THREADS if warp else BLOCK_THREADS
        return cooperate(plain, sizes, min_length, width * policy.max_float32_terms, min_outputs, warp)

    found = None
    if may_cooperate and settings.value(TILES_ENV):
        plain = lower(spec, signature, name=name, share=False, block_sums=False)
        sizes = size_values(plain, shapes)
        found = (block_tiles(plain, sizes, tiles, policy.max_float32_terms)
                 or window_tiles(plain, sizes, tiles, policy.max_float32_terms))
    found = (found or together(cooperation.block_from, cooperation.block_outputs, False)
             or together(cooperation.warp_from, cooperation.warp_outputs, True))
    if found is None and _may_split(spec, signature, shapes, policy):
        plain = plain or lower(spec, signature, name=name, share=False, block_sums=False)
        found = split_sums(plain, size_values(plain, shapes), policy)
    found = found or together(cooperation.block_from, 1, False)
    if found is not None:
        return found, plan_launch(found, spec, shapes, signature.out_dtype)
    kernel = lower(spec, signature, name=name)
    if spec.scan is not None:  # a long linear scan over few lanes: chunks; a state that mixes its lanes: a block
        sizes = size_values(kernel, shapes)  # per row, a barrier per step
        kernel = (chunked_scan(kernel, spec, signature, sizes, lower, settings.value(SCAN_CHUNKS_ENV))
                  or scan_block_per_row(kernel, spec, sizes) or kernel)
    elif settings.value(VECTORS_ENV):  # an elementwise kernel: runs of 16 bytes per thread
        lengths = {a.name: tuple(shapes[a.source]) for a in kernel.arrays}
        kernel = vectorize(kernel, size_values(kernel, shapes), lengths) or kernel
    return kernel, plan_launch(kernel, spec, shapes, signature.out_dtype)


def _may_split(spec: Spec, signature: Any, shapes: Mapping[str, tuple[int, ...]], policy: SplitPolicy) -> bool:
    """Whether ``spec`` is a plain float sum over fewer output elements than ``policy.below`` (checked before
    lowering it a second time)."""
    if not settings.value(SPLIT_ENV):
        return False
    if spec.scan is not None:  # a recurrence's sums run inside each sequential step
        return False
    if spec.redop != "+" or spec.finalizer is not None or spec.assign not in (":=", "+=") or spec.is_scatter:
        return False
    if signature.out_dtype not in FLOATS or not spec.reduced:
        return False
    ranges = eval_shapes(spec, shapes)
    return math.prod(max(hi - lo, 0) for lo, hi in (ranges[n] for n in spec.free)) < policy.below


def _source_position(kernel: LoopKernel, spec: Spec, param: Parameter) -> int | None:
    if param.kind == "scalar":
        source = next(s.source for s in kernel.scalars if s.name == param.array)
        return spec.input_names.index(source)
    array = next(a for a in kernel.arrays if a.name == param.array)
    return None if array.role != "in" else spec.input_names.index(array.source)


class ParamBlock:
    """The ``void**`` array ``cuLaunchKernel`` reads the parameters through, built once per launch plan: the
    integer values are fixed, the pointers are set before each launch (``set_pointers``)."""

    def __init__(self, kernel: LoopKernel, plan: LaunchPlan):
        index = ctypes.c_int32 if plan.index_bits == 32 else ctypes.c_int64
        params = parameters(kernel, plan.index_bits)
        self.slots = [ctypes.c_void_p(0) for p in params if p.pointer]
        holders: list[ctypes._SimpleCData] = list(self.slots)
        holders += [index(v) for v in plan.values]
        self.holders = holders
        self.array = (ctypes.c_void_p * len(holders))(*(ctypes.addressof(h) for h in holders))

    @property
    def address(self) -> int:
        return ctypes.addressof(self.array)

    def set_pointers(self, pointers: Sequence[int]) -> None:
        for slot, pointer in zip(self.slots, pointers, strict=True):
            slot.value = pointer

    def decoded(self) -> list[int]:
        """What the kernel would receive, read back through the ``void**`` (for tests and debugging)."""
        out = []
        for k, holder in enumerate(self.holders):
            kind = ctypes.c_void_p if isinstance(holder, ctypes.c_void_p) else type(holder)
            out.append(ctypes.cast(self.array[k], ctypes.POINTER(kind)).contents.value or 0)
        return out


__all__ = ["LaunchPlan", "ParamBlock", "device_lowering", "plan_launch", "SPLIT_ENV", "START_ANY", "START_GIVEN",
           "START_ZERO", "SCAN_CHUNKS_ENV", "TILES_ENV"]
