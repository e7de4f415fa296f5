"""The cooperative copy of a staged patch into shared memory (``tullax.compiler.window_tiles``): a box of an
array, ``widths[j]`` positions from ``corner[j]`` along each axis j, stored row-major in a shared array.

The patch is cut into rows (its leading axes) and columns (its trailing axes together, at least half a warp of
them: a convolution kernel's 3 x 3 window joins its channel axis). A warp copies 32 columns of one row; its
lanes start at the array's own 32-element group of the row's first element (the phase of that element's flat
position), so where the row's columns are contiguous in memory each warp request touches at most 4 sectors of
float32. Every lane loads (an address clamped into the array; 0 is stored for a position outside it, the zeros
of a ``pad``), so lanes stay in step; lanes outside the patch store nothing.

Also the two rewrites of the reduction's statements in a chunk: staged loads read from registers
(``staged_registers``), sums taken per chunk apart (``accumulate_apart``).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping

from tullax.compiler.loops import (
    INDEX,
    Accum,
    Const,
    Expr,
    If,
    Let,
    Load,
    Loop,
    Select,
    Stmt,
    Store,
    Var,
    binop,
    const,
    map_loads,
)
from tullax.compiler.tiles import zero

SEGMENT = 32  # a warp


def pitch(widths: tuple[int, ...]) -> tuple[int, ...]:
    """The shared array's layout of a patch: its widths, the last one padded to an odd count, so that rows of
    the patch start in different banks (a window's rows read by one warp: w + q, h + p)."""
    if len(widths) < 2 or widths[-1] % 2:
        return widths
    return widths[:-1] + (widths[-1] + 1,)


def patch_copy(load: Load, shared: str, widths: tuple[int, ...], corner: list[Expr], extents: list[Var],
               thread: Var, threads: int, prefix: str) -> Loop:
    """The loop by which ``threads`` threads (``thread`` each) copy the patch of ``load``'s array into
    ``shared`` (laid out as ``pitch(widths)``)."""
    dims = pitch(widths)
    coords: list[Expr] = [const(0)] * len(widths)
    seg = min(SEGMENT, threads)
    if threads % seg:  # every thread in exactly one group
        seg = math.gcd(SEGMENT, threads)
    groups = threads // seg
    rank = len(widths)
    j = rank - 1
    while j > 0 and 2 * math.prod(widths[j:]) <= seg:
        j -= 1
    cols, rows = math.prod(widths[j:]), math.prod(widths[:j])
    per_row = -(-(cols + seg - 1) // seg)  # segments per row, whatever the phase
    total = rows * per_row
    r, unit, lane, row = (Var(f"{prefix}{n}", INDEX) for n in ("r", "u", "l", "q"))
    at = binop("min", unit, const(total - 1))
    body: list[Stmt] = [
        Let(unit.name, binop("+", binop("*", r, const(groups)), binop("//", thread, const(seg)))),
        Let(lane.name, binop("mod", thread, const(seg))),
        Let(row.name, binop("//", at, const(per_row)))]
    index: list[Expr] = [const(0)] * rank
    for axis, coord in _decode(row, widths[:j], f"{prefix}x", body):
        index[axis] = binop("+", corner[axis], coord)
        coords[axis] = coord
    # the flat position of the row's first element, its phase in the array's 32-element groups
    start: Expr = const(0)
    for axis in range(rank):
        first = _clamp(index[axis], extents[axis]) if axis < j else corner[axis]
        start = binop("+", binop("*", start, extents[axis]), first) if axis else first
    phase, pos = Var(f"{prefix}ph", INDEX), Var(f"{prefix}p", INDEX)
    body += [Let(phase.name, binop("mod", start, const(seg))),
             Let(pos.name, binop("-", binop("+", binop("*", binop("mod", at, const(per_row)), const(seg)), lane),
                                 phase))]
    column = binop("min", binop("max", pos, const(0)), const(cols - 1))
    for n, (axis, coord) in enumerate(_decode(column, widths[j:], f"{prefix}y", body)):
        index[j + n] = binop("+", corner[j + n], coord)
        coords[j + n] = coord
    ok: Expr | None = None
    for axis in range(rank):
        e = Var(f"{prefix}i{axis}", INDEX)
        body.append(Let(e.name, index[axis]))
        index[axis] = e
        cond = binop("and", binop(">=", e, const(0)), binop("<", e, extents[axis]))
        ok = cond if ok is None else binop("and", ok, cond)
    assert ok is not None
    raw = Var(f"{prefix}v", load.dtype)
    body.append(Let(raw.name, Load(load.array, tuple(_clamp(e, n) for e, n in zip(index, extents)), load.dtype)))
    keep = binop("and", binop("<", unit, const(total)),
                 binop("and", binop(">=", pos, const(0)), binop("<", pos, const(cols))))
    value = Select(ok, raw, Const(0.0, load.dtype), load.dtype)
    at_shared: Expr = const(0)
    for coord, dim in zip(coords, dims):
        at_shared = binop("+", binop("*", at_shared, const(dim)), coord)
    body.append(If(keep, (Store(shared, (at_shared,), value),)))
    return Loop(r.name, const(0), const(-(-total // groups)), False, tuple(body))


def _decode(flat: Expr, widths: tuple[int, ...], name: str, body: list[Stmt]) -> list[tuple[int, Expr]]:
    """Row-major coordinates of ``flat`` in a box of ``widths`` (Lets appended to ``body``)."""
    out = []
    stride = 1
    for axis in reversed(range(len(widths))):
        d = Var(f"{name}{axis}", INDEX)
        body.append(Let(d.name, binop("mod", binop("//", flat, const(stride)), const(widths[axis]))
                        if widths[axis] > 1 else const(0)))
        stride *= widths[axis]
        out.append((axis, d))
    return out[::-1]


def _clamp(e: Expr, n: Expr) -> Expr:
    return binop("min", binop("max", e, const(0)), binop("-", n, const(1)))


def accumulate_apart(stmt: Stmt, parts: Mapping[str, Var]) -> Stmt:
    """``stmt`` with its "+" accumulations into the chunk's partial sums."""
    if isinstance(stmt, Accum) and stmt.op == "+" and stmt.var in parts:
        return replace(stmt, var=parts[stmt.var].name)
    if isinstance(stmt, If):
        return replace(stmt, then=tuple(accumulate_apart(s, parts) for s in stmt.then))
    return stmt


def staged_registers(stmt: Stmt, staged: Mapping[Load, Var], ok: Expr) -> Stmt:
    """A reduction statement with its staged loads replaced by registers, its other loads guarded to the
    output's range (they are per element: read only for elements inside it)."""
    def swap(load: Load) -> Expr:
        return staged[load] if load in staged else Select(ok, load, zero(load.dtype), load.dtype)

    assert isinstance(stmt, (Let, Accum)), stmt
    return replace(stmt, value=map_loads(stmt.value, swap))


__all__ = ["patch_copy", "pitch", "accumulate_apart", "staged_registers"]
