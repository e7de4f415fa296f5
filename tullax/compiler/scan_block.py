"""A recurrence whose state mixes its lanes (``h[b,t,n] := W[n,m]*h[b,t-1,m] |> tanh(_ + x[b,t,n])``) as a
GPU schedule: ONE block per batch row (per point of the parallel nest), walking ``t``; at each step the block's
threads share the positions of the row (the mixing loop becomes a ``lanes`` loop, each thread its positions
``n``), then wait for each other (a ``Barrier``): step t+1 reads every position of step t.

The scan kernel (``tullax.compiler.scan.lower_scan``, GPU form: the lanes parallel, ``t`` and the mixing loops
sequential inside each lane) gives one thread the whole row, its mat-vec serial at each step. Here the row is
spread over a block, and the state rows the step reads live in the block's shared memory (a ``Shared`` array of
``depth + 1`` rows, position p in slot ``p mod (depth + 1)``: step t writes slot t while reading the ``depth``
slots before it, and the one barrier per step keeps a slot from being overwritten before all have read it); the
output is written too. Where the rows do not fit the static shared memory, or the state mixes along more than
one axis, the reads stay in global memory (the block wrote them before the barrier, so they are visible to it).

A lane-wise recurrence (no mixing loop) keeps the scan kernel's form, a thread per lane walking ``t``.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from tullax.compiler.loops import (
    INDEX,
    Barrier,
    Const,
    Expr,
    Let,
    Load,
    Loop,
    LoopKernel,
    Shared,
    Stmt,
    Store,
    Var,
    binop,
    eval_int,
    parallel_nest,
    walk_stmts,
)
from tullax.compiler.scan import map_statement_expressions, rebuild_expression
from tullax.errors import TullaxError
from tullax.spec.ir import Spec

SHARED_BYTES = 40 * 1024  # of the 48 KiB of static shared memory: the cooperative kernels' tx_red takes 512 B
STATE_ROW = "tx_row"  # the Shared array of the state rows the steps read


def block_per_row(kernel: LoopKernel, spec: Spec, sizes: Mapping[str, int],
                  shared_bytes: int = SHARED_BYTES) -> LoopKernel | None:
    """``kernel`` (the GPU scan kernel of the recurrence ``spec``) as a block per row with a barrier per step,
    or None where the state does not mix its lanes (or the kernel is not the plain scan nest). ``sizes``: the
    call's size parameters (the state rows in shared memory are sized by them)."""
    if spec.scan is None:
        return None
    loops, body = parallel_nest(kernel)
    if not loops or len(body) != 1 or not isinstance(body[0], Loop) or body[0].parallel:
        return None
    t_loop = body[0]
    out = kernel.output.name
    stores = [s for s in walk_stmts(t_loop.body) if isinstance(s, Store) and s.array == out]
    if len(stores) != 1 or not all(isinstance(i, Var) for i in stores[0].index):
        return None
    store = stores[0]
    position = [i.name for i in store.index]  # type: ignore[union-attr]
    lanes = {loop.var for loop in loops}
    t_var = position[spec.scan.axis]
    mixing = [s for s in t_loop.body if isinstance(s, Loop) and s.var in position]
    if len(mixing) != 1 or any(not isinstance(s, (Let, Loop)) for s in t_loop.body) or \
            set(position) - lanes - {t_var} - {v.var for v in _nest(mixing[0])}:
        return None
    mix = mixing[0]
    row = _shared_row(kernel, spec, store, mix, sizes, shared_bytes)
    if row is not None:
        mix = row[1]
    step = tuple(replace(mix, lanes=True) if s is mixing[0] else s for s in t_loop.body) + (Barrier(),)
    nest: tuple[Stmt, ...] = ((row[0],) if row is not None else ()) + (replace(t_loop, body=step),)
    for loop in reversed(loops):
        nest = (replace(loop, body=nest),)
    return replace(kernel, body=nest, cooperative=True)


def _nest(loop: Loop) -> list[Loop]:
    """``loop`` and the loops nested directly inside it, one in the other (the mixing axes, outermost first)."""
    found = [loop]
    while len(found[-1].body) == 1 and isinstance(found[-1].body[0], Loop):
        found.append(found[-1].body[0])
    return found


def _shared_row(kernel: LoopKernel, spec: Spec, store: Store, mix: Loop, sizes: Mapping[str, int],
                limit: int) -> tuple[Shared, Loop] | None:
    """(the Shared array, ``mix`` reading the previous rows from it and writing its row to it as well as to the
    output), where the state mixes along one axis, the store is a statement of ``mix`` itself and ``depth + 1``
    rows fit ``limit`` bytes; else None."""
    scan = spec.scan
    assert scan is not None
    axes = [k for k, i in enumerate(store.index) if i == Var(mix.var, i.dtype)]
    if len(axes) != 1 or len(_nest(mix)) != 1 or store not in mix.body:
        return None
    axis = axes[0]
    try:
        length = eval_int(mix.stop, dict(sizes)) - eval_int(mix.start, dict(sizes))
    except (TullaxError, KeyError):
        return None
    slots = scan.depth + 1
    if length <= 0 or slots * length * 8 > limit:  # 8 bytes an element: any float type fits
        return None
    out = kernel.output.name

    def where(index: tuple[Expr, ...]) -> Expr:
        slot = binop("mod", index[scan.axis], Const(slots, INDEX))
        return binop("+", binop("*", slot, Const(length, INDEX)), binop("-", index[axis], mix.start))

    def from_row(expr: Expr) -> Expr:
        if isinstance(expr, Load) and expr.array == out:
            return Load(STATE_ROW, (where(tuple(from_row(i) for i in expr.index)),), expr.dtype)
        return rebuild_expression(expr, from_row)

    body: list[Stmt] = []
    for stmt in mix.body:
        if stmt is store:
            value = Var("tx_state", store.value.dtype)
            body += [Let(value.name, from_row(store.value)), replace(store, value=value),
                     Store(STATE_ROW, (where(store.index),), value)]
        else:
            body.append(map_statement_expressions(stmt, from_row))
    return Shared(STATE_ROW, slots * length, kernel.output.dtype), replace(mix, body=tuple(body))


__all__ = ["SHARED_BYTES", "block_per_row"]
