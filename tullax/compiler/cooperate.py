"""Block- and warp-cooperative reductions (GPU printers): a kernel whose per-element work is a few long
reductions along the contiguous axis of an input (row logsumexp, max/min, norms, a Dist or Linear gradient
``ΔW[k,i] := ΔD[i,j]*...``) runs ONE block (or one warp) per output element instead of one thread, its threads
striding each reduction so a warp reads 32 consecutive elements per request, then combining their partials
with a fixed tree (``Combine``; the loop IR's docstring says what printers do).

One thread per row reads rows 32 lines apart per warp request and, with few rows, leaves most of the GPU idle;
a block per row reads each row's lines once, whole. The choice is by shapes (``Cooperation``): a block for rows
long enough to give each of its threads several terms, a warp for medium rows over many elements (its merge is
one shuffle tree, no barrier).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping

from tullax.compiler.loops import (
    FLOATS,
    Accum,
    Barrier,
    BinOp,
    Buffer,
    Call,
    Combine,
    Const,
    Expr,
    If,
    Let,
    Load,
    Loop,
    LoopKernel,
    Select,
    Stmt,
    Store,
    Var,
    binop,
    eval_int,
    expr_vars,
    expressions,
    parallel_nest,
    walk_expr,
    walk_stmts,
)
from tullax.errors import TullaxError


@dataclass(frozen=True)
class Cooperation:
    """When threads cooperate on a reduction, by shapes. A block per output element for rows at least
    ``block_from`` long (8 terms for each of 256 threads: the merge, two shuffle trees and two barriers, then
    costs less than the terms) into at least ``block_outputs`` elements (fewer leave most SMs idle: a sum over
    so few is split over threads instead, ``tullax.compiler.split``; anything else still takes a block each,
    after the split was tried). Else a warp per element for rows at least ``warp_from`` long (8 terms per lane)
    into at least ``warp_outputs`` elements (enough warps to fill the GPU)."""

    block_from: int = 2048
    block_outputs: int = 64
    warp_from: int = 256
    warp_outputs: int = 1024


FORCE_BLOCK = Cooperation(block_from=1, block_outputs=1)  # every kernel that can (tests, at small sizes)
FORCE_WARP = Cooperation(block_from=1 << 62, warp_from=1, warp_outputs=1)
COMBINED = ("+", "max", "min")


def cooperate(kernel: LoopKernel, sizes: Mapping[str, int], min_length: int, max_float32_sum: int | None = None,
              min_outputs: int = 1, warp: bool = False) -> LoopKernel | None:
    """``kernel`` as a cooperative kernel for these ``sizes`` (size parameter -> value), or None where its
    per-element work is not a sequence of Lets, long unit-stride reductions and stores of the output.
    ``max_float32_sum``: the longest float32 sum taken (each thread sums its share in one float32 register);
    ``min_outputs``: the fewest output elements taken; ``warp``: a warp per element instead of a block."""
    if kernel.is_scatter or kernel.split or kernel.cooperative or kernel.compute_dtype not in FLOATS:
        return None
    loops, body = parallel_nest(kernel)
    if not loops or not any(isinstance(s, Loop) for s in body):
        return None
    try:
        outputs = math.prod(max(eval_int(loop.stop, dict(sizes)) - eval_int(loop.start, dict(sizes)), 0)
                            for loop in loops)
    except (TullaxError, KeyError):
        return None
    if outputs < min_outputs:
        return None
    declared: dict[str, str] = {}  # accumulator candidates: Lets at the top of the per-element block
    stmts: list[Stmt] = []
    buffers = {s.var for s in body if isinstance(s, Buffer)}
    if buffers and warp:  # a buffer is the block's, its barrier the block's: a warp per row would share both
        return None
    for stmt in body:
        if isinstance(stmt, Buffer):  # a fused program's row buffer: one per block, in shared memory
            stmts.append(replace(stmt, shared=True))
        elif isinstance(stmt, Loop) and not stmt.parallel and buffers and _elementwise(stmt, buffers):
            # the threads write their elements of the row buffer; a later loop reads any element
            stmts += [replace(stmt, lanes=True), Barrier()]
        elif isinstance(stmt, Let):
            declared[stmt.var] = stmt.value.dtype
            stmts.append(stmt)
        elif isinstance(stmt, Store):
            if stmt.mode != "set" or stmt.array != kernel.output.name:
                return None
            stmts.append(stmt)
        elif isinstance(stmt, Loop) and not stmt.parallel and _elementwise(stmt, {kernel.output.name}):
            stmts.append(replace(stmt, lanes=True))  # a fused program's output row: each thread its elements
        elif isinstance(stmt, Loop) and not stmt.parallel:
            combined = _reduction(stmt, declared, sizes, min_length)
            if combined is None:
                return None
            if max_float32_sum is not None and any(op == "+" and declared[v] == "float32" for v, op in combined) \
                    and _length(stmt, sizes) > max_float32_sum:
                return None
            stmts.append(replace(stmt, lanes=True))
            stmts += [Combine(var, op, declared[var]) for var, op in combined]
        else:  # a guard or anything else around the reductions: not every thread would reach each Combine
            return None
    if buffers:  # the next row's writes of the buffers wait until every thread has read this row's
        stmts.append(Barrier())
    nest: tuple[Stmt, ...] = _online_logsumexp(tuple(stmts))
    for loop in reversed(loops):
        nest = (replace(loop, body=nest),)
    return replace(kernel, body=nest, cooperative=True, warp=warp)


def _reduction(loop: Loop, declared: Mapping[str, str], sizes: Mapping[str, int],
               min_length: int) -> list[tuple[str, str]] | None:
    """(accumulator, op) of each accumulator ``loop`` updates, in order, when the block's threads may share its
    iterations: only Lets, Accums (+ max min, of floats declared before it) and nested loops and guards inside,
    every load that moves with the loop variable indexed by it alone along its last (unit-stride) axis, at least
    ``min_length`` iterations."""
    ops: dict[str, str] = {}
    for stmt in walk_stmts(loop.body):
        if isinstance(stmt, Accum):
            if stmt.var not in declared or declared[stmt.var] not in FLOATS or stmt.op not in COMBINED \
                    or ops.setdefault(stmt.var, stmt.op) != stmt.op:
                return None
        elif not isinstance(stmt, (Let, Loop, If)):
            return None
    if not ops:
        return None
    # every load that moves with the loop moves along its array's last axis: lanes then read consecutive
    # elements of each (a load strided along the loop, ΔD[i,j] of ΔX[k,j] := ΔD[i,j]*W[k,i], would read 32 lines)
    moving = [node for expr in expressions(loop.body) for node in walk_expr(expr)
              if isinstance(node, Load) and any(loop.var in expr_vars(i) for i in node.index)]
    unit = bool(moving) and all(node.index[-1] == Var(loop.var, node.index[-1].dtype)
                                and not any(loop.var in expr_vars(i) for i in node.index[:-1]) for node in moving)
    length = _length(loop, sizes)
    return list(ops.items()) if unit and length is not None and length >= min_length else None


def _elementwise(loop: Loop, targets: set[str]) -> bool:
    """A loop of a fused program (``tullax.compiler.fuse``) writing one row of the output (or of a row buffer),
    an element per iteration along its last axis: Lets and plain stores only, so the block's threads may share it
    with no combine (the per-row values it reads, every thread holds after the Combines before it)."""
    stores = [s for s in loop.body if isinstance(s, Store)]
    return bool(stores) and all(isinstance(s, (Let, Store)) for s in loop.body) and all(
        s.array in targets and s.mode == "set" and s.index[-1] == Var(loop.var, s.index[-1].dtype)
        and not any(loop.var in expr_vars(i) for i in s.index[:-1]) for s in stores)


def _online_logsumexp(stmts: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    """The two passes of a logsumexp (``lower._logsumexp``: the max, then the sum of exp(x - shift)) as ONE
    pass that keeps a running max m and a sum s of exp(x - m') rescaled whenever m grows, so each row is read
    once; merged over the block by ``Combine(m, "logsumexp", scaled=s)``. Other statements unchanged."""
    for k in range(len(stmts) - 7):
        init_m, first, max_all, shift, init_s, second, sum_all = stmts[k:k + 7]
        if not (isinstance(init_m, Let) and isinstance(first, Loop) and isinstance(max_all, Combine)
                and isinstance(shift, Let) and isinstance(init_s, Let) and isinstance(second, Loop)
                and isinstance(sum_all, Combine) and max_all.op == "max" and sum_all.op == "+"):
            continue
        m, total = max_all.var, sum_all.var
        if (first.var, first.start, first.stop) != (second.var, second.start, second.stop) \
                or len(first.body) != 1 or len(second.body) != 1:
            continue
        take_max, add = first.body[0], second.body[0]
        if not (isinstance(take_max, Accum) and take_max.var == m and isinstance(add, Accum) and add.var == total):
            continue
        dtype = max_all.dtype
        shifted = Call("exp", (BinOp("-", take_max.value, Var(shift.var, dtype), dtype),), dtype)
        if add.value != shifted or init_m.var != m or init_s.var != total:
            continue
        body = _online_step(m, total, take_max.value, dtype)
        online = (init_m, init_s, replace(first, body=body), Combine(m, "logsumexp", dtype, scaled=total), shift)
        return stmts[:k] + online + stmts[k + 7:]
    return stmts


def _online_step(m: str, total: str, value: Expr, dtype: str) -> tuple[Stmt, ...]:
    """One term x of a running (m, s): m_new = max(m, x); s = rescaled(s) + exp(x - safe(m_new)), where safe(v)
    is v when finite, else 0 (as the two-pass shift), and s is only rescaled when m grew and s is not 0 (0 times
    an overflowing factor would be NaN)."""
    x, grown = Var("term_x", dtype), Var("max_new", dtype)
    old, running = Var(m, dtype), Var(total, dtype)
    rescaled = Select(binop("or", binop("==", running, Const(0.0, dtype)), binop("==", old, grown)), running,
                      running, dtype)
    shift = Var("shift_new", dtype)
    rescaled = replace(rescaled, orelse=BinOp("*", running, Call("exp", (BinOp("-", _safe(old), shift, dtype),),
                                                                   dtype), dtype))
    term = Call("exp", (BinOp("-", x, shift, dtype),), dtype)
    return (Let(x.name, value), Let(grown.name, BinOp("max", old, x, dtype)), Let(shift.name, _safe(grown)),
            Let(total, BinOp("+", rescaled, term, dtype)), Let(m, grown))


def _safe(v: Var) -> Expr:
    finite = binop("and", binop(">", v, Const(-math.inf, v.dtype)), binop("<", v, Const(math.inf, v.dtype)))
    return Select(finite, v, Const(0.0, v.dtype), v.dtype)


def shared_buffer_bytes(kernel: LoopKernel, sizes: Mapping[str, int]) -> int:
    """The dynamic shared memory a cooperative kernel's row buffers take for these sizes: each buffer a slot of
    its length in 8-byte words (a double holds any float type; the printers lay them out so), one after another."""
    return sum(8 * eval_int(s.length, dict(sizes)) for s in walk_stmts(kernel.body) if isinstance(s, Buffer)
               and s.shared)


def _length(loop: Loop, sizes: Mapping[str, int]) -> int | None:
    try:
        return eval_int(loop.stop, dict(sizes)) - eval_int(loop.start, dict(sizes))
    except (TullaxError, KeyError):  # bounds that depend on the element (a triangle): not a fixed row
        return None


__all__ = ["FORCE_BLOCK", "FORCE_WARP", "Cooperation", "cooperate", "shared_buffer_bytes"]
