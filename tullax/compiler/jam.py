"""Register tiles: unroll-and-jam of a parallel loop, so each iteration computes several outputs and shares the
loads and calls that do not depend on that loop's index (``Schedule.register``, decided in ``schedule``).

A parallel loop ``for p in start:stop`` of the kernel's parallel nest becomes, in its place, a parallel loop
over tiles of ``factor`` values of p. The body of the innermost parallel loop becomes::

    p_r0 = start + p_rt * factor
    if p_r0 + factor <= stop:          # a whole tile
        <the body for p = p_r0, p_r0 + 1, ..., jammed>
    else:                              # the ragged last tile
        for p in p_r0:min(p_r0 + factor, stop): <the body>

Jammed: every statement whose value depends on p (through the variables it reads, transitively) is repeated
once per copy with its names renamed (``acc`` -> ``acc_0``, ``acc_1`` ...), inside the same loops and guards;
statements that do not depend on p (hoisted loads, an ``exp`` of other indices, loop headers) stay once. Each
copy keeps its own order of operations, so every output is bitwise what the untiled kernel computes. Loops
and guards must not depend on p (else the loop is not tiled).

With literal cases (``RegisterTile.literal``: the body compares p with the literals ``start .. start +
factor - 1``, the Kronecker deltas of a gradient w.r.t. a coordinate), the first tile substitutes the
literals for p and folds (``tullax.compiler.rewrite``): each case keeps only its own terms. Every other tile
(p beyond the cases) runs the plain body.

A ``Scratch`` array (a tile's float64 totals) is declared once, ``factor`` times longer, before the ``if``:
copy u (in the ragged tile, the iteration at p_r0 + u) uses segment u. Numba's prange miscomputes (even
corrupts memory) with a Scratch declared in both branches of an ``if``; one declaration avoids that.

After jamming, calls evaluated twice in one block are computed once (``rewrite.share_calls``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from tullax.compiler.loops import (
    INDEX,
    Accum,
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


def _reads(expr: Expr) -> set[str]:
    names: set[str] = set()
    for node in walk_expr(expr):
        if isinstance(node, Var):
            names.add(node.name)
        elif isinstance(node, Load):
            names.add(node.array)
    return names


def dependent(stmts: tuple[Stmt, ...], var: str) -> set[str]:
    """``var`` and every local whose value depends on it: Lets, accumulators and scratch arrays (fixed point;
    the kernel's arrays are not locals: a store into the output depends on ``var`` through its position)."""
    scratch = {s.var for s in walk_stmts(stmts) if isinstance(s, Scratch)}
    found = {var}
    while True:
        before = len(found)
        for stmt in walk_stmts(stmts):
            if isinstance(stmt, (Let, Accum)) and _reads(stmt.value) & found:
                found.add(stmt.var)
            elif isinstance(stmt, Store) and stmt.array in scratch and any(
                    _reads(e) & found for e in stmt.index + (stmt.value,)):
                found.add(stmt.array)
        if len(found) == before:
            return found


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


def register_tile(kernel: LoopKernel, var: str, tile: RegisterTile) -> LoopKernel:
    """``kernel`` with its parallel loop over ``var`` (a generated loop variable) tiled by ``tile.factor``
    outputs per iteration (see the module doc); unchanged when that loop cannot be jammed."""
    loops, body = parallel_nest(kernel)
    target = next((loop for loop in loops if loop.var == var), None)
    if target is None or tile.factor < 2:
        return kernel
    if tile.literal and not isinstance(target.start, Const):
        return kernel
    dep = dependent(body, var)
    lo_name, tile_var = f"{var}_r0", f"{var}_rt"
    lo = Var(lo_name, INDEX)
    factor = tile.factor
    if tile.literal:
        values = [Const(target.start.value + u, INDEX) for u in range(factor)]
        whole = binop("and", binop("==", Var(tile_var, INDEX), const(0)),
                      binop("<=", const(target.start.value + factor), target.stop))
    else:
        values = [binop("+", lo, const(u)) for u in range(factor)]
        whole = binop("<=", binop("+", lo, const(factor)), target.stop)
    renames: list[dict[str, Expr]] = []
    scratch = {s.var: (s.length, s.dtype) for s in walk_stmts(body) if isinstance(s, Scratch)}
    if any(isinstance(s, Loop) and any(isinstance(t, Scratch) for t in walk_stmts(s.body)) for s in walk_stmts(body)):
        return kernel  # declared anew in each iteration of a loop: not one segment per copy
    for u in range(factor):
        renames.append({name: const(u * scratch[name][0]) if name in scratch else _typed(body, name, u)
                        for name in dep if name != var})
        renames[u][var] = values[u]
    declared = tuple(Scratch(name, length * factor, dtype) for name, (length, dtype) in scratch.items())
    body = _without_scratch(body)
    try:
        jammed = drop_dead_lets(_jam(body, dep, renames))
    except _NotJammable:
        return kernel
    segment = {name: binop("*", binop("-", Var(var, INDEX), lo), const(length))
               for name, (length, _) in scratch.items()}
    ragged = Loop(var, lo, binop("min", binop("+", lo, const(factor)), target.stop), False,
                  substitute_stmts(body, segment))
    tiled_body: tuple[Stmt, ...] = (
        Let(lo_name, binop("+", target.start, binop("*", Var(tile_var, INDEX), const(factor)))),
        *declared,
        If(whole, jammed, (ragged,)),
    )
    extent = binop("-", target.stop, target.start)
    count = binop("//", binop("+", extent, const(factor - 1)), const(factor))
    nest: tuple[Stmt, ...] = tiled_body
    for loop in reversed(loops):  # the loop over tiles where the tiled loop was: the same traversal order
        nest = (Loop(tile_var, const(0), count, True, nest) if loop is target else replace(loop, body=nest),)
    return replace(kernel, body=nest)


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


def _typed(body: tuple[Stmt, ...], name: str, copy: int) -> Var:
    """The renamed variable of copy ``copy`` with the dtype of ``name`` (a Let's value)."""
    for stmt in walk_stmts(body):
        if isinstance(stmt, Let) and stmt.var == name:
            return Var(f"{name}_{copy}", stmt.value.dtype)
    raise AssertionError(f"internal error: no definition of {name}")


__all__ = ["RegisterTile", "dependent", "register_tile"]
