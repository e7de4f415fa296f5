"""Vector lanes for elementwise GPU kernels: each thread computes a run of 4 (float32) or 2 (float64) consecutive
outputs along the output's last (contiguous) axis, reading each input that runs along that axis as ONE 16-byte
vector and writing the run as one (CUDA ``float4``/``double2``: LDG.E.128/STG.E.128), instead of one 4- or
8-byte element per thread: a quarter of the load and store instructions and requests per element.

Narrow by design. A kernel qualifies when, at the call's sizes:

* it is plain (no block tile, no cooperation, no split, no scatter) and its innermost parallel loop ``v`` starts
  at 0 with an extent that is a multiple of the lanes (else the scalar kernel: ragged extents stay scalar);
* the per-element body is ``Let``s and one ``set`` ``Store`` (no reduction, no guard) of a float output whose
  last index is ``v`` (and no other index mentions it);
* every load that mentions ``v`` reads the element at ``v`` along the array's last axis (no other index mentions
  it), in the output's precision; other loads are broadcasts (read once per lane, the same address);
* every array read or written in vectors has a last axis whose length is a multiple of the lanes (so each run
  starts at a flat position that is a multiple of the lanes).

Alignment: XLA's device buffers are aligned (256 bytes for what buffer assignment allocates, 16 for entry
parameters), but a kernel must not trust that of every caller: the vector path stands under
``If(Var(ALIGNED))``, which the printer binds to a test of the arrays' addresses (uniform over the grid, so no
divergence), and the else runs the same lanes in scalar reads.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from tullax.compiler.loops import (
    ALIGNED,
    BOOL,
    INDEX,
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
    VectorLoad,
    VectorStore,
    binop,
    children,
    const,
    eval_int,
    expr_vars,
    map_loads,
    parallel_nest,
    walk_expr,
    walk_stmts,
    with_children,
)
from tullax.compiler.rewrite import substitute

LANES = {"float32": 4, "float64": 2}  # 16 bytes of each
ENV = "TULLAX_CUDA_VECTORS"  # 0: never vector lanes


def vectorize(kernel: LoopKernel, sizes: Mapping[str, int],
              lengths: Mapping[str, tuple[int, ...]]) -> LoopKernel | None:
    """``kernel`` with vector lanes (module docstring), or None where it does not qualify at these ``sizes``
    (size parameter -> value) and array shapes (``lengths``: kernel array name -> shape)."""
    if kernel.tile is not None or kernel.cooperative or kernel.split or kernel.is_scatter or kernel.vector:
        return None
    loops, body = parallel_nest(kernel)
    if not loops or not body or not isinstance(body[-1], Store) or not all(isinstance(s, Let) for s in body[:-1]):
        return None
    inner, store = loops[-1], body[-1]
    arrays = {a.name: a for a in kernel.arrays}
    out = arrays.get(store.array)
    lanes = LANES.get(out.dtype) if out is not None else None
    if lanes is None or store.mode != "set" or inner.start != const(0):
        return None
    extent = eval_int(inner.stop, dict(sizes))
    if extent <= 0 or extent % lanes:
        return None
    along = Var(inner.var, INDEX)
    moving = {inner.var}  # v and the Lets that move with it

    def runs_along(array: str, index: tuple[Expr, ...], dtype: str) -> bool:
        shape = lengths.get(array)
        return (array in arrays and shape is not None and index[-1] == along and LANES.get(dtype) == lanes
                and not any(expr_vars(i) & moving for i in index[:-1]) and shape[-1] % lanes == 0)

    # Lets that do not move with v run once per run (a gather's row index ix[b]); the rest once per lane
    invariant: list[Let] = []
    variant: list[Stmt] = []
    for stmt in body[:-1]:
        assert isinstance(stmt, Let)
        if expr_vars(stmt.value) & moving:
            variant.append(stmt)
            moving.add(stmt.var)
        else:
            invariant.append(stmt)
    work = (*variant, store)
    if not runs_along(store.array, store.index, out.dtype):
        return None
    if not any(isinstance(part, Load) and inner.var in expr_vars(part)
               for stmt in work for part in walk_expr(stmt.value)):  # type: ignore[union-attr]
        return None  # nothing to read in vectors: the store alone gains little, keep the plain kernel
    # a checked read (a gather's W[ix[b],d] under ix[b]'s range check) is read in a vector only under its check
    # as an If, each branch its own lanes; its condition must not move with v
    checks: list[Expr] = []
    for stmt in work:
        for select in walk_expr(stmt.value):  # type: ignore[union-attr]
            if isinstance(select, Select) and any(
                    isinstance(part, Load) and inner.var in expr_vars(part)
                    for branch in (select.then, select.orelse) for part in walk_expr(branch)):
                if expr_vars(select.cond) & moving:
                    return None
                checks.append(select.cond)
    checks = list(dict.fromkeys(checks))
    if len(checks) > 2:
        return None
    lets = {s.var: s.value.dtype for s in variant if isinstance(s, Let)}

    def lanes_of(stmts: tuple[Stmt, ...], k: int, reads: Mapping[Load, tuple[str, ...]] | None
                 ) -> tuple[tuple[Stmt, ...], Expr]:
        """Lane ``k``'s Lets and stored value: its inputs the k-th part of each vector (``reads``), or (None)
        scalar reads at v + k."""
        renamed: dict[str, Expr] = {var: Var(f"{var}_{k}", dtype) for var, dtype in lets.items()}
        found: list[Stmt] = []
        for stmt in stmts:
            value = stmt.value  # type: ignore[union-attr]
            if reads is not None:
                value = map_loads(value, lambda load: Var(reads[load][k], load.dtype) if load in reads else load)
            else:
                value = substitute(value, {inner.var: binop("+", along, const(k))})
            value = substitute(value, renamed)
            if isinstance(stmt, Let):
                found.append(Let(renamed[stmt.var].name, value))  # type: ignore[union-attr]
            else:
                return tuple(found), value
        raise AssertionError(stmts)

    def vector_block(stmts: tuple[Stmt, ...], checks: list[Expr], tag: str) -> tuple[Stmt, ...] | None:
        """``stmts`` (the variant Lets and the Store) in vectors, unswitched over ``checks``; None where some
        read does not run along v, or v is used outside a vector read."""
        if checks:
            then = vector_block(_decided(stmts, checks[0], True), checks[1:], tag + "t")
            orelse = vector_block(_decided(stmts, checks[0], False), checks[1:], tag + "f")
            return None if then is None or orelse is None else (If(checks[0], then, orelse),)
        loads: list[Load] = []
        for stmt in stmts:
            for part in walk_expr(stmt.value):  # type: ignore[union-attr]
                if isinstance(part, Load) and inner.var in expr_vars(part):
                    if not runs_along(part.array, part.index, part.dtype):
                        return None
                    loads.append(part)
        for stmt in stmts:  # a read still under a Select is in range only where its check holds: never ahead of it
            for select in walk_expr(stmt.value):  # type: ignore[union-attr]
                if isinstance(select, Select) and any(part in loads for branch in (select.then, select.orelse)
                                                      for part in walk_expr(branch)):
                    return None
        reads = {load: tuple(f"{inner.var}{tag}_{n}_{k}" for k in range(lanes))
                 for n, load in enumerate(dict.fromkeys(loads))}
        found: list[Stmt] = [VectorLoad(names, load.array, load.index, load.dtype) for load, names in reads.items()]
        # a broadcast (a load that does not move with v, outside any check) is read once for all lanes
        checked = {part for stmt in stmts for select in walk_expr(stmt.value)  # type: ignore[union-attr]
                   if isinstance(select, Select) for branch in (select.then, select.orelse)
                   for part in walk_expr(branch)}
        broadcasts = [part for stmt in stmts for part in walk_expr(stmt.value)  # type: ignore[union-attr]
                      if isinstance(part, Load) and part not in checked and not expr_vars(part) & moving]
        shared = {load: Var(f"{inner.var}{tag}_b{n}", load.dtype) for n, load in enumerate(dict.fromkeys(broadcasts))}
        found += [Let(var.name, load) for load, var in shared.items()]
        stmts = tuple(replace(stmt, value=map_loads(stmt.value, lambda load: shared.get(load, load)))  # type: ignore
                      for stmt in stmts)
        values = []
        for k in range(lanes):
            lets_k, value = lanes_of(stmts, k, reads)
            if any(inner.var in expr_vars(e) for e in (value, *(s.value for s in lets_k))):  # type: ignore
                return None  # v outside a vector read
            found += lets_k
            values.append(value)
        return (*found, VectorStore(store.array, store.index, tuple(values), out.dtype))

    vector = vector_block(work, checks, "")
    if vector is None:
        return None
    scalar: list[Stmt] = []
    for k in range(lanes):
        stmts, value = lanes_of(work, k, None)
        scalar += stmts
        scalar.append(Store(store.array, store.index[:-1] + (binop("+", along, const(k)),), value, "set"))
    run = Var(f"{inner.var}v", INDEX)  # the run's position: v = run * lanes
    per_run = (Let(inner.var, binop("*", run, const(lanes))), *invariant,
               If(Var(ALIGNED, BOOL), vector, tuple(scalar)))
    nest: Stmt = Loop(run.name, const(0), binop("//", inner.stop, const(lanes)), True, per_run)
    for loop in reversed(loops[:-1]):
        nest = replace(loop, body=(nest,))
    return replace(kernel, body=(nest,), vector=lanes)


def _decided(stmts: tuple[Stmt, ...], check: Expr, holds: bool) -> tuple[Stmt, ...]:
    """``stmts`` with every ``Select`` on ``check`` replaced by the branch ``holds`` picks."""
    def decide(expr: Expr) -> Expr:
        if isinstance(expr, Select) and expr.cond == check:
            return decide(expr.then if holds else expr.orelse)
        parts = children(expr)
        return with_children(expr, tuple(decide(p) for p in parts)) if parts else expr

    return tuple(replace(s, value=decide(s.value)) for s in stmts)  # type: ignore[union-attr]


def vector_arrays(kernel: LoopKernel) -> tuple[str, ...]:
    """The kernel arrays a vector-lane kernel reads or writes in vectors (what ``Var(ALIGNED)`` tests)."""
    found = [s.array for s in walk_stmts(kernel.body) if isinstance(s, (VectorLoad, VectorStore))]
    return tuple(dict.fromkeys(found))


__all__ = ["ENV", "LANES", "vector_arrays", "vectorize"]
