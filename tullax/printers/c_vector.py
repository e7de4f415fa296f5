"""Sum lanes as GCC vector arithmetic (``CPrinter.sum_lanes``): where every term of a lane loop is plain float
arithmetic (``+ - * /``, negation) of loads along the loop's last axis, loop-invariant values and the body's own
locals, the C printer writes it over vectors directly: one unaligned vector load per moving array read, the
term's arithmetic on vectors (a broadcast scalar where a value does not move), and ``lane += term``. The block
of terms through a stack array (the general form, which calls vectorise through) made GCC keep a register
tile's loaded vectors on the stack and read them back for every multiply-add.

Lane by lane the same operations in the same order as the loop's terms, so the lanes hold what the general
form's hold: IEEE throughout (NaN and inf reach the fold, -0.0 starts stay -0.0).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from tullax.compiler.loops import Accum, BinOp, Const, Expr, Let, Load, UnOp, Var, expr_vars, walk_expr

_ARITHMETIC = ("+", "-", "*", "/")
VECTOR_SUFFIX = "_vv"  # a body local's vector: its name with this suffix


@dataclass(frozen=True)
class VectorBody:
    """A lane loop's body over vectors: the moving loads with the vector each is read into, the body's locals
    and the accumulations with vectors in place of moving values."""

    loads: tuple[tuple[Load, str], ...]
    lets: tuple[Let, ...]
    accums: tuple[Accum, ...]


def vector_body(var: str, lets: Sequence[Let], accums: Sequence[Accum], dtype: str) -> VectorBody | None:
    """The body of a lane loop over ``var`` as vector arithmetic, or None where a term holds anything else (a
    call, a cast, a select, another type, a strided or indirect moving read)."""
    local = {let.var for let in lets}
    loads: dict[Load, str] = {}

    def convert(expr: Expr) -> Expr | None:
        if getattr(expr, "dtype", None) != dtype:
            return None
        if isinstance(expr, Const):
            return expr
        if isinstance(expr, Var):
            if expr.name == var:
                return None
            return Var(expr.name + VECTOR_SUFFIX, dtype) if expr.name in local else expr
        if isinstance(expr, Load):
            names = [expr_vars(index) for index in expr.index]
            if any(isinstance(sub, Load) for index in expr.index for sub in walk_expr(index)) \
                    or any(n & local for n in names):
                return None
            if not any(var in n for n in names):
                return expr  # does not move: a scalar, broadcast by the vector arithmetic
            if any(var in n for n in names[:-1]) or not _unit_step(expr.index[-1], var):
                return None
            return Var(loads.setdefault(expr, f"{var}_ld{len(loads)}"), dtype)
        if isinstance(expr, BinOp) and expr.op in _ARITHMETIC:
            lhs, rhs = convert(expr.lhs), convert(expr.rhs)
            return None if lhs is None or rhs is None else BinOp(expr.op, lhs, rhs, dtype)
        if isinstance(expr, UnOp) and expr.op == "neg":
            arg = convert(expr.arg)
            return None if arg is None else UnOp("neg", arg, dtype)
        return None

    new_lets, new_accums = [], []
    for let in lets:
        value = convert(let.value)
        if value is None:
            return None
        new_lets.append(Let(let.var + VECTOR_SUFFIX, value))
    for accum in accums:
        value = convert(accum.value)
        if value is None:
            return None
        new_accums.append(Accum(accum.var, accum.op, value))
    return VectorBody(tuple(loads.items()), tuple(new_lets), tuple(new_accums))


def _unit_step(index: Expr, var: str) -> bool:
    """Whether ``index`` is ``var`` plus terms without it: consecutive iterations read consecutive elements."""
    if isinstance(index, Var):
        return index.name == var
    if isinstance(index, BinOp) and index.op == "+":
        return (_unit_step(index.lhs, var) and var not in expr_vars(index.rhs)) \
            or (_unit_step(index.rhs, var) and var not in expr_vars(index.lhs))
    if isinstance(index, BinOp) and index.op == "-":
        return _unit_step(index.lhs, var) and var not in expr_vars(index.rhs)
    return False


def vector_block(body: VectorBody, var: str, first: str, chains: int, vector: str, width: int, at: str,
                 indent: str, index_type: str, expr: Callable[[Expr], str]) -> list[str]:
    """``chains`` vectors of terms from ``first``: chain c reads iterations ``first + c*width`` on and adds into
    lane vector ``{acc}_l{c}``. A local starts as -0.0 plus its value (a broadcast where it does not move; x +
    -0.0 is x for every x)."""
    zero = "(" + vector + "){" + ", ".join(["-0.0"] * width) + "}"
    lines: list[str] = []
    for c in range(chains):
        inner = at + indent
        lines += [at + "{", f"{inner}const {index_type} {var} = {first} + {c * width};"]
        suffix = vector.split("_")[-1]
        lines += [f"{inner}const {vector} {name} = tx_vload_{suffix}(&{expr(load)});" for load, name in body.loads]
        lines += [f"{inner}const {vector} {let.var} = {zero} + ({expr(let.value)});" for let in body.lets]
        lines += [f"{inner}{a.var}_l{c} {a.op}= {expr(a.value)};" for a in body.accums]
        lines.append(at + "}")
    return lines


def vector_rest(body: VectorBody, var: str, stop: str, tail: str, vector: str, width: int, identity: str, at: str,
                indent: str, index_type: str, expr: Callable[[Expr], str]) -> list[str]:
    """The iterations from ``tail`` to ``stop`` (fewer than ``width``) as one vector, the last ``width``
    iterations of the loop: the lanes of the ones the blocks already took hold the op's ``identity`` (a bitwise
    select, not a product by zero: a NaN term there stays out) and the others their term, added into lane vector
    ``{acc}_l0``. For a loop of at least ``width`` iterations, so every read is one the loop makes; then the
    remainder starts at ``stop``."""
    mask, suffix = vector.replace("_v", "_m", 1), vector.split("_")[-1]
    ident = "(" + vector + "){" + ", ".join([identity] * width) + "}"
    inner = at + indent
    lanes = "(" + mask + "){" + ", ".join(str(k) for k in range(width)) + "}"
    lines = [at + f"if ({tail} < {stop}) {{", f"{inner}const {index_type} {var} = {stop} - {width};",
             f"{inner}const {mask} {var}_new = {lanes} >= (tx_i{suffix[1:]})({width} - ({stop} - {tail}));"]
    lines += [f"{inner}const {vector} {name} = tx_vload_{suffix}(&{expr(load)});" for load, name in body.loads]
    zero = "(" + vector + "){" + ", ".join(["-0.0"] * width) + "}"
    lines += [f"{inner}const {vector} {let.var} = {zero} + ({expr(let.value)});" for let in body.lets]
    lines += [f"{inner}{a.var}_l0 {a.op}= ({vector})((({mask})({expr(a.value)}) & {var}_new) | "
              f"(({mask}){ident} & ~{var}_new));" for a in body.accums]
    lines += [f"{inner}{var}_rest = {stop};", at + "}"]
    return lines


__all__ = ["VECTOR_SUFFIX", "VectorBody", "vector_block", "vector_body", "vector_rest"]
