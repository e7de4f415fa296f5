"""Print specs and expressions as canonical text (one operator table, no state)."""
from __future__ import annotations

from functools import lru_cache

from tullax.spec.ir import (
    Access,
    Affine,
    Binary,
    Call,
    Expr,
    Hole,
    Idx,
    IndexVal,
    Name,
    Num,
    Param,
    ParsedSpec,
    Range,
    Size,
    Spec,
    Unary,
    Wrapped,
    idx_names,
    walk,
)
from tullax.spec.ranges import format_clause
from tullax.spec.sizes import Sym

# precedence: higher binds tighter
PRECEDENCE = {"<": 1, "<=": 1, ">": 1, ">=": 1, "==": 1, "!=": 1, "+": 2, "-": 2, "*": 3, "/": 3,
              "neg": 4, "^": 5}


def format_number(value: int | float | complex) -> str:
    if isinstance(value, complex):  # only derived gradient specs hold one (imag's rule: -0.5im), Julia's spelling
        imag = f"{format_number(value.imag)}im"
        return imag if value.real == 0 else f"({format_number(value.real)}{'+' * (value.imag >= 0)}{imag})"
    if isinstance(value, int):
        return str(value)
    text = repr(float(value))
    return text


def format_affine(aff: Affine, end: Sym | None = None) -> str:
    """``aff`` as spec text; ``end`` (the last position of the axis it addresses) is written as ``end``."""
    parts: list[str] = []
    for name, coef in aff.terms:
        mag = "" if abs(coef) == 1 else str(abs(coef))
        parts.append(("-" if coef < 0 else "+") + mag + name)
    const = aff.const
    ends = _ends_in(const, end)
    if ends:
        parts.append(("-" if ends < 0 else "+") + ("" if abs(ends) == 1 else str(abs(ends))) + "end")
        const = const - end * ends
    if const != Sym(0) or not parts:
        if const.is_const:
            parts.append(("-" if const.const < 0 else "+") + str(abs(const.const)))
        else:
            parts.append(f"+({const})")
    text = "".join(parts)
    text = text[1:] if text.startswith("+") else text
    if aff.div != 1:
        text = f"({text})/{aff.div}" if len(parts) > 1 or text.startswith("-") else f"{text}/{aff.div}"
    return text


def _ends_in(const: Sym, end: Sym | None) -> int:
    """How many times the extent behind ``end`` occurs in ``const`` (a position written with ``end``)."""
    if end is None:
        return 0
    (atom, _), = end.terms
    return dict(const.terms).get(atom, 0)


def format_idx(idx: Idx, end: Sym | None = None) -> str:
    if isinstance(idx, Affine):
        return format_affine(idx, end)
    if isinstance(idx, Wrapped):
        return f"{idx.kind}({format_affine(idx.inner, end)})"
    text = f"{idx.array}[{format_affine(idx.inner, Sym.extent(idx.array, 0) - 1)}]"
    if not idx.plain:
        text = text if idx.scale == 1 else f"-{text}" if idx.scale == -1 else f"{idx.scale}*{text}"
        if idx.offset != Affine():
            rest = format_affine(idx.offset, end)
            text = f"{text}{rest}" if rest.startswith("-") else f"{text}+{rest}"
    return f"pad({text})" if idx.pad else text


def format_access(name: str, idx: tuple[Idx, ...] | None) -> str:
    if idx is None:
        return name
    return f"{name}[{','.join(format_idx(i, Sym.extent(name, axis) - 1) for axis, i in enumerate(idx))}]"


def format_expr(expr: Expr, parent: int = 0) -> str:
    if isinstance(expr, Num):
        text = format_number(expr.value)
        return f"({text})" if text.startswith("-") and parent else text
    if isinstance(expr, (Name, Param)):
        return expr.name
    if isinstance(expr, Hole):
        return "_"
    if isinstance(expr, Size):
        return f"size({expr.array},{expr.axis})"
    if isinstance(expr, IndexVal):
        if expr.offset == Sym(0):
            return expr.name
        return _wrap(f"{expr.name}+({expr.offset})", PRECEDENCE["+"], parent)
    if isinstance(expr, Access):
        return format_access(expr.array, expr.idx)
    if isinstance(expr, Call):
        return f"{expr.fn}({', '.join(format_expr(a) for a in expr.args)})"
    if isinstance(expr, Unary):
        return _wrap("-" + format_expr(expr.arg, PRECEDENCE["neg"]), PRECEDENCE["neg"], parent)
    assert isinstance(expr, Binary)
    prec = PRECEDENCE[expr.op]
    if expr.op == "^":  # right-associative
        left, right = format_expr(expr.lhs, prec + 1), format_expr(expr.rhs, prec)
    elif prec == PRECEDENCE["=="]:  # comparisons do not chain: one on either side keeps its parentheses
        left, right = format_expr(expr.lhs, prec + 1), format_expr(expr.rhs, prec + 1)
    else:
        left, right = format_expr(expr.lhs, prec), format_expr(expr.rhs, prec + 1)
    sep = " " if prec <= 2 else ""
    return _wrap(f"{left}{sep}{expr.op}{sep}{right}", prec, parent)


def _wrap(text: str, prec: int, parent: int) -> str:
    return f"({text})" if prec < parent else text


@lru_cache(maxsize=4096)  # the cache keys, the plan's keys and every host call ask again for the same spec
def format_spec(spec: ParsedSpec | Spec) -> str:
    """The canonical text of a spec: default reduction omitted, one space around := and |>."""
    head = "" if spec.redop == "+" else f"({spec.redop}) "
    text = f"{head}{format_access(spec.out, spec.lhs)} {spec.assign} {format_expr(spec.body)}"
    if spec.finalizer is not None:
        text += f" |> {format_finalizer(spec.finalizer)}"
    hidden = spec.ranges if isinstance(spec, ParsedSpec) else _unseen_reductions(spec)
    if hidden:  # a sum over an index the body does not mention multiplies it by the range's length: say so
        text += "  " + " ".join(format_clause(name, rng.lo, rng.hi) for name, rng in hidden)
    if getattr(spec, "scan", None) is not None:
        text += "  " + spec.scan.clause()
    return text


def format_finalizer(finalizer: Expr) -> str:
    """``f`` for ``f(_)`` of a one-argument function, else the expression over ``_``."""
    if isinstance(finalizer, Call) and len(finalizer.args) == 1 and isinstance(finalizer.args[0], Hole):
        return finalizer.fn
    return format_expr(finalizer)


def _unseen_reductions(spec: ParsedSpec | Spec) -> list[tuple[str, Range]]:
    """Reduced indices of an analysed spec that index no array (their range is in no array's shape: it must be
    written for the text to mean the same spec), with their ranges."""
    if not isinstance(spec, Spec):
        return []
    seen = set(_indexing_names(spec.body))
    return [(name, rng) for name, rng in spec.ranges if name in spec.reduced and name not in seen]


def _indexing_names(expr: Expr):
    for node in walk(expr):
        if isinstance(node, Access):
            for idx in node.idx:
                yield from idx_names(idx)
