"""A strip-mined tile summed several reduction steps at a time: unroll-and-jam of the reduction loop around it.

A strip-mined kernel (``Schedule.tiling``: Dist's gradient w.r.t. X, ``ΔX[k,j] := -ΔD[i,j]*(2*(W[k,i]-X[k,j]))``)
keeps its accumulators in the output elements of a tile: for each step r of the innermost reduction loop, the
tile loop (contiguous and vectorised) loads every element of the tile, adds one term and stores it back. The
output is read and written once per term, and the tile's other loads that do not depend on r (``X[k,j]``) are
loaded again for every r. Unrolled by ``FACTOR`` and jammed::

    for r in start:stop                       for q in 0:(stop - start) // FACTOR
        t = <lets of r>                           t_q0 = <lets of r = start + FACTOR*q>  ... t_q3
        for j in tile                             for j in tile
            out[.., j] += v(t, j)                     out[.., j] += v(t_q0, j) + ... + v(t_q3, j)
                                              for r in start + FACTOR*((stop - start) // FACTOR):stop
                                                  <the loop as it was>

the tile loop reads and writes the output once per FACTOR terms, and loads what the copies have in common
(``X[k,j]``) once. The terms of one update are
added together before the output: a float sum in another order (the same terms, the same blocks of
``tullax.compiler.blocking``), as a vectorised sum reorders its terms anyway.

Where the tile loop's range moves with r (a window narrowed by r: conv1d's input gradient
``Δx[b,m] := Δy[b,pad(m-k)]*w[k]`` sums over ``max(tile_lo, k) <= m < min(tile_hi, k + n)``), the FACTOR terms
are added together only over the part of the tile all of their ranges cover, ``lo = max(start_u)`` to
``hi = max(lo, min(stop_u))``; each term is added alone before ``lo`` and from ``hi`` on, within its own range
(when the common part is empty, ``hi = lo`` splits each range at ``lo``). Every element of every term's range is
updated exactly once per term, and in the interior tiles of a convolution the edges are empty.

Only the exact pattern is rewritten: a serial loop whose body is Lets and then one serial loop whose body is
Lets and one ``add`` Store, nothing else (no guard, no inner loop, no accumulator), where the update's
position does not depend on r; anything else is left as it was. A complex update is left as it was too: GCC
vectorises a tile loop adding one complex product per element (its real and imaginary parts interleaved), not
one adding four (the complex LRU scan's Δlam ran ~9x slower jammed, a scalar loop).
"""
from __future__ import annotations

from dataclasses import replace

from tullax.compiler.loops import COMPLEX, INDEX, Let, Loop, LoopKernel, Stmt, Store, Var, binop, const, expr_vars
from tullax.compiler.rewrite import substitute, substitute_stmts

FACTOR = 4  # terms per update of the tile: on Dist's gradient (host C) 4 and 8 ran alike, 2 and 1 slower


def jam_reductions(kernel: LoopKernel) -> LoopKernel:
    """``kernel`` with every loop of the pattern (module doc) unrolled by ``FACTOR`` and jammed."""
    return replace(kernel, body=_rewrite(kernel.body))


def _rewrite(stmts: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for stmt in stmts:
        if isinstance(stmt, Loop):
            if _jammable(stmt):
                out += _jammed(stmt)
            else:
                out.append(replace(stmt, body=_rewrite(stmt.body)))
        elif hasattr(stmt, "then"):  # an If: its branches
            out.append(replace(stmt, then=_rewrite(stmt.then), orelse=_rewrite(stmt.orelse)))
        else:
            out.append(stmt)
    return tuple(out)


def _jammable(loop: Loop) -> bool:
    if loop.parallel or loop.reduce_parallel or not loop.body:
        return False
    *lets, tile = loop.body
    if not isinstance(tile, Loop) or tile.parallel or tile.reduce_parallel or not tile.body:
        return False
    if not all(isinstance(s, Let) for s in lets):
        return False
    *tile_lets, update = tile.body
    if not (all(isinstance(s, Let) for s in tile_lets) and isinstance(update, Store) and update.mode == "add"):
        return False
    if update.value.dtype in COMPLEX:  # one complex product per element vectorises, four do not (module doc)
        return False
    # the update's position may not move with r (the tile's range may: ``_ranged``)
    varying = {loop.var} | {s.var for s in (*lets, *tile_lets)}
    return not any(expr_vars(e) & varying for e in update.index)


def _jammed(loop: Loop) -> list[Stmt]:
    *lets, tile = loop.body
    *tile_lets, update = tile.body
    assert isinstance(tile, Loop) and isinstance(update, Store)
    r, start = loop.var, loop.start
    quads = binop("//", binop("max", binop("-", loop.stop, start), const(0)), const(FACTOR))  # empty: none
    q = f"{r}_q"
    assigned = {s.var: s.value.dtype for s in (*lets, *tile_lets) if isinstance(s, Let)}
    outer: list[Stmt] = []
    copies, ranges = [], []  # per term: the tile's body, and the tile's range
    for u in range(FACTOR):
        values = {name: Var(f"{name}_u{u}", dtype) for name, dtype in assigned.items()}  # renamed copies
        values[r] = binop("+", start, binop("+", binop("*", Var(q, INDEX), const(FACTOR)), const(u)))
        outer += substitute_stmts(tuple(lets), values)
        copies.append(substitute_stmts(tuple(tile_lets) + (update,), values))
        ranges.append((substitute(tile.start, values), substitute(tile.stop, values)))
    value = copies[0][-1].value
    for copy in copies[1:]:
        value = binop("+", value, copy[-1].value)
    inner = tuple(stmt for copy in copies for stmt in copy[:-1])
    jammed_tile = replace(tile, body=inner + (replace(update, value=value),))
    if (expr_vars(tile.start) | expr_vars(tile.stop)) & ({r} | {s.var for s in lets}):
        outer += _ranged(tile, jammed_tile, q, ranges, copies)
    else:
        outer.append(jammed_tile)
    main = Loop(q, const(0), quads, False, tuple(outer))
    rest = replace(loop, start=binop("+", start, binop("*", quads, const(FACTOR))))
    return [main, rest]


def _ranged(tile: Loop, jammed_tile: Loop, q: str, ranges: list[tuple], copies: list[tuple]) -> list[Stmt]:
    """The tile's statements of one quad whose tile range moves with r (module doc): the FACTOR terms together
    over the range they share, each term alone (``copies[u]``, over ``ranges[u]``) over the rest of its own."""
    lo, hi = Var(f"{q}_lo", INDEX), Var(f"{q}_hi", INDEX)
    shared_start, shared_stop = ranges[0]
    for start_u, stop_u in ranges[1:]:
        shared_start, shared_stop = binop("max", shared_start, start_u), binop("min", shared_stop, stop_u)
    before = [replace(tile, start=start_u, stop=binop("min", stop_u, lo), body=copy)
              for (start_u, stop_u), copy in zip(ranges, copies)]
    after = [replace(tile, start=binop("max", start_u, hi), stop=stop_u, body=copy)
             for (start_u, stop_u), copy in zip(ranges, copies)]
    return [Let(lo.name, shared_start), Let(hi.name, binop("max", lo, shared_stop)), *before,
            replace(jammed_tile, start=lo, stop=hi), *after]


__all__ = ["jam_reductions", "FACTOR"]
