"""Terms a sequential loop recomputes at every iteration, computed once before it (a scan program's step,
``tullax.compiler.scan_program``).

Inside the ``t`` loop of issue 7024's step, ``softplus(W1[i+1,j])`` and ``softplus(W2[j])`` read only inputs,
at positions of loops inside the step whose bounds are sizes: they are the same at every step. Each such term
(one holding a function call: the costly ones) becomes a ``Buffer`` over the loops it varies along, filled by a
copy of those loops before the ``t`` loop, and the step loads it. The same expression is evaluated in the same
precision, so the results are bitwise those of the kernel without hoisting.
"""
from __future__ import annotations

from dataclasses import replace

from tullax.compiler.loops import (
    INDEX,
    Accum,
    Buffer,
    Call,
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
    children,
    expr_vars,
    walk_expr,
)
from tullax.compiler.scan import rebuild_expression


def hoist_invariants(body: tuple[Stmt, ...], sizes: frozenset[str], inputs: frozenset[str]
                     ) -> tuple[tuple[Stmt, ...], tuple[Stmt, ...]]:
    """(statements to run once before the loop whose body is ``body``, the new body). ``sizes``: the size and
    scalar parameters; ``inputs``: the arrays only read. A term's buffer counts towards the row buffers' share
    of a thread's stack (``Fused.check``: past it the program runs unfused). A term qualifies when its
    variables are sizes and the variables of loops inside ``body`` whose bounds are sizes and constants."""
    hoisted: dict[tuple, tuple[str, Expr, tuple[Loop, ...]]] = {}

    def term(expr: Expr, loops: tuple[Loop, ...]) -> Expr:
        allowed = {loop.var: loop for loop in loops}
        if _invariant(expr, sizes, inputs, allowed) and any(isinstance(n, Call) for n in walk_expr(expr)) \
                and not isinstance(expr, (Var, Const, Load)):
            used = tuple(loop for loop in loops if loop.var in expr_vars(expr))
            key = (expr, tuple((loop.var, loop.start, loop.stop) for loop in used))  # a name reused: other bounds
            if key not in hoisted:
                hoisted[key] = (f"h{len(hoisted)}", expr, used)
            name = hoisted[key][0]
            return Load(name, (_flat(used),), expr.dtype)
        return rebuild_expression(expr, lambda e: term(e, loops))

    def stmt(s: Stmt, loops: tuple[Loop, ...]) -> Stmt:
        if isinstance(s, Loop):
            inner = loops + ((s,) if expr_vars(s.start) | expr_vars(s.stop) <= sizes else ())
            return replace(s, body=tuple(stmt(x, inner) for x in s.body))
        if isinstance(s, If):
            return replace(s, cond=term(s.cond, loops), then=tuple(stmt(x, loops) for x in s.then),
                           orelse=tuple(stmt(x, loops) for x in s.orelse))
        if isinstance(s, (Let, Accum)):
            return replace(s, value=term(s.value, loops))
        if isinstance(s, Store):
            return replace(s, value=term(s.value, loops))
        return s

    new = tuple(stmt(s, ()) for s in body)
    pre: list[Stmt] = []
    for name, expr, used in hoisted.values():
        fill: tuple[Stmt, ...] = (Store(name, (_flat(used),), expr),)
        for loop in reversed(used):
            fill = (replace(loop, parallel=False, body=fill),)
        pre = [Buffer(name, _length(used), expr.dtype)] + pre + list(fill)
    return tuple(s for s in pre if isinstance(s, Buffer)) + tuple(s for s in pre if not isinstance(s, Buffer)), new


def _invariant(expr: Expr, sizes: frozenset[str], inputs: frozenset[str], loops: dict[str, Loop]) -> bool:
    for node in walk_expr(expr):
        if isinstance(node, Var) and node.name not in sizes and node.name not in loops:
            return False
        if isinstance(node, Load) and node.array not in inputs:
            return False
        if isinstance(node, Select) and not all(_invariant(c, sizes, inputs, loops) for c in children(node)):
            return False
    return True


def _length(loops: tuple[Loop, ...]) -> Expr:
    length: Expr = Const(1, INDEX)
    for loop in loops:
        length = binop("*", length, binop("max", binop("-", loop.stop, loop.start), Const(0, INDEX)))
    return length


def _flat(loops: tuple[Loop, ...]) -> Expr:
    flat: Expr = Const(0, INDEX)
    for loop in loops:
        flat = binop("+", binop("*", flat, binop("-", loop.stop, loop.start)),
                     binop("-", Var(loop.var, INDEX), loop.start))
    return flat


__all__ = ["hoist_invariants"]
