"""Readable pseudo-code for loop-nest kernels (golden files, ``tullax explain``, debugging).

Loops print as ``for i0 in start:stop`` (half-open, 0-based), parallel ones prefixed with ``parallel``;
``//`` and ``mod`` are floor division and floor modulo; ``c ? a : b`` evaluates one branch only.
"""
from __future__ import annotations

import math

from tullax.compiler.loops import (
    Accum,
    BinOp,
    Call,
    Cast,
    Const,
    Expr,
    If,
    Let,
    Load,
    Loop,
    LoopKernel,
    Select,
    Stmt,
    Store,
    UnOp,
    Var,
)

# precedence: higher binds tighter
_PREC = {"?": 0, "or": 1, "and": 2, "<": 3, "<=": 3, ">": 3, ">=": 3, "==": 3, "!=": 3, "+": 4, "-": 4,
         "*": 5, "/": 5, "//": 5, "mod": 5, "neg": 6, "not": 6, "^": 7}
_ATOM = 9


def format_const(node: Const) -> str:
    value = node.value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    return str(value)


def format_expr(expr: Expr, parent: int = 0) -> str:
    text, prec = _expr(expr)
    return f"({text})" if prec < parent else text


def _expr(expr: Expr) -> tuple[str, int]:
    if isinstance(expr, Const):
        text = format_const(expr)
        return text, (_PREC["neg"] if text.startswith("-") else _ATOM)
    if isinstance(expr, Var):
        return expr.name, _ATOM
    if isinstance(expr, Load):
        return f"{expr.array}[{', '.join(format_expr(i) for i in expr.index)}]", _ATOM
    if isinstance(expr, Cast):
        return f"{expr.dtype}({format_expr(expr.arg)})", _ATOM
    if isinstance(expr, Call):
        return f"{expr.fn}({', '.join(format_expr(a) for a in expr.args)})", _ATOM
    if isinstance(expr, UnOp):
        sym = "-" if expr.op == "neg" else "!"
        return sym + format_expr(expr.arg, _PREC["neg"] + 1), _PREC["neg"]
    if isinstance(expr, Select):
        text = (f"{format_expr(expr.cond, 1)} ? {format_expr(expr.then, 1)} : "
                f"{format_expr(expr.orelse, 1)}")
        return text, _PREC["?"]
    assert isinstance(expr, BinOp)
    if expr.op in ("max", "min"):
        return f"{expr.op}({format_expr(expr.lhs)}, {format_expr(expr.rhs)})", _ATOM
    prec = _PREC[expr.op]
    if expr.op == "^":
        left, right = format_expr(expr.lhs, prec + 1), format_expr(expr.rhs, prec)
    else:
        left, right = format_expr(expr.lhs, prec), format_expr(expr.rhs, prec + 1)
    op = {"and": "&&", "or": "||"}.get(expr.op, expr.op)
    return f"{left} {op} {right}", prec


def _stmts(stmts: tuple[Stmt, ...], indent: int) -> list[str]:
    pad = "  " * indent
    lines: list[str] = []
    for stmt in stmts:
        if isinstance(stmt, Loop):
            head = "parallel for" if stmt.parallel else (
                "reduce-parallel for" if stmt.reduce_parallel else "for")
            lines.append(f"{pad}{head} {stmt.var} in {format_expr(stmt.start)}:{format_expr(stmt.stop)}")
            lines += _stmts(stmt.body, indent + 1)
        elif isinstance(stmt, If):
            lines.append(f"{pad}if {format_expr(stmt.cond)}")
            lines += _stmts(stmt.then, indent + 1)
            if stmt.orelse:
                lines.append(f"{pad}else")
                lines += _stmts(stmt.orelse, indent + 1)
        elif isinstance(stmt, Let):
            lines.append(f"{pad}{stmt.var} = {format_expr(stmt.value)}")
        elif isinstance(stmt, Accum):
            if stmt.op in ("max", "min"):
                lines.append(f"{pad}{stmt.var} = {stmt.op}({stmt.var}, {format_expr(stmt.value)})")
            else:
                lines.append(f"{pad}{stmt.var} {stmt.op}= {format_expr(stmt.value)}")
        else:
            assert isinstance(stmt, Store)
            target = f"{stmt.array}[{', '.join(format_expr(i) for i in stmt.index)}]"
            op = {"set": "=", "add": "+=", "atomic_add": "+= (atomic)"}[stmt.mode]
            lines.append(f"{pad}{target} {op} {format_expr(stmt.value)}")
    return lines


def format_kernel(kernel: LoopKernel) -> str:
    """The kernel as indented pseudo-code: a header with its parameters, then the loop nest."""
    lines = [f"kernel {kernel.name}  # {kernel.spec_text}"]
    for arr in kernel.arrays:
        lines.append(f"  array  {arr.name}: {arr.role} {arr.dtype}, rank {arr.rank}  ({arr.source})")
    for sc in kernel.scalars:
        lines.append(f"  scalar {sc.name}: {sc.dtype}  ({sc.source})")
    for size in kernel.sizes:
        lines.append(f"  size   {size.name} = {size.size}")
    lines.append("body")
    lines += _stmts(kernel.body, 1)
    return "\n".join(lines) + "\n"


__all__ = ["format_kernel", "format_expr"]
