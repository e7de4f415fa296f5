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
    const,
    eval_int,
    expr_vars,
    map_loads,
    parallel_nest,
    walk_expr,
    walk_stmts,
)
from tullax.compiler.rewrite import substitute, substitute_stmts

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

    def runs_along(array: str, index: tuple[Expr, ...], dtype: str) -> bool:
        shape = lengths.get(array)
        return (array in arrays and shape is not None and index[-1] == along and LANES.get(dtype) == lanes
                and all(inner.var not in expr_vars(i) for i in index[:-1]) and shape[-1] % lanes == 0)

    if not runs_along(store.array, store.index, out.dtype):
        return None
    reads: dict[Load, int] = {}
    for stmt in body:
        for part in walk_expr(stmt.value):  # type: ignore[union-attr]
            if isinstance(part, Load) and inner.var in expr_vars(part):
                if not runs_along(part.array, part.index, part.dtype):
                    return None
                reads.setdefault(part, len(reads))
    guarded = [part for stmt in body for select in walk_expr(stmt.value)  # type: ignore[union-attr]
               if isinstance(select, Select) for branch in (select.then, select.orelse)
               for part in walk_expr(branch) if isinstance(part, Load) and part in reads]
    if guarded:  # a checked read is in range only where its check holds: never read ahead of it in a vector
        return None
    if not reads:  # nothing to read in vectors: the store alone gains little, keep the plain kernel
        return None
    names = {load: tuple(f"{inner.var}_{n}_{k}" for k in range(lanes)) for load, n in reads.items()}
    lets = {s.var: s.value.dtype for s in body if isinstance(s, Let)}

    def lane(k: int, vector: bool) -> tuple[tuple[Stmt, ...], Expr]:
        """Lane ``k``'s Lets and stored value: its inputs the k-th part of each vector, or scalar reads at v + k."""
        renamed: dict[str, Expr] = {var: Var(f"{var}_{k}", dtype) for var, dtype in lets.items()}
        stmts: list[Stmt] = []
        for stmt in body:
            value = stmt.value
            if vector:
                value = map_loads(value, lambda load: Var(names[load][k], load.dtype) if load in names else load)
                if inner.var in expr_vars(value):  # v outside a vector read: no such kernel qualifies
                    raise AssertionError(value)
            else:
                value = substitute(value, {inner.var: binop("+", along, const(k))})
            value = substitute(value, renamed)
            if isinstance(stmt, Let):
                stmts.append(Let(renamed[stmt.var].name, value))  # type: ignore[union-attr]
            else:
                return tuple(stmts), value
        raise AssertionError(body)

    try:
        vector_lanes = [lane(k, True) for k in range(lanes)]
    except AssertionError:
        return None
    vector: list[Stmt] = [VectorLoad(names[load], load.array, load.index, load.dtype) for load in reads]
    for stmts, _ in vector_lanes:
        vector += stmts
    vector.append(VectorStore(store.array, store.index, tuple(value for _, value in vector_lanes), out.dtype))
    scalar: list[Stmt] = []
    for k in range(lanes):
        stmts, value = lane(k, False)
        scalar += stmts
        scalar.append(Store(store.array, store.index[:-1] + (binop("+", along, const(k)),), value, "set"))
    run = Var(f"{inner.var}v", INDEX)  # the run's position: v = run * lanes
    per_run = (Let(inner.var, binop("*", run, const(lanes))),
               If(Var(ALIGNED, BOOL), tuple(vector), substitute_stmts(tuple(scalar), {})))
    nest: Stmt = Loop(run.name, const(0), binop("//", inner.stop, const(lanes)), True, per_run)
    for loop in reversed(loops[:-1]):
        nest = replace(loop, body=(nest,))
    return replace(kernel, body=(nest,), vector=lanes)


def vector_arrays(kernel: LoopKernel) -> tuple[str, ...]:
    """The kernel arrays a vector-lane kernel reads or writes in vectors (what ``Var(ALIGNED)`` tests)."""
    found = [s.array for s in walk_stmts(kernel.body) if isinstance(s, (VectorLoad, VectorStore))]
    return tuple(dict.fromkeys(found))


__all__ = ["ENV", "LANES", "vector_arrays", "vectorize"]
