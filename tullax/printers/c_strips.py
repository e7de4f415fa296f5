"""Register strips as GCC vectors (``CPrinter.loop`` of a ``Loop.registers`` chunk loop, made by
``tullax.compiler.strips``): a whole chunk loads each output row segment its strips add into as vectors, runs the
reductions with each strip's terms on vectors (``c_vector.vector_body``: one load per moving read, shared by the
rows) added into them, and stores them after; a ragged chunk, a plain (tcc) module or a term that is not plain
arithmetic runs the loops as the IR says. Each lane adds the same terms in the same order as the loop."""
from __future__ import annotations

from tullax.compiler.loops import (
    INDEX,
    Accum,
    BinOp,
    Const,
    Expr,
    Let,
    Load,
    Loop,
    Stmt,
    Store,
    UnOp,
    Var,
    binop,
    const,
    walk_stmts,
)
from tullax.printers.c_vector import VectorBody, vector_body
from tullax.printers.clike import TYPE_SUFFIX, CLikePrinter, CPlace

_ITEMSIZE = {"float32": 4, "float64": 8}
_LANE_INT = {"float32": "tx_i32", "float64": "tx_i64"}


def register_strips(printer: CLikePrinter, loop: Loop, place: CPlace, vector_bytes: int) -> list[str] | None:
    """The lines of chunk loop ``loop`` with its whole chunks on vectors, or None where it prints as written."""
    lo, hi = loop.body[0], loop.body[1]
    assert isinstance(lo, Let) and isinstance(hi, Let), loop
    run = loop.body[2:]
    strips = [s for s in walk_stmts(run) if isinstance(s, Loop) and s.start == Var(lo.var, INDEX)]
    stores = [s for strip in strips for s in strip.body if isinstance(s, Store)]
    dtypes = {s.value.dtype for s in stores}
    if getattr(printer, "plain", False) or len(dtypes) != 1 or next(iter(dtypes)) not in _ITEMSIZE:
        return None
    dtype = next(iter(dtypes))
    width = vector_bytes // _ITEMSIZE[dtype]
    if loop.registers % width:
        return None
    segments: dict[tuple[str, tuple[Expr, ...]], str] = {}
    for store in stores:
        segments.setdefault((store.array, store.index[:-1]), f"{loop.var}_s{len(segments)}")
    bodies: dict[int, VectorBody] = {}
    for strip in strips:
        lets = [Let(s.var, _squares(s.value)) for s in strip.body if isinstance(s, Let)]
        accums = [Accum(segments[(s.array, s.index[:-1])], "+", _squares(s.value))
                  for s in strip.body if isinstance(s, Store)]
        body = vector_body(strip.var, lets, accums, dtype)
        if body is None:
            return None
        bodies[id(strip)] = body
    vector, suffix, count = f"tx_v{width}_{TYPE_SUFFIX[dtype]}", TYPE_SUFFIX[dtype], loop.registers // width
    pad, step = printer.indent * place.depth, printer.indent
    inner = CPlace(place.depth + 1, place.declared)
    deep = CPlace(place.depth + 2, place.declared)
    first = f"{loop.var}_at"  # where the vectors start: the chunk's start, or its end less a whole chunk

    def address(array: str, index: tuple[Expr, ...], v: int) -> str:
        return "&" + printer.expr(Load(array, index + (binop("+", Var(first, INDEX), const(v * width)),), dtype))

    def vectors(stmts: tuple[Stmt, ...], at: CPlace, masked: bool) -> list[str]:
        lines: list[str] = []
        for stmt in stmts:
            if isinstance(stmt, Loop) and id(stmt) in bodies:
                lines += _strip_vectors(stmt, bodies[id(stmt)], first, width, count, vector, suffix, printer, at,
                                        masked)
            elif isinstance(stmt, Loop):
                lines += [printer.indent * at.depth + printer.loop_header(stmt, at),
                          *vectors(stmt.body, CPlace(at.depth + 1, at.declared), masked),
                          printer.indent * at.depth + "}"]
            else:
                lines += printer.statement(stmt, at)
        return lines

    def chunk(start: str, masked: bool) -> list[str]:
        at = pad + step * 2
        lines = [f"{at}const {printer.index_type} {first} = {start};"]
        if masked:  # lane k of vector v is new where first + v*width + k >= clo
            mask = vector.replace("_v", "_m", 1)
            lanes = "(" + mask + "){" + ", ".join(str(k) for k in range(width)) + "}"
            lines += [f"{at}const {mask} {first}_new{v} = {lanes} >= ({_LANE_INT[dtype]})({lo.var} - {first} - "
                      f"{v * width});" for v in range(count)]
        for (array, index), name in segments.items():
            lines += [f"{at}{vector} {name}_v{v};" for v in range(count)]
            lines += [f"{at}memcpy(&{name}_v{v}, {address(array, index, v)}, sizeof({vector}));"
                      for v in range(count)]
        lines += vectors(run, deep, masked)
        for (array, index), name in segments.items():
            lines += [f"{at}memcpy({address(array, index, v)}, &{name}_v{v}, sizeof({vector}));"
                      for v in range(count)]
        return lines

    tile_start, tile_stop = _tile(lo, hi)
    lines = [pad + printer.loop_header(loop, place), *printer.block(loop.body[:2], inner),
             f"{pad}{step}if ({hi.var} - {lo.var} == {loop.registers}) {{", *chunk(lo.var, False),
             # a ragged last chunk of a tile holding a whole one: the last whole chunk's vectors, adding -0.0 (no
             # change to any value) into the lanes the chunk before took
             f"{pad}{step}}} else if ({printer.expr(tile_stop)} - {printer.expr(tile_start)} >= {loop.registers}) {{",
             *chunk(f"{hi.var} - {loop.registers}", True)]
    lines += [f"{pad}{step}}} else {{", *printer.block(run, deep), f"{pad}{step}}}", pad + "}"]
    return lines


def _tile(lo: Let, hi: Let) -> tuple[Expr, Expr]:
    """The tile's bounds, from the chunk's bounds ``start + ch*width`` and ``min(clo + width, stop)``."""
    assert isinstance(lo.value, BinOp) and isinstance(hi.value, BinOp), (lo, hi)
    return lo.value.lhs, hi.value.rhs


def _squares(expr: Expr) -> Expr:
    """``expr`` with each ``x^2`` as ``x*x``: what the prelude's ``tx_powi`` computes for it, on vectors too."""
    if isinstance(expr, BinOp):
        lhs, rhs = _squares(expr.lhs), _squares(expr.rhs)
        if expr.op == "^" and isinstance(rhs, Const) and rhs.dtype == INDEX and rhs.value == 2:
            return BinOp("*", lhs, lhs, expr.dtype)
        return BinOp(expr.op, lhs, rhs, expr.dtype)
    if isinstance(expr, UnOp):
        return UnOp(expr.op, _squares(expr.arg), expr.dtype)
    return expr


def _strip_vectors(strip: Loop, body: VectorBody, lo: str, width: int, count: int, vector: str, suffix: str,
                   printer: CLikePrinter, at: CPlace, masked: bool) -> list[str]:
    """One strip of a whole chunk: ``count`` vectors, each its moving loads, its locals and the adds into the
    segments' vectors."""
    pad, step, idx = printer.indent * at.depth, printer.indent, printer.index_type
    splat = "(" + vector + "){" + ", ".join(["-0.0"] * width) + "}"
    lines: list[str] = []
    for v in range(count):
        lines += [pad + "{", f"{pad}{step}const {idx} {strip.var} = {lo} + {v * width};"]
        lines += [f"{pad}{step}const {vector} {name} = tx_vload_{suffix}(&{printer.expr(load)});"
                  for load, name in body.loads]
        lines += [f"{pad}{step}const {vector} {let.var} = {splat} + ({printer.expr(let.value)});" for let in body.lets]
        if masked:  # a bitwise select: a NaN or inf term of an old lane stays out
            mask = vector.replace("_v", "_m", 1)
            lines += [f"{pad}{step}{a.var}_v{v} += ({vector})((({mask})({printer.expr(a.value)}) & {lo}_new{v}) | "
                      f"(({mask}){splat} & ~{lo}_new{v}));" for a in body.accums]
        else:
            lines += [f"{pad}{step}{a.var}_v{v} += {printer.expr(a.value)};" for a in body.accums]
        lines.append(pad + "}")
    return lines


__all__ = ["register_strips"]
