"""Register strips: the micro-kernel of a strip-mined kernel (``lower(..., strips=True)``, the C printer's).

A strip-mined kernel (``schedule.Tiling``) runs its reductions around an innermost loop over the tile of j that
adds one term into each output element of the tile: the tile's row is read and written back once per term (once
per ``reduction_jam.FACTOR`` terms). With its rows register-tiled (``schedule.register_tiles``: ``STRIP_ROWS``
copies of the row index, sharing the loads that do not depend on it) this pass moves the loop over j out of the
reductions in chunks of ``width`` elements::

    for blk ...:                                  for blk ...:
        for k ...:                                    for j_ch in 0:ceil((tile_hi - tile_lo) / width):
            t_r = x[r, k]                                 j_clo = tile_lo + j_ch * width
            for j in tile_lo:tile_hi:     ->              j_chi = min(j_clo + width, tile_hi)
                out[r, j] += t_r * W[k, j]                for k ...:
                                                              t_r = x[r, k]
                                                              for j in j_clo:j_chi:
                                                                  out[r, j] += t_r * W[k, j]

An interchange: distinct j touch distinct output elements, and what stays outside the j loop (Lets, loop bounds)
does not read j. Each element still adds its terms in the same order, into the output element, and the blocked
float32 sums (``blocking``: a float64 total per 512 terms) stay around the moved loops, so values are unchanged.
The chunk loop is marked (``Loop.registers``, its width): the C printer keeps the chunk's ``STRIP_ROWS`` row
segments in vector registers across the reductions (a whole chunk; a ragged one as written), the other printers
print the loops as they are.
"""
from __future__ import annotations

from dataclasses import replace

from tullax.compiler.loops import (
    INDEX,
    Const,
    Expr,
    If,
    Let,
    Load,
    Loop,
    LoopKernel,
    Stmt,
    Store,
    Var,
    binop,
    const,
    expr_vars,
    statement_expressions,
    walk_expr,
    walk_stmts,
)

STRIP_ROWS = 6  # rows of a strip-mined kernel per register tile: 12 vector accumulators (2 per row) fit AVX2's 16
STRIP_VECTORS = 2  # vectors per row segment: their loads are shared by every row (2 loads and 6 broadcasts per 12)
VECTOR_BYTES = 32  # the C printer's vectors (``tullax.printers.c.VECTOR_BYTES``)
MAX_SEGMENTS = 8  # output row segments one chunk may hold in registers
_ITEMSIZE = {"float32": 4, "float64": 8}


def strip_width(dtype: str) -> int:
    """Elements of j per chunk for a kernel computing in ``dtype``: ``STRIP_VECTORS`` vectors (0: no strips)."""
    return STRIP_VECTORS * VECTOR_BYTES // _ITEMSIZE[dtype] if dtype in _ITEMSIZE else 0


def register_strips(kernel: LoopKernel, var: str, start: Expr, stop: Expr, width: int) -> LoopKernel | None:
    """``kernel`` with each run of reduction loops around loops over ``var`` from ``start`` to ``stop`` (the
    tile) moved inside a chunk loop over ``var`` (module doc), or None where no run qualifies."""
    found: list[int] = []
    body = _rewrite(kernel.body, var, start, stop, width, found)
    return replace(kernel, body=_distributed(body, var, start, stop)) if found else None


def _distributed(stmts: tuple[Stmt, ...], var: str, start: Expr, stop: Expr) -> tuple[Stmt, ...]:
    """``stmts`` with each tile loop of stores that each read no element another one writes (the jammed rows'
    finaliser ``out[r, j] = tanh(out[r, j] + c[j])``, their zeroing) as one loop per store: GCC vectorised
    none of the six calls of one loop (a row's store may alias the next row's load as far as it knows)."""
    out: list[Stmt] = []
    for stmt in stmts:
        if isinstance(stmt, Loop) and stmt.var == var and stmt.start == start and stmt.stop == stop and len(
                stmt.body) > 1 and all(isinstance(s, Store) for s in stmt.body) and _own_reads(stmt.body):
            out += [replace(stmt, body=(s,)) for s in stmt.body]
        elif isinstance(stmt, Loop):
            out.append(replace(stmt, body=_distributed(stmt.body, var, start, stop)))
        elif isinstance(stmt, If):
            out.append(replace(stmt, then=_distributed(stmt.then, var, start, stop),
                               orelse=_distributed(stmt.orelse, var, start, stop)))
        else:
            out.append(stmt)
    return tuple(out)


def _own_reads(stores: tuple[Stmt, ...]) -> bool:
    """Every store writes an element of its own (distinct index lists) and reads, of the arrays they write, only
    that element."""
    written = {s.array for s in stores if isinstance(s, Store)}
    targets = {(s.array, s.index) for s in stores if isinstance(s, Store)}
    if len(targets) < len(stores):
        return False
    return all(isinstance(s, Store) and all(
        n.array not in written or (n.array, n.index) == (s.array, s.index)
        for e in statement_expressions(s) for n in walk_expr(e) if isinstance(n, Load)) for s in stores)


def _rewrite(stmts: tuple[Stmt, ...], var: str, start: Expr, stop: Expr, width: int,
             found: list[int]) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    run: list[Loop] = []

    def flush() -> None:
        if run and _segments(run, var, start, stop) is not None:
            out.append(_chunked(tuple(run), var, start, stop, width))
            found.append(1)
        else:
            out.extend(replace(s, body=_rewrite(s.body, var, start, stop, width, found)) for s in run)
        run.clear()

    for stmt in stmts:
        if isinstance(stmt, Loop) and _reduction(stmt, var, start, stop):
            run.append(stmt)
            continue
        flush()
        if isinstance(stmt, Loop):
            out.append(replace(stmt, body=_rewrite(stmt.body, var, start, stop, width, found)))
        elif isinstance(stmt, If):
            out.append(replace(stmt, then=_rewrite(stmt.then, var, start, stop, width, found),
                               orelse=_rewrite(stmt.orelse, var, start, stop, width, found)))
        else:
            out.append(stmt)
    flush()
    return tuple(out)


def _strip(loop: Stmt, var: str, start: Expr, stop: Expr) -> bool:
    """A loop over the whole tile whose body is Lets and then adds into elements ``[..., var]`` (``var`` in the
    last position only)."""
    if not (isinstance(loop, Loop) and loop.var == var and loop.start == start and loop.stop == stop
            and not loop.parallel and not loop.reduce_parallel and loop.body):
        return False
    count = next((n for n, s in enumerate(loop.body) if not isinstance(s, Let)), len(loop.body))
    stores = loop.body[count:]
    return bool(stores) and all(
        isinstance(s, Store) and s.mode == "add" and s.index and s.index[-1] == Var(var, INDEX)
        and not any(var in expr_vars(i) for i in s.index[:-1]) for s in stores)


def _reduction(loop: Loop, var: str, start: Expr, stop: Expr) -> bool:
    """A serial loop whose bounds do not read ``var``, whose body is Lets that do not read it, strips, and
    loops of the same kind, at least one strip somewhere."""
    if loop.parallel or loop.reduce_parallel or var in expr_vars(loop.start) | expr_vars(loop.stop):
        return False
    strips = 0
    for stmt in loop.body:
        if _strip(stmt, var, start, stop):
            strips += 1
        elif isinstance(stmt, Loop) and _reduction(stmt, var, start, stop):
            strips += 1
        elif not (isinstance(stmt, Let) and var not in expr_vars(stmt.value)):
            return False
    return strips > 0


def _segments(run: list[Loop], var: str, start: Expr, stop: Expr) -> set[tuple[str, tuple[Expr, ...]]] | None:
    """The output row segments the strips of ``run`` add into (array, index before ``var``), or None where they
    are too many to hold in registers, some statement of the run reads one of those arrays, or a segment or the
    tile's bounds read a variable the run binds (a ragged register tile's loop over its rows, with the tile's
    bounds inside it: the chunks go inside that loop)."""
    stmts = [s for loop in run for s in walk_stmts((loop,))]
    stores = [s for s in stmts if isinstance(s, Store)]
    segments = {(s.array, s.index[:-1]) for s in stores}
    arrays = {array for array, _ in segments}
    read = {node.array for s in stmts for e in statement_expressions(s) for node in walk_expr(e)
            if isinstance(node, Load)}
    bound = {s.var for s in stmts if isinstance(s, (Let, Loop))}
    outside = expr_vars(start) | expr_vars(stop) | {n for _, index in segments for i in index for n in expr_vars(i)}
    if len(segments) > MAX_SEGMENTS or arrays & read or outside & bound:
        return None
    return segments


def _chunked(run: tuple[Loop, ...], var: str, start: Expr, stop: Expr, width: int) -> Loop:
    lo, hi = Var(f"{var}_clo", INDEX), Var(f"{var}_chi", INDEX)
    count = binop("//", binop("+", binop("-", stop, start), const(width - 1)), const(width))
    head: tuple[Stmt, ...] = (Let(lo.name, binop("+", start, binop("*", Var(f"{var}_ch", INDEX), const(width)))),
                              Let(hi.name, binop("min", binop("+", lo, const(width)), stop)))
    return Loop(f"{var}_ch", Const(0, INDEX), count, False, head + _bounded(run, var, lo, hi), registers=width)


def _bounded(stmts: tuple[Stmt, ...], var: str, lo: Var, hi: Var) -> tuple[Stmt, ...]:
    """``stmts`` with their strips over ``var`` running from ``lo`` to ``hi``."""
    out: list[Stmt] = []
    for stmt in stmts:
        if isinstance(stmt, Loop) and stmt.var == var:
            out.append(replace(stmt, start=lo, stop=hi))
        elif isinstance(stmt, Loop):
            out.append(replace(stmt, body=_bounded(stmt.body, var, lo, hi)))
        else:
            out.append(stmt)
    return tuple(out)


__all__ = ["STRIP_ROWS", "register_strips", "strip_width"]
