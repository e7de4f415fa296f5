"""Vector math out of a scalar loop: a serial loop that no vector form takes (its body holds a loop of its own, say)
but whose leading Lets call a libmvec function (``exp`` of a Gaussian kernel's distance) runs in strips of
``STRIP`` iterations, each first computing those Lets for the whole strip in an ``omp simd`` loop (glibc's vector
``expf``, declared by ``c_mvec``) into a small array, then the loop as the IR says, reading them from it.

Every value is the IR's: the precomputed Lets read only the loop variable, names the loop never assigns, other such
Lets and arrays it never stores to, so computing them ahead is exact; the sums keep their order. Only the function
differs: the library's vector clone, within 4 ulp, as in every vectorised loop calling it (IEEE specials included:
NaN, infinities and -0 go through as the scalar function's).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from tullax.compiler.loops import (
    FLOATS,
    INDEX,
    Accum,
    Call,
    If,
    Let,
    Load,
    Loop,
    Store,
    Var,
    binop,
    expr_vars,
    walk_expr,
    walk_stmts,
)
from tullax.printers.base import LoopPrinter
from tullax.printers.clike import CLikePrinter, CPlace
from tullax.spec.functions import FUNCTIONS

STRIP = 64  # iterations per strip: a few vectors of any width, 256 bytes of float32 per precomputed Let


@dataclass(frozen=True)
class Strip:
    """What a strip precomputes: ``lets`` (in order; those in ``stored`` are kept in an array per strip, the rest
    are their operands, recomputed in the vector loop)."""

    lets: tuple[Let, ...]
    stored: frozenset[str]


def calls_libmvec(expr) -> bool:
    """Whether ``expr`` calls a function glibc's libmvec has a vector clone of."""
    return any(isinstance(n, Call) and n.fn in FUNCTIONS and FUNCTIONS[n.fn].libmvec for n in walk_expr(expr))


def bound_counts(stmts: list) -> dict[str, int]:
    """How often each name is bound (by a Let, an Accum or a Loop) among ``stmts``."""
    bound: dict[str, int] = {}
    for stmt in stmts:
        if isinstance(stmt, (Let, Accum, Loop)):
            bound[stmt.var] = bound.get(stmt.var, 0) + 1
    return bound


def ready_lets(stmts, var: str, bound: dict[str, int], stored: set[str]) -> dict[str, Let]:
    """The Lets among ``stmts`` (a loop's leading statements) computable ahead of their iteration of loop ``var``:
    bound once, reading no array the loop stores to, and no name the loop binds but other such Lets."""
    ready: dict[str, Let] = {}
    for let in stmts:
        if not isinstance(let, Let) or bound[let.var] != 1:
            continue
        if not any(isinstance(n, Load) and n.array in stored for n in walk_expr(let.value)) and all(
                name in ready or name not in bound for name in expr_vars(let.value) - {var}):
            ready[let.var] = let
    return ready


def lets_needed(ready: dict[str, Let], names: set[str]) -> tuple[Let, ...]:
    """The Lets of ``ready`` that ``names`` need, directly or through each other, in order."""
    needed = set(names) & set(ready)
    for let in reversed(list(ready.values())):
        if let.var in needed:
            needed |= expr_vars(let.value) & set(ready)
    return tuple(let for let in ready.values() if let.var in needed)


def math_strip_plan(loop: Loop) -> Strip | None:
    """The ``Strip`` of ``loop``, or None where none applies: a serial loop that holds a loop of its own (the loops
    that print as vector lanes hold none), a leading float Let calling a libmvec function, and no statement but Let,
    Accum, Store, Loop and If anywhere in it."""
    if loop.parallel or loop.reduce_parallel or loop.lanes:
        return None
    stmts = list(walk_stmts(loop.body))
    if not all(isinstance(s, (Let, Accum, Store, Loop, If)) for s in stmts) or not any(isinstance(s, Loop)
                                                                                       for s in stmts):
        return None
    count = next((n for n, s in enumerate(loop.body) if not isinstance(s, Let)), len(loop.body))
    ready = ready_lets(loop.body[:count], loop.var, bound_counts(stmts),
                       {s.array for s in stmts if isinstance(s, Store)})
    stored = {let.var for let in ready.values() if let.value.dtype in FLOATS and calls_libmvec(let.value)}
    if not stored:
        return None
    return Strip(lets_needed(ready, stored), frozenset(stored))


def math_strip_loop(printer: CLikePrinter, loop: Loop, place: CPlace, plan: Strip) -> list[str]:
    """``loop`` in strips (``Strip``): per strip the vector loop of the stored Lets, then the loop itself with
    each stored Let read from its strip's array."""
    pad, step = printer.indent * place.depth, printer.indent
    v, start, stop = loop.var, printer.expr(loop.start), printer.expr(loop.stop)
    begin, end = f"{v}_sb", f"{v}_se"
    lines = [f"{pad}for (tx_i64 {begin} = {start}; {begin} < {stop}; {begin} += {STRIP}) {{",
             f"{pad}{step}const tx_i64 {end} = tx_min_i64({begin} + {STRIP}, {stop});"]
    lines += [f"{pad}{step}{printer.type_name(let.value.dtype)} {let.var}_strip[{STRIP}];"
              for let in plan.lets if let.var in plan.stored]
    lines += [f"{pad}{step}#pragma omp simd", f"{pad}{step}for (tx_i64 {v} = {begin}; {v} < {end}; ++{v}) {{"]
    for let in plan.lets:
        value = printer.expr(let.value)
        lines.append(f"{pad}{step * 2}{let.var}_strip[{v} - {begin}] = {value};" if let.var in plan.stored else
                     f"{pad}{step * 2}const {printer.type_name(let.value.dtype)} {let.var} = {value};")
    lines.append(f"{pad}{step}}}")
    offset = binop("-", Var(v, INDEX), Var(begin, INDEX))
    body = tuple(Let(s.var, Load(f"{s.var}_strip", (offset,), s.value.dtype))
                 if isinstance(s, Let) and s.var in plan.stored else s for s in loop.body)
    inner = Loop(v, Var(begin, INDEX), Var(end, INDEX), False, body)
    # the plain loop (no strip again, no other vector form); the loops in its body print as they would
    lines += LoopPrinter.loop(printer, inner, replace(place, depth=place.depth + 1))
    return lines + [f"{pad}}}"]


__all__ = ["STRIP", "Strip", "bound_counts", "calls_libmvec", "lets_needed", "math_strip_loop", "math_strip_plan",
           "ready_lets"]
