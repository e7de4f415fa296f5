"""Register tiles: unroll-and-jam of a parallel loop, so each iteration computes several outputs and shares the
loads and calls that do not depend on that loop's index (``Schedule.register``, decided in ``schedule``).

A parallel loop ``for p in start:stop`` of the kernel's parallel nest becomes, in its place, a parallel loop
over tiles of ``factor`` values of p. The body of the innermost parallel loop becomes::

    p_r0 = start + p_rt * factor
    if p_r0 + factor <= stop:          # a whole tile
        <the body for p = p_r0, p_r0 + 1, ..., jammed>
    else:                              # the ragged last tile
        for p in p_r0:min(p_r0 + factor, stop): <the body>

Two loops are tiled together (a 2x2 tile: ``i_r0``, ``j_r0``; the condition holds both whole): the copies are
every combination of their values (``acc_0_1``: i = i_r0, j = j_r0 + 1), the ragged tile loops over both
ranges. Tiling them one after the other would jam the first loop's ragged tile again (9 copies of the body
for 4 outputs, and Numba compiles each).

Jammed: every statement whose value depends on p (through the variables it reads, transitively) is repeated
once per copy with its names renamed (``acc`` -> ``acc_0``, ``acc_1`` ...), inside the same loops and guards;
statements that do not depend on p (hoisted loads, an ``exp`` of other indices, loop headers) stay once. Each
copy keeps its own order of operations, so every output is bitwise what the untiled kernel computes. Loops
and guards must not depend on p (else the loop is not tiled).

With literal cases (``RegisterTile.literal``: the body compares p with the literals ``start .. start +
factor - 1``, the Kronecker deltas of a gradient w.r.t. a coordinate), the first tile substitutes the
literals for p and folds (``tullax.compiler.rewrite``): each case keeps only its own terms. Every other tile
(p beyond the cases) runs the plain body.

With a length condition (``RegisterTile.min_trips``: the row streams of a max/min reduction, which pay only on
long rows), the whole tile also needs the innermost loop of the body to run that many iterations; shorter rows
take the ragged branch, one by one, as the untiled kernel runs them.

A ``Scratch`` array (a tile's float64 totals) is declared once, as many times longer as there are copies,
before the ``if``: copy u (in the ragged tile, the iteration at p_r0 + u) uses segment u. Numba's prange
miscomputes (even corrupts memory) with a Scratch declared in both branches of an ``if``; one declaration
avoids that.

A row ``Buffer`` (a fused program's per-row array, ``tullax.compiler.fuse``) declared at the top of the body is
treated the same way: declared once, ``factor`` times longer (its length an expression), copy u in segment u.

After jamming, calls and larger expressions evaluated twice in one block are computed once
(``rewrite.share_subexpressions``).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Sequence

from tullax.compiler.loops import (
    INDEX,
    Accum,
    Buffer,
    Const,
    Expr,
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
    conjunction,
    const,
    parallel_nest,
    statement_expressions,
    walk_expr,
    walk_stmts,
)
from tullax.compiler.rewrite import drop_dead_lets, substitute_stmts


@dataclass(frozen=True)
class RegisterTile:
    index: str  # the spec index whose parallel loop is tiled
    factor: int  # outputs per tile along it
    literal: bool = False  # the first tile substitutes the literals start .. start + factor - 1
    min_trips: int = 0  # jammed only where the innermost loop of the body runs this many iterations (else ragged)


def _reads(expr: Expr) -> set[str]:
    names: set[str] = set()
    for node in walk_expr(expr):
        if isinstance(node, Var):
            names.add(node.name)
        elif isinstance(node, Load):
            names.add(node.array)
    return names


def dependent(stmts: tuple[Stmt, ...], tiled: set[str]) -> set[str]:
    """The variables ``tiled`` and every local whose value depends on one: Lets, accumulators and scratch
    arrays (fixed point; the kernel's arrays are not locals: a store into the output depends on a tiled variable
    through its position). A value depends on what it reads, and on every guard and loop bound around its
    assignment: ``acc += A[i]`` under ``if (m == 1)`` reads no m, yet each copy of the tile needs its own ``acc``
    (one shared accumulator stored for every m put A[i] where m != 1 too)."""
    scratch = {s.var for s in walk_stmts(stmts) if isinstance(s, (Scratch, Buffer))}
    found = set(tiled)
    while True:
        before = len(found)
        _mark_dependent(stmts, found, scratch, False)
        if len(found) == before:
            return found


def _mark_dependent(stmts: tuple[Stmt, ...], found: set[str], scratch: set[str], guarded: bool) -> None:
    """Add to ``found`` what ``stmts`` assign from it, or assign at all where ``guarded`` (under a guard or loop
    bound that reads it)."""
    for stmt in stmts:
        if isinstance(stmt, (Let, Accum)):
            if guarded or _reads(stmt.value) & found:
                found.add(stmt.var)
        elif isinstance(stmt, Store):
            if stmt.array in scratch and (guarded or any(_reads(e) & found for e in stmt.index + (stmt.value,))):
                found.add(stmt.array)
        elif isinstance(stmt, If):
            inner = guarded or bool(_reads(stmt.cond) & found)
            _mark_dependent(stmt.then, found, scratch, inner)
            _mark_dependent(stmt.orelse, found, scratch, inner)
        elif isinstance(stmt, Loop):
            bounds = _reads(stmt.start) | _reads(stmt.stop)
            _mark_dependent(stmt.body, found, scratch, guarded or bool(bounds & found))


class _NotJammable(Exception):
    """A loop bound that depends on the tiled index, or a guard around a loop that does."""


def _copies(stmt: Stmt, renames: list[dict[str, Expr]]) -> list[Stmt]:
    return [s for values in renames for s in substitute_stmts((stmt,), values)]


def _jam(stmts: tuple[Stmt, ...], dep: set[str], renames: list[dict[str, Expr]]) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for stmt in stmts:
        if isinstance(stmt, Loop):
            if (_reads(stmt.start) | _reads(stmt.stop)) & dep:
                raise _NotJammable()
            out.append(replace(stmt, body=_jam(stmt.body, dep, renames)))
        elif isinstance(stmt, If):
            if not _reads(stmt.cond) & dep:
                out.append(replace(stmt, then=_jam(stmt.then, dep, renames), orelse=_jam(stmt.orelse, dep, renames)))
            elif any(isinstance(s, (Loop, Scratch)) for s in walk_stmts(stmt.then + stmt.orelse)):
                raise _NotJammable()
            else:  # a guard on p around straight-line code: one guarded copy per value of p
                out += _copies(stmt, renames)
        elif isinstance(stmt, (Let, Accum)):
            out += _copies(stmt, renames) if stmt.var in dep else [stmt]
        else:
            assert isinstance(stmt, Store), stmt
            depends = stmt.array in dep or any(_reads(e) & dep for e in statement_expressions(stmt))
            out += _copies(stmt, renames) if depends else [stmt]
    return tuple(out)


def register_tiles(kernel: LoopKernel, tiles: Sequence[tuple[str, RegisterTile]]) -> LoopKernel:
    """``kernel`` with its parallel loops over the generated loop variables of ``tiles`` tiled together, each by
    its factor (see the module doc): the copies are every combination (a 2x2 tile: four), the ragged tile runs
    the plain body over the tile's ranges. Unchanged when a loop cannot be jammed."""
    loops, body = parallel_nest(kernel)
    by_var = {loop.var: loop for loop in loops}
    tiles = [(var, tile) for var, tile in tiles if var in by_var and tile.factor >= 2 and (
        not tile.literal or isinstance(by_var[var].start, Const))]
    if not tiles:
        return kernel
    scratch = {s.var: (s.length, s.dtype) for s in walk_stmts(body) if isinstance(s, Scratch)}
    if any(isinstance(s, Loop) and any(isinstance(t, Scratch) for t in walk_stmts(s.body)) for s in walk_stmts(body)):
        return kernel  # declared anew in each iteration of a loop: not one segment per copy
    buffers = {s.var: s for s in body if isinstance(s, Buffer)}
    if len(buffers) != sum(isinstance(s, Buffer) for s in walk_stmts(body)):
        return kernel  # a row buffer declared below the top of the body
    tiled = {var for var, _ in tiles}
    long_enough = _long_enough(body, max(tile.min_trips for _, tile in tiles))
    if long_enough is None:
        return kernel
    dep = dependent(body, tiled)
    lows = {var: Var(f"{var}_r0", INDEX) for var in tiled}
    per_var: list[list[Expr]] = []
    whole: list[Expr] = []
    for var, tile in tiles:
        target, factor = by_var[var], tile.factor
        if tile.literal:
            per_var.append([Const(target.start.value + u, INDEX) for u in range(factor)])
            whole += [binop("==", Var(f"{var}_rt", INDEX), const(0)),
                      binop("<=", const(target.start.value + factor), target.stop)]
        else:
            per_var.append([binop("+", lows[var], const(u)) for u in range(factor)])
            whole.append(binop("<=", binop("+", lows[var], const(factor)), target.stop))
    copies = list(itertools.product(*(range(len(values)) for values in per_var)))
    renames: list[dict[str, Expr]] = []
    taken = {s.var for s in walk_stmts(body) if isinstance(s, (Let, Accum, Loop, Scratch, Buffer))}
    for number, combo in enumerate(copies):
        suffix = "_".join(str(u) for u in combo)
        values: dict[str, Expr] = {
            name: const(number * scratch[name][0]) if name in scratch else _typed(body, name, suffix, taken)
            for name in sorted(dep - tiled - set(buffers))}
        values.update({name: binop("*", const(number), buffers[name].length) if number else const(0)
                       for name in dep & set(buffers)})
        values.update({var: per_var[k][u] for k, ((var, _), u) in enumerate(zip(tiles, combo))})
        renames.append(values)
    declared = _declared(body, tuple(Scratch(name, length * len(copies), dtype)
                                     for name, (length, dtype) in scratch.items()))
    body = tuple(s for s in _without_scratch(body) if not isinstance(s, Buffer))
    try:
        jammed = drop_dead_lets(_jam(body, dep, renames))
    except _NotJammable:
        return kernel
    ragged = substitute_stmts(body, {name: binop("*", _copy_number(tiles, lows), const(length))
                                     for name, (length, _) in scratch.items()})
    ragged = substitute_stmts(ragged, {name: binop("*", _copy_number(tiles, lows), buffers[name].length)
                                       for name in dep & set(buffers)})
    for var, tile in reversed(tiles):
        stop = binop("min", binop("+", lows[var], const(tile.factor)), by_var[var].stop)
        ragged = (Loop(var, lows[var], stop, False, ragged),)
    tiled_body: tuple[Stmt, ...] = tuple(
        Let(lows[var].name, binop("+", by_var[var].start, binop("*", Var(f"{var}_rt", INDEX), const(tile.factor))))
        for var, tile in tiles)
    tiled_body += declared
    tiled_body += tuple(replace(b, length=binop("*", b.length, const(len(copies)))) if name in dep else b
                        for name, b in buffers.items())
    tiled_body += (If(conjunction(whole + long_enough), jammed, ragged),)
    factors = dict(tiles)
    nest: tuple[Stmt, ...] = tiled_body
    for loop in reversed(loops):  # a loop over tiles where a tiled loop was: the same traversal order
        if loop.var in factors:
            factor = factors[loop.var].factor
            count = binop("//", binop("+", binop("-", loop.stop, loop.start), const(factor - 1)), const(factor))
            nest = (Loop(f"{loop.var}_rt", const(0), count, True, nest),)
        else:
            nest = (replace(loop, body=nest),)
    return replace(kernel, body=nest)


def _long_enough(body: tuple[Stmt, ...], trips: int) -> list[Expr] | None:
    """The condition that the innermost loop of ``body`` (the first loop with none inside) runs at least ``trips``
    iterations (empty when it always does), or None when it never does or its bounds read a local of the body
    (the condition stands before it)."""
    if not trips:
        return []
    loop = next((s for s in walk_stmts(body) if isinstance(s, Loop)
                 and not any(isinstance(t, Loop) for t in walk_stmts(s.body))), None)
    if loop is None:
        return None
    bound = {s.var for s in walk_stmts(body) if isinstance(s, (Let, Accum, Loop))}
    if (_reads(loop.start) | _reads(loop.stop)) & bound:
        return None
    extent = binop("-", loop.stop, loop.start)
    if isinstance(extent, Const):
        return [] if extent.value >= trips else None
    return [binop(">=", extent, const(trips))]


def _copy_number(tiles: Sequence[tuple[str, RegisterTile]], lows: dict[str, Var]) -> Expr:
    """The number of the copy an iteration of the ragged tile is (row-major over the tiles' offsets): its
    segment of a Scratch array."""
    number: Expr = const(0)
    for var, tile in tiles:
        number = binop("+", binop("*", number, const(tile.factor)), binop("-", Var(var, INDEX), lows[var]))
    return number


def _declared(body: tuple[Stmt, ...], scratch: tuple[Scratch, ...]) -> tuple[Stmt, ...]:
    """The declarations of ``scratch`` before the tile, under the guard they had where ``body`` declares them all
    in one ``if (flag)`` on a flag bound before it from values outside the body (a strip-mined kernel's float64
    totals, only for long sums): a Scratch is zeroed where it is declared, and the tile's many copies cost a
    memset per tile otherwise."""
    lets = {s.var: s for s in body if isinstance(s, Let)}
    bound = {s.var for s in walk_stmts(body) if isinstance(s, (Let, Accum, Loop))}
    names = {s.var for s in scratch}
    for stmt in body:
        if isinstance(stmt, If) and isinstance(stmt.cond, Var) and stmt.cond.name in lets and not (
                _reads(lets[stmt.cond.name].value) & bound) and names <= {
                s.var for s in stmt.then if isinstance(s, Scratch)}:
            return (lets[stmt.cond.name], If(stmt.cond, scratch))
    return scratch


def _without_scratch(stmts: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    """``stmts`` without their Scratch declarations (and guards left empty by that)."""
    out: list[Stmt] = []
    for stmt in stmts:
        if isinstance(stmt, Scratch):
            continue
        if isinstance(stmt, If):
            stmt = replace(stmt, then=_without_scratch(stmt.then), orelse=_without_scratch(stmt.orelse))
            if not stmt.then and not stmt.orelse:
                continue
        out.append(stmt)
    return tuple(out)


def _typed(body: tuple[Stmt, ...], name: str, copy: str, taken: set[str]) -> Var:
    """The renamed variable of copy ``copy`` with the dtype of ``name`` (a Let's value), a name not in ``taken``
    (a body tiled before has ``acc_2_1`` already: ``acc_2``'s copy 1 is then ``acc_2_1_``); added to it."""
    for stmt in walk_stmts(body):
        if isinstance(stmt, Let) and stmt.var == name:
            fresh = f"{name}_{copy}"
            while fresh in taken:
                fresh += "_"
            taken.add(fresh)
            return Var(fresh, stmt.value.dtype)
    raise AssertionError(f"internal error: no definition of {name}")


__all__ = ["RegisterTile", "dependent", "register_tiles"]
