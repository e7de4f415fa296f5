"""Vector math across a serial loop whose short inner sum calls a libmvec function (issue 7024's hidden layer,
``a[j] = Σ_i sigmoid(w0[j]*y + w[i,j]*u[i])``: 12 units of 3 terms, every step of a scan): no vector form takes
the inner sum (3 iterations), so each ``expf`` would run scalar. Here the outer loop runs in strips of ``STRIP``
iterations, and each strip first computes the inner sum's terms for every inner iteration and the whole strip, in
an ``omp simd`` loop over the OUTER variable (glibc's vector ``expf``, declared by ``c_mvec``), into a small array
(inner iteration major); then the loop runs as the IR says, its inner sum adding the terms read from that array.

Only where the inner loop has at most ``NEST`` iterations (a runtime check; otherwise the loop as written): the
array stays ``NEST * STRIP`` elements. Every value is the IR's: a term reads only the two loop variables, names
the outer loop never assigns, leading Lets of the outer loop that are computable ahead (``c_math_strips``' rule)
and arrays the outer loop never stores to; the sums add the same terms in the same order. Only the function
differs: the library's vector clone, within 4 ulp, as in every vectorised loop calling it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from tullax.compiler.loops import (
    INDEX,
    Accum,
    Const,
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
from tullax.printers.c_math_strips import bound_counts, calls_libmvec, lets_needed, ready_lets
from tullax.printers.clike import CLikePrinter, CPlace

STRIP = 16  # outer iterations per strip: two vectors of float32
NEST = 8  # the most inner iterations a strip holds terms for


@dataclass(frozen=True)
class NestStrip:
    """The inner loop (``position`` in the outer loop's body), its term (the Accum's value) and the outer
    loop's leading Lets the term needs (in order)."""

    position: int
    lets: tuple[Let, ...]
    inner: Loop
    term: Accum


def nest_strip_plan(loop: Loop) -> NestStrip | None:
    """The ``NestStrip`` of a serial ``loop`` whose body holds, after its leading Lets, a serial loop of Lets and
    one float ``+`` Accum whose value calls a libmvec function, with bounds the outer loop does not change; None
    where none applies."""
    if loop.parallel or loop.reduce_parallel or loop.lanes or loop.registers:
        return None
    stmts = list(walk_stmts(loop.body))
    if not all(isinstance(s, (Let, Accum, Store, Loop, If)) for s in stmts):
        return None
    position = next((k for k, s in enumerate(loop.body) if isinstance(s, Loop)), None)
    if position is None:
        return None
    inner = loop.body[position]
    if inner.parallel or inner.reduce_parallel or inner.lanes or inner.registers or not inner.body:
        return None
    *inner_lets, term = inner.body
    if not isinstance(term, Accum) or term.op != "+" or term.value.dtype not in ("float32", "float64") or not all(
            isinstance(s, Let) for s in inner_lets):
        return None
    values = [s.value for s in inner_lets] + [term.value]
    if not any(calls_libmvec(value) for value in values):
        return None
    bound = bound_counts(stmts)
    if (expr_vars(inner.start) | expr_vars(inner.stop)) & (set(bound) | {loop.var}):
        return None
    stored = {s.array for s in stmts if isinstance(s, Store)}
    ready = ready_lets(loop.body[:position], loop.var, bound, stored)
    own = {let.var for let in inner_lets}
    if any(bound[name] != 1 for name in own):
        return None
    for value in values:
        if any(isinstance(n, Load) and n.array in stored for n in walk_expr(value)):
            return None
        if not all(name in ready or name in own or name not in bound
                   for name in expr_vars(value) - {loop.var, inner.var}):
            return None
    lets = lets_needed(ready, set().union(*(expr_vars(v) for v in values)))
    return NestStrip(position, lets, inner, term)


def nest_strip_loop(printer: CLikePrinter, loop: Loop, place: CPlace, plan: NestStrip) -> list[str]:
    """``loop`` in strips (``NestStrip``) where its inner loop is short, else as written."""
    pad, step = printer.indent * place.depth, printer.indent
    v, w = loop.var, plan.inner.var
    begin, end, count, terms = f"{v}_nb", f"{v}_ne", f"{w}_nn", f"{w}_terms"
    start, stop = printer.expr(loop.start), printer.expr(loop.stop)
    inner_start = printer.expr(plan.inner.start)
    dtype = plan.term.value.dtype
    lines = [f"{pad}{{", f"{pad}{step}const tx_i64 {count} = {printer.expr(plan.inner.stop)} - {inner_start};",
             f"{pad}{step}if ({count} <= {NEST}) {{"]
    deep = pad + step * 2
    lines += [f"{deep}for (tx_i64 {begin} = {start}; {begin} < {stop}; {begin} += {STRIP}) {{",
              f"{deep}{step}const tx_i64 {end} = tx_min_i64({begin} + {STRIP}, {stop});",
              f"{deep}{step}{printer.type_name(dtype)} {terms}[{NEST * STRIP}];",
              f"{deep}{step}for (tx_i64 {w} = {inner_start}; {w} < {inner_start} + {count}; ++{w}) {{",
              f"{deep}{step * 2}#pragma omp simd",
              f"{deep}{step * 2}for (tx_i64 {v} = {begin}; {v} < {end}; ++{v}) {{"]
    body = deep + step * 3
    for let in plan.lets + tuple(plan.inner.body[:-1]):
        lines.append(f"{body}const {printer.type_name(let.value.dtype)} {let.var} = {printer.expr(let.value)};")
    slot = binop("+", binop("*", binop("-", Var(w, INDEX), plan.inner.start), Const(STRIP, INDEX)),
                 binop("-", Var(v, INDEX), Var(begin, INDEX)))
    lines += [f"{body}{terms}[{printer.expr(slot)}] = {printer.expr(plan.term.value)};",
              f"{deep}{step * 2}}}", f"{deep}{step}}}"]
    inner = replace(plan.inner, body=(replace(plan.term, value=Load(terms, (slot,), dtype)),))
    strip = Loop(v, Var(begin, INDEX), Var(end, INDEX), False,
                 loop.body[:plan.position] + (inner,) + loop.body[plan.position + 1:])
    lines += LoopPrinter.loop(printer, strip, replace(place, depth=place.depth + 3))
    lines += [f"{deep}}}", f"{pad}{step}}} else {{"]
    lines += LoopPrinter.loop(printer, loop, replace(place, depth=place.depth + 2))
    return lines + [f"{pad}{step}}}", f"{pad}}}"]


def vector_math(lets, accums) -> bool:
    """Whether a sum loop's Lets or terms call a libmvec function."""
    return any(calls_libmvec(s.value) for s in (*lets, *accums))


def vector_rest(printer: CLikePrinter, rest: Loop, width: int, private: str, place: CPlace) -> list[str]:
    """The remainder of a sum on vector lanes (fewer than ``width`` iterations) whose terms call a libmvec
    function: the terms into an array by an ``omp simd`` loop (the vector clone), then added one by one in order,
    as the scalar loop adds them (issue 7024's output layer: 12 units, 8 on lanes, 4 scalar ``expf`` every step)."""
    pad, step = printer.indent * place.depth, printer.indent
    v, start, stop = rest.var, printer.expr(rest.start), printer.expr(rest.stop)
    lets = [s for s in rest.body if isinstance(s, Let)]
    accums = [s for s in rest.body if isinstance(s, Accum)]
    declared = dict(place.declared)
    lines = [f"{pad}{{"] + [f"{pad}{step}{printer.type_name(declared[a.var])} {a.var}_r[{width}];" for a in accums]
    lines += [f"{pad}{step}#pragma omp simd{private}",
              f"{pad}{step}for (tx_i64 {v} = {start}; {v} < {stop}; ++{v}) {{",
              *printer.block(lets, replace(place, depth=place.depth + 2)),
              *(f"{pad}{step * 2}{a.var}_r[{v} - {start}] = {printer.expr(a.value)};" for a in accums),
              f"{pad}{step}}}",
              f"{pad}{step}for (tx_i64 {v} = {start}; {v} < {stop}; ++{v}) {{",
              *(f"{pad}{step * 2}{a.var} {a.op}= {a.var}_r[{v} - {start}];" for a in accums),
              f"{pad}{step}}}", f"{pad}}}"]
    return lines


__all__ = ["NEST", "STRIP", "NestStrip", "nest_strip_loop", "nest_strip_plan", "vector_math", "vector_rest"]
