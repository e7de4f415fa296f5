"""A register tile's sums, once folded, scaled into their totals and stored on vectors (``CPrinter.block``).

After a lane loop of a register tile's float sums (attention's scores: eight dot products of a 2 x 4 tile, folded
together by ``tx_vfold8add_f32``), the fused row adds each sum times the factor taken out of it
(``tullax.compiler.factor.factor_sums(each=True)``) into its total, runs the blocked sums' guard (float64 totals
past 512 terms), and stores each total into its row buffer: per sum a lane extract, a scalar multiply-add and a
store, which GCC left scalar. Where the guard does not hold (every sum within one block, the common case) this
prints the multiply-adds as one vector operation per vector of sums and stores its lanes; where it holds, the
statements as written. Each lane computes its statement's multiply-add (both contracted alike under
``-ffp-contract=fast``), so every total is the same value.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from tullax.compiler.loops import Accum, BinOp, Expr, If, Loop, Stmt, Store, Var, expr_vars, statement_expressions


@dataclass(frozen=True)
class FoldStore:
    """The statements after a lane loop that ``fold_store_lines`` prints on vectors: the loop's sums (in its
    order), the total each is added into, the common factor, the blocked sums' guard (or None) and the stores of
    the totals; ``count``: statements after the loop it takes."""

    sums: tuple[str, ...]
    totals: tuple[str, ...]
    factor: Expr
    guard: If | None
    stores: tuple[Store, ...]
    count: int


def fold_store_plan(stmts: Sequence[Stmt], at: int, declared: Mapping[str, str], width: int) -> FoldStore | None:
    """The plan for the statements after the lane loop ``stmts[at]``, or None where they are not, in this order:
    one ``total += factor * sum`` per sum of the loop (one factor for all, reading no sum or total), perhaps an
    ``If`` without else (the blocked sums' guard) whose condition reads none of them, and one store of each
    total; a whole number of vectors of ``width`` sums, every sum and total of one float type."""
    loop = stmts[at]
    assert isinstance(loop, Loop)
    sums = tuple(s.var for s in loop.body if isinstance(s, Accum))
    n = len(sums)
    if not n or n % width or len(set(sums)) != n:
        return None
    adds = stmts[at + 1:at + 1 + n]
    if len(adds) != n or not all(isinstance(s, Accum) and s.op == "+" and isinstance(s.value, BinOp)
                                 and s.value.op == "*" and isinstance(s.value.rhs, Var) for s in adds):
        return None
    factor = adds[0].value.lhs  # type: ignore[union-attr]
    total_of = {s.value.rhs.name: s.var for s in adds}  # type: ignore[union-attr]
    if any(s.value.lhs != factor for s in adds) or set(total_of) != set(sums) \
            or len(set(total_of.values())) != n:  # type: ignore[union-attr]
        return None
    totals = tuple(total_of[s] for s in sums)
    if set(totals) & set(sums):
        return None
    names = set(sums) | set(totals)
    dtypes = {declared.get(v) for v in names}
    if expr_vars(factor) & names or len(dtypes) != 1 or factor.dtype not in dtypes:
        return None
    k = at + 1 + n
    guard = None
    if k < len(stmts) and isinstance(stmts[k], If):
        guard = stmts[k]
        assert isinstance(guard, If)
        if guard.orelse or expr_vars(guard.cond) & names:
            return None
        k += 1
    stores = tuple(stmts[k:k + n])
    if len(stores) != n or not all(isinstance(s, Store) and s.mode == "set" and isinstance(s.value, Var)
                                   and s.value.name in totals for s in stores):
        return None
    if len({s.value.name for s in stores}) != n or any(  # type: ignore[union-attr]
            expr_vars(e) & names for s in stores for e in statement_expressions(s) if e is not s.value):
        return None
    return FoldStore(sums, totals, factor, guard, stores, k + n - at - 1)  # type: ignore[arg-type]


def fold_store_lines(printer, plan: FoldStore, written: Sequence[Stmt], place, vector: str, width: int) -> list[str]:
    """The lines of the statements ``written`` (the plan's, after its loop): the totals on vectors where the guard
    does not hold, else as written."""
    from tullax.printers.clike import CPlace

    pad, inner = printer.indent * place.depth, printer.indent * (place.depth + 1)
    deeper = CPlace(place.depth + 1, place.declared)
    lines: list[str] = []
    for c in range(0, len(plan.sums), width):
        name = f"{plan.sums[c]}_tot"
        lines.append(f"{inner}const {vector} {name} = ({vector}){{{', '.join(plan.totals[c:c + width])}}} + "
                     f"{printer.expr(plan.factor)} * ({vector}){{{', '.join(plan.sums[c:c + width])}}};")
        lines += [f"{inner}{total} = {name}[{lane}];" for lane, total in enumerate(plan.totals[c:c + width])]
    lines += printer.block(plan.stores, deeper)
    if plan.guard is None:
        return [pad + "{", *lines, pad + "}"]
    return [f"{pad}if (!({printer.expr(plan.guard.cond)})) {{", *lines, pad + "} else {",
            *printer.block(written, deeper), pad + "}"]


__all__ = ["FoldStore", "fold_store_lines", "fold_store_plan"]
