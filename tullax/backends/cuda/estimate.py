"""A roofline estimate of one printed CUDA kernel's device time, from its schedule alone (no GPU): what
``generate_source(spec, backend="cuda", shapes=...)`` and ``tullax explain --backend cuda --shape ...`` print
beside each launch.

Work: two FLOPs per term (point of the space of all the spec's indices). Global traffic, by schedule:

* block and window tiles (``LoopKernel.tile``): block 0's global loads (its copies into shared memory, every
  chunk, and the loads hoisted out of the chunk loop; a window tile's copies as its patches' elements, halos
  included) times the grid; coalesced, so bytes are elements times the item size, plus the output once. The
  memory-traffic tracer (``tests/cuda_trace.py``) counts the same traffic in 32-byte sectors: the same bytes
  for block tiles, up to a third more for window tiles (patch rows that start mid-sector); tests hold both.
* every other kernel: each input and the output moved once (the compulsory bytes), the least any kernel moves;
  a kernel whose loads are not coalesced moves more, which only the tracer sees.

The estimate is the longer of the FLOPs at the device's FP32 (or FP64: half) peak and the traffic at its HBM
bandwidth: a lower bound on the kernel's device time, not counting the per-call launch overhead.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from tullax.compiler.loops import (
    Barrier,
    If,
    Load,
    Loop,
    LoopKernel,
    Shared,
    Stmt,
    eval_int,
    parallel_nest,
    statement_expressions,
    walk_expr,
)
from tullax.spec.ir import Spec
from tullax.spec.shapes import eval_shapes

# compute capability -> (device, FP32 FLOP/s, HBM bytes/s) of the data-centre parts of that architecture
PEAKS: Mapping[tuple[int, int], tuple[tuple[str, float, float], ...]] = {
    (8, 0): (("A100", 19.5e12, 2.0e12),),
    (9, 0): (("H100", 67e12, 3.35e12), ("H200", 67e12, 4.8e12)),
}


@dataclass(frozen=True)
class Estimate:
    """One kernel's work and global traffic; ``model``: how the traffic was counted."""

    flops: int
    compulsory_bytes: int
    traffic_bytes: int
    model: str

    def micros(self, flop_rate: float, bandwidth: float) -> float:
        """The least device time (µs) at these peaks."""
        return max(self.flops / flop_rate, self.traffic_bytes / bandwidth) * 1e6

    def bound(self, flop_rate: float, bandwidth: float) -> str:
        return "FLOP-bound" if self.flops / flop_rate >= self.traffic_bytes / bandwidth else "bandwidth-bound"


def estimate(kernel: LoopKernel, spec: Spec, shapes: Mapping[str, tuple[int, ...]], grid: int,
             sizes: Mapping[str, int], start_read: bool = False) -> Estimate:
    """The estimate of ``kernel`` (lowered from ``spec``) launched on ``grid`` blocks for ``shapes`` (inputs by
    name plus ``spec.out``) with these size-parameter values; ``start_read``: the output's starting values are
    read too (a '+=' or '=' update that starts from the given array)."""
    ranges = eval_shapes(spec, {n: s for n, s in shapes.items() if n != spec.out})
    terms = math.prod(max(hi - lo, 0) for lo, hi in ranges.values())
    compulsory = 0
    for array in kernel.arrays:
        moved = math.prod(shapes[array.source]) * np.dtype(array.dtype).itemsize
        compulsory += moved * (2 if array.role != "in" and start_read else 1)
    if kernel.tile is None:
        return Estimate(2 * terms, compulsory, compulsory, "each input and the output once")
    inputs = frozenset(a.name for a in kernel.arrays if a.role == "in")
    window = kernel.split or len(parallel_nest(kernel)[0]) != 2  # tullax.compiler.window_tiles
    loads = _block_loads(kernel.body, dict(sizes), inputs, kernel.tile.threads, window)
    out = next(a for a in kernel.arrays if a.role != "in")
    out_bytes = math.prod(shapes[out.source]) * np.dtype(out.dtype).itemsize
    itemsize = max(np.dtype(a.dtype).itemsize for a in kernel.arrays if a.role == "in")
    return Estimate(2 * terms, compulsory, grid * loads * itemsize + out_bytes,
                    "tiles: every block's copies and hoisted loads")


def _block_loads(stmts: tuple[Stmt, ...], env: dict[str, int], inputs: frozenset[str], threads: int,
                 window: bool, staged: int = 0) -> int:
    """The global elements one block (block 0: parallel loops at their first value) loads: each statement's
    loads of ``inputs`` times its loops' trips, times the threads; in a window tile's chunk loop (the loop that
    holds a barrier), whose copy lanes outside the patch skip their loads, the elements of the shared arrays
    declared above it (each operand's patch, halo included) per trip instead."""
    total = 0
    for stmt in stmts:
        if isinstance(stmt, Shared):
            staged += stmt.length
        if isinstance(stmt, If):  # both branches: an over-count where they load different elements
            total += _block_loads(stmt.then, env, inputs, threads, window, staged)
            total += _block_loads(stmt.orelse, env, inputs, threads, window, staged)
        if not isinstance(stmt, Loop):
            total += threads * sum(isinstance(e, Load) and e.array in inputs
                                   for expr in statement_expressions(stmt) for e in walk_expr(expr))
            continue
        start = eval_int(stmt.start, env)
        inner = {**env, stmt.var: start}
        if stmt.parallel:
            total += _block_loads(stmt.body, inner, inputs, threads, window, staged)
            continue
        trips = max(eval_int(stmt.stop, env) - start, 0)
        if window and any(isinstance(s, Barrier) for s in stmt.body):
            total += trips * staged
        else:
            total += trips * _block_loads(stmt.body, inner, inputs, threads, window, staged)
    return total


def devices(arch: str | None) -> tuple[tuple[str, float, float], ...]:
    """The devices whose peaks the estimate is given at: ``arch``'s (the entry at or below its capability), or
    every entry's when no architecture is known."""
    from tullax.backends.cuda.tile_sizes import capability

    if arch is None:
        return tuple(d for entry in PEAKS.values() for d in entry)
    have = capability(arch)
    below = [c for c in PEAKS if c <= have]
    return PEAKS[max(below)] if below else tuple(d for entry in PEAKS.values() for d in entry)


def describe(found: Estimate, dtype: str, arch: str | None) -> str:
    """One line: the estimate on each device, what bounds it, the work and the traffic model."""
    rate = 1.0 if np.dtype(dtype).itemsize <= 4 else 0.5
    times = ", ".join(f"{found.micros(f * rate, b):.3g} µs on {name}" for name, f, b in devices(arch))
    name, f, b = devices(arch)[-1]
    return (f"estimate (roofline, no GPU): {times}; {found.bound(f * rate, b)}: {found.flops / 1e9:.3g} GFLOP, "
            f"{found.traffic_bytes / 1e6:.3g} MB ({found.model}; {found.compulsory_bytes / 1e6:.3g} MB compulsory)")


__all__ = ["Estimate", "PEAKS", "describe", "devices", "estimate"]
