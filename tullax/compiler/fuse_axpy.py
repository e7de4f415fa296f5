"""A fused row's contractions scheduled for the row (issue 50, ``tullax.compiler.fuse``): ``row_axpy`` and
``row_tiles``.

A fused row's contraction turned inside out (issue 50, ``tullax.compiler.fuse``): ``o[r.., e] := p[r.., j] *
v[b, j, e]`` per row runs ``for j: for e: o[e] += p[j] * v[j, e]`` instead of ``for e: for j: acc += ...``.

Inside a fused row the output's other index ``e`` is a serial loop, and each of its elements sums over ``j`` with
a read of ``v`` that strides along ``j`` (attention's values, a row times a matrix). With ``j`` outside, the
inner loop reads ``v`` and writes the output row along their unit-stride axis, which the C compiler vectorises;
each element adds its terms in the order of ``j``, unblocked, ``tullax.compiler.reduction_jam``'s four at a time
(the output row read and written once per four terms). Taken only where some read moves along ``e``'s axis and
none strides along it, and ``j``'s bounds do not depend on ``e``.

A row's contraction along the unit-stride axis of both its reads (attention's scores ``s[b,i,j] := q[b,i,d] *
k[b,j,d]``: per row a dot product for each ``j``) is register-tiled over ``j`` instead (``tullax.compiler.jam``):
four dot products at a time share the row's loads of ``q`` and their vector sums' folds, each bitwise what it was.
"""
from __future__ import annotations

from dataclasses import replace

from tullax.compiler.loops import (
    Accum,
    Const,
    Let,
    Load,
    Loop,
    LoopKernel,
    Stmt,
    Store,
    Var,
    expr_vars,
    expressions,
    parallel_nest,
    walk_expr,
    walk_stmts,
)
from tullax.compiler.reduction_jam import jam_reductions


def row_axpy(kernel: LoopKernel, rows: int, jam: bool = True) -> tuple[Stmt, ...] | None:
    """The per-row work of ``kernel`` (lowered without blocked sums or register tiles; its parallel nest the
    ``rows`` row loops and one more, ``e``) with its sum's loop outside ``e``'s, or None where it does not apply:
    the output row cleared, then ``for j: for e: out[.., e] += term``. ``jam=False``: a term per pass over the row
    (where the row stays in registers across j, ``tullax.compiler.strips``: a multiply-add per term)."""
    loops, inner = parallel_nest(kernel)
    if len(loops) != rows + 1 or len(inner) != 3:
        return None
    e, (start, loop, store) = loops[-1], inner
    out = kernel.arrays[0]
    if not (isinstance(start, Let) and start.value == Const(0.0, out.dtype) and isinstance(loop, Loop)
            and not loop.parallel and not loop.reduce_parallel and isinstance(store, Store) and store.mode == "set"
            and store.array == out.name and store.value == Var(start.var, out.dtype) and store.index
            and store.index[-1] == Var(e.var, "int64") and loop.body and isinstance(loop.body[-1], Accum)):
        return None
    *lets, accum = loop.body
    if not (all(isinstance(s, Let) for s in lets) and accum.var == start.var and accum.op == "+"
            and e.var not in expr_vars(loop.start) | expr_vars(loop.stop)):
        return None
    moving = {e.var}  # e, and the lets that depend on it
    for let in lets:
        if expr_vars(let.value) & moving:
            moving.add(let.var)
    loads = [node for s in (*lets, accum) for node in walk_expr(s.value) if isinstance(node, Load)]
    if any(moving & expr_vars(i) for load in loads for i in load.index[:-1]):
        return None  # a read striding along e
    if not any(load.index[-1] == Var(e.var, "int64") for load in loads):
        return None  # nothing moves along e's axis: the plain order is as good
    clear = replace(e, parallel=False, body=(Store(out.name, store.index, Const(0.0, out.dtype)),))
    add = replace(e, parallel=False, body=(*(s for s in lets if s.var in moving),
                                           Store(out.name, store.index, accum.value, "add")))
    swapped = (clear, replace(loop, body=(*(s for s in lets if s.var not in moving), add)))
    return jam_reductions(replace(kernel, body=swapped)).body if jam else swapped if jam else swapped


TILE = 4  # dot products of a row at a time: their vector sum lanes fill the registers the printers vectorise into


def row_tiles(kernel: LoopKernel, rows: int) -> LoopKernel | None:
    """``kernel`` (its parallel nest the ``rows`` row loops and one more, ``j``, whose body sums) with ``j``
    register-tiled, or None where no read of its sum is shared by the tile's copies (nothing to gain) or the
    tiling does not apply."""
    from tullax.compiler.jam import RegisterTile, register_tiles

    loops, inner = parallel_nest(kernel)
    if len(loops) != rows + 1:
        return None
    j = loops[-1].var
    sums = [s for s in walk_stmts(inner) if isinstance(s, Loop)]
    loads = [node for s in sums for e in expressions(s.body) for node in walk_expr(e) if isinstance(node, Load)]
    if not sums or not any(j not in set().union(*map(expr_vars, load.index)) for load in loads):
        return None
    tiled = register_tiles(kernel, [(j, RegisterTile(j, TILE))])
    return None if tiled is kernel else tiled

