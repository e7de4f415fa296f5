"""Accurate float32 sums: a long ``+`` reduction is summed in blocks.

One float32 accumulator running over n terms loses up to about n * 2^-24 of the sum (2.5e-5 relative on 10^7
uniform products, where XLA's reduction loses 1.4e-8). So in float32 one reduction loop is strip-mined into
blocks: each block sums into a float32 partial (the loop over a block still vectorises), the running total is
float64, updated once per block, and the result is cast back once. The rounding errors of independent blocks
average out instead of accumulating. float64 sums stay as they are.

* ``BLOCK``: 512 iterations. A partial is a sequential float32 sum wherever the block's loop does not vectorise
  (Julia, which never reassociates a float sum; a tile, whose vector runs across its elements): 512 keeps it at
  XLA's error (a tiled matmul over 2048 terms: 1.5e-7, as XLA; 6.2e-7 with blocks of 2048). Where Numba
  vectorises a block, a larger one would amortise its horizontal reduction better (a compute-bound sum over rows
  of 2000-4000: 8-13% slower than unblocked with 512, 1-4% with 2048; memory-bound sums show no difference).
* The strip-mined loop: walking the reduction loops from the innermost outward, the first whose extent is not a
  constant, or whose constant extent makes the product so far exceed ``BLOCK``. When every reduction extent is a
  constant and their product is at most ``BLOCK``, nothing is strip-mined (the whole sum is one block).
* A sum in a register (``register_sum``; logsumexp's sum pass too): ``acc = 0.0`` in float64; per block
  ``acc_part = 0`` in float32, the block's loop adds into it, ``acc += float64(acc_part)``. When the block loop
  is a kernel's outermost loop (a scalar result) it is the one the lowering marks ``reduce_parallel``, and the
  total is updated by one plain ``Accum``: Numba's prange splits the blocks across threads. Anywhere else the
  blocks run once per output element (or outer iteration), often over a short loop: the first block is peeled
  off ahead of the loop over the others, so a one-block sum pays no loop over blocks.
* A tiled kernel (``TileSum``) accumulates into the output elements of its tile: those hold the float32
  partial of the current block, and a ``Scratch`` array holds the tile's float64 totals. Moving the partials
  into the totals is a pass over the tile per block, which a short loop (one block) would pay for nothing:
  it runs only when the strip-mined loop is longer than one block (``long_sum``, known before the loops).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Sequence

from tullax.compiler.loops import (
    BOOL,
    INDEX,
    Accum,
    Const,
    Expr,
    If,
    Let,
    Load,
    Loop,
    Scratch,
    Stmt,
    Store,
    Var,
    binop,
    cast,
    const,
)

if TYPE_CHECKING:
    from tullax.compiler.assemble import Nest
    from tullax.compiler.schedule import Schedule
    from tullax.spec.ir import Spec

BLOCK = 512  # iterations per block
TOTAL = "float64"  # the dtype of the running total
BLOCK_VAR, BLOCK_LO, BLOCK_HI = "blk", "blk_lo", "blk_hi"  # the loop over blocks and the range of one block
LONG, TOTALS = "long_sum", "tile_tot"  # tiled kernels: more than one block; the tile's float64 totals


def blocked_index(spec: Spec, plan: Schedule, compute: str) -> str | None:
    """The reduction index whose loop a float32 sum of ``spec`` strip-mines, or None (float64, other
    reductions, no reduction loop, or a constant total extent of at most one block)."""
    if compute != "float32" or spec.redop not in ("+", "logsumexp") or spec.is_scatter:
        return None
    reductions = plan.loops[plan.top + 1:]
    if plan.tiling:  # the tiled index runs innermost over the tile: not a reduction
        reductions = reductions[:-1]
    elems = 1
    for name in reversed(reductions):
        extent = spec.range_of[name].extent()
        if not extent.is_const:
            return name
        elems *= max(extent.const, 0)
        if elems > BLOCK:
            return name
    return None


@dataclass(frozen=True)
class Blocks:
    """How to run the serial loop over ``var`` in blocks of ``BLOCK`` iterations: ``before`` and ``after`` each
    block; ``peel``: the first block runs ahead of the loop over the others."""

    var: str
    before: tuple[Stmt, ...]
    after: tuple[Stmt, ...]
    peel: bool

    def apply(self, stmts: Sequence[Stmt]) -> list[Stmt]:
        """``stmts`` with the loop over ``var`` replaced by its blocks: a loop over block numbers whose body binds
        ``blk_lo``/``blk_hi`` (the block's range), then ``before``, the loop over the block and ``after``."""
        out: list[Stmt] = []
        for stmt in stmts:
            if isinstance(stmt, Loop) and stmt.var == self.var:
                out += self._blocks(stmt)
            elif isinstance(stmt, Loop):
                out.append(replace(stmt, body=tuple(self.apply(stmt.body))))
            elif isinstance(stmt, If):
                out.append(replace(stmt, then=tuple(self.apply(stmt.then)), orelse=tuple(self.apply(stmt.orelse))))
            else:
                out.append(stmt)
        return out

    def _blocks(self, loop: Loop) -> list[Stmt]:
        count = binop("//", binop("+", binop("-", loop.stop, loop.start), const(BLOCK - 1)), const(BLOCK))
        lo, hi = Var(BLOCK_LO, INDEX), Var(BLOCK_HI, INDEX)
        body = (Let(BLOCK_LO, binop("+", loop.start, binop("*", Var(BLOCK_VAR, INDEX), const(BLOCK)))),
                Let(BLOCK_HI, binop("min", binop("+", lo, const(BLOCK)), loop.stop)),
                *self.before, replace(loop, start=lo, stop=hi), *self.after)
        if not self.peel:
            return [Loop(BLOCK_VAR, const(0), count, False, body)]
        first = replace(loop, stop=binop("min", binop("+", loop.start, const(BLOCK)), loop.stop))
        return [*self.before, first, *self.after, Loop(BLOCK_VAR, const(1), count, False, body)]


def register_sum(nest: Nest, acc: str, value: Expr, compute: str, index: str | None) -> tuple[list[Stmt], Expr]:
    """The statements summing ``value`` over the loops of ``nest`` into the register ``acc``, and the sum (in
    ``compute``). Blocked over the loop of spec index ``index`` when there is one (``blocked_index``)."""
    if index is None:
        return [Let(acc, Const(0.0, compute)), *nest.block([Accum(acc, "+", value)])], Var(acc, compute)
    part = f"{acc}_part"
    # a loop that runs once per output element or per outer iteration peels its first block: a short loop (one
    # block) then costs what it did unblocked (measured: 1M rows of 8, 1.6 ms -> 2.8 ms unpeeled, 1.6 peeled)
    blocks = Blocks(nest.schedule.var(index), before=(Let(part, Const(0.0, compute)),),
                    after=(Accum(acc, "+", cast(Var(part, compute), TOTAL)),), peel=nest.schedule.level(index) > 0)
    return [Let(acc, Const(0.0, TOTAL)), *blocks.apply(nest.block([Accum(part, "+", value)]))], \
        cast(Var(acc, TOTAL), compute)


@dataclass(frozen=True)
class TileSum:
    """A tiled kernel's blocked sum. ``tile``: a loop over the elements of the tile (its body is replaced);
    ``element``: the output element its iterations accumulate into; ``slot``: that element's position in the
    tile (from 0), below ``elems``, the tile's size; ``extent``: the extent of the strip-mined loop before any
    guard narrows it."""

    tile: Loop
    element: Load
    slot: Expr
    elems: int
    extent: Expr

    def prologue(self) -> list[Stmt]:
        """Whether the sum is longer than one block, and then the zero totals."""
        return [Let(LONG, binop(">", self.extent, const(BLOCK))),
                If(Var(LONG, BOOL), (Scratch(TOTALS, self.elems, TOTAL),))]

    def blocked(self, stmts: Sequence[Stmt], var: str) -> list[Stmt]:
        """``stmts`` (the reduction loops) blocked over loop variable ``var``: after each block of a long sum,
        its partials move into the totals and the output elements restart from zero."""
        element = self.element
        move = (Store(TOTALS, (self.slot,), cast(element, TOTAL), "add"),
                Store(element.array, element.index, Const(0.0, element.dtype)))
        return Blocks(var, before=(), after=(self._if_long(move),), peel=False).apply(stmts)

    def epilogue(self) -> list[Stmt]:
        """The totals of a long sum added back into the output elements (zero after the last block; an added
        total keeps what a '+=' output held when a guard skipped every block)."""
        element = self.element
        total = Load(TOTALS, (self.slot,), TOTAL)
        return [self._if_long((Store(element.array, element.index, cast(total, element.dtype), "add"),))]

    def _if_long(self, body: tuple[Stmt, ...]) -> If:
        return If(Var(LONG, BOOL), (replace(self.tile, body=body),))

