"""The loop structure of a kernel: which loops run in parallel, their order, which indices need no loop
(solved from an equality), and whether the last parallel index is strip-mined into tiles.

* Parallel loops are the output's free indices (a gradient kernel is an ordinary ``:=`` spec, so it is
  parallel over all of its input's indices). For a scatter (``+=`` into computed positions) only indices that
  cannot collide are parallel: one that appears alone (``d``, ``2d+1``, ``pad(d)``) in some left-hand
  position; the others run serially inside each parallel iteration.
* Loop order: parallel loops outermost in left-hand order; then the reductions, ordered so the innermost is
  the index that is unit-stride (last axis, row-major) in the most accesses.
* Tiling (``lower(..., tile=True)``, CPU printers only): strip-mine the last parallel index and make it the
  innermost loop, accumulating into the output elements of the tile, when that reads more arrays
  contiguously than the innermost reduction does (a matmul, Dist, the conv1d input gradient). The tile loop
  is the last parallel loop. A scatter whose last collision-free index is unit-stride in the output
  (``ΔW[ix[b],d] += Δout[b,d]``) is tiled the same way: tiles of d in parallel, the colliding loops serially
  inside, d innermost, so each thread owns whole cache lines of every output row.

A loop's LEVEL is its position in ``Schedule.loops``, outermost 0; the per-element block of a kernel is the
level of its innermost parallel loop, ``top`` (-1 without parallel loops).
"""
from __future__ import annotations

from dataclasses import dataclass

from tullax.compiler.guards import Guards, Rel
from tullax.compiler.jam import RegisterTile
from tullax.compiler.strips import STRIP_ROWS
from tullax.spec import ir
from tullax.spec.ir import Affine, Indirect, Spec, Wrapped

TILE = "<tile>"  # the pseudo index of the loop over tiles (no spec index can be spelled with '<')
TILE_VAR = "tile"
STRIDE_DEPTH = 8  # axes counted from the last one by stride_scores; deeper ones never decide an order
TILE_BYTES = 2048  # output elements of a tile: L1-resident together with the input rows they read
SINGLE_LOOP_TILE_ELEMS = 64  # with one parallel loop its tiles are all the parallelism: keep many
SCATTER_TILE_BYTES = 128  # 64 B pays more per-row overhead; 256 B leaves too few tiles on many cores


@dataclass(frozen=True)
class Tiling:
    index: str  # the strip-mined spec index (the last parallel one)
    elems: int  # its elements per tile


@dataclass(frozen=True)
class Schedule:
    parallel: tuple[str, ...]  # outermost first; a tiled kernel's last one is TILE
    serial: tuple[str, ...]  # every other spec index, innermost last, solved ones included
    loops: tuple[str, ...]  # every loop, outermost first: parallel, unsolved serial, then the tiled index
    solved: tuple[tuple[str, int], ...]  # index solved from an equality -> level of its Let (dependency order)
    variables: tuple[tuple[str, str], ...]  # spec index (or TILE) -> its generated variable
    tiling: Tiling | None
    register: tuple[RegisterTile, ...] = ()  # parallel loops unrolled-and-jammed, applied in this order

    @property
    def top(self) -> int:
        """The level of the per-element block: the innermost parallel loop."""
        return len(self.parallel) - 1

    @property
    def innermost(self) -> int:
        return len(self.loops) - 1

    def var(self, index: str) -> str:
        return dict(self.variables)[index]

    def level(self, index: str) -> int:
        """Where the value of ``index`` is known: its loop, or the Let of its solution."""
        if index in self.loops:
            return self.loops.index(index)
        return dict(self.solved)[index]

    @property
    def colliding(self) -> bool:
        """A scatter with serial loops may add twice to one element (the tile loop over j never collides)."""
        solved = dict(self.solved)
        return any(n not in solved for n in self.serial)


def schedule(spec: Spec, compute: str, guards: Guards, tile: bool, streams: bool = False,
             strips: bool = False) -> Schedule:
    """The schedule of ``spec`` computing in dtype ``compute``, once ``guards`` solved what it could;
    ``streams``: a max/min reduction along rows reads ``STREAM_ROWS`` of them at once (``register_tiles``);
    ``strips``: a strip-mined kernel's rows are register-tiled for ``tullax.compiler.strips``."""
    parallel, serial = loop_order(spec)
    solved_names = {s.index for s in guards.solutions}
    reductions = tuple(n for n in serial if n not in solved_names)
    tiling = None
    if tile and _tiling_pays(spec, parallel, reductions, guards):
        tiling = Tiling(parallel[-1], tile_size(len(spec.free), compute, spec.is_scatter))
        parallel = parallel[:-1] + (TILE,)
        ordered = tiled_reduction_order(spec, reductions)
        if ordered != reductions:
            reductions, serial = ordered, ordered + tuple(n for n in serial if n in solved_names)
    loops = parallel + reductions + ((tiling.index,) if tiling else ())
    top = len(parallel) - 1
    levels = {name: level for level, name in enumerate(loops)}
    for solution in guards.solutions:  # dependency order: what a solution reads has its level already
        others = [n for n in solution.cond.names() if n != solution.index]
        levels[solution.index] = max([top] + [levels[n] for n in others])
    variables = tuple((index, f"i{n}") for n, index in enumerate(spec.indices)) + ((TILE, TILE_VAR),)
    register = register_tiles(spec, parallel, reductions, tiling, compute if streams else None, strips)
    return Schedule(parallel, serial, loops, tuple((s.index, levels[s.index]) for s in guards.solutions),
                    variables, tiling, register)


def tile_size(parallel_count: int, dtype: str, scatter: bool = False) -> int:
    """Elements of j per tile: 2 KiB of output (L1-resident with its input rows); smaller with a single
    parallel loop, whose tiles are then the only parallelism. A scatter's tile is one row segment per colliding
    iteration, streamed rather than kept: 128 bytes (two cache lines, so tiles never share one when the row
    starts on a line) leaves 4 tiles per thread on 2 threads for a 256-wide embedding."""
    itemsize = _itemsize(dtype)
    if scatter:
        return SCATTER_TILE_BYTES // itemsize
    return TILE_BYTES // itemsize if parallel_count > 1 else SINGLE_LOOP_TILE_ELEMS


def _itemsize(dtype: str) -> int:
    """Bytes per element of a dtype a kernel computes in (narrower ones are widened to float32 or int64)."""
    return 4 if dtype in ("float32", "int32") else 8


# =============================================================================================
# Loop order
# =============================================================================================
def stride_scores(spec: Spec) -> dict[str, tuple[int, ...]]:
    """Per index, how many accesses use it on the last axis, the one before, ... (higher: more unit-stride)."""
    found: dict[str, list[int]] = {name: [0] * STRIDE_DEPTH for name in spec.indices}
    items = [a.idx for a in ir.accesses(spec.body)]
    if spec.lhs is not None:
        items.append(spec.lhs)
    for idx in items:
        for depth, one in enumerate(reversed(idx)):
            for name, _ in ir.idx_affine(one).terms:
                if name in found and depth < STRIDE_DEPTH:
                    found[name][depth] += 1
    return {name: tuple(v) for name, v in found.items()}


def collision_free(spec: Spec) -> tuple[str, ...]:
    """Indices of a scatter that alone determine some left-hand position (distinct values never collide)."""
    names: list[str] = []
    for idx in spec.lhs or ():
        aff = idx.inner if isinstance(idx, Wrapped) and idx.kind == "pad" else idx
        if isinstance(aff, Affine) and aff.div == 1 and len(aff.terms) == 1 and aff.terms[0][0] not in names:
            names.append(aff.terms[0][0])
    return tuple(names)


def loop_order(spec: Spec) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(parallel indices, serial indices innermost last)."""
    parallel = collision_free(spec) if spec.is_scatter else spec.free
    scores = stride_scores(spec)
    serial = [n for n in spec.indices if n not in parallel]
    serial.sort(key=lambda n: scores[n])  # stable: ties keep spec order
    return tuple(parallel), tuple(serial)


# =============================================================================================
# Whether tiling pays
# =============================================================================================
def inner_loop_score(accesses: list[tuple], name: str) -> int:
    """How well an innermost loop over ``name`` reads: +1 per access contiguous in it (``name`` with
    coefficient 1 on the last axis only), -1 per access strided in it, 0 for accesses it does not move."""
    score = 0
    for idx in accesses:
        axes = [ir.idx_affine(i).coef(name) for i in idx]
        if not any(axes):
            continue
        last = idx[-1]
        contiguous = axes[-1] == 1 and not any(axes[:-1]) and not isinstance(last, Indirect) and (
            ir.idx_affine(last).div == 1)
        score += 1 if contiguous else -1
    return score


def _tiling_pays(spec: Spec, parallel: tuple[str, ...], reductions: tuple[str, ...], guards: Guards) -> bool:
    """Tile the last parallel index j when that makes the innermost loop read more arrays contiguously than
    the innermost reduction loop does, and nothing but inequalities (which narrow j's loop) guards j. Only
    for + * max min reductions (they accumulate into the output), and '+=' only with + and no finaliser."""
    if not parallel or spec.redop == "logsumexp":
        return False
    if spec.assign == "*=" or (spec.assign == "+=" and (spec.redop != "+" or spec.finalizer)):
        return False
    if not reductions:
        return False
    j = parallel[-1]
    guarded = {n for c in guards.conds if c.rel != Rel.NONNEGATIVE for n in c.names()}
    guarded |= {n for s in guards.solutions for n in s.cond.names()}
    guarded |= {n.name for g in guards.generic for n in ir.walk(g) if isinstance(n, ir.IndexVal)}
    if j in guarded:
        return False
    reads = [a.idx for a in ir.accesses(spec.body)]
    if spec.is_scatter:
        return _scatter_tiling_pays(spec, j, reads, reductions[-1])
    tiled, untiled = inner_loop_score(reads + [spec.lhs], j), inner_loop_score(reads, reductions[-1])
    return tiled > untiled or (tiled == untiled and tiled > 0 and _sliding_window(spec, j, reductions[-1]))


def tiled_reduction_order(spec: Spec, reductions: tuple[str, ...]) -> tuple[str, ...]:
    """The reduction loops of a strip-mined kernel, innermost last. The tile loop inside them is the contiguous
    one, so their order is free of stride concerns; what it decides is whether the innermost one is summed
    ``reduction_jam.FACTOR`` steps per pass over the tile: only when it neither narrows the tile's range nor
    moves its update, and only where its trip count is long. A window index (one summed with a free index in
    some position: a convolution's p and q in ``x[n,c,h+p,w+q]``) is short and narrows the tile of the input
    gradient, so the innermost index that is not one (the channel c) goes innermost. Measured on conv2d
    (x 8x32x64x64, k 32x32x3x3, host C): forward 19.4 -> 13.3 ms, input gradient 21.6 -> 10.1 ms."""
    if spec.is_scatter or len(reductions) < 2:
        return reductions
    positions = [set(ir.idx_names(i)) for idx in [a.idx for a in ir.accesses(spec.body)] + [spec.lhs or ()]
                 for i in idx]

    def window(name: str) -> bool:
        return any(name in names and not names.isdisjoint(spec.free) for names in positions)

    plain = [n for n in reductions if not window(n)]
    if not plain or plain[-1] == reductions[-1]:
        return reductions
    return tuple(n for n in reductions if n != plain[-1]) + (plain[-1],)


def _scatter_tiling_pays(spec: Spec, j: str, reads: list[tuple], k: str) -> bool:
    """A scatter tiles j only when j alone is the last output axis: then tiles of j write disjoint output
    elements (race-free whatever the colliding loops do) and contiguous row segments (no shared cache
    lines between threads); and only when j innermost reads better than the colliding k innermost."""
    last = spec.lhs[-1]
    aff = last.inner if isinstance(last, Wrapped) and last.kind == "pad" else last
    if not (isinstance(aff, Affine) and aff.div == 1 and aff.terms == ((j, 1),)):
        return False
    if any(ir.idx_affine(i).coef(j) for i in spec.lhs[:-1]):
        return False
    accesses = reads + [spec.lhs]
    return inner_loop_score(accesses, j) > inner_loop_score(accesses, k)


def _sliding_window(spec: Spec, j: str, k: str) -> bool:
    """``x[j+k]`` with j's range shrunk by k's extent (a valid convolution): the reduction is a short
    filter and neighbouring j reuse the same inputs, so a tie goes to tiling."""
    ranges = spec.range_of
    together = any(ir.idx_affine(i).coef(j) and ir.idx_affine(i).coef(k)
                   for a in ir.accesses(spec.body) for i in a.idx)
    filter_atoms = {atom for atom, _ in ranges[k].extent().terms}
    shrunk = any(atom in filter_atoms and coef < 0 for atom, coef in ranges[j].extent().terms)
    return together and shrunk


# =============================================================================================
# Register tiles
# =============================================================================================
MAX_CASES = 8  # literal cases of a small output index split into per-case code
CALL_TILE = 4  # outputs per tile along an index a call does not depend on
LOAD_TILE = 2  # ... along each of two indices that each leave some load shared (a 2x2 tile)
SINGLE_TILE = 4  # ... along the one index that leaves loads shared
STREAM_ROWS = 4  # rows of a max/min reduction read at once (benchmarks/row_streams.py)
STREAM_MIN_BYTES = 8192  # ... when a row is this long: shorter ones read one after the other stream better


def _node_indices(node: ir.Expr) -> set[str]:
    names = {n.name for n in ir.walk(node) if isinstance(n, ir.IndexVal)}
    for access in ir.accesses(node):
        for idx in access.idx:
            names.update(ir.idx_affine(idx).names())
    return names


def literal_cases(spec: Spec, index: str) -> tuple[int, ...]:
    """The integers ``index`` is compared with for equality in the body (``m == 2``): a gradient w.r.t. a
    coordinate multiplies each coordinate's terms by such a Kronecker delta."""
    cases = set()
    for node in ir.walk(spec.body):
        if isinstance(node, ir.Binary) and node.op == "==":
            for a, b in ((node.lhs, node.rhs), (node.rhs, node.lhs)):
                value = ir.integer_literal(b)
                if isinstance(a, ir.IndexVal) and a.name == index and a.offset.is_const and value is not None:
                    cases.add(value - a.offset.const)
    return tuple(sorted(cases))


def register_tiles(spec: Spec, parallel: tuple[str, ...], reductions: tuple[str, ...],
                   tiling: Tiling | None, streams: str | None = None, strips: bool = False) -> tuple[RegisterTile, ...]:
    """Which parallel loops to unroll-and-jam (``tullax.compiler.jam``), by how much.

    * A free index compared with literals ``lo .. lo+c-1`` (its range starting at the constant ``lo``, c at most
      ``MAX_CASES``): one tile of the c cases, each with only its own terms (the Gaussian gradient's ``m``).
    * Otherwise, with reductions: an index that a CALL inside the reduction does not depend on is tiled by
      ``CALL_TILE`` (its exp is computed once per tile: the Gaussian kernel sum's column index ``d``). Else
      each of the last two parallel indices that some load inside the reduction does not depend on (that load
      is shared by the tile) is tiled by 2, or by ``SINGLE_TILE`` when only one is (a matmul, Dist: 2x2;
      measured, 2x2 beats 4x1 by 1.2-1.5x on their gradients).
    * A strip-mined kernel (``tiling``) is not tiled: 4 rows per iteration, each updating its row of the strip in
      memory, measured slower or no faster (matmul, Linear, Dist forward: 0.8-1.0x; ``benchmarks/sharing.py``).
      Its innermost loop is already contiguous and vectorised; a win there needs the strip's partial sums in
      registers: with ``strips`` (the C printer's), the parallel index before the tile that leaves some load
      inside the reduction shared is tiled by ``strips.STRIP_ROWS``, whose row segments
      ``tullax.compiler.strips`` then keeps in registers across the reduction (a GEMM micro-kernel).
    * With ``streams`` (the dtype of the computation, given for the C printer, whose max/min lanes take one
      vector per row of a tile), a max/min reduction whose innermost loop reads its rows contiguously and shares
      nothing reads ``STREAM_ROWS`` rows at once where a row holds at least ``STREAM_MIN_BYTES`` (a condition
      at run time: shorter rows run one by one, as without it). One long row at a time left the loads waiting
      on memory (a row max over 4096x4096 read at about 20 GB/s where XLA's reads at 30); rows of 2 KB or less,
      read one by one, are one sequential stream that the interleaved short ones lose to
      (``benchmarks/row_streams.py``)."""
    if spec.is_scatter or not parallel:
        return ()
    ranges = spec.range_of
    for name in spec.free:
        if tiling and name == tiling.index:
            continue
        cases = literal_cases(spec, name)
        lo = ranges[name].lo
        if cases and lo.is_const and cases[0] >= lo.const and cases[-1] - lo.const < MAX_CASES:
            return (RegisterTile(name, cases[-1] - lo.const + 1, literal=True),)
    if not reductions or (tiling is None and spec.redop == "logsumexp"):
        return ()
    candidates = [n for n in parallel if n != TILE][-2:]
    loads = [_node_indices(a) for a in ir.accesses(spec.body)]
    calls = [_node_indices(c) for c in ir.walk(spec.body) if isinstance(c, ir.Call)]
    inner = reductions[-1]
    if tiling is not None:  # rows that each update their strip in memory lose (benchmarks/sharing.py): strips only
        rows = [n for n in candidates[-1:] if any(inner in used and n not in used for used in loads)]
        return tuple(RegisterTile(n, STRIP_ROWS) for n in rows) if strips else ()
    for name in reversed(candidates):
        if any(inner in used and name not in used for used in calls):
            return (RegisterTile(name, CALL_TILE),)
    sharing = [n for n in candidates if any(inner in used and n not in used for used in loads)]
    if not sharing and streams and candidates and spec.redop in ("max", "min") and (
            inner_loop_score([a.idx for a in ir.accesses(spec.body)], inner) > 0):
        return (RegisterTile(candidates[-1], STREAM_ROWS, min_trips=STREAM_MIN_BYTES // _itemsize(streams)),)
    if len(sharing) == 2:
        return tuple(RegisterTile(n, LOAD_TILE) for n in sharing)
    return tuple(RegisterTile(n, SINGLE_TILE) for n in sharing)
