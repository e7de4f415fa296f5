"""Terms a fused program would compute twice, made locals of their own (issue 50, ``tullax.compiler.fuse``).

Softmax sums ``exp(s[r,i,j] - m[r,i])`` over ``j`` and then divides the same term by the sum: written as two
statements, each computes the exponential. Where a local's reduction sums (or maxes...) a term ``E`` that a later
statement repeats verbatim, the program becomes::

    local E_t[F.., K..] := E          # F: the local's free indices, K: its reduced ones
    local z[F..]        := E_t[F.., K..]
    p[...]              := ... E_t[F.., K..] ...

which the fusion keeps as a row buffer over ``K`` (one index), so the fused row computes ``E`` once per element.
The rewrite is textual over the analysed statements (their canonical spelling) and analysed again; a term is only
taken when it calls a function (the cost worth a buffer) and the local's result indices are plain names.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from tullax.errors import TullaxError
from tullax.spec.ir import Access, Affine, Binary, Call, Expr, Unary
from tullax.spec.program import Program, analyze_program
from tullax.spec.text import format_access, format_expr, format_spec


def share_terms(program: Program, ranges: Mapping | None = None) -> Program | None:
    """``program`` with its repeated reduction terms as locals, or None where it has none (or the rewritten
    program does not analyse)."""
    lines = [("local " if st.local else "") + format_spec(st.spec) for st in program.statements]
    texts = list(lines)
    taken = {st.out for st in program.statements} | set(program.inputs)
    inserted: dict[int, str] = {}  # statement index -> the new local's statement, written before it
    specs = [st.spec for st in program.statements]
    for k, st in enumerate(program.statements):
        spec = specs[k]
        term = spec.body
        if not (st.local and spec.reduced and _calls(term) and spec.lhs is not None
                and format_access(spec.out, spec.lhs) == f"{spec.out}[{','.join(spec.free)}]"):
            continue
        later = [n for n in range(k + 1, len(specs)) if _contains(specs[n].body, term)]
        if not later:
            continue
        name = _fresh(f"{spec.out}_t", taken)
        taken.add(name)
        indices = (*spec.free, *spec.reduced)
        ref = Access(name, tuple(Affine.index(i) for i in indices))
        inserted[k] = f"local {name}[{','.join(indices)}] := {format_expr(term)}"
        specs[k] = replace(spec, body=ref)
        texts[k] = "local " + format_spec(specs[k])
        for n in later:
            specs[n] = replace(specs[n], body=_replaced(specs[n].body, term, ref))
            texts[n] = ("local " if program.statements[n].local else "") + format_spec(specs[n])
    if not inserted:
        return None
    source = "\n".join(line for k, text in enumerate(texts) for line in (inserted.get(k), text) if line)
    try:
        return analyze_program(source, ranges)
    except TullaxError:
        return None


def _fresh(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_"
    return name


def _calls(expr: Expr) -> bool:
    return isinstance(expr, Call) or any(_calls(e) for e in _children(expr))


def _children(expr: Expr) -> tuple[Expr, ...]:
    if isinstance(expr, Binary):
        return (expr.lhs, expr.rhs)
    if isinstance(expr, Unary):
        return (expr.arg,)
    if isinstance(expr, Call):
        return expr.args
    return ()


def _contains(expr: Expr, term: Expr) -> bool:
    return expr == term or any(_contains(e, term) for e in _children(expr))


def _replaced(expr: Expr, term: Expr, by: Expr) -> Expr:
    if expr == term:
        return by
    if isinstance(expr, Binary):
        return replace(expr, lhs=_replaced(expr.lhs, term, by), rhs=_replaced(expr.rhs, term, by))
    if isinstance(expr, Unary):
        return replace(expr, arg=_replaced(expr.arg, term, by))
    if isinstance(expr, Call):
        return replace(expr, args=tuple(_replaced(a, term, by) for a in expr.args))
    return expr
