"""Sum lanes as GCC vector arithmetic (``CPrinter.sum_lanes``): where every term of a lane loop is plain float
arithmetic (``+ - * /``, negation) of loads along the loop's last axis, loop-invariant values and the body's own
locals, the C printer writes it over vectors directly: one unaligned vector load per moving array read, the
term's arithmetic on vectors (a broadcast scalar where a value does not move), and ``lane += term``. The block
of terms through a stack array (the general form, which calls vectorise through) made GCC keep a register
tile's loaded vectors on the stack and read them back for every multiply-add.

Lane by lane the same operations in the same order as the loop's terms, so the lanes hold what the general
form's hold: IEEE throughout (NaN and inf reach the fold, -0.0 starts stay -0.0). The iterations after the last
whole vector are one more vector (``vector_rest``), not a scalar loop: a 30-term row paid 6 serial scalar terms;
a row shorter than a vector but of half of one is two half vectors the same way (``half_row``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

from tullax.compiler.loops import Accum, BinOp, Const, Expr, Let, Load, UnOp, Var, expr_vars, walk_expr
from tullax.printers.clike import TYPE_SUFFIX, storage_type

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


@dataclass(frozen=True)
class LaneLoop:
    """How a lane loop over ``var`` prints: its bounds (C text), ``lanes`` partial sums per accumulator in vectors
    of ``width`` (type ``vector``), the op's ``identity``, the index type and one indentation step."""

    var: str
    start: str
    stop: str
    lanes: int
    width: int
    vector: str
    identity: str
    index_type: str
    indent: str
    load: str = "tx_vload"  # the helper reading one vector (``tx_hload``: half of one)

    @property
    def mask(self) -> str:
        return self.vector.replace("_v", "_m", 1)

    def splat(self, value: str) -> str:
        return "(" + self.vector + "){" + ", ".join([value] * self.width) + "}"


def lane_vectors(body: VectorBody, loop: LaneLoop, at: str, expr: Callable[[Expr], str]) -> list[str]:
    """Blocks of ``lanes`` iterations from ``start`` to ``{var}_top``, a last vector to ``{var}_tail`` where the
    chains are several, then the remainder (``vector_rest``)."""
    var, deep = loop.var, at + loop.indent
    lines = [f"{at}for ({loop.index_type} {var}_blk = {loop.start}; {var}_blk < {var}_top; {var}_blk += "
             f"{loop.lanes}) {{", *vector_block(body, loop, f"{var}_blk", loop.lanes // loop.width, deep, expr),
             at + "}"]
    if loop.lanes > loop.width:
        lines += [f"{at}if ({var}_top < {var}_tail) {{", *vector_block(body, loop, f"{var}_top", 1, deep, expr),
                  at + "}"]
    return lines + vector_rest(body, loop, at, expr)


def vector_block(body: VectorBody, loop: LaneLoop, first: str, chains: int, at: str,
                 expr: Callable[[Expr], str]) -> list[str]:
    """``chains`` vectors of terms from ``first``: chain c reads iterations ``first + c*width`` on and adds into
    lane vector ``{acc}_l{c}``. A local starts as -0.0 plus its value (a broadcast where it does not move; x +
    -0.0 is x for every x)."""
    var, suffix = loop.var, loop.vector.split("_")[-1]
    lines: list[str] = []
    for c in range(chains):
        inner = at + loop.indent
        lines += [at + "{", f"{inner}const {loop.index_type} {var} = {first} + {c * loop.width};"]
        lines += [f"{inner}const {loop.vector} {name} = {loop.load}_{suffix}(&{expr(load)});"
                  for load, name in body.loads]
        lines += [f"{inner}const {loop.vector} {let.var} = {loop.splat('-0.0')} + ({expr(let.value)});"
                  for let in body.lets]
        lines += [f"{inner}{a.var}_l{c} {a.op}= {expr(a.value)};" for a in body.accums]
        lines.append(at + "}")
    return lines


def vector_rest(body: VectorBody, loop: LaneLoop, at: str, expr: Callable[[Expr], str]) -> list[str]:
    """The iterations from ``{var}_tail`` to ``stop`` (fewer than ``width``) as one vector, the last ``width``
    iterations of the loop: the lanes of the ones the blocks already took hold the op's identity (a bitwise
    select, not a product by zero: a NaN or inf term there stays out) and the others their term, added into
    lane vector ``{acc}_l0``. For a loop of at least ``width`` iterations, so every read is one the loop makes."""
    var, width, stop, mask = loop.var, loop.width, loop.stop, loop.mask
    suffix, inner = loop.vector.split("_")[-1], at + loop.indent
    lanes = "(" + mask + "){" + ", ".join(str(k) for k in range(width)) + "}"
    lines = [at + f"if ({var}_tail < {stop}) {{", f"{inner}const {loop.index_type} {var} = {stop} - {width};",
             f"{inner}const {mask} {var}_new = {lanes} >= (tx_i{suffix[1:]})({width} - ({stop} - {var}_tail));"]
    lines += [f"{inner}const {loop.vector} {name} = {loop.load}_{suffix}(&{expr(load)});" for load, name in body.loads]
    lines += [f"{inner}const {loop.vector} {let.var} = {loop.splat('-0.0')} + ({expr(let.value)});"
              for let in body.lets]
    lines += [f"{inner}{a.var}_l0 {a.op}= ({loop.vector})((({mask})({expr(a.value)}) & {var}_new) | "
              f"(({mask}){loop.splat(loop.identity)} & ~{var}_new));" for a in body.accums]
    lines.append(at + "}")
    return lines


def half_row(body: VectorBody, loop: LaneLoop, at: str, expr: Callable[[Expr], str]) -> list[str]:
    """The ``else if`` of a lane loop's row shorter than one vector but of at least half of one: a half vector
    from its start and the rest as one more half vector (``vector_rest``), folded into the accumulators; a
    shorter row stays scalar (the ``else`` the caller prints). A 4-term float32 row (a Gaussian kernel's 4
    columns) paid 4 serial multiply-adds. Lane by lane the loop's terms, as the whole vectors'."""
    h, suffix = loop.width // 2, loop.vector.split("_")[-1]
    half = replace(loop, lanes=h, width=h, vector=f"tx_vh{h}_{suffix}", load="tx_hload")
    inner = at + loop.indent
    lines = [f"{at}}} else if ({loop.stop} - {loop.start} >= {h}) {{",
             f"{inner}const {loop.index_type} {loop.var}_tail = {loop.start} + {h};"]
    lines += [f"{inner}{half.vector} {a.var}_l0 = {half.splat(loop.identity)};" for a in body.accums]
    lines += vector_block(body, half, loop.start, 1, inner, expr) + vector_rest(body, half, inner, expr)
    return lines + [f"{inner}{a.var} = tx_hfold{_FOLDS[a.op]}_{suffix}({a.var}_l0, {a.var});" for a in body.accums]


def half_helpers(dtype: str, lanes: int) -> str:
    """``half_row``'s C: the half vector and mask types of ``lanes // 2`` elements, its unaligned read and its
    folds (halves with halves, as ``tx_vfoldadd_f32``), for a float ``dtype``; nothing for another."""
    if dtype not in ("float32", "float64"):
        return ""
    h, suffix, storage = lanes // 2, TYPE_SUFFIX[dtype], storage_type(dtype)
    vector, mask, size = f"tx_vh{h}_{suffix}", f"tx_mh{h}_{suffix}", h * (4 if dtype == "float32" else 8)
    lines = [f"typedef {storage} {vector} __attribute__((vector_size({size})));",
             f"typedef tx_i{suffix[1:]} {mask} __attribute__((vector_size({size})));",
             f"static inline {vector} tx_hload_{suffix}(const {storage}* p) {{",
             f"    {vector} v;", "    memcpy(&v, p, sizeof(v));", "    return v;", "}"]
    steps, width = [], h // 2
    while width:  # lane k with lane k ^ width: after the last, lane 0 holds the fold
        steps.append(", ".join(str(k ^ width) for k in range(h)))
        width //= 2
    for op, sign in (("add", "+"), ("mul", "*")):
        lines.append(f"static inline {storage} tx_hfold{op}_{suffix}({vector} l, {storage} acc) {{")
        lines += [f"    l = l {sign} TX_SHUFFLE(l, {mask}, {step});" for step in steps]
        lines += [f"    return acc {sign} l[0];", "}"]
    return "\n".join(lines) + "\n"


_FOLDS = {"+": "add", "*": "mul"}

__all__ = ["LaneLoop", "VECTOR_SUFFIX", "VectorBody", "half_helpers", "half_row", "lane_vectors", "vector_block",
           "vector_body", "vector_rest"]
