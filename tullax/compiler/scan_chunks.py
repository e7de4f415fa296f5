"""A linear first-order recurrence ``h[t] = a[t]*h[t-1] + b[t]`` over a long ``t`` and few lanes as a GPU schedule:
ONE block per lane (per point of the parallel nest), ``t`` cut into chunks shared by the block's threads.

The scan kernel (``tullax.compiler.scan.lower_scan``, GPU form) gives one thread each lane's whole walk: with
few lanes and a long ``t`` nearly every thread of the GPU idles. Here, in three passes with a barrier between:

1. each thread walks its chunks from a zero state (the scan's own step, the self-read replaced by a register)
   and multiplies the chunk's slopes ``a`` (the recurrence's derivative in its self-read, ``tullax.grad.linear``):
   the chunk maps an incoming state ``h`` to ``P*h + H``; ``P`` and ``H`` go to shared memory;
2. one thread composes the chunks in order, from the initial state (or 0): each chunk's incoming state, stored
   over its ``H`` (a few hundred multiply-adds, serial: the order is fixed, the result deterministic);
3. each thread walks its chunks again from their incoming states, with the scan's own step, and stores them.

Pass 3 is the serial recurrence itself within each chunk; only the chunk carries are reassociated (the products
of ``a`` over a chunk, composed chunk by chunk), which is what docs/recurrences.md states. The products and the
carries are float64 whatever the state's precision. Lanes along the result's contiguous last axis are grouped,
up to a 32-byte sector of them a block (while ``MIN_BLOCKS`` blocks remain): the block's work item ``q`` is chunk
``q // width`` of lane ``q mod width``, so a warp's loads read whole sectors. A reverse scan walks
the chunks in its own order (``t`` downwards). The gradient's adjoint scan of a linear recurrence is linear too,
so it takes the same form.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from tullax.compiler.loops import (
    FLOATS,
    INDEX,
    Accum,
    Barrier,
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
    binop,
    cast,
    eval_int,
    parallel_nest,
    walk_expr,
    walk_stmts,
)
from tullax.compiler.scan import map_statement_expressions, rebuild_expression
from tullax.errors import TullaxError
from tullax.grad.linear import linear_parts
from tullax.spec.ir import Spec

CHUNKS = 256  # the most chunks of one lane: the block's threads (the cuda printer's BLOCK_THREADS)
MIN_CHUNK = 4  # the fewest steps of a chunk: below it the carries cost more than the chunk
MIN_BLOCKS = 128  # lanes grouped into a block only while this many blocks remain (an H100 has 132 SMs)
SECTOR = 32  # bytes: a group of lanes reads whole sectors
GROUP = "tx_g"  # the loop over groups of lanes
MAX_LANES = 8192  # beyond this many lanes a thread per lane already fills a GPU; the chunks would only add traffic
SLOPE = "tx_slope"  # the composed slopes of the chunks (Shared), then nothing
OFFSET = "tx_carry"  # the chunks' results from a zero state (Shared), then their incoming states


def chunked_scan(kernel: LoopKernel, spec: Spec, signature, sizes: Mapping[str, int], lower,
                 min_steps: int, max_lanes: int = MAX_LANES) -> LoopKernel | None:
    """``kernel`` (the GPU scan kernel of ``spec``, lowered for ``signature``) as a chunked scan, a block per lane,
    where ``spec`` is a linear first-order recurrence whose lanes do not mix, over at least ``min_steps`` steps
    (0: never) and at most ``max_lanes`` lanes for these ``sizes``; else None. ``lower`` is
    ``compiler.lower.lower`` (passed in, as to ``lower_scan``)."""
    if spec.scan is None or min_steps <= 0 or kernel.output.dtype not in FLOATS:
        return None
    parts = linear_parts(spec)
    if parts is None:
        return None
    loops, body = parallel_nest(kernel)
    if not loops or len(body) != 1 or not isinstance(body[0], Loop) or body[0].parallel:
        return None
    walk = body[0]
    out = kernel.output.name
    stores = [s for s in walk_stmts(walk.body) if isinstance(s, Store)]
    if len(stores) != 1 or stores[0].array != out or stores[0] not in walk.body or \
            not all(isinstance(i, Var) for i in stores[0].index) or \
            any(not isinstance(s, (Let, Store)) for s in walk.body):
        return None
    store = stores[0]
    try:
        env = dict(sizes)
        steps = eval_int(walk.stop, env) - eval_int(walk.start, env)
        lanes = 1
        for loop in loops:
            lanes *= max(eval_int(loop.stop, env) - eval_int(loop.start, env), 0)
    except (TullaxError, KeyError):
        return None
    if steps < min_steps or lanes > max_lanes:
        return None
    found = _self_read(walk.body, out)
    slope = _slope(parts[0], signature, kernel, store, lower)
    if found is None or slope is None:
        return None
    start_state, step = found
    kernel, slope_lets, slope_value = slope
    dtype = kernel.output.dtype
    group = _group(loops, store, spec.scan.axis, lanes, dtype, env)
    passes = _passes(walk, step, start_state, slope_lets, slope_value, dtype, group)
    return replace(kernel, body=_nest(_grouped(loops, group), passes), cooperative=True)


def _self_read(stmts: tuple[Stmt, ...], out: str) -> tuple[Expr, tuple[Stmt, ...]] | None:
    """(the state before the start, ``stmts`` reading the state from ``Var(STATE)``) where every read of the
    output is the scan's one checked self-read ``Select(inside, out[..t-1..], before)``; else None."""
    reads = {e for s in stmts for e in _expressions(s) for e in walk_expr(e)
             if isinstance(e, Select) and isinstance(e.then, Load) and e.then.array == out}
    if len(reads) != 1:
        return None
    (read,) = reads

    def fix(expr: Expr) -> Expr:
        return Var(STATE, expr.dtype) if expr == read else rebuild_expression(expr, fix)

    step = tuple(map_statement_expressions(s, fix) for s in stmts)
    if any(isinstance(e, Load) and e.array == out for s in step for x in _expressions(s) for e in walk_expr(x)):
        return None
    if any(isinstance(e, Var) and e.name in _bound(stmts) for e in walk_expr(read.orelse)):
        return None  # the state before the start must not depend on the step
    return read.orelse, step


STATE = "tx_h"  # a chunk's running state
PRODUCT = "tx_p"  # a chunk's running product of slopes


def _expressions(stmt: Stmt) -> tuple[Expr, ...]:
    if isinstance(stmt, Let):
        return (stmt.value,)
    if isinstance(stmt, Store):
        return stmt.index + (stmt.value,)
    return ()


def _bound(stmts: tuple[Stmt, ...]) -> set[str]:
    return {s.var for s in stmts if isinstance(s, Let)}


def _slope(part: Spec, signature, kernel: LoopKernel, store: Store, lower) -> \
        tuple[LoopKernel, tuple[Stmt, ...], Expr] | None:
    """(``kernel`` with any size parameter the slope needs added, the slope's Lets, its value) in ``kernel``'s
    names, the slope's positions at ``store``'s; None where its lowering is not a plain elementwise nest."""
    lowered = lower(part, signature, "slope", tile=False, share=False)
    stmts: list[Stmt] = []
    body = lowered.body
    while len(body) and isinstance(body[-1], Loop) and body[-1].parallel:
        stmts += body[:-1]
        body = body[-1].body
    stmts += body[:-1]
    final = body[-1] if body else None
    if not isinstance(final, Store) or final.array != lowered.output.name or \
            not all(isinstance(i, Var) for i in final.index) or len(final.index) != len(store.index) or \
            any(isinstance(s, (Loop, Store)) for s in walk_stmts(tuple(stmts))) or \
            any(not isinstance(s, (Let, If, Accum)) for s in walk_stmts(tuple(stmts))):
        return None
    names: dict[str, str] = {i.name: s.name for i, s in zip(final.index, store.index)}  # type: ignore[union-attr]
    names.update({s.var: f"tx_slope_{s.var}" for s in walk_stmts(tuple(stmts)) if isinstance(s, Let)})
    arrays = {a.name: next((b.name for b in kernel.arrays if b.source == a.source and b.role == "in"), None)
              for a in lowered.arrays if a.role == "in"}
    scalars = {a.name: next((b.name for b in kernel.scalars if b.source == a.source), None)
               for a in lowered.scalars}
    if None in arrays.values() or None in scalars.values():
        return None
    sizes = list(kernel.sizes)
    for size in lowered.sizes:
        same = next((s for s in sizes if s.size == size.size), None)
        if same is None:
            same = replace(size, name=f"n{len(sizes)}")
            if any(s.name == same.name for s in sizes):
                return None
            sizes.append(same)
        names[size.name] = same.name
    names.update(scalars)  # type: ignore[arg-type]

    def rename(expr: Expr) -> Expr:
        if isinstance(expr, Var) and expr.name in names:
            return Var(names[expr.name], expr.dtype)
        if isinstance(expr, Load) and expr.array in arrays:
            return Load(arrays[expr.array], tuple(rename(i) for i in expr.index), expr.dtype)  # type: ignore
        return rebuild_expression(expr, rename)

    def rename_statement(stmt: Stmt) -> Stmt:
        if isinstance(stmt, If):
            return If(rename(stmt.cond), tuple(map(rename_statement, stmt.then)),
                      tuple(map(rename_statement, stmt.orelse)))
        assert isinstance(stmt, (Let, Accum))
        return replace(stmt, var=names.get(stmt.var, stmt.var), value=rename(stmt.value))

    lets = tuple(map(rename_statement, stmts))
    value = cast(rename(final.value), kernel.output.dtype)
    return replace(kernel, sizes=tuple(sizes)), lets, value


def _nest(loops: tuple[Loop, ...], body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    for loop in reversed(loops):
        body = (replace(loop, body=body),)
    return body


@dataclass(frozen=True)
class Group:
    """``width`` consecutive lanes of the result's contiguous last axis in one block (the loop over it, ``lane``,
    replaced by one over groups of ``width``): a warp's threads read whole 32-byte sectors."""

    lane: Loop
    width: int


def _group(loops: tuple[Loop, ...], store: Store, scan_axis: int, lanes: int, dtype: str,
           env: dict[str, int]) -> Group | None:
    """The widest group (a power of two, at most one sector of ``dtype``) that leaves at least ``MIN_BLOCKS``
    blocks, where the result's last axis is a lane; else None (a block per lane)."""
    if scan_axis == len(store.index) - 1:
        return None
    last = store.index[-1]
    lane = next((loop for loop in loops if isinstance(last, Var) and loop.var == last.name), None)
    if lane is None:
        return None
    extent = eval_int(lane.stop, env) - eval_int(lane.start, env)
    width = SECTOR // (4 if dtype == "float32" else 8)
    while width > 1 and (width > extent or lanes // width < MIN_BLOCKS):
        width //= 2
    return Group(lane, width) if width > 1 else None


def _grouped(loops: tuple[Loop, ...], group: Group | None) -> tuple[Loop, ...]:
    """The parallel nest with the grouped lane's loop over its groups."""
    if group is None:
        return loops
    lane, width = group.lane, Const(group.width, INDEX)
    groups = binop("//", binop("+", binop("-", lane.stop, lane.start), Const(group.width - 1, INDEX)), width)
    return tuple(Loop(GROUP, Const(0, INDEX), groups, True, ()) if loop is lane else loop for loop in loops)


def _in_group(group: Group | None, member: Expr, body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    """``body`` for the lane ``member`` of the block's group: the lane's variable bound, ragged groups guarded."""
    if group is None:
        return body
    lane = group.lane
    position = binop("+", lane.start, binop("+", binop("*", Var(GROUP, INDEX), Const(group.width, INDEX)), member))
    return (Let(lane.var, position), If(binop("<", Var(lane.var, INDEX), lane.stop), body))


def _passes(walk: Loop, step: tuple[Stmt, ...], start_state: Expr, slope_lets: tuple[Stmt, ...],
            slope_value: Expr, dtype: str, group: Group | None) -> tuple[Stmt, ...]:
    """The three passes of one block over the steps of ``walk`` (its variable runs upwards, in the order of the
    recurrence; its body is ``step``, the state read from ``Var(STATE)``). The block's work item ``tx_q`` is
    chunk ``tx_q // width`` of lane ``tx_q mod width`` of its group; the shared arrays are indexed by it."""
    index = lambda name: Var(name, INDEX)  # noqa: E731
    width = group.width if group is not None else 1
    chunks = CHUNKS // width
    wide = "float64"  # the slopes' products and the carries: float32's rounding of lam^L, composed over every
    # chunk of a long memory (lam near 1), cost 40x lax.scan's error at T = 16384 (benchmarks/scan_chunks_precision.py)
    one, zero = Const(1.0, wide), cast(Const(0.0, "float64"), dtype)
    state, product = Var(STATE, dtype), Var(PRODUCT, wide)
    steps = binop("-", walk.stop, walk.start)
    length = binop("max", binop("//", binop("+", steps, Const(chunks - 1, INDEX)), Const(chunks, INDEX)),
                   Const(MIN_CHUNK, INDEX))
    count = binop("//", binop("+", steps, binop("-", index("tx_len"), Const(1, INDEX))), index("tx_len"))
    item = index("tx_q")
    member = binop("mod", item, Const(width, INDEX))
    chunk_of = item if width == 1 else binop("//", item, Const(width, INDEX))
    chunk = (Let("tx_lo", binop("+", walk.start, binop("*", chunk_of, index("tx_len")))),
             Let("tx_hi", binop("min", binop("+", index("tx_lo"), index("tx_len")), walk.stop)))
    (mine,) = [s for s in step if isinstance(s, Store)]
    new_state = Let(STATE, mine.value)
    lets = tuple(s for s in step if not isinstance(s, Store))
    items = binop("*", index("tx_n"), Const(width, INDEX))
    first = Loop("tx_q", Const(0, INDEX), items, False, _in_group(group, member, chunk + (
        Let(PRODUCT, one), Let(STATE, zero),
        Loop(walk.var, index("tx_lo"), index("tx_hi"), False, slope_lets + lets + (
            Let("tx_a", slope_value), Let(PRODUCT, binop("*", product, cast(Var("tx_a", dtype), wide))),
            new_state)),
        Store(SLOPE, (item,), product), Store(OFFSET, (item,), cast(state, wide)))), lanes=True)
    carry = Var("tx_in", wide)
    at = binop("+", binop("*", index("tx_c"), Const(width, INDEX)), index("tx_j"))
    compose = Loop("tx_j", Const(0, INDEX), Const(width, INDEX), False, _in_group(group, index("tx_j"), (
        Let("tx_in", cast(start_state, wide)),
        Loop("tx_c", Const(0, INDEX), index("tx_n"), False, (
            Let("tx_local", Load(OFFSET, (at,), wide)),
            Store(OFFSET, (at,), carry),
            Let("tx_in", binop("+", binop("*", Load(SLOPE, (at,), wide), carry), Var("tx_local", wide))))))),
        lanes=True)
    last = Loop("tx_q", Const(0, INDEX), items, False, _in_group(group, member, chunk + (
        Let(STATE, cast(Load(OFFSET, (item,), wide), dtype)),
        Loop(walk.var, index("tx_lo"), index("tx_hi"), False, lets + (new_state, replace(mine, value=state))))),
        lanes=True)
    return (Shared(SLOPE, CHUNKS, wide), Shared(OFFSET, CHUNKS, wide), Let("tx_len", length),
            Let("tx_n", count), first, Barrier(), compose, Barrier(), last)


def is_chunked(kernel: LoopKernel) -> bool:
    """Whether ``kernel`` is a chunked scan (for what describes a schedule)."""
    return kernel.cooperative and any(isinstance(s, Shared) and s.var == OFFSET for s in walk_stmts(kernel.body))


__all__ = ["CHUNKS", "MAX_LANES", "MIN_CHUNK", "chunked_scan", "is_chunked"]
