"""What the two C printers share: the CUDA C printer (``tullax.printers.cuda``) and the host C printer
(``tullax.printers.c``) print the same C expressions and statements from the loop IR, and differ only in how
helpers are instantiated, how a value is cast and in the kernel around the statements.

* ``C_TYPES`` / ``storage_type``: the C type of an element of each dtype (typedef'd ``tx_`` integers).
* ``format_float``: float literals (NumPy's shortest round-trip digits for float32) and the prelude's
  ``tx_inf_*``/``tx_nan_*`` for infinities and NaN.
* ``CLikePrinter``: the operator tables (C's ``/`` and ``%`` truncate, so ``//`` and ``mod`` are the floor
  helpers ``tx_floordiv``/``tx_floormod``; ``max``/``min`` are ``tx_max``/``tx_min``, which propagate NaN like
  ``jnp.maximum``; an integer-constant power is the exact ``tx_powi``, other powers ``powf``/``pow``), the
  registry's ``c`` spelling of functions, a ``Select`` as a C ternary (only the chosen branch runs), array
  elements at their row-major flat offset over the ``a1_e1`` extent parameters, and ``Let`` as a declaration
  the first time a C scope binds a name and an assignment afterwards. A target says how a helper is named for a
  dtype (``helper_name``: a template argument in CUDA C++, a type suffix in C) and how it casts.
* ``helper_definitions``: the helpers' one definition, rendered as C++ templates (CUDA) or as one C function
  per type (host C).
"""
from __future__ import annotations

import math
import re
from abc import abstractmethod
from dataclasses import dataclass, replace
from typing import ClassVar, Mapping, Sequence

import numpy as np

from tullax.compiler.loops import (
    FLOATS,
    INDEX,
    Accum,
    BinOp,
    Const,
    Expr,
    Let,
    Loop,
    Stmt,
    Var,
    binop,
    const,
)
from tullax.errors import TullaxError
from tullax.printers.base import (
    Infix,
    LoopPrinter,
    Place,
    Precedence,
    Prefix,
    arithmetic_operators,
    left_associative,
    non_chaining,
)
from tullax.spec.functions import Function

C_TYPES = {
    "float32": "float", "float64": "double", "bool": "bool",
    "int8": "tx_i8", "int16": "tx_i16", "int32": "tx_i32", "int64": "tx_i64",
    "uint8": "tx_u8", "uint16": "tx_u16", "uint32": "tx_u32", "uint64": "tx_u64",
}
FLOAT_SUFFIX = {"float32": "f32", "float64": "f64"}
TYPE_SUFFIX = {**FLOAT_SUFFIX, "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8",
               "uint16": "u16", "uint32": "u32", "uint64": "u64", "bool": "b"}
# The integer types of C_TYPES, declared at the top of every printed module (CUDA C and host C alike)
TYPEDEFS = """\
typedef signed char tx_i8;
typedef short tx_i16;
typedef int tx_i32;
typedef long long tx_i64;
typedef unsigned char tx_u8;
typedef unsigned short tx_u16;
typedef unsigned int tx_u32;
typedef unsigned long long tx_u64;
"""
POWER = {"float32": "powf", "float64": "pow"}  # `^` with a non-constant exponent (an operator, not a function)


def storage_type(dtype: str, backend: str = "cuda") -> str:
    """The C type of an element of an array of ``dtype``."""
    try:
        return C_TYPES[str(dtype)]
    except KeyError:
        raise TullaxError(f"the {backend} backend has no element type for dtype {dtype}; use float32/float64 data "
                          "and integer index arrays") from None


@dataclass(frozen=True)
class Parameter:
    """One kernel parameter: ``kind`` is ``array`` (a pointer to the elements of array parameter ``array``),
    ``scalar`` (a pointer to the one element of scalar ``array`` in CUDA, the value itself in host C), ``size``
    (the IR size parameter ``name``) or ``extent`` (extent ``axis`` of the array parameter ``array``).
    ``ctype``: the C type it is passed as."""

    name: str
    kind: str
    dtype: str
    ctype: str
    array: str = ""
    axis: int = 0
    restrict: str = "__restrict__"  # the pointer qualifier's spelling: C++ (nvcc, g++) or C99 ``restrict``

    @property
    def pointer(self) -> bool:
        return self.ctype.endswith("*")

    @property
    def declaration(self) -> str:
        return f"{self.ctype} {self.restrict} {self.name}" if self.pointer else f"const {self.ctype} {self.name}"


def extent_name(array: str, axis: int) -> str:
    return f"{array}_e{axis}"


def format_float(value: float, dtype: str) -> str:
    """A C literal of the float dtype (``1.5f``, ``1e-05f``; ``1.5``), or the prelude's infinity/NaN. Float32
    values print with NumPy's shortest round-trip digits, so the compiler reads back the same float."""
    suffix = FLOAT_SUFFIX[dtype]
    if math.isnan(value):
        return f"tx_nan_{suffix}()"
    if math.isinf(value):
        return f"tx_inf_{suffix}()" if value > 0 else f"-tx_inf_{suffix}()"
    text = str(np.float32(value)) if dtype == "float32" else repr(float(value))
    if "." not in text and "e" not in text:
        text += ".0"
    return text + "f" if dtype == "float32" else text


@dataclass(frozen=True)
class CPlace(Place):
    """``declared``: the locals (name, dtype) already declared in this C scope or an enclosing one. The loop IR
    may bind a name again in the same block (a hoisted value placed before each pass of a logsumexp, as
    Python and Julia rebind it); C declares once and then assigns."""

    declared: frozenset[tuple[str, str]] = frozenset()


class CLikePrinter(LoopPrinter):
    """Loop-IR expressions and statements as C with ``index_type`` index arithmetic; a target names the
    helpers (``helper_name``) and says how it casts (``cast``)."""

    infix: ClassVar[Mapping[str, Infix]] = {
        # C would parse `a < b < c`, as (a < b) < c: never print it
        **arithmetic_operators(non_chaining),
        "and": left_associative("&&", Precedence.AND), "or": left_associative("||", Precedence.OR),
    }
    prefix: ClassVar[Mapping[str, Prefix]] = {"neg": Prefix("-", Precedence.UNARY, Precedence.UNARY),
                                              "not": Prefix("!", Precedence.UNARY, Precedence.UNARY)}
    called: ClassVar[Mapping[str, str]] = {"//": "tx_floordiv", "mod": "tx_floormod", "max": "tx_max",
                                           "min": "tx_min"}
    wrap_negative_operands = True  # `- -x` would print as the decrement `--x`
    if_head = "if ({cond}) {{"
    else_line = "} else {"
    block_end = "}"
    statement_end = ";"
    backend: ClassVar[str]  # the backend's name, in error messages

    def __init__(self, index_type: str):
        self.index_type = index_type

    @abstractmethod
    def helper_name(self, name: str, dtype: str) -> str:
        """The prelude helper ``name`` (``tx_max``, ``tx_powi``, ``tx_iabs``...) for ``dtype`` operands."""

    def constant(self, node: Const) -> str:
        value = node.value
        if isinstance(value, (bool, np.bool_)):
            text = "true" if value else "false"
            return text if node.dtype == "bool" else self.cast_text(node.dtype, text)
        if node.dtype in FLOATS:
            return format_float(float(value), node.dtype)
        if int(value) == -2**63:  # an integer max's start: the literal 9223372036854775808 has no signed type
            return "(-9223372036854775807LL - 1)"
        return str(int(value))

    def cast_text(self, dtype: str, text: str) -> str:
        """``text`` (an atom) converted to ``dtype``: a C++ functional cast unless the target overrides it."""
        return f"{self.type_name(dtype)}({text})"

    def type_name(self, dtype: str) -> str:
        return self.index_type if dtype == INDEX else storage_type(dtype, self.backend)

    def call_name(self, fn: Function, dtype: str) -> str:
        if dtype not in FLOATS:  # abs of an index value: integer arithmetic
            return self.helper_name("tx_iabs", dtype)
        if fn.c is None:
            raise TullaxError(f"internal error: the function registry has no C spelling of {fn.name}")
        return fn.c[FLOATS.index(dtype)]

    def loop_header(self, loop: Loop, place: Place) -> str:
        v = loop.var
        return f"for ({self.index_type} {v} = {self.expr(loop.start)}; {v} < {self.expr(loop.stop)}; ++{v}) {{"

    def block(self, stmts: Sequence[Stmt], place: Place) -> list[str]:
        assert isinstance(place, CPlace)
        lines: list[str] = []
        at = 0
        while at < len(stmts):
            stmt = stmts[at]
            lines += self.statement(stmt, place)
            if isinstance(stmt, Let):
                place = replace(place, declared=place.declared | {(stmt.var, stmt.value.dtype)})
            taken, more = self.after_statement(stmts, at, place)
            lines += more
            at += 1 + taken
        return lines

    def after_statement(self, stmts: Sequence[Stmt], at: int, place: CPlace) -> tuple[int, list[str]]:
        """The statements after ``stmts[at]`` that this printer prints as one form with it: how many, and their
        lines (none here)."""
        return 0, []

    def statement(self, stmt: Stmt, place: Place) -> list[str]:
        assert isinstance(place, CPlace)
        if isinstance(stmt, Let) and any(name == stmt.var for name, _ in place.declared):
            if (stmt.var, stmt.value.dtype) not in place.declared:
                raise TullaxError(f"internal error: the loop IR binds {stmt.var} again with another type")
            return [self.indent * place.depth + super().let(stmt) + self.statement_end]
        return super().statement(stmt, place)

    def let(self, stmt: Let) -> str:
        return f"{self.type_name(stmt.value.dtype)} {super().let(stmt)}"

    def helper(self, op: str, dtype: str) -> str:
        """The prelude helper of a binary IR op for ``dtype`` operands."""
        return self.helper_name(self.called[op], dtype)

    def accumulate(self, stmt: Accum) -> str:
        if stmt.op in self.called:  # max/min
            return f"{stmt.var} = {self.helper(stmt.op, stmt.value.dtype)}({stmt.var}, {self.expr(stmt.value)})"
        return super().accumulate(stmt)

    def binary(self, expr: BinOp) -> tuple[str, int]:
        if expr.op in self.called:
            return self.call(self.helper(expr.op, expr.lhs.dtype), (expr.lhs, expr.rhs)), Precedence.ATOM
        if expr.op != "^":
            return super().binary(expr)
        if isinstance(expr.rhs, Const) and expr.rhs.dtype == INDEX:  # exact, any sign of the base
            name = self.helper_name("tx_powi", expr.lhs.dtype)
            return f"{name}({self.expr(expr.lhs)}, {int(expr.rhs.value)})", Precedence.ATOM
        return self.call(POWER[expr.dtype], (expr.lhs, expr.rhs)), Precedence.ATOM

    def element(self, array: str, index: Sequence[Expr]) -> str:
        """``a[offset]`` with the row-major offset ``(i0 * a_e1 + i1) * a_e2 + i2``."""
        return f"{array}[{self.expr(self.offset(array, index))}]"

    def offset(self, array: str, index: Sequence[Expr]) -> Expr:
        """The row-major flat position of ``array[index]``: ``(i0 * a_e1 + i1) * a_e2 + i2``."""
        offset: Expr = const(0)
        for axis, position in enumerate(index):
            scaled = binop("*", offset, Var(extent_name(array, axis), INDEX)) if axis else offset
            offset = binop("+", scaled, position)
        return offset


# =============================================================================================
# The helpers, defined once
# =============================================================================================
# Each helper over a type T, written once as the body of a C++ template; ``helper_definitions`` renders it as a
# template (CUDA) or once per C type with the type's suffix on its name (host C). ``T`` is the only type name.
HELPERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("// max/min that propagate NaN, as jnp.maximum/minimum (fmaxf/fminf return the other operand): the plain\n"
     "// compare-select (maxss/minss), then a's NaN; `a > b || a != a` compiled to two branches\n"
     "// (benchmarks/row_streams.py, the max pool)", (
        "T tx_max(T a, T b) { T m = a > b ? a : b; return a != a ? a : m; }",
        "T tx_min(T a, T b) { T m = a < b ? a : b; return a != a ? a : m; }")),
    ("// floor division and floor modulo (the sign of the divisor), as the loop IR defines them; C's / and % "
     "truncate", (
         "T tx_floordiv(T a, T b) {\n    T q = a / b;\n    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;\n}",
         "T tx_floormod(T a, T b) {\n    T r = a % b;\n    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;\n}",
         "T tx_iabs(T a) { return a < 0 ? -a : a; }")),
    ("// x^n for an integer constant n by repeated squaring (exact signs for negative x, like lax.integer_pow); the\n"
     "// usual squares and cubes first, with the same products the loop would form", (
        "T tx_powi(T x, int n) {\n"
        "    if (n == 2) return x * x;  // folded where n is a constant: no loop left to stop vectorisation\n"
        "    if (n == 3) return x * (x * x);\n"
        "    T result = (T)1;\n"
        "    T base = x;\n"
        "    for (unsigned m = n < 0 ? 0u - (unsigned)n : (unsigned)n; m != 0; m >>= 1) {\n"
        "        if (m & 1u) result *= base;\n"
        "        base *= base;\n"
        "    }\n"
        "    return n < 0 ? (T)1 / result : result;\n"
        "}",)),
)
_INTEGER_ONLY = ("tx_floordiv", "tx_floormod", "tx_iabs")  # never instantiated for a float type
_HELPER_NAME = re.compile(r"\b(tx_[a-z]+)\(")


def helper_definitions(qualifier: str, types: Sequence[str] | None = None) -> str:
    """The helpers of ``HELPERS`` with their comments: as templates (``template <typename T> {qualifier} T
    tx_max(...)``) when ``types`` is None, else once per dtype of ``types`` (``{qualifier} double
    tx_max_f64(...)``)."""
    parts = []
    for comment, functions in HELPERS:
        if types is None:
            texts = [f"template <typename T> {qualifier} {f}" for f in functions]
        else:
            texts = [f"{qualifier} {_instantiate(f, dtype)}" for dtype in types for f in functions
                     if not (dtype in FLOATS and _HELPER_NAME.search(f).group(1) in _INTEGER_ONLY)]
        parts.append("\n".join([comment, *texts]))
    return "\n\n".join(parts) + "\n"


def _instantiate(function: str, dtype: str) -> str:
    """One helper for one dtype: ``T`` becomes its C type, helper names get its suffix (``tx_max_f64``)."""
    text = re.sub(r"\bT\b", C_TYPES[dtype], function)
    return _HELPER_NAME.sub(lambda m: f"{m.group(1)}_{TYPE_SUFFIX[dtype]}(", text)


__all__ = ["C_TYPES", "CLikePrinter", "CPlace", "FLOAT_SUFFIX", "HELPERS", "POWER", "Parameter", "TYPE_SUFFIX",
           "extent_name", "format_float", "helper_definitions", "storage_type"]
