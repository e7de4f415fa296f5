"""Shared-memory window tiles (GPU printers): implicit GEMM for kernels with windowed reads, such as the
convolutions ``y[n,o,h,w] := x[n,c,h+p,w+q]*k[o,c,p,q]`` and their gradients, where ``tullax.compiler.tiles``
(two parallel loops, one reduction) does not apply.

The parallel loops fall into two sides by the loads that move with the reduction ("staged" loads: ``x`` moves
with n, h, w; ``k`` with o): each staged load reads the indices of one side only; indices every staged load reads
are common (one value per block). A block computes a box of ``T_v`` consecutive values of each parallel index
(the box of each side flattened: the two sides are the rows and columns of a GEMM tile, each thread a register
tile of them), and the reductions run in chunks, a box of ``C_r`` steps of each reduced index at a time.

For each chunk the block's threads copy, for every staged load, the box of the array it reads there into shared
memory: along each array axis ``e = rest + sum(coef * index)`` the box spans ``1 + sum(|coef| * (T - 1))``
positions, so the window's offset is part of the staged patch (``x[n,c,h+p,w+q]`` stages ``T_h + C_p - 1`` rows
of ``T_w + C_q - 1`` columns: the halo), and an element reads its term at the window's offset in that patch.
The copy runs a warp's lanes along the array's last (contiguous) axis, aligned to the array's own 32-element
groups (the phase of each patch row's first address), every lane loads (an address clamped into the array; 0
is stored for a position outside it: a ``pad`` window's zeros), and lanes outside the patch store nothing.

A reduction loop the lowering narrowed to a window of the element (``max(0, m-H+1):min(P, m+1)`` from a
``pad``) runs over its whole range here and each term is taken only inside the narrowed bounds (an ``If``).
Sums inside one chunk step keep the serial order of the reduced indices; across chunks the order is the chunks'
(the same on every run). Edge tiles: elements outside the output are computed from staged values and not
stored; their per-element loads are guarded.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping

from tullax.compiler.interface import SizeArg
from tullax.compiler.loops import (
    BOOL,
    FLOATS,
    INDEX,
    THREAD,
    Accum,
    Barrier,
    BinOp,
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
    UnOp,
    Var,
    binop,
    const,
    eval_int,
    expr_vars,
    parallel_nest,
    walk_expr,
    walk_stmts,
)
from tullax.compiler.rewrite import substitute, substitute_stmts
from tullax.compiler.tiles import PREFIX, TilePolicy, guarded, zero
from tullax.compiler.window_copy import SEGMENT, accumulate_apart, patch_copy, pitch, staged_registers
from tullax.spec.sizes import Sym

MAX_SHARED_BYTES = 48 * 1024  # the static shared memory a block may declare
MAX_THREADS = 1024
SMALL = 8  # a window extent up to this is staged whole (a 3x3 kernel: all nine steps in one chunk)


@dataclass(frozen=True)
class _Affine:
    coefs: tuple[tuple[str, int], ...]  # loop variable -> integer coefficient
    rest: Expr  # over sizes


@dataclass(frozen=True)
class _Staged:
    load: Load
    side: int
    axes: tuple[_Affine, ...]
    name: str
    widths: tuple[int, ...]  # the patch's extent along each axis of the array


@dataclass(frozen=True)
class _Geometry:
    box: dict  # parallel variable -> T_v
    chunk: dict  # reduction variable -> C_r
    sides: tuple[tuple[str, ...], tuple[str, ...]]  # each side's variables, outermost first
    counts: tuple[int, int]  # register tile: elements of each side per thread
    across: tuple[int, int]  # threads along each side

    @property
    def threads(self) -> int:
        return self.across[0] * self.across[1]

    def flat(self, side: int) -> int:
        return math.prod(self.box[v] for v in self.sides[side])


def window_tiles(kernel: LoopKernel, sizes: Mapping[str, int], policy: TilePolicy = TilePolicy(),
                 max_float32_sum: int | None = None) -> LoopKernel | None:
    """``kernel`` as a window-tiled kernel for these ``sizes``, or None where it does not have the shape the
    module docstring describes, or the shapes are below ``policy``'s thresholds."""
    if kernel.is_scatter or kernel.split or kernel.cooperative or kernel.tile is not None \
            or kernel.compute_dtype not in FLOATS:
        return None
    loops, body = parallel_nest(kernel)
    known = {s.name for s in kernel.sizes}
    if len(loops) < 2 or not all(expr_vars(e) <= known for loop in loops for e in (loop.start, loop.stop)):
        return None
    parts = _parts(body)
    if parts is None:
        return None
    pre, nest, inner, post = parts
    env = dict(sizes)
    par = [loop.var for loop in loops]
    red = [loop.var for loop in nest]
    outer = [_outer(loop, known) for loop in nest]
    if any(o is None for o in outer):
        return None
    try:
        extents = {loop.var: eval_int(loop.stop, env) - eval_int(loop.start, env) for loop in loops}
        lengths = {loop.var: eval_int(o[1], env) - eval_int(o[0], env) for loop, o in zip(nest, outer)}
    except (Exception,):  # a size the host has not given: not for these shapes
        return None
    if math.prod(max(e, 0) for e in extents.values()) < policy.min_outputs \
            or math.prod(max(n, 0) for n in lengths.values()) < policy.min_length:
        return None
    declared = {s.var: s.value.dtype for s in pre}
    for stmt in inner:
        if not isinstance(stmt, (Let, Accum)):
            return None
        if isinstance(stmt, Accum):
            if declared.get(stmt.var) not in FLOATS:
                return None
    narrowed = any(o[2] for o in outer)
    if narrowed and any(isinstance(s, Accum) and s.op != "+" for s in inner):
        return None
    found = _loads(inner, par, red, known)
    if found is None or any(load.dtype not in FLOATS for load in found):  # the copies store a float 0 outside
        return None
    sides = _sides(found, par, red)
    if sides is None:
        return None
    geometry = _geometry(par, red, sides, extents, lengths, policy)
    if geometry is None:
        return None
    if max_float32_sum is not None and any(isinstance(s, Accum) and s.op == "+" and declared[s.var] == "float32"
                                           for s in inner):
        # a sum is taken per chunk, then the chunks' sums: neither part longer than a split piece
        steps = math.prod(geometry.chunk.values())
        chunks = math.prod(-(-n // geometry.chunk[r]) for r, n in lengths.items())
        if max(steps, chunks) > max_float32_sum:
            return None
    staged = [_Staged(load, side, axes, f"{PREFIX}w{n}", _widths(axes, geometry))
              for n, (load, (side, axes)) in enumerate(sides[0].items())]
    itemsize = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}
    if sum(math.prod(pitch(s.widths)) * itemsize.get(s.load.dtype, 8) for s in staged) > MAX_SHARED_BYTES:
        return None
    blocks = math.prod(-(-max(extents[v], 0) // geometry.box[v]) for v in par)
    chunks = math.prod(-(-max(lengths[r], 0) // geometry.chunk[r]) for r in red)
    slices = 1
    if blocks < policy.min_blocks and chunks > 1 and _linear(pre, inner, post):
        per = -(-chunks // min(-(-policy.min_blocks // max(blocks, 1)), chunks))
        slices = -(-chunks // per)
    new_sizes = list(kernel.sizes)
    body_out = _Builder(kernel, loops, nest, outer, pre, inner, post, staged, geometry, new_sizes,
                        slices and -(-chunks // slices) if slices > 1 else 0).build()
    if slices > 1:
        return replace(kernel, body=body_out, tile=BlockTile(geometry.flat(0), geometry.flat(1), geometry.counts[0],
                                                             geometry.counts[1], math.prod(geometry.chunk.values())),
                       sizes=tuple(new_sizes), split=True)
    tile = BlockTile(geometry.flat(0), geometry.flat(1), geometry.counts[0], geometry.counts[1],
                     math.prod(geometry.chunk.values()))
    return replace(kernel, body=body_out, tile=tile, sizes=tuple(new_sizes))


def _linear(pre: tuple[Let, ...], inner: tuple[Stmt, ...], post: tuple[Stmt, ...]) -> bool:
    """Whether the result is the sum of the terms alone (every store writes a "+" accumulator that starts at 0
    and nothing else touches it): then parts of the sum may be added into the output by several blocks."""
    sums = {s.var for s in inner if isinstance(s, Accum) and s.op == "+"}
    if not sums or any(isinstance(s, Accum) and s.var not in sums for s in inner):
        return False
    starts = {s.var: s.value for s in pre}
    if any(not (isinstance(starts.get(v), Const) and starts[v].value == 0) for v in sums):
        return False
    return all(isinstance(s, Store) and s.mode in ("set", "add") and isinstance(s.value, Var) and s.value.name in sums
               for s in post)


def _parts(body: tuple[Stmt, ...]):
    """(Lets before, the perfect nest of serial reduction loops, the innermost statements, the statements
    after), or None."""
    at = next((n for n, s in enumerate(body) if isinstance(s, Loop)), None)
    if at is None or not all(isinstance(s, Let) for s in body[:at]):
        return None
    post = body[at + 1:]
    if any(isinstance(s, (Loop, Shared, Barrier)) for s in walk_stmts(post)):
        return None
    nest = [body[at]]
    while True:
        loop = nest[-1]
        if loop.parallel or loop.lanes:
            return None
        if len(loop.body) == 1 and isinstance(loop.body[0], Loop):
            nest.append(loop.body[0])
            continue
        break
    inner = nest[-1].body
    if any(isinstance(s, (Loop, If)) for s in inner):
        return None
    return body[:at], tuple(nest), inner, post


def _outer(loop: Loop, known: set[str]) -> tuple[Expr, Expr, bool] | None:
    """The loop's range over sizes only: its own bounds, or the size-only side of a ``max``/``min`` the
    lowering narrowed it with (then True: its terms are taken inside the narrowed bounds only)."""
    def side(expr: Expr, op: str) -> tuple[Expr, bool] | None:
        if expr_vars(expr) <= known:
            return expr, False
        if isinstance(expr, BinOp) and expr.op == op:
            fixed = [e for e in (expr.lhs, expr.rhs) if expr_vars(e) <= known]
            if len(fixed) == 1:
                return fixed[0], True
        return None

    lo, hi = side(loop.start, "max"), side(loop.stop, "min")
    if lo is None or hi is None:
        return None
    return lo[0], hi[0], lo[1] or hi[1]


def _affine(expr: Expr, loop_vars: set[str], known: set[str]) -> _Affine | None:
    """``expr`` as integer coefficients of loop variables plus an expression over sizes, or None."""
    coefs: dict[str, int] = {}
    rest: list[tuple[int, Expr]] = []

    def walk(e: Expr, sign: int) -> bool:
        if isinstance(e, Var) and e.name in loop_vars:
            coefs[e.name] = coefs.get(e.name, 0) + sign
            return True
        if expr_vars(e) <= known and not any(isinstance(n, Load) for n in walk_expr(e)):
            rest.append((sign, e))
            return True
        if isinstance(e, BinOp) and e.op in ("+", "-"):
            return walk(e.lhs, sign) and walk(e.rhs, sign if e.op == "+" else -sign)
        if isinstance(e, UnOp) and e.op == "neg":
            return walk(e.arg, -sign)
        if isinstance(e, BinOp) and e.op == "*":
            for a, b in ((e.lhs, e.rhs), (e.rhs, e.lhs)):
                if isinstance(a, Const) and isinstance(a.value, int):
                    return walk(b, sign * a.value)
        return False

    if not walk(expr, 1):
        return None
    total: Expr = const(0)
    for sign, e in rest:
        total = binop("+" if sign > 0 else "-", total, e) if abs(sign) == 1 else binop("+", total, binop(
            "*", const(sign), e))
    return _Affine(tuple((v, c) for v, c in coefs.items() if c), total)


def _loads(inner: tuple[Stmt, ...], par: list[str], red: list[str], known: set[str]):
    """Each load that moves with a reduced index -> its axes as affine forms; None where one cannot be staged
    (a gather, a load in a branch, an index that is not affine in the loops)."""
    found: dict[Load, tuple[_Affine, ...]] = {}
    loop_vars = set(par) | set(red)
    for stmt in inner:
        for node in walk_expr(stmt.value):
            if isinstance(node, Select) and any(isinstance(n, Load) for b in (node.then, node.orelse)
                                                for n in walk_expr(b)):
                return None
            if not isinstance(node, Load):
                continue
            names = set().union(*(expr_vars(i) for i in node.index)) if node.index else set()
            if not names <= known | loop_vars:
                return None
            if not names & set(red) or node in found:
                continue
            axes = tuple(_affine(i, loop_vars, known) for i in node.index)
            if any(a is None for a in axes):
                return None
            found[node] = axes
    return found or None


def _sides(found: dict, par: list[str], red: list[str]):
    """Each staged load's side (0 or 1) and axes, with every parallel variable's side (None: common), or None
    unless the loads split the parallel variables into exactly two sides."""
    reads = {load: {v for a in axes for v, _ in a.coefs if v in par} for load, axes in found.items()}
    common = set(par)
    for names in reads.values():
        common &= names
    groups: list[set[str]] = []
    for names in reads.values():
        mine = names - common
        if not mine:
            continue
        joined = [g for g in groups if g & mine]
        for g in joined:
            groups.remove(g)
            mine |= g
        groups.append(mine)
    if len(groups) != 2:
        return None
    # side 1 holds the innermost parallel index (the output's contiguous axis): consecutive threads along it
    if par[-1] in groups[0]:
        groups.reverse()
    out = {}
    for load, names in reads.items():
        side = 0 if names & groups[0] else 1
        out[load] = (side, found[load])
    free = [v for v in par if v not in common and not any(v in g for g in groups)]
    return out, tuple(tuple(v for v in par if v in g) for g in groups), common | set(free)


def _geometry(par: list[str], red: list[str], sides, extents: dict, lengths: dict,
              policy: TilePolicy) -> _Geometry | None:
    staged, side_vars, common = sides
    tile = policy.tile
    # the reduced indices that offset a parallel one along some axis: a window (p and q of x[n,c,h+p,w+q])
    windows = {v for _, axes in staged.values() for a in axes if any(u in par for u, _ in a.coefs)
               for v, _ in a.coefs if v in red}
    box = {v: 1 for v in common}
    targets = (tile.rows, tile.cols)
    for s in range(2):
        remaining = targets[s]
        for v in reversed(side_vars[s]):
            box[v] = _share(extents[v], remaining)
            remaining = max(-(-remaining // box[v]), 1)
    chunk: dict[str, int] = {}
    remaining = tile.chunk
    for r in reversed(red):
        # an innermost reduced index that is not a small window runs a warp's row of steps per chunk (a
        # convolution's kernel gradient sums along rows of the image: the copies read whole rows)
        # a small window is staged whole (its steps are not cut over chunks)
        chunk[r] = lengths[r] if 0 < lengths[r] <= SMALL and r in windows else \
            _share(lengths[r], max(remaining, SEGMENT) if r == red[-1] else remaining)
        remaining = max(-(-remaining // chunk[r]), 1)
    counts, across = [], []
    wanted = (tile.thread_rows, tile.thread_cols)
    for s in range(2):
        flat = math.prod(box[v] for v in side_vars[s])
        # threads along the side: a power of two dividing the side, near flat / the register tile's extent
        n = 1
        while flat % (2 * n) == 0 and 2 * n * wanted[s] <= flat:
            n *= 2
        if n == 1:  # an odd side (a 3 x 3 window, 5 channels): any divisor
            n = max(d for d in range(1, flat + 1) if flat % d == 0 and d * wanted[s] <= max(flat, wanted[s]))
        across.append(n)
        counts.append(flat // n)
    geometry = _Geometry(box, chunk, side_vars, (counts[0], counts[1]), (across[0], across[1]))
    if not 1 < geometry.threads <= MAX_THREADS or counts[0] * counts[1] > 64:
        return None
    return geometry


def _share(extent: int, remaining: int) -> int:
    """A box's extent along one index: a small window whole, else a power of two up to what is left."""
    if 0 < extent <= SMALL and extent < remaining:
        return extent
    return max(1, min(remaining, 1 << max(extent - 1, 0).bit_length()))


def _widths(axes: tuple[_Affine, ...], g: _Geometry) -> tuple[int, ...]:
    span = {**g.box, **g.chunk}
    return tuple(1 + sum(abs(c) * (span[v] - 1) for v, c in a.coefs) for a in axes)


class _Builder:
    def __init__(self, kernel: LoopKernel, loops, nest, outer, pre, inner, post, staged, g: _Geometry,
                 sizes: list[SizeArg], per_slice: int = 0):
        self.per_slice = per_slice  # split-K: chunks of the outermost reduction per block (0: no split)
        self.kernel, self.loops, self.nest, self.outer = kernel, loops, nest, outer
        self.pre, self.inner, self.post, self.staged, self.g = pre, inner, post, staged, g
        self.sizes = sizes
        self.thread = Var(THREAD, INDEX)
        self.slice = Var(f"{PREFIX}sk", INDEX)
        self.origin = {lp.var: Var(f"{PREFIX}o_{lp.var}", INDEX) for lp in loops}
        self.first = {lp.var: Var(f"{PREFIX}f_{lp.var}", INDEX) for lp in nest}
        self.step = {lp.var: Var(f"{PREFIX}k_{lp.var}", INDEX) for lp in nest}
        self.arrays = {a.name: a for a in kernel.arrays}

    def extent(self, array: str, axis: int) -> Var:
        """A size parameter holding ``array``'s extent along ``axis`` (added to the kernel when new)."""
        sym = Sym.extent(self.arrays[array].source, axis)
        for s in self.sizes:
            if s.size == sym:
                return Var(s.name, INDEX)
        self.sizes.append(SizeArg(f"{PREFIX}n{len(self.sizes)}", sym))
        return Var(self.sizes[-1].name, INDEX)

    def build(self) -> tuple[Stmt, ...]:
        g = self.g
        out: list[Stmt] = [Shared(s.name, math.prod(pitch(s.widths)), s.load.dtype) for s in self.staged]
        blocks = {lp.var: Var(f"{PREFIX}b_{lp.var}", INDEX) for lp in self.loops}
        for lp in self.loops:
            out.append(Let(self.origin[lp.var].name,
                           binop("+", lp.start, binop("*", blocks[lp.var], const(g.box[lp.var])))))
        mine = [Var(f"{PREFIX}t0", INDEX), Var(f"{PREFIX}t1", INDEX)]
        out += [Let(mine[0].name, binop("//", self.thread, const(g.across[1]))),
                Let(mine[1].name, binop("mod", self.thread, const(g.across[1])))]
        # each element of the thread's register tile: its offset in the box along every index of its side
        self.offset: list[list[dict[str, Expr]]] = [[], []]
        inside: list[list[Expr]] = [[], []]
        stops = {lp.var: lp.stop for lp in self.loops}
        for s in range(2):
            names = g.sides[s]
            for a in range(g.counts[s]):
                flat = binop("+", mine[s], const(a * g.across[s]))
                offsets, ok = {}, None
                stride = 1
                for v in reversed(names):
                    var = Var(f"{PREFIX}d{s}_{a}_{v}", INDEX)
                    value = binop("mod", binop("//", flat, const(stride)), const(g.box[v])) if g.box[v] > 1 \
                        else const(0)
                    out.append(Let(var.name, value))
                    offsets[v] = var
                    stride *= g.box[v]
                    cond = binop("<", binop("+", self.origin[v], var), stops[v])
                    ok = cond if ok is None else binop("and", ok, cond)
                flag = Var(f"{PREFIX}in{s}_{a}", BOOL)
                out.append(Let(flag.name, ok if ok is not None else Const(True, BOOL)))
                self.offset[s].append(offsets)
                inside[s].append(flag)
        pairs = [(a, b) for a in range(g.counts[0]) for b in range(g.counts[1])]
        self.both = {(a, b): binop("and", inside[0][a], inside[1][b]) for a, b in pairs}
        types = {s.var: s.value.dtype for s in walk_stmts(self.pre + self.inner) if isinstance(s, Let)}
        self.types = types
        bound = {s.var for s in self.pre} | {s.var for s in self.inner if isinstance(s, Let)}
        self.rename = {(a, b): {name: Var(f"{name}_{a}_{b}", types[name]) for name in bound} for a, b in pairs}
        for a, b in pairs:
            for let in substitute_stmts(self.pre, self.positions(a, b)):
                assert isinstance(let, Let)
                out.append(Let(let.var, guarded(let.value, self.both[a, b])))
        out.append(self.chunks(pairs, inside))
        post = self.post
        if self.per_slice:
            post = tuple(replace(s, mode="atomic_add") for s in post)
        for a, b in pairs:
            out.append(If(self.both[a, b], substitute_stmts(post, self.positions(a, b))))
        body: tuple[Stmt, ...] = tuple(out)
        for lp in reversed(self.loops):
            extent = binop("-", lp.stop, lp.start)
            count = binop("//", binop("+", extent, const(g.box[lp.var] - 1)), const(g.box[lp.var]))
            body = (Loop(blocks[lp.var].name, const(0), count, True, body),)
        if self.per_slice:
            count = self.total_chunks()
            slices = binop("//", binop("+", count, const(self.per_slice - 1)), const(self.per_slice))
            body = (Loop(self.slice.name, const(0), slices, True, body),)
        return body

    def positions(self, a: int, b: int, steps: bool = False) -> dict[str, Expr]:
        """Element (a, b)'s substitution: parallel indices at its place, its own copy of every local and, in a
        chunk, the reduced indices at the chunk's step."""
        table: dict[str, Expr] = {}
        for lp in self.loops:
            v = lp.var
            off = self.offset[0][a].get(v, self.offset[1][b].get(v))
            table[v] = self.origin[v] if off is None else binop("+", self.origin[v], off)
        table.update(self.rename[a, b])
        if steps:
            for lp in self.nest:
                table[lp.var] = binop("+", self.first[lp.var], self.step[lp.var])
        return table

    def chunks(self, pairs, inside) -> Stmt:
        g = self.g
        body: list[Stmt] = [self.copy(s) for s in self.staged]
        body.append(Barrier())
        terms: list[Stmt] = []
        registers: dict[tuple[str, int], Var] = {}
        for s in self.staged:
            for a in range(g.counts[s.side]):
                registers[s.name, a] = Var(f"{s.name}_{a}", s.load.dtype)
                terms.append(Let(registers[s.name, a].name, Load(s.name, (self.local(s, a),), s.load.dtype)))
        for a, b in pairs:
            swap = {s.load: registers[s.name, (a, b)[s.side]] for s in self.staged}
            stmts = tuple(staged_registers(stmt, swap, self.both[a, b]) for stmt in self.inner)
            table = self.positions(a, b, steps=True)
            stmts = substitute_stmts(stmts, table)
            conds = [c for lp, o in zip(self.nest, self.outer) if o[2] for c in self.window(lp, table)]
            if conds:
                ok = conds[0]
                for c in conds[1:]:
                    ok = binop("and", ok, c)
                stmts = (If(ok, stmts),)
            terms += stmts
        # each "+" accumulator sums a chunk's terms apart, then adds them (float32 sums stay short)
        sums = {s.var: declared for s in self.inner if isinstance(s, Accum) and s.op == "+"
                for declared in [self.types[s.var]]}
        parts = {self.rename[a, b][v].name: Var(f"{self.rename[a, b][v].name}_p", t)
                 for a, b in pairs for v, t in sums.items()}
        terms = [accumulate_apart(stmt, parts) for stmt in terms]
        inner: tuple[Stmt, ...] = tuple(terms)
        for lp, (lo, hi, _) in reversed(list(zip(self.nest, self.outer))):
            left = binop("-", hi, self.first[lp.var])
            inner = (Loop(self.step[lp.var].name, const(0), binop("min", const(g.chunk[lp.var]), left), False, inner),)
        body += [Let(p.name, zero(p.dtype)) for p in parts.values()]
        body += list(inner)
        body += [Accum(name, "+", p) for name, p in parts.items()]
        body.append(Barrier())
        chunk_body: tuple[Stmt, ...] = tuple(body)
        # one loop over the chunks of every reduced index together (the nest's order), so that split-K can
        # give each block a slice of them
        flat = Var(f"{PREFIX}c", INDEX)
        decode: list[Stmt] = []
        rest: Expr = flat
        for lp, (lo, hi, _) in reversed(list(zip(self.nest, self.outer))):
            c = Var(f"{PREFIX}c_{lp.var}", INDEX)
            count = self.chunk_count(lp, lo, hi)
            last = lp is self.nest[0]
            decode.insert(0, Let(self.first[lp.var].name, binop("+", lo, binop("*", c, const(g.chunk[lp.var])))))
            decode.insert(0, Let(c.name, rest if last else binop("mod", rest, count)))
            rest = binop("//", rest, count)
        total = self.total_chunks()
        if self.per_slice:  # split-K: this block's slice of the chunks
            begin = binop("*", self.slice, const(self.per_slice))
            return Loop(flat.name, begin, binop("min", total, binop("+", begin, const(self.per_slice))), False,
                        tuple(decode) + chunk_body)
        return Loop(flat.name, const(0), total, False, tuple(decode) + chunk_body)

    def chunk_count(self, lp: Loop, lo: Expr, hi: Expr) -> Expr:
        size = self.g.chunk[lp.var]
        return binop("//", binop("+", binop("-", hi, lo), const(size - 1)), const(size))

    def total_chunks(self) -> Expr:
        total: Expr = const(1)
        for lp, (lo, hi, _) in zip(self.nest, self.outer):
            total = binop("*", total, self.chunk_count(lp, lo, hi))
        return total

    def window(self, lp: Loop, table: dict[str, Expr]) -> list[Expr]:
        """The narrowed bounds of reduction loop ``lp`` at element and step ``table``."""
        k = table[lp.var]
        return [binop(">=", k, substitute(lp.start, table)), binop("<", k, substitute(lp.stop, table))]

    def local(self, s: _Staged, a: int) -> Expr:
        """Where element ``a`` of ``s``'s side reads its term at the current chunk step: its position in the
        staged patch, the window's offset included."""
        span = {**self.g.box, **self.g.chunk}
        offsets = {**self.offset[s.side][a], **{r: self.step[r] for r in self.g.chunk}}
        flat: Expr = const(0)
        for axis, width in zip(s.axes, pitch(s.widths)):
            pos: Expr = const(0)
            for v, c in axis.coefs:
                off = offsets.get(v, const(0))  # a common index: the box's one value
                term = off if c > 0 else binop("-", const(span[v] - 1), off)
                pos = binop("+", pos, binop("*", const(abs(c)), term) if abs(c) != 1 else term)
            flat = binop("+", binop("*", flat, const(width)), pos)
        return flat

    def corner(self, s: _Staged, axis: _Affine) -> Expr:
        """The patch's first position along one axis of the array (the axis's value at the box's corner)."""
        span = {**self.g.box, **self.g.chunk}
        start = {**self.origin, **self.first}
        value = axis.rest
        for v, c in axis.coefs:
            at = start[v] if c > 0 else binop("+", start[v], const(span[v] - 1))
            value = binop("+", value, binop("*", const(c), at) if c != 1 else at)
        return value

    def copy(self, s: _Staged) -> Loop:
        return patch_copy(s.load, s.name, s.widths, [self.corner(s, axis) for axis in s.axes],
                          [self.extent(s.load.array, j) for j in range(len(s.widths))], self.thread,
                          self.g.threads, PREFIX)


__all__ = ["window_tiles"]
