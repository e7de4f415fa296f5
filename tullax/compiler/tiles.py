"""Shared-memory block tiles (GPU printers): a matmul-like kernel (Dist, Linear, the Gaussian kernel sum and
their gradients: two parallel indices p0, p1 and one reduction over k whose loads each move with k and ONE of
p0, p1) as one block per ``rows`` x ``cols`` tile of the output. For each chunk of ``chunk`` steps of k the
block's threads copy the chunk of every such load into shared memory (``Shared``), each thread several
elements, consecutive threads along the array's own contiguous axis (a ``ΔD[i,j]`` read down its columns by
one thread per output is read along its rows here); a ``Barrier``; then each thread computes its
``thread_rows`` x ``thread_cols`` register tile from the staged values (a staged value is read once per row or
column of the register tile, not once per term); a second barrier before the next chunk overwrites them.

Global loads per output element drop from about one per term (a 2x2 register tile: 4 loads for 4 terms) to
``(rows + cols) / (rows * cols)`` per term: 1/32 for 64 x 64 tiles (``tests/test_cuda_tiles.py`` holds the
ratio from the memory-traffic tracer's counts).

The result is loop IR (``tullax.compiler.loops``: ``LoopKernel.tile``, ``Shared``, ``Barrier``, the printer's
``THREAD``); every other statement is ordinary IR. Each thread sums its elements' terms in k's order, as the
serial definition. Edge tiles: the copies store 0 outside the loads' ranges, the register tile computes every
element of the tile from the staged values, and only elements inside the output are stored. Loads in the
per-element statements that do not move with k (hoisted by the lowering) are read under the same guard.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping

import numpy as np

from tullax.compiler.loops import (
    BOOL,
    FLOATS,
    INDEX,
    THREAD,
    Accum,
    Barrier,
    BlockTile,
    Const,
    Expr,
    If,
    Let,
    Load,
    Loop,
    LoopKernel,
    Select,
    Shared,
    Stmt,
    Store,
    Var,
    VectorLoad,
    binop,
    const,
    eval_int,
    expr_vars,
    map_loads,
    parallel_nest,
    walk_expr,
    walk_stmts,
)
from tullax.compiler.rewrite import substitute, substitute_stmts
from tullax.errors import TullaxError


@dataclass(frozen=True)
class TilePolicy:
    """When and how a kernel is block-tiled, by shapes: ``tile`` the geometry (64 x 64 outputs per block, 4 x 4
    per thread, chunks of 16: 256 threads, 8 KiB of shared memory per staged float32 load pair); at least
    ``min_outputs`` output elements (a few tiles) and a reduction at least ``min_length`` long (shorter ones
    reuse too little to pay for the barriers)."""

    tile: BlockTile = BlockTile(64, 64, 4, 4, 16)
    min_outputs: int = 64 * 64
    min_length: int = 64
    # window tiles (tullax.compiler.window_tiles): below this many blocks the outermost reduction is cut over
    # more blocks that add into the output atomically (split-K)
    min_blocks: int = 128


# every kernel that can, with small tiles (the host harness runs one OS thread per GPU thread)
FORCE_TILES = TilePolicy(BlockTile(8, 8, 2, 2, 4), min_outputs=1, min_length=1)
PREFIX = "bt_"  # the names this stage makes: no other generated name starts with it


@dataclass(frozen=True)
class _Staged:
    load: Load
    side: int  # 0: moves with p0 (and k), 1: with p1
    k_fastest: bool  # the array's last axis moves with k: the copy runs consecutive threads along k
    name: str


@dataclass(frozen=True)
class _Layout:
    """Where a staged array's values sit in shared memory, one row of ``pitch`` elements per step of k. Column
    ``mine + c * across`` of the tile (the thread ``mine``'s register-tile column c) sits at
    ``(c // lanes) * across * lanes + mine * lanes + c % lanes``: each vector read of ``lanes`` elements is
    contiguous and aligned, and a warp's lanes (consecutive ``mine``) read one contiguous run (no bank
    conflicts). A row read along k by the copy (``k_fastest``) is padded by ``lanes`` elements so that the
    copy's lanes at consecutive k fall in different banks."""

    across: int  # threads along the tile's axis
    count: int  # register-tile elements per thread along it
    lanes: int  # elements per vector read
    pitch: int  # elements per staged row

    @staticmethod
    def of(across: int, count: int, dtype: str, k_fastest: bool) -> _Layout:
        lanes = vector_lanes(dtype, count)
        width = across * count
        return _Layout(across, count, lanes, width + (lanes if k_fastest else 0))

    def column(self, position: Expr) -> Expr:
        """The tile column held at ``position`` of a row (``position`` < across * count)."""
        run = self.across * self.lanes
        group, rest = binop("//", position, const(run)), binop("mod", position, const(run))
        c = binop("+", binop("*", group, const(self.lanes)), binop("mod", rest, const(self.lanes)))
        return binop("+", binop("//", rest, const(self.lanes)), binop("*", c, const(self.across)))

    def read_start(self, step: Expr, mine: Expr, c: int) -> Expr:
        """Where the vector read of the thread's columns c .. c + lanes - 1 (c a multiple of lanes) starts."""
        row = binop("+", binop("*", step, const(self.pitch)), binop("*", mine, const(self.lanes)))
        return binop("+", row, const((c // self.lanes) * self.across * self.lanes))


def block_tiles(kernel: LoopKernel, sizes: Mapping[str, int], policy: TilePolicy = TilePolicy(),
                max_float32_sum: int | None = None) -> LoopKernel | None:
    """``kernel`` as a block-tiled kernel for these ``sizes`` (size parameter -> value), or None where it is
    not matmul-like (see the module docstring) or the shapes are below ``policy``'s thresholds.
    ``max_float32_sum``: the longest float32 sum a thread may take in one register."""
    tile = policy.tile
    if kernel.is_scatter or kernel.split or kernel.cooperative or kernel.tile is not None \
            or kernel.compute_dtype not in FLOATS:
        return None
    if tile.rows % tile.thread_rows or tile.cols % tile.thread_cols \
            or (tile.chunk * tile.rows) % tile.threads or (tile.chunk * tile.cols) % tile.threads:
        raise TullaxError(f"internal error: a block tile {tile} must divide evenly over its threads")
    loops, body = parallel_nest(kernel)
    known = {s.name for s in kernel.sizes}
    if len(loops) != 2 or not all(_over(e, known) for loop in loops for e in (loop.start, loop.stop)):
        return None
    pre, reduction, post = _parts(body)
    if reduction is None or not (_over(reduction.start, known) and _over(reduction.stop, known)):
        return None
    try:
        extents = [eval_int(loop.stop, dict(sizes)) - eval_int(loop.start, dict(sizes)) for loop in loops]
        length = eval_int(reduction.stop, dict(sizes)) - eval_int(reduction.start, dict(sizes))
    except (TullaxError, KeyError):
        return None
    if math.prod(max(e, 0) for e in extents) < policy.min_outputs or length < policy.min_length:
        return None
    declared = {s.var: s.value.dtype for s in pre}
    for stmt in reduction.body:
        if isinstance(stmt, Accum) and (stmt.var not in declared or declared[stmt.var] not in FLOATS):
            return None
        if not isinstance(stmt, (Let, Accum)):
            return None
        if isinstance(stmt, Accum) and stmt.op == "+" and declared[stmt.var] == "float32" \
                and max_float32_sum is not None and length > max_float32_sum:
            return None
    p0, p1, k = loops[0].var, loops[1].var, reduction.var
    staged = _staged(reduction.body, p0, p1, k, known)
    if not staged:
        return None
    return replace(kernel, body=_nest(loops, pre, reduction, post, staged, tile, kernel.compute_dtype),
                   tile=tile)


def _over(expr: Expr, names: set[str]) -> bool:
    return expr_vars(expr) <= names


def _parts(body: tuple[Stmt, ...]) -> tuple[tuple[Let, ...], Loop | None, tuple[Stmt, ...]]:
    """(Lets before the reduction, the one serial reduction loop, the statements after it), or a None loop."""
    at = next((n for n, s in enumerate(body) if isinstance(s, Loop)), None)
    if at is None or not all(isinstance(s, Let) for s in body[:at]):
        return (), None, ()
    loop, post = body[at], body[at + 1:]
    if loop.parallel or loop.lanes or any(isinstance(s, (Loop, Shared, Barrier)) for s in walk_stmts(post)):
        return (), None, ()
    return body[:at], loop, post  # type: ignore[return-value]


def _staged(stmts: tuple[Stmt, ...], p0: str, p1: str, k: str, known: set[str]) -> list[_Staged] | None:
    """The loads to stage in shared memory (each moving with k and one of p0, p1), or None where a load
    cannot be tiled (it moves with k and both or neither of p0 and p1, it is a gather, or it sits in a
    checked branch and may be out of range where the branch is not taken)."""
    found: dict[Load, _Staged] = {}
    for stmt in stmts:
        value = stmt.value  # Lets and Accums only
        for node in walk_expr(value):
            if isinstance(node, Select) and any(isinstance(n, Load) for branch in (node.then, node.orelse)
                                                for n in walk_expr(branch)):
                return None
            if not isinstance(node, Load):
                continue
            if any(isinstance(n, (Load, Select)) for i in node.index for n in walk_expr(i)):
                return None
            names = set().union(*(expr_vars(i) for i in node.index)) if node.index else set()
            if not names <= known | {p0, p1, k}:
                return None
            if k not in names:
                continue  # read per term from global memory, guarded at edge tiles
            sides = [side for side, p in enumerate((p0, p1)) if p in names]
            if len(sides) != 1:
                return None
            if node not in found:
                last = expr_vars(node.index[-1])
                found[node] = _Staged(node, sides[0], k in last and not last & {p0, p1},
                                      f"{PREFIX}s{len(found)}")
    return list(found.values())


def _nest(loops: tuple[Loop, ...], pre: tuple[Let, ...], reduction: Loop, post: tuple[Stmt, ...],
          staged: list[_Staged], tile: BlockTile, compute: str) -> tuple[Stmt, ...]:
    thread = Var(THREAD, INDEX)
    across = (tile.rows // tile.thread_rows, tile.cols // tile.thread_cols)  # threads along each tile axis
    widths = (tile.rows, tile.cols)
    counts = (tile.thread_rows, tile.thread_cols)
    blocks = [Var(f"{PREFIX}b{n}", INDEX) for n in range(2)]
    origin = [Var(f"{PREFIX}o{n}", INDEX) for n in range(2)]
    mine = [Var(f"{PREFIX}t{n}", INDEX) for n in range(2)]  # the thread's row and column in the tile
    layouts = {s.name: _Layout.of(across[s.side], counts[s.side], s.load.dtype, s.k_fastest) for s in staged}
    out: list[Stmt] = [Shared(s.name, tile.chunk * layouts[s.name].pitch, s.load.dtype) for s in staged]
    out += [Let(origin[n].name, binop("+", loops[n].start, binop("*", blocks[n], const(widths[n]))))
            for n in range(2)]
    out += [Let(mine[0].name, binop("//", thread, const(across[1]))),
            Let(mine[1].name, binop("mod", thread, const(across[1])))]
    # the thread's elements: rows origin0 + t0 + a*across0, columns origin1 + t1 + b*across1 (consecutive
    # threads on consecutive columns: the output's stores and the staged columns' reads are contiguous)
    where = [[Var(f"{PREFIX}p{n}_{a}", INDEX) for a in range(counts[n])] for n in range(2)]
    inside = [[Var(f"{PREFIX}in{n}_{a}", BOOL) for a in range(counts[n])] for n in range(2)]
    for n in range(2):
        for a in range(counts[n]):
            out.append(Let(where[n][a].name, binop("+", origin[n], binop("+", mine[n], const(a * across[n])))))
            out.append(Let(inside[n][a].name, binop("<", where[n][a], loops[n].stop)))
    copies = [(a, b) for a in range(counts[0]) for b in range(counts[1])]
    bound = {s.var for s in pre} | {s.var for s in reduction.body if isinstance(s, Let)}

    types = {s.var: s.value.dtype for s in walk_stmts(pre + reduction.body) if isinstance(s, Let)}

    def renamed(stmts: tuple[Stmt, ...], a: int, b: int, k: Expr | None = None) -> tuple[Stmt, ...]:
        """Statements of element (a, b) of the register tile: its positions, its own copy of every local."""
        table: dict[str, Expr] = {loops[0].var: where[0][a], loops[1].var: where[1][b]}
        table.update({name: Var(f"{name}_{a}_{b}", types[name]) for name in bound})
        if k is not None:
            table[reduction.var] = k
        return substitute_stmts(stmts, table)

    both = [binop("and", inside[0][a], inside[1][b]) for a, b in copies]
    for (a, b), ok in zip(copies, both):
        for let in renamed(pre, a, b):
            assert isinstance(let, Let)
            out.append(Let(let.var, guarded(let.value, ok)))
    length = binop("-", reduction.stop, reduction.start)
    chunk = Var(f"{PREFIX}c", INDEX)
    first = Var(f"{PREFIX}k0", INDEX)
    step = Var(f"{PREFIX}kk", INDEX)
    chunk_body: list[Stmt] = [Let(first.name, binop("+", reduction.start, binop("*", chunk, const(tile.chunk))))]
    for s in staged:
        chunk_body.append(_copy(s, layouts[s.name], loops[s.side], origin[s.side], reduction, first, tile, thread))
    chunk_body.append(Barrier())
    term_body: list[Stmt] = []
    registers: dict[tuple[str, int], Var] = {}
    for s in staged:
        # the thread's register-tile elements, ``lanes`` at a time, from where ``_Layout`` put them
        layout = layouts[s.name]
        count, lanes = layout.count, layout.lanes
        for a in range(count):
            registers[s.name, a] = Var(f"{s.name}_{a}", s.load.dtype)
        for a in range(0, count, lanes):
            names = tuple(registers[s.name, a + n].name for n in range(lanes))
            start = layout.read_start(step, mine[s.side], a)
            term_body.append(VectorLoad(names, s.name, (start,), s.load.dtype) if lanes > 1
                             else Let(names[0], Load(s.name, (start,), s.load.dtype)))
    k_value = binop("+", first, step)
    for (a, b), ok in zip(copies, both):
        swapped = tuple(_swap_loads(stmt, {s.load: registers[s.name, (a, b)[s.side]] for s in staged}, ok,
                                    loops[0].var, loops[1].var, inside[0][a], inside[1][b]) for stmt in reduction.body)
        term_body += renamed(swapped, a, b, k_value)
    steps = binop("min", const(tile.chunk), binop("-", length, binop("*", chunk, const(tile.chunk))))
    chunk_body.append(Loop(step.name, const(0), steps, False, tuple(term_body)))
    chunk_body.append(Barrier())
    chunks = binop("//", binop("+", length, const(tile.chunk - 1)), const(tile.chunk))
    out.append(Loop(chunk.name, const(0), chunks, False, tuple(chunk_body)))
    for (a, b), ok in zip(copies, both):
        out.append(If(ok, renamed(post, a, b)))
    nest: tuple[Stmt, ...] = tuple(out)
    for n in reversed(range(2)):
        extent = binop("-", loops[n].stop, loops[n].start)
        count = binop("//", binop("+", extent, const(widths[n] - 1)), const(widths[n]))
        nest = (Loop(blocks[n].name, const(0), count, True, nest),)
    return nest


def vector_lanes(dtype: str, count: int) -> int:
    """How many of a thread's ``count`` staged elements one read takes: the most that fit 16 bytes and divide
    ``count`` (1: scalar reads)."""
    lanes = max(16 // np.dtype(dtype).itemsize, 1)
    while count % lanes:
        lanes //= 2
    return lanes


def _copy(s: _Staged, layout: _Layout, along: Loop, origin: Var, reduction: Loop, first: Var, tile: BlockTile,
          thread: Var) -> Loop:
    """The block's threads copy ``chunk`` x ``width`` values of ``s.load`` into its shared array (row kk at
    kk * pitch, column pp where ``layout`` puts it), each thread ``chunk * width / threads`` of them; 0 where
    (k, p) is outside the loops' ranges. A warp's 32 stores fall in distinct banks and its loads in as few
    32-byte sectors as 32 consecutive elements take: along p, consecutive lanes store consecutive positions
    of a row (``lanes`` runs of consecutive p); along k (``k_fastest``), runs of consecutive k for ``lanes``
    neighbouring positions (the rows' pitch puts consecutive k in other banks)."""
    width = layout.across * layout.count
    r = Var(f"{PREFIX}r", INDEX)
    e = Var(f"{PREFIX}e", INDEX)
    kk, at = Var(f"{PREFIX}ck", INDEX), Var(f"{PREFIX}cp", INDEX)  # the row and the position in it
    body: list[Stmt] = [Let(e.name, binop("+", binop("*", r, const(tile.threads)), thread))]
    if s.k_fastest:
        run = math.gcd(tile.chunk, max(32 // layout.lanes, 1))  # consecutive k per position in a warp
        lane, rest = binop("mod", e, const(run)), binop("//", e, const(run))
        inner, rest = binop("mod", rest, const(layout.lanes)), binop("//", rest, const(layout.lanes))
        runs = tile.chunk // run
        body += [Let(kk.name, binop("+", binop("*", binop("mod", rest, const(runs)), const(run)), lane)),
                 Let(at.name, binop("+", binop("*", binop("//", rest, const(runs)), const(layout.lanes)), inner))]
    else:
        body += [Let(at.name, binop("mod", e, const(width))), Let(kk.name, binop("//", e, const(width)))]
    k, p = binop("+", first, kk), binop("+", origin, layout.column(at))
    ok = binop("and", binop("<", k, reduction.stop), binop("<", p, along.stop))
    value = Select(ok, substitute(s.load, {reduction.var: k, along.var: p}), Const(0.0, s.load.dtype), s.load.dtype)
    body.append(Store(s.name, (binop("+", binop("*", kk, const(layout.pitch)), at),), value))
    return Loop(r.name, const(0), const(tile.chunk * width // tile.threads), False, tuple(body))


def guarded(value: Expr, ok: Expr) -> Expr:
    """A per-element value that reads memory, read only for elements inside the output (edge tiles)."""
    if not any(isinstance(n, Load) for n in walk_expr(value)):
        return value
    return Select(ok, value, zero(value.dtype), value.dtype)


def zero(dtype: str) -> Const:
    """The zero of ``dtype``: what a guarded load reads outside the array."""
    return Const(False if dtype == BOOL else 0.0 if dtype in FLOATS else 0, dtype)


def _swap_loads(stmt: Stmt, staged: Mapping[Load, Var], ok: Expr, p0: str, p1: str, in0: Expr, in1: Expr) -> Stmt:
    """A statement of the reduction with its staged loads replaced by the registers read from shared memory,
    and its other loads that move with p0 or p1 guarded to the output's range."""
    guard = {p0: in0, p1: in1}

    def swap(load: Load) -> Expr:
        if load in staged:
            return staged[load]
        names = set().union(*(expr_vars(i) for i in load.index)) if load.index else set()
        conds = [guard[p] for p in (p0, p1) if p in names]
        if conds:
            cond = conds[0] if len(conds) == 1 else ok
            return Select(cond, load, zero(load.dtype), load.dtype)
        return load

    assert isinstance(stmt, (Let, Accum)), stmt
    return replace(stmt, value=map_loads(stmt.value, swap))


__all__ = ["FORCE_TILES", "TilePolicy", "block_tiles"]
