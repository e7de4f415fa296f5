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
* A sum in a register (``register_sum``; logsumexp's sum pass too), by where its blocked loop runs:

  - once per output element (the outermost reduction loop under parallel ones; the common case, often short):
    the ragged first block sums into the float32 ``acc_part``, and only when there are more blocks does a
    float64 ``acc`` take it and the others, and give the result back to ``acc_part``. A one-block sum then runs
    the unblocked loop and one untaken branch (Numba, one thread: sums of 8 terms 11-22% slower than
    unblocked, of 16 terms as fast, of 64 terms 2-11% slower; without the branch, 8 terms are as fast).
  - once per call (a scalar result): whole blocks from the start, ``acc += float64(acc_part)`` after each; the
    loop over blocks is the one the lowering marks ``reduce_parallel`` (Numba's prange splits the blocks across
    threads) and updates the total by one plain ``Accum``.
  - inside outer reduction loops: ``acc`` (float64) spans them; the ragged first block is peeled off ahead of
    the loop over the others.

  The peeled block is the ragged one (``stop - (blocks - 1) * BLOCK`` is its end): a first block ending at
  ``min(start + BLOCK, stop)`` tells LLVM its trip count is at most ``BLOCK``, and it then unrolls the vector
  loop 6x, slower than the unblocked loop (rows of 512: +9%), which the ragged block compiles to exactly.
* A tiled kernel (``TileSum``) accumulates into the output elements of its tile: those hold the float32
  partial of the current blocks, and a ``Scratch`` array holds the tile's float64 totals. Moving the partials
  into the totals is a pass over the tile, which a short sum (one block) would pay for nothing: it runs only
  when the whole sum, the strip-mined loop times every reduction loop around it, is longer than one block
  (``long_sum``, known before the loops), and then once at least ``BLOCK`` terms went into the partials since
  the last move (``tile_terms`` counts them). Counting the strip-mined loop alone once let a sum of 128x80
  terms (80 in the strip-mined loop, 128 around it) run in float32 from end to end: 7e-5 relative error.

A float32 product (``product_total``) runs in one float64 register instead, not blocked: the range, not the
rounding, is what a running product loses. Its partial products wander over many more decades than the product
itself: a float32 running product of 600 terms reached inf where the product was 2.5e36 (a random spec of the
fuzzing, ``(*) O[i,j] := B[l,i] + C[k] - tan(tanh(A[j,k]))``; XLA's pairwise product and a float32 product in
the naive evaluator's order stayed finite), and one that passes below 1e-38 on the way flushes to a zero it
never leaves. float64's range holds any float32 terms' partial products over a run of practical length; the
result is rounded to float32 once, after what follows the product: the given value of '*=' and the finaliser
run on the float64 total (``lower._reduction``), so ``|> log`` of a product beyond float32 is finite. Such a product
is never tiled (a tile accumulates in the float32 output).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Sequence

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
from tullax.spec.sizes import Sym, ceildiv, smax

if TYPE_CHECKING:
    from tullax.compiler.assemble import Nest
    from tullax.compiler.schedule import Schedule
    from tullax.spec.ir import Range, Spec

BLOCK = 512  # iterations per block
TOTAL = "float64"  # the dtype of the running total
BLOCK_VAR, BLOCK_LO, BLOCK_HI = "blk", "blk_lo", "blk_hi"  # the loop over blocks and the range of one block
FIRST_HI = "blk_first_hi"  # the end of a peeled loop's first block
LONG, TOTALS = "long_sum", "tile_tot"  # tiled kernels: more than one block; the tile's float64 totals
TERMS = "tile_terms"  # tiled kernels: the terms summed into the partials since they last moved into the totals


def blocked_index(spec: Spec, plan: Schedule, compute: str) -> str | None:
    """The reduction index whose loop a float32 sum of ``spec`` strip-mines, or None (float64, other
    reductions, no reduction loop, or a constant total extent of at most one block)."""
    if compute != "float32" or spec.redop not in ("+", "logsumexp") or spec.is_scatter:
        return None
    reductions = _reductions(plan)
    elems = 1
    for name in reversed(reductions):
        extent = spec.range_of[name].extent()
        if not extent.is_const:
            return name
        elems *= max(extent.const, 0)
        if elems > BLOCK:
            return name
    return None


def product_total(spec: Spec, compute: str) -> str | None:
    """The dtype a product reduction of ``spec`` computed in ``compute`` accumulates in when that is wider than
    ``compute``: ``TOTAL`` for a float32 product (see the module docstring), else None."""
    return TOTAL if compute == "float32" and spec.redop == "*" and not spec.is_scatter else None


def sum_terms(spec: Spec, plan: Schedule, index: str, size: Callable[[Sym], Expr]) -> tuple[Expr, int]:
    """The number of terms of the whole sum of a tiled kernel whose loop over ``index`` is strip-mined: the
    product of every reduction loop's extent (``size`` makes a size expression an Expr); and the terms per
    iteration of that loop: the product of the constant extents inside it (``blocked_index`` picks the loop
    so that they are constant)."""
    reductions = _reductions(plan)
    inner = 1
    for name in reductions[reductions.index(index) + 1:]:
        inner *= max(spec.range_of[name].extent().const, 0)
    terms: Expr | None = None
    for name in reductions:
        rng = spec.range_of[name]
        extent = binop("max", binop("-", size(rng.hi), size(rng.lo)), const(0))
        terms = extent if terms is None else binop("*", terms, extent)
    assert terms is not None
    return terms, inner


def _reductions(plan: Schedule) -> list[str]:
    """The reduction loops of ``plan``, outermost first (the tiled index, innermost over the tile, is not)."""
    reductions = list(plan.loops[plan.top + 1:])
    return reductions[:-1] if plan.tiling else reductions


def _replace_loop(stmts: Sequence[Stmt], var: str, make: Callable[[Loop], list[Stmt]]) -> list[Stmt]:
    """``stmts`` with the serial loop over ``var`` (wherever it is nested) replaced by ``make(loop)``."""
    out: list[Stmt] = []
    for stmt in stmts:
        if isinstance(stmt, Loop) and stmt.var == var:
            out += make(stmt)
        elif isinstance(stmt, Loop):
            out.append(replace(stmt, body=tuple(_replace_loop(stmt.body, var, make))))
        elif isinstance(stmt, If):
            out.append(replace(stmt, then=tuple(_replace_loop(stmt.then, var, make)),
                               orelse=tuple(_replace_loop(stmt.orelse, var, make))))
        else:
            out.append(stmt)
    return out


def _count(loop: Loop) -> Expr:
    """The number of blocks of ``loop`` (0 or less when it is empty)."""
    return binop("//", binop("+", binop("-", loop.stop, loop.start), const(BLOCK - 1)), const(BLOCK))


def _blocks(loop: Loop, origin: Expr, first: int, count: Expr, before: tuple[Stmt, ...],
            after: tuple[Stmt, ...]) -> Loop:
    """The loop over the blocks of ``loop`` numbered from ``first`` to ``count``: block b binds its range
    ``[blk_lo, blk_hi)`` from ``origin + (b - first) * BLOCK``, then runs ``before``, ``loop`` over the block and
    ``after``."""
    lo, hi = Var(BLOCK_LO, INDEX), Var(BLOCK_HI, INDEX)
    number = binop("-", Var(BLOCK_VAR, INDEX), const(first))
    body = (Let(BLOCK_LO, binop("+", origin, binop("*", number, const(BLOCK)))),
            Let(BLOCK_HI, binop("min", binop("+", lo, const(BLOCK)), loop.stop)),
            *before, replace(loop, start=lo, stop=hi), *after)
    return Loop(BLOCK_VAR, const(first), count, False, body)


def first_block_end(rng: Range) -> Sym:
    """The end of the ragged first block of a loop over ``rng``, for the host to compute: a size parameter costs
    the kernel nothing, the same arithmetic per output element made 16-term sums 16% slower (Numba)."""
    return rng.hi - smax(ceildiv(rng.extent(), BLOCK) - 1, Sym(0)) * BLOCK


@dataclass(frozen=True)
class RaggedFirst:
    """``loop`` run as its first block, which holds the remainder, then whole blocks. ``first_hi``: the end of
    the first block when the host computes it (``first_block_end``); else ``blk_first_hi`` is bound to it. The
    block count is recomputed where it is used: bound to a variable too, it made Numba's code for rows of 8
    terms 12% slower (measured, the same sums otherwise)."""

    loop: Loop
    first_hi: Expr | None

    @property
    def _end(self) -> Expr:
        return Var(FIRST_HI, INDEX) if self.first_hi is None else self.first_hi

    def first(self) -> list[Stmt]:
        """The end of the first block (when the kernel computes it) and the loop over it."""
        loop = self.loop
        head: list[Stmt] = []
        if self.first_hi is None:
            whole = binop("*", binop("max", binop("-", _count(loop), const(1)), const(0)), const(BLOCK))
            head.append(Let(FIRST_HI, binop("-", loop.stop, whole)))
        return [*head, replace(loop, stop=self._end)]

    def others(self, before: tuple[Stmt, ...], after: tuple[Stmt, ...]) -> Loop:
        """The loop over the blocks after the first."""
        return _blocks(self.loop, self._end, 1, _count(self.loop), before, after)


def peels(plan: Schedule, index: str) -> bool:
    """Whether a sum in a register blocked over ``index`` runs its ragged first block apart (``register_sum``):
    everywhere but in a scalar result's loop over whole blocks."""
    return plan.level(index) > 0


def register_sum(nest: Nest, acc: str, value: Expr, compute: str, index: str | None,
                 first_hi: Expr | None = None) -> tuple[list[Stmt], Expr]:
    """The statements summing ``value`` over the loops of ``nest`` into the register ``acc``, and the sum (in
    ``compute``). Blocked over the loop of spec index ``index`` when there is one (``blocked_index``);
    ``first_hi``: the end of its first block as a size parameter (``first_block_end``), when its bounds are
    sizes."""
    if index is None:
        return [Let(acc, Const(0.0, compute)), *nest.block([Accum(acc, "+", value)])], Var(acc, compute)
    part, plan = f"{acc}_part", nest.schedule
    stmts, var = nest.block([Accum(part, "+", value)]), plan.var(index)
    zero, total = Let(part, Const(0.0, compute)), Var(acc, TOTAL)
    add = Accum(acc, "+", cast(Var(part, compute), TOTAL))
    if plan.parallel and plan.level(index) == plan.top + 1:  # once per output element
        def per_element(loop: Loop) -> list[Stmt]:
            ragged = RaggedFirst(loop, first_hi)
            more = (Let(acc, cast(Var(part, compute), TOTAL)), ragged.others((zero,), (add,)),
                    Let(part, cast(total, compute)))
            longer = binop(">", binop("-", loop.stop, loop.start), const(BLOCK))
            return [*ragged.first(), If(longer, more)]

        return [zero, *_replace_loop(stmts, var, per_element)], Var(part, compute)
    if not peels(plan, index):  # once per call
        def whole(loop: Loop) -> list[Stmt]:
            return [_blocks(loop, loop.start, 0, _count(loop), (zero,), (add,))]

        return [Let(acc, Const(0.0, TOTAL)), *_replace_loop(stmts, var, whole)], cast(total, compute)

    def peeled(loop: Loop) -> list[Stmt]:
        ragged = RaggedFirst(loop, first_hi)
        return [zero, *ragged.first(), add, ragged.others((zero,), (add,))]

    return [Let(acc, Const(0.0, TOTAL)), *_replace_loop(stmts, var, peeled)], cast(total, compute)


@dataclass(frozen=True)
class TileSum:
    """A tiled kernel's blocked sum. ``tile``: a loop over the elements of the tile (its body is replaced);
    ``element``: the output element its iterations accumulate into; ``slot``: that element's position in the
    tile (from 0), below ``elems``, the tile's size; ``terms``: the number of terms of the whole sum (every
    reduction loop's extent before any guard narrows it); ``inner``: the terms per iteration of the
    strip-mined loop (the constant extents of the reduction loops inside it)."""

    tile: Loop
    element: Load
    slot: Expr
    elems: int
    terms: Expr
    inner: int = 1

    def prologue(self) -> list[Stmt]:
        """Whether the sum is longer than one block, and then the zero totals and term count."""
        return [Let(LONG, binop(">", self.terms, const(BLOCK))),
                If(Var(LONG, BOOL), (Scratch(TOTALS, self.elems, TOTAL), Let(TERMS, const(0))))]

    def blocked(self, stmts: Sequence[Stmt], var: str) -> list[Stmt]:
        """``stmts`` (the reduction loops) blocked over loop variable ``var``: in a long sum, once a block
        brings the terms since the last move to ``BLOCK`` or more, the partials move into the totals and the
        output elements restart from zero."""
        element = self.element
        move = (Store(TOTALS, (self.slot,), cast(element, TOTAL), "add"),
                Store(element.array, element.index, Const(0.0, element.dtype)))
        length = binop("-", Var(BLOCK_HI, INDEX), Var(BLOCK_LO, INDEX))
        counted = Accum(TERMS, "+", length if self.inner == 1 else binop("*", length, const(self.inner)))
        full = If(binop(">=", Var(TERMS, INDEX), const(BLOCK)), (replace(self.tile, body=move), Let(TERMS, const(0))))
        after = (If(Var(LONG, BOOL), (counted, full)),)
        return _replace_loop(stmts, var, lambda loop: [_blocks(loop, loop.start, 0, _count(loop), (), after)])

    def epilogue(self) -> list[Stmt]:
        """The totals of a long sum added back into the output elements (zero after the last block; an added
        total keeps what a '+=' output held when a guard skipped every block)."""
        element = self.element
        total = Load(TOTALS, (self.slot,), TOTAL)
        return [self._if_long((Store(element.array, element.index, cast(total, element.dtype), "add"),))]

    def _if_long(self, body: tuple[Stmt, ...]) -> If:
        return If(Var(LONG, BOOL), (replace(self.tile, body=body),))

