"""Lower an analysed Spec to a loop-nest kernel (the loop IR of ``tullax.compiler.loops``).

The stages, each in its module: ``params`` names the kernel's parameters; ``guards`` turns the conditions of
the body into linear conditions and solves its equalities; ``schedule`` decides the loops (parallel ones,
order, tiling); the ``Emitter`` (``emit``) numbers names and places statements at loop levels, fed by
``translate`` (spec expressions as loop-IR expressions) and by the body forms below; ``assemble`` nests it
all. Decisions taken here (printer-neutral):

* Reductions accumulate in a register (``Let acc = init``; loops; ``Accum``; finaliser; one ``Store``).
  Initial values: + 0, * 1, max -inf, min +inf (integers: the extremes of the result type). logsumexp runs
  two passes over the same loops: a max pass, then a sum of ``exp(v - m)`` (m replaced by 0 when it is
  infinite, which makes an all ``-inf`` or empty range give ``-inf`` and a ``+inf`` give ``+inf``), result
  ``m + log(s)``. A float32 sum (logsumexp's too) that may be long runs in blocks: float32 partials, a
  float64 total (``blocking``).
* A tiled kernel accumulates straight into the output elements of its tile (initialised first, finalised
  after); the output is then also read (``Load`` of the output array). A long float32 sum moves the tile's
  partials into float64 totals after each block (a ``Scratch`` array).
* A scatter adds into its positions (``atomic_add`` when its serial loops may hit one element twice); an
  index array pointing outside the output skips the element.
* Loads and calls that do not depend on an inner loop are hoisted into ``Let``s at the loop level where
  their indices are known (never out of a ``Select`` branch or above a guard that protects them).
* Then work is shared (``share=True``): the schedule's register tiles (``jam``) compute several outputs per
  parallel iteration, which then share their loads and calls; a small output index compared with literals (a
  gradient w.r.t. a coordinate, ``(m == c)``) gets per-case code; a call evaluated twice in one block is
  computed once (``rewrite``).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from tullax.compiler.assemble import Nest, mark_reduce_parallel
from tullax.compiler.blocking import (
    TileSum,
    blocked_index,
    first_block_end,
    peels,
    product_total,
    register_sum,
    sum_terms,
)
from tullax.compiler.bounds import Bound, Side, narrow
from tullax.compiler.emit import Emitter, Phase
from tullax.compiler.factor import factor_sums
from tullax.compiler.guards import Rel, Solution, find_guards
from tullax.compiler.jam import RegisterTile, register_tiles
from tullax.compiler.loops import (
    INDEX,
    Accum,
    BinOp,
    Call,
    Const,
    Expr,
    Let,
    Load,
    Loop,
    LoopKernel,
    Select,
    Stmt,
    Store,
    Var,
    binop,
    cast,
    conjunction,
    const,
    is_float,
)
from tullax.compiler.params import parameters
from tullax.compiler.reduction_jam import jam_reductions
from tullax.compiler.rewrite import share_subexpressions
from tullax.compiler.schedule import TILE, Schedule, loop_order, schedule
from tullax.compiler.strips import register_strips, strip_width
from tullax.compiler.translate import Translator, as_bool
from tullax.spec import ir
from tullax.spec.ir import Spec, Wrapped, reduction_identity
from tullax.spec.text import format_spec

if TYPE_CHECKING:
    from tullax.spec.signature import Signature

ACC, MAX_ACC, SUM_ACC, SHIFT = "acc", "accm", "accs", "shift"  # accumulators (logsumexp: max, shifted sum)
TILE_LO, TILE_HI = "tile_lo", "tile_hi"  # the range of the tiled index in the current tile


def identity(redop: str, compute: str, wrap: str | None = None) -> Const:
    """The initial value of reduction ``redop`` in ``compute``: an integer max/min starts at the extreme of the
    result's type (``wrap``, else ``compute``: integers have no infinities)."""
    return Const(reduction_identity(redop, compute if is_float(compute) else wrap or compute), compute)


def lower(spec: Spec, signature: Signature, name: str = "kernel", *, tile: bool = False,
          share: bool = True, block_sums: bool = True, streams: bool = False, strips: bool = False) -> LoopKernel:
    """The loop-nest kernel of ``spec`` for ``signature`` (a ``backends.base.Signature``).

    ``tile=True`` (CPU printers): when the innermost reduction index is strided but the last parallel index j
    is unit-stride in more accesses (``D[i,j] := (W[k,i]-X[k,j])^2``, a matmul), j is strip-mined: a parallel
    loop over tiles of j, the reductions inside it, and j innermost over the tile, accumulating straight into
    the output elements of the tile (initialised first, finalised after), so the inner loop is contiguous and
    vectorises. Only without guards on j and for + * max min reductions (not a float32 product, which
    accumulates in float64: ``blocking.product_total``; and '+=' only with + and no finaliser). A scatter is
    tiled when its last parallel (collision-free) index is the last output axis and colliding loops run inside
    it: tiles own disjoint output columns, so it stays race-free. A GPU printer
    keeps the default: one element per work item.

    ``share`` (the default): the schedule's register tiles (``tullax.compiler.jam``) and subexpressions computed
    once per block (``tullax.compiler.rewrite``); ``share=False`` gives the kernel without them (benchmarks compare
    the two, and tests of the loop order read the plain nest).

    ``block_sums=False``: a float32 sum accumulates in one float32 register, not in blocks with a float64 total.
    For a kernel whose sums ``tullax.compiler.split`` cuts into short pieces, one per GPU thread.

    ``streams=True`` (a printer whose max/min lanes take several accumulators, the C printer's): a max/min
    reduction along contiguous rows reads several rows at once (``schedule.register_tiles``).

    ``strips=True`` (the C printer, whose vectors hold them): a strip-mined float kernel's rows are register-tiled
    and their tile segments held across the reduction (``tullax.compiler.strips``); where that finds nothing to
    hold, the kernel is lowered without those rows."""
    if spec.scan is not None:  # a recurrence: its own nest around the plain lowering (tullax.compiler.scan)
        from tullax.compiler.scan import lower_scan

        return lower_scan(spec, signature, lower, name, contiguous=tile)
    params = parameters(spec, signature)
    guards = find_guards(spec, loop_order(spec)[1])
    # a tile accumulates in the output elements: not when they are real and the sum complex (|> abs), nor for a
    # product that accumulates in a wider register (blocking.product_total)
    tiles = tile and params.compute == params.out.dtype and product_total(spec, params.compute) is None
    width = strip_width(params.compute) if strips and share else 0
    plan = schedule(spec, params.compute, guards, tiles, streams, strips=bool(width))
    emit = Emitter(plan)
    translator = Translator(params, emit)
    for solution in guards.solutions:
        emit.solved_index(solution.index, _solved_value(solution, emit))
    narrowing = narrow(guards.conds, plan, emit)
    for expr in guards.generic:
        emit.guard(as_bool(translator.translate(expr)), Phase.DATA_GUARD)
    if spec.is_scatter:
        stmts = _scatter(spec, plan, translator, guards.body, narrowing)
    elif plan.tiling:
        stmts = _tiled(spec, plan, translator, guards.body, narrowing)
    else:
        stmts = _reduction(spec, plan, translator, guards.body, narrowing, block_sums)
    kernel = LoopKernel(
        name=name, spec_text=format_spec(spec).replace("\n", " "), arrays=params.arrays, scalars=params.scalars,
        sizes=emit.size_args(), body=tuple(stmts), compute_dtype=params.compute,
        is_scatter=spec.is_scatter)
    if not share:
        return kernel
    shared = _shared(kernel, plan, plan.register)
    if not (width and plan.tiling and plan.register):
        return shared
    stripped = register_strips(shared, plan.var(plan.tiling.index), Var(TILE_LO, INDEX), Var(TILE_HI, INDEX), width)
    return stripped if stripped is not None else _shared(kernel, plan, ())


def _shared(kernel: LoopKernel, plan: Schedule, tiles: tuple[RegisterTile, ...]) -> LoopKernel:
    """``kernel`` with its register ``tiles``, its reduction jams and shared subexpressions."""
    kernel = register_tiles(kernel, [(plan.var(tile.index), tile) for tile in tiles])
    if plan.tiling:  # the tile's output elements updated FACTOR terms at a time
        kernel = jam_reductions(kernel)
    kernel = factor_sums(kernel)  # what an inner sum multiplies by in every term, multiplied once after it
    return replace(kernel, body=share_subexpressions(kernel.body))


def _solved_value(solution: Solution, emit: Emitter) -> Expr:
    """``coef*t + rest == 0`` -> ``t = -rest / coef`` (exact: a divisibility guard comes with |coef| > 1); a
    divisibility condition (coef ±1, ``Solution.lo``): ``t = lo + mod(-coef*rest - lo, div)``."""
    cond, coef = solution.cond, solution.coef
    if cond.rel == Rel.DIVISIBLE:  # coef*t + rest divisible by div, coef ±1: t = -coef*rest (mod div)
        others = tuple((n, -coef * c) for n, c in cond.terms if n != solution.index)
        shifted = emit.linear(others, cond.const * (-coef) - solution.lo)
        return binop("+", const(solution.lo), binop("mod", shifted, const(cond.div)))
    rest = emit.linear(tuple((n, c) for n, c in cond.terms if n != solution.index), cond.const)
    if coef == 1:
        return binop("-", const(0), rest)
    if coef == -1:
        return rest
    return binop("//", binop("-", const(0), rest) if coef > 0 else rest, const(abs(coef)))


def _nest(spec: Spec, plan: Schedule, emit: Emitter, narrowing: tuple[Bound, ...]) -> Nest:
    """The loop nest once every statement is placed: the bounds of the loops inside the per-element block,
    outermost first, then of the parallel loops, innermost first (the order their size parameters are
    numbered in)."""
    ranges = spec.range_of
    bounds = []
    for name in plan.loops[plan.top + 1:] + tuple(reversed(plan.parallel)):
        if name == TILE:  # the number of tiles
            rng, elems = ranges[plan.tiling.index], plan.tiling.elems
            count = binop("//", binop("+", emit.size(rng.hi - rng.lo), const(elems - 1)), const(elems))
            bounds.append((name, const(0), count))
            continue
        if plan.tiling and name == plan.tiling.index:
            start, stop = Var(TILE_LO, INDEX), Var(TILE_HI, INDEX)
        else:
            start, stop = emit.size(ranges[name].lo), emit.size(ranges[name].hi)
        for bound in narrowing:
            if bound.index == name and bound.side == Side.START:
                start = binop("max", start, bound.value)
            elif bound.index == name:
                stop = binop("min", stop, bound.value)
        bounds.append((name, start, stop))
    return Nest(plan, emit.placements(), tuple(bounds))


def _reduction(spec: Spec, plan: Schedule, translator: Translator, body: ir.Expr,
               narrowing: tuple[Bound, ...], block_sums: bool = True) -> list[Stmt]:
    """One output element per parallel iteration, reduced in a register (or computed directly); a float32 sum
    in blocks unless ``block_sums`` is False."""
    emit, compute, out = translator.emit, translator.compute, translator.params.out
    value = emit.hoist(translator.value(body))
    out_index = tuple(emit.index_var(n) for n in spec.free)
    nest = _nest(spec, plan, emit, narrowing)
    has_loops = plan.innermost > plan.top
    result: Expr
    wide: Expr | None = None  # a float32 product's float64 total, before it is rounded
    blocked = blocked_index(spec, plan, compute) if block_sums else None
    first_hi = _first_block_end(spec, plan, emit, nest, blocked)
    if spec.redop == "logsumexp":
        block, result = _logsumexp(nest, value, compute, blocked, first_hi)
    elif not has_loops and not nest.placements.has_guards:
        block, result = nest.block([]), value
    elif spec.redop == "+":
        block, result = register_sum(nest, ACC, value, compute, blocked, first_hi)
    elif (total := product_total(spec, compute)) is not None:
        block = [Let(ACC, identity("*", total))] + nest.block([Accum(ACC, "*", cast(value, total))])
        wide = Var(ACC, total)
        result = cast(wide, compute)
    else:
        block = [Let(ACC, identity(spec.redop, compute, translator.params.wrap))]
        block += nest.block([Accum(ACC, spec.redop, translator.wrapped(value) if spec.redop != "*" else value)])
        result = Var(ACC, compute)
    if spec.finalizer is not None and wide is not None:  # on the float64 total, rounded once after it: the
        # product alone may be beyond float32 where what the finaliser makes of it is not (|> log, |> _ * O[i])
        result = finalize(spec, replace(translator, params=replace(translator.params, compute=wide.dtype)), wide)
    elif spec.finalizer is not None:
        result = finalize(spec, translator, translator.wrapped(result))
    if spec.assign == "*=":  # multiply into the given value (the host passes it in: role 'inout')
        given = Load(out.name, out_index, compute)
        if wide is not None:  # before rounding: the product alone may be beyond float32, given * product not
            result = cast(binop("*", cast(given, wide.dtype), wide), compute)
        else:
            result = binop("*", given, result)
    block.append(Store(out.name, out_index, result, "add" if spec.assign == "+=" else "set"))
    if not plan.parallel and has_loops:
        block = [mark_reduce_parallel(s) for s in block]
    return nest.parallel(block)


def finalize(spec: Spec, translator: Translator, reduced: Expr) -> Expr:
    """The finaliser applied to the ``reduced`` value of one element: its reads happen once per element, at the
    free indices, after the reduction (not hoisted: they sit in the per-element block)."""
    value = replace(translator, hole=reduced).translate(spec.finalizer)
    return cast(value, translator.params.out.dtype)  # |> abs of a complex sum: real, as the output


def _first_block_end(spec: Spec, plan: Schedule, emit: Emitter, nest: Nest, blocked: str | None) -> Expr | None:
    """The end of the ragged first block of the loop of ``blocked`` as a size parameter, when the sum has one and
    no guard narrows the loop."""
    if blocked is None or not peels(plan, blocked):
        return None
    rng = spec.range_of[blocked]
    start, stop = next((start, stop) for name, start, stop in nest.bounds if name == blocked)
    if (start, stop) != (emit.size(rng.lo), emit.size(rng.hi)):
        return None
    return emit.size(first_block_end(rng))


def _logsumexp(nest: Nest, value: Expr, compute: str, blocked: str | None,
               first_hi: Expr | None) -> tuple[list[Stmt], Expr]:
    """Two passes over the same loops: m = max(v); s = sum(exp(v - m')) with m' = m, or 0 when m is
    infinite; result m' + log(s). The sum is blocked over the loop of index ``blocked``, if any (its first block
    ends at ``first_hi`` when the host computes that)."""
    block: list[Stmt] = [Let(MAX_ACC, Const(-math.inf, compute))]
    block += nest.block([Accum(MAX_ACC, "max", value)])
    m = Var(MAX_ACC, compute)
    finite = binop("and", binop(">", m, Const(-math.inf, compute)), binop("<", m, Const(math.inf, compute)))
    block.append(Let(SHIFT, Select(finite, m, Const(0.0, compute), compute)))
    shift = Var(SHIFT, compute)
    term = Call("exp", (BinOp("-", value, shift, compute),), compute)
    sums, total = register_sum(nest, SUM_ACC, term, compute, blocked, first_hi)
    return block + sums, BinOp("+", shift, Call("log", (total,), compute), compute)


def _tile_bounds(spec: Spec, plan: Schedule, emit: Emitter) -> list[Stmt]:
    """``tile_lo``/``tile_hi``: the range of j in this tile (Lets at the top of the per-element block)."""
    rng, elems = spec.range_of[plan.tiling.index], plan.tiling.elems
    tile_lo = binop("+", emit.size(rng.lo), binop("*", emit.index_var(TILE), const(elems)))
    return [
        Let(TILE_LO, tile_lo),
        Let(TILE_HI, binop("min", binop("+", Var(TILE_LO, INDEX), const(elems)), emit.size(rng.hi))),
    ]


def _tiled(spec: Spec, plan: Schedule, translator: Translator, body: ir.Expr,
           narrowing: tuple[Bound, ...]) -> list[Stmt]:
    """Tiles of j in parallel; inside, the output elements of the tile are the accumulators."""
    emit, compute, out = translator.emit, translator.compute, translator.params.out
    block = _tile_bounds(spec, plan, emit)
    value = emit.hoist(translator.value(body))
    out_index = tuple(emit.index_var(n) for n in spec.free)
    here = Load(out.name, out_index, compute)
    nest = _nest(spec, plan, emit, narrowing)

    j = plan.var(plan.tiling.index)
    tile = Loop(j, Var(TILE_LO, INDEX), Var(TILE_HI, INDEX), False, ())

    def over_tile(stmt: Stmt) -> Stmt:
        return replace(tile, body=(stmt,))

    if spec.assign != "+=":
        block.append(over_tile(Store(out.name, out_index, identity(spec.redop, compute, translator.params.wrap))))
    if spec.redop == "+":
        update = Store(out.name, out_index, value, "add")
    else:
        wrapped = translator.wrapped(value) if spec.redop != "*" else value
        update = Store(out.name, out_index, binop(spec.redop, here, wrapped), "set")
    blocked = blocked_index(spec, plan, compute)
    if blocked is None:
        block += nest.block([update])
    else:
        terms, inner = sum_terms(spec, plan, blocked, emit.size)
        sums = TileSum(tile, here, binop("-", Var(j, INDEX), Var(TILE_LO, INDEX)), plan.tiling.elems, terms, inner)
        block += sums.prologue() + sums.blocked(nest.block([update]), plan.var(blocked)) + sums.epilogue()
    if spec.finalizer is not None:
        block.append(over_tile(Store(out.name, out_index, finalize(spec, translator, translator.wrapped(here)))))
    return nest.parallel(block)


def _scatter(spec: Spec, plan: Schedule, translator: Translator, body: ir.Expr,
             narrowing: tuple[Bound, ...]) -> list[Stmt]:
    """Add each term into its computed position."""
    emit, out = translator.emit, translator.params.out
    block = _tile_bounds(spec, plan, emit) if plan.tiling else []
    checks: list[Expr] = []
    index: list[Expr] = []
    for axis, idx in enumerate(spec.lhs):
        if isinstance(idx, Wrapped) and idx.kind == "pad":  # its conditions are guards already
            index.append(translator.affine(idx.inner))
        else:
            pos = translator.position(idx, spec.out, axis)
            checks += pos.checks  # an index array pointing outside: the element is skipped
            index.append(pos.index)
    if checks:
        emit.guard(conjunction(checks), Phase.DATA_GUARD)
    value = emit.hoist(translator.value(body))
    store = Store(out.name, tuple(index), value, "atomic_add" if plan.colliding else "add")
    nest = _nest(spec, plan, emit, narrowing)
    block += nest.block([store])
    return nest.parallel(block)


__all__ = ["lower"]
