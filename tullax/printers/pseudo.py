"""Readable pseudo-code for loop-nest kernels (golden files, ``tullax explain``, debugging).

Loops print as ``for i0 in start:stop`` (half-open, 0-based), parallel ones prefixed with ``parallel``;
``//`` and ``mod`` are floor division and floor modulo; ``c ? a : b`` evaluates one branch only. Calls keep the
spec language's names, and comparisons are plain left-associative operators (nothing executes this text).
"""
from __future__ import annotations

import math
from typing import ClassVar, Mapping

from tullax.compiler.loops import THREAD, Const, Expr, Loop, LoopKernel, Shared
from tullax.printers.base import (
    Infix,
    LoopPrinter,
    Place,
    Precedence,
    Prefix,
    arithmetic_operators,
    left_associative,
)
from tullax.spec.functions import Function


class PseudoPrinter(LoopPrinter):
    """Pseudo-code: the IR's own names and 0-based row-major indices, C-like operators, indentation only."""

    infix: ClassVar[Mapping[str, Infix]] = {
        **arithmetic_operators(left_associative),
        "//": left_associative("//", Precedence.PRODUCT), "mod": left_associative("mod", Precedence.PRODUCT),
        "and": left_associative("&&", Precedence.AND), "or": left_associative("||", Precedence.OR),
        "^": Infix("^", Precedence.POWER, Precedence.ATOM, Precedence.POWER),  # right-associative
    }
    prefix: ClassVar[Mapping[str, Prefix]] = {"neg": Prefix("-", Precedence.UNARY, Precedence.POWER),
                                              "not": Prefix("!", Precedence.UNARY, Precedence.POWER)}
    called: ClassVar[Mapping[str, str]] = {"max": "max", "min": "min"}
    indent = "  "
    if_head = "if {cond}"
    else_line = "else"
    store_forms: ClassVar[Mapping[str, str]] = {"set": "{target} = {value}", "add": "{target} += {value}",
                                                "atomic_add": "{target} += (atomic) {value}"}
    scratch_form = "{var} = zeros({type}, {length})"

    def constant(self, node: Const) -> str:
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

    def type_name(self, dtype: str) -> str:
        return dtype

    def call_name(self, fn: Function, dtype: str) -> str:
        return fn.name

    def loop_header(self, loop: Loop, place: Place) -> str:
        head = "parallel for" if loop.parallel else ("reduce-parallel for" if loop.reduce_parallel else "for")
        return f"{head} {loop.var} in {self.expr(loop.start)}:{self.expr(loop.stop)}"

    def shared(self, stmt: Shared, place: Place) -> list[str]:
        return [f"{self.indent * place.depth}{stmt.var} = shared({stmt.dtype}, {stmt.length})"]

    def barrier(self) -> str:
        return "barrier"


def format_expr(expr: Expr) -> str:
    """One expression as pseudo-code."""
    return PseudoPrinter().expr(expr)


def format_kernel(kernel: LoopKernel) -> str:
    """The kernel as indented pseudo-code: a header with its parameters, then the loop nest."""
    lines = [f"kernel {kernel.name}  # {kernel.spec_text}"]
    for arr in kernel.arrays:
        lines.append(f"  array  {arr.name}: {arr.role} {arr.dtype}, rank {arr.rank}  ({arr.source})")
    for sc in kernel.scalars:
        lines.append(f"  scalar {sc.name}: {sc.dtype}  ({sc.source})")
    for size in kernel.sizes:
        lines.append(f"  size   {size.name} = {size.size}")
    if kernel.tile is not None:
        tile = kernel.tile
        lines.append(f"  block  {tile.threads} threads ({THREAD}) per {tile.rows}x{tile.cols} tile, "
                     f"{tile.thread_rows}x{tile.thread_cols} per thread, chunks of {tile.chunk}")
    lines.append("body")
    lines += PseudoPrinter().block(kernel.body, Place(1))
    return "\n".join(lines) + "\n"


__all__ = ["PseudoPrinter", "format_kernel", "format_expr"]
