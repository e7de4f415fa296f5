"""Lower a recurrence (a spec with a ``(t scan)`` clause, ``tullax.spec.scan``) to one loop kernel.

The spec's unrolled form (self-reads as reads of the trajectory h̃) is lowered as any spec, plainly (no
tiles, no register tiles: they would compute several positions of ``t`` at once), and its loop nest is then
rearranged:

* the lanes (free indices a self-read keeps at the result's own index) stay parallel, outermost;
* ``t`` runs sequentially inside them (reverse: downwards), so each thread walks its lanes' whole sequence;
* the other free indices (those the state mixes along, ``W[n,m]*h[b,t-1,m]``) run sequentially inside ``t``:
  every position of step t is written before step t+1 reads it.

The output array holds the state: a read of h̃ at a position along ``t`` inside the result reads the result
already written there; one before the start (after the end, reverse) reads the initial state, or 0.

A reverse scan whose contiguous row runs inside ``t`` walks memory downwards from row to row. Each row, walked
upwards, looks like an ascending stream to the hardware prefetchers, which then fetch the lines after it: the row
just done. Where a row spans ``DESCENDING_ROW_BYTES`` or more, the row is walked a cache line at a time from its
top line down (each line's elements upwards, as one vector loop), so the lines come in one descending stream
(the complex LRU's adjoint, 512-byte rows: about half the time of the ascending rows); shorter rows keep the
plain loop (there the chunks cost more than they save).
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from tullax.compiler.loops import (
    INDEX,
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
    cast,
    children,
    expr_vars,
    parallel_nest,
    walk_stmts,
    with_children,
)
from tullax.errors import TullaxError
from tullax.spec.ir import Affine, Spec, accesses
from tullax.spec.scan import TRAJECTORY, unrolled

if TYPE_CHECKING:
    from tullax.spec.signature import Signature


def lower_scan(spec: Spec, signature: Signature, lower, name: str = "kernel", contiguous: bool = False) -> LoopKernel:
    """The one loop kernel of the recurrence ``spec`` (``spec.scan`` set) for ``signature``. ``contiguous``
    (CPU printers): the last axis of the result, when it is a lane and another lane stays parallel, runs inside
    ``t`` too, so each step is a contiguous row that vectorises, rather than one lane per thread walking ``t``
    with a stride. ``lower`` is ``compiler.lower.lower`` (passed in: that module imports this one)."""

    scan = spec.scan
    flat = unrolled(spec)
    init_at = spec.input_names.index(scan.init) if scan.init is not None else None
    in_dtypes = signature.in_dtypes + (signature.out_dtype,)
    kernel = lower(flat, replace(signature, in_dtypes=in_dtypes), name, tile=False, share=False)
    trajectory = next(a for a in kernel.arrays if a.source == TRAJECTORY)
    init = None
    arrays = tuple(a for a in kernel.arrays if a.source != TRAJECTORY)
    if scan.init is not None:
        init = replace(trajectory, name=f"a{len(arrays)}", source=scan.init,
                       rank=len(spec.lhs) - (1 if scan.depth == 1 else 0),
                       dtype=signature.in_dtypes[init_at])
        arrays += (init,)
    out = kernel.output
    loops, inner = parallel_nest(kernel)
    store = next((s for s in walk_stmts(inner) if isinstance(s, Store) and s.array == out.name), None)
    if store is None or not isinstance(store.index[scan.axis], Var):
        raise TullaxError(f"internal error: the scan kernel of {kernel.spec_text} stores no plain position")
    var_of = [ix.name if isinstance(ix, Var) else None for ix in store.index]
    t_var = var_of[scan.axis]
    mixing = _mixing(spec, var_of)
    lanes = [v for v in var_of if v is not None and v != t_var and v not in mixing]
    row = None  # the contiguous row that runs inside t
    if contiguous and len(lanes) > 1 and var_of[-1] in lanes:
        mixing.add(var_of[-1])
        row = var_of[-1]
    by_var = {loop.var: loop for loop in loops}
    if set(by_var) != set(v for v in var_of if v is not None) or any(
            expr_vars(loop.start) | expr_vars(loop.stop) & set(by_var) for loop in loops):
        raise TullaxError(f"internal error: the free loops of the scan kernel of {kernel.spec_text} are not a "
                          f"plain nest")
    t_loop = by_var[t_var]
    stop = t_loop.stop
    step = _swap_reads(inner, trajectory.name, out, init, scan, t_var, stop)

    def walk(lines: bool) -> tuple[Stmt, ...]:
        """The t loop around the step's nest; ``lines``: its row by descending lines (``descending_lines``)."""
        body = step
        for loop in reversed([by_var[v] for v in var_of if v in mixing]):
            body = (replace(loop, parallel=False, body=body),)
            if lines and loop.var == row:
                body = descending_lines(body[0], out.dtype)
        if scan.reverse:  # t = start + stop - 1 - u, for u running upwards
            u = t_var + "r"
            top = binop("-", binop("+", t_loop.start, stop), Const(1, INDEX))
            body = (Let(t_var, binop("-", top, Var(u, INDEX))),) + body
            return (Loop(u, t_loop.start, stop, False, body),)
        return (replace(t_loop, parallel=False, body=body),)

    body = walk(False)
    if scan.reverse and row is not None:  # a long row by descending lines, a short one as it was
        body = (If(long_row(by_var[row], out.dtype), walk(True), body),)
    for loop in reversed([loop for loop in loops if loop.var != t_var and loop.var not in mixing]):
        body = (replace(loop, body=body),)
    return replace(kernel, arrays=arrays, body=body)


LINE_BYTES = 64  # a cache line
DESCENDING_ROW_BYTES = 512  # rows from this long are walked line by line downwards (module doc)
_ITEM_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "complex64": 8, "complex128": 16}


def descending_lines(loop: Loop, dtype: str) -> tuple[Stmt, ...]:
    """The row loop ``loop`` (independent iterations over ``dtype`` elements) as its cache lines from the top one
    down, each line's iterations upwards."""
    width = Const(max(1, LINE_BYTES // _ITEM_BYTES.get(dtype, 8)), INDEX)
    count = binop("//", binop("+", binop("-", loop.stop, loop.start), binop("-", width, Const(1, INDEX))), width)
    lo = Var(loop.var + "lo", INDEX)
    chunk = loop.var + "c"
    top = binop("-", binop("-", count, Const(1, INDEX)), Var(chunk, INDEX))
    line = Loop(loop.var, lo, binop("min", binop("+", lo, width), loop.stop), False, loop.body)
    return (Loop(chunk, Const(0, INDEX), count, False,
                 (Let(lo.name, binop("+", loop.start, binop("*", top, width))), line)),)


def long_row(loop: Loop, dtype: str) -> Expr:
    """Whether the row loop ``loop`` over ``dtype`` elements spans ``DESCENDING_ROW_BYTES`` or more."""
    extent = binop("*", binop("-", loop.stop, loop.start), Const(_ITEM_BYTES.get(dtype, 8), INDEX))
    return binop(">=", extent, Const(DESCENDING_ROW_BYTES, INDEX))


def _mixing(spec: Spec, var_of: list[str | None]) -> set[str]:
    """The loop variables of the free indices the state mixes along: a self-read reads another position there."""
    mixing = set()
    for acc in accesses(spec.body):
        for axis, idx in enumerate(acc.idx if acc.array == spec.out else ()):
            if axis != spec.scan.axis and not (isinstance(idx, Affine) and idx.plain == spec.lhs[axis].plain):
                mixing.add(var_of[axis])
    return mixing


def _swap_reads(stmts: tuple[Stmt, ...], trajectory: str, out, init, scan, t_var: str,
                stop: Expr) -> tuple[Stmt, ...]:
    """Reads of the trajectory as reads of the result (inside it) or of the initial state (before it)."""

    def fix(expr: Expr) -> Expr:
        if isinstance(expr, Load) and expr.array == trajectory:
            index = tuple(fix(i) for i in expr.index)
            pos = index[scan.axis]
            if scan.reverse:  # h̃ = [h, h0]: position p is h[p] below T, else h0[p - T]
                inside = binop("<", pos, stop)
                here = pos
                before = binop("-", pos, stop)
            else:  # h̃ = [h0, h]: position p is h[p - d] from d on, else h0[p]
                inside = binop(">=", pos, Const(scan.depth, INDEX))
                here = binop("-", pos, Const(scan.depth, INDEX))
                before = pos
            rest = index[:scan.axis] + index[scan.axis + 1:]
            mine = Load(out.name, index[:scan.axis] + (here,) + index[scan.axis + 1:], expr.dtype)
            if init is None:
                start: Expr = Const(0, expr.dtype) if expr.dtype == INDEX else cast(Const(0.0, "float64"),
                                                                                     expr.dtype)
            else:
                where = rest if scan.depth == 1 else (before,) + rest
                start = cast(Load(init.name, where, init.dtype), expr.dtype)
            return Select(inside, mine, start, expr.dtype)
        return rebuild_expression(expr, fix)

    return tuple(map_statement_expressions(s, fix) for s in stmts)


def rebuild_expression(expr: Expr, fix) -> Expr:
    """``expr`` with ``fix`` applied to each of its children (itself where none changes)."""
    kids = children(expr)
    if not kids:
        return expr
    new = tuple(fix(k) for k in kids)
    return expr if new == kids else with_children(expr, new)


def map_statement_expressions(stmt: Stmt, fix) -> Stmt:
    """``stmt`` with ``fix`` applied to each expression in it, nested statements too."""
    from tullax.compiler.loops import Accum, Buffer, If, Scratch

    if isinstance(stmt, Loop):
        return replace(stmt, start=fix(stmt.start), stop=fix(stmt.stop),
                       body=tuple(map_statement_expressions(s, fix) for s in stmt.body))
    if isinstance(stmt, If):
        return replace(stmt, cond=fix(stmt.cond), then=tuple(map_statement_expressions(s, fix) for s in stmt.then),
                       orelse=tuple(map_statement_expressions(s, fix) for s in stmt.orelse))
    if isinstance(stmt, (Let, Accum)):
        return replace(stmt, value=fix(stmt.value))
    if isinstance(stmt, Store):
        return replace(stmt, index=tuple(fix(i) for i in stmt.index), value=fix(stmt.value))
    assert isinstance(stmt, (Scratch, Buffer))  # a row buffer: a scan program's step (compiler.scan_program)
    return stmt


__all__ = ["descending_lines", "long_row", "lower_scan", "map_statement_expressions", "rebuild_expression"]
