"""Split sums, for GPU printers: a kernel with few output elements and long sums runs on more threads than it has
outputs.

One thread per output element leaves a GPU idle when the elements are few and each sums many terms. conv1d's
filter gradient ``Δw[k] := Δy[b,i]*x[b,i+k]`` has 31 elements of 64x16384 terms each: 31 threads on a chip that
keeps a quarter of a million resident. ``split_sums`` moves the outer loops of the sum into the launch nest
(``Loop.parallel``) and cuts the next one into chunks of ``length`` iterations, with a new launch loop over the
chunks (``chunk``). Every thread sums its piece in a register, then adds it into its output element with
``atomic_add``; the kernel is marked ``split`` and the host starts the output at zero (``:=``) or at the given
array (``+=``).

The cut is decided with the call's sizes (shapes are static under jit): each output element gets up to
``SplitPolicy.threads / outputs`` threads (its pieces), at most ``max_pieces`` of them (they contend for its
atomic) and no more than leave each thread ``min_terms`` terms, but as many as keep a float32 piece within
``max_float32_terms``. Outermost loop first, whole loops join the launch while the pieces allow, then the next
loop is cut; the chunk length is a power of two, so few variants compile.

Only plain sums qualify: the kernel's one store writes the accumulator of a ``+`` reduction, with no finaliser,
in a float dtype (``atomicAdd`` of float and double). Loops move into the launch nest only where their bounds are
sizes (the grid is a box) and the statements before them are ``Let``s and guards without an ``else``, which every
thread can then run for itself.

The kernel to split is lowered with ``share=False`` (register tiles would cut the thread count further) and
``block_sums=False``: a thread's piece is short (a float32 piece at most ``max_float32_terms`` terms, where the
unsplit kernel's float64 totals take float32 blocks of 512), and the pieces meet in the output in no fixed order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping

from tullax.compiler.loops import (
    FLOATS,
    INDEX,
    Accum,
    Const,
    If,
    Let,
    Load,
    Loop,
    LoopKernel,
    Scratch,
    Stmt,
    Store,
    Var,
    binop,
    const,
    eval_int,
    expr_vars,
    expressions,
    parallel_nest,
    walk_expr,
    walk_stmts,
)

CHUNK = "chunk"  # the launch loop over the pieces of the cut loop (no IR name is spelled so)


@dataclass(frozen=True)
class SplitPolicy:
    """When and how far to split (thread counts are a GPU's: an H100 keeps 132 x 2048 threads resident)."""

    threads: int = 1 << 18  # a split kernel's launch grows towards this many threads
    below: int = 1 << 16  # only kernels with fewer output elements than this are split
    min_work: int = 1 << 10  # ... and only when each element sums at least this many terms
    min_terms: int = 64  # every thread of a split kernel sums at least this many terms
    max_pieces: int = 1 << 12  # ... and at most this many threads add into one element (atomics contend) ...
    max_float32_terms: int = 1 << 12  # ... unless a thread would sum more float32 terms than this in a register


def split_sums(kernel: LoopKernel, sizes: Mapping[str, int], policy: SplitPolicy = SplitPolicy()) -> LoopKernel | None:
    """``kernel`` with its sum split over more threads for these ``sizes`` (size parameter -> value), or None where
    it is no plain sum or cannot be cut into at least two pieces per output element."""
    if kernel.is_scatter or kernel.split or kernel.compute_dtype not in FLOATS:
        return None
    if kernel.output.dtype != kernel.compute_dtype:
        return None
    loops, body = parallel_nest(kernel)
    if not body or not isinstance(body[-1], Store):
        return None
    store, block = body[-1], tuple(body[:-1])
    if store.mode not in ("set", "add") or not isinstance(store.value, Var) or store.array != kernel.output.name:
        return None
    if not _plain_sum(block, store.value.name, kernel.output.name):
        return None
    size_names = set(sizes)
    outputs = math.prod(_extent(loop, sizes) for loop in loops)
    work = _work(block, sizes)
    if not 0 < outputs < policy.below or work < policy.min_work:
        return None
    wanted = min(-(-policy.threads // max(outputs, 1)), policy.max_pieces, work // policy.min_terms)
    if kernel.compute_dtype == "float32":
        wanted = max(wanted, -(-work // policy.max_float32_terms))
    pieces, launch, chunk = 1, [], None  # pieces: threads per output element
    while pieces < wanted and (found := _chain(block, size_names)) is not None:
        loop, rebuild = found
        extent = _extent(loop, sizes)
        inner = _work(loop.body, sizes)
        if pieces * extent <= wanted:
            launch.append(replace(loop, parallel=True, reduce_parallel=False, body=()))
            block, pieces, work = rebuild(loop.body), pieces * extent, inner
            continue
        length = 1 << max(0, math.ceil(math.log2(-(-extent // -(-wanted // pieces)))))
        if length < extent:
            count = binop("//", binop("+", binop("-", loop.stop, loop.start), const(length - 1)), const(length))
            chunk = Loop(CHUNK, const(0), count, True, ())
            lo = binop("+", loop.start, binop("*", Var(CHUNK, INDEX), const(length)))
            cut = replace(loop, start=lo, stop=binop("min", loop.stop, binop("+", lo, const(length))),
                          reduce_parallel=False)
            block, pieces, work = rebuild((cut,)), pieces * -(-extent // length), length * inner
        break
    if pieces < 2 or (kernel.compute_dtype == "float32" and work > policy.max_float32_terms):
        return None
    nest = [*launch, *([chunk] if chunk else []), *loops]
    stmts: tuple[Stmt, ...] = (*block, replace(store, mode="atomic_add"))
    for loop in reversed(nest):
        stmts = (replace(loop, body=stmts),)
    return replace(kernel, body=stmts, split=True)


def _plain_sum(block: tuple[Stmt, ...], acc: str, out: str) -> bool:
    """Whether ``block`` starts ``acc`` at zero, only adds to it, and neither stores nor reads the output."""
    if not any(isinstance(s, Let) and s.var == acc and isinstance(s.value, Const) and s.value.value == 0
               for s in block):
        return False
    for stmt in walk_stmts(block):
        if isinstance(stmt, (Store, Scratch)):
            return False
        if isinstance(stmt, Accum) and stmt.var == acc and stmt.op != "+":
            return False
        if isinstance(stmt, Let) and stmt.var == acc and not any(s is stmt for s in block):
            return False  # re-started inside a loop: not one running sum
    return not any(isinstance(node, Load) and node.array == out
                   for expr in expressions(block) for node in walk_expr(expr))


def _chain(block: tuple[Stmt, ...], sizes: set[str]) -> tuple[Loop, Callable[[tuple[Stmt, ...]], tuple]] | None:
    """The loop that ends ``block``'s chain of ``Let``s and guards (``If`` without ``else``), when its bounds are
    sizes; with a function that rebuilds ``block`` with other statements in the loop's place."""
    if not block or not all(isinstance(s, Let) for s in block[:-1]):
        return None
    head, last = tuple(block[:-1]), block[-1]
    if isinstance(last, Loop) and not last.parallel and _sized(last, sizes):
        return last, lambda stmts: head + tuple(stmts)
    if isinstance(last, If) and not last.orelse:
        inner = _chain(last.then, sizes)
        if inner is not None:
            loop, rebuild = inner
            return loop, lambda stmts: head + (replace(last, then=rebuild(stmts)),)
    return None


def _work(stmts: tuple[Stmt, ...], sizes: Mapping[str, int]) -> int:
    """About how many innermost iterations ``stmts`` run: loop extents multiplied (a loop whose bounds are not
    sizes counts once), the longer branch of a guard."""
    total = 0
    for stmt in stmts:
        if isinstance(stmt, Loop):
            extent = _extent(stmt, sizes) if _sized(stmt, sizes) else 1
            total += extent * _work(stmt.body, sizes)
        elif isinstance(stmt, If):
            total += max(_work(stmt.then, sizes), _work(stmt.orelse, sizes))
    return max(total, 1)


def _sized(loop: Loop, sizes: Iterable[str]) -> bool:
    """Whether ``loop``'s bounds are expressions of the size parameters ``sizes`` alone."""
    return (expr_vars(loop.start) | expr_vars(loop.stop)) <= set(sizes)


def _extent(loop: Loop, sizes: Mapping[str, int]) -> int:
    """The trip count of ``loop``, whose bounds are sizes, for these ``sizes``."""
    return max(eval_int(binop("-", loop.stop, loop.start), dict(sizes)), 0)


__all__ = ["CHUNK", "SplitPolicy", "split_sums"]
