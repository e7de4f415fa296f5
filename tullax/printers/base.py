"""The one printer of the loop IR (``tullax.compiler.loops``) that every target specialises.

A target is TABLES plus a few hooks on ``LoopPrinter``:

* ``infix`` / ``prefix`` / ``called``: how each ``BinOp`` and ``UnOp`` is spelled and how tightly it binds, on
  the shared ``Precedence`` scale; ``ternary``: how a ``Select`` is written.
* capability flags: ``one_based`` and ``reversed_index`` (a column-major target reverses every index list),
  ``wrap_negative_operands`` (``a * (-b)``: no bare minus after an operator), the block syntax (``if_head``,
  ``else_line``, ``block_end``, ``empty_block``, ``statement_end``, ``indent``) and ``store_forms``: one template
  per ``Store.mode``, which is where an atomic addition (``atomic_add``) gets its spelling; ``scratch_form``: how
  a zero-filled local array (``Scratch``) is made.
* hooks for what no table can say: ``constant`` (literals), ``type_name`` (casts), ``call_name`` (a function's
  spelling, read from the registry ``tullax.spec.functions``), ``loop_header``, ``position`` (one array
  position) and ``variable``.

The walker is pure: ``block(stmts, place)`` prints statements at a ``Place``; a target whose loops depend on
where they sit (Numba's ``prange`` only on the outermost parallel loop) extends ``Place`` and derives the inner
ones in ``inside_loop`` / ``inside_branch``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import Callable, ClassVar, Mapping, Sequence

from tullax.compiler.loops import (
    COMPARE,
    Accum,
    Barrier,
    BinOp,
    Buffer,
    Call,
    Cast,
    Const,
    Expr,
    If,
    Let,
    Load,
    Loop,
    Scratch,
    Select,
    Shared,
    Stmt,
    Store,
    UnOp,
    Var,
    VectorLoad,
    VectorStore,
    binop,
    const,
)
from tullax.errors import TullaxError
from tullax.spec import functions
from tullax.spec.functions import Function


class Precedence(IntEnum):
    """How tightly a printed expression binds, loosest first; one scale for every target (a target that has no
    ``not`` below the comparisons simply never uses NOT)."""

    TERNARY = 0
    OR = 1
    AND = 2
    NOT = 3
    COMPARE = 4
    SUM = 5
    PRODUCT = 6
    UNARY = 7
    POWER = 8
    ATOM = 9


@dataclass(frozen=True)
class Infix:
    """A binary operator written between its operands: the result binds at ``precedence``; an operand binding
    looser than ``left`` / ``right`` is parenthesised."""

    symbol: str
    precedence: int
    left: int
    right: int


def left_associative(symbol: str, precedence: int) -> Infix:
    """``a - b - c`` reads as ``(a - b) - c``: the right operand must bind strictly tighter."""
    return Infix(symbol, precedence, precedence, precedence + 1)


def non_chaining(symbol: str, precedence: int) -> Infix:
    """An operator whose repetition would mean something else (``a < b < c`` chains in Python and Julia): both
    operands must bind strictly tighter."""
    return Infix(symbol, precedence, precedence + 1, precedence + 1)


@dataclass(frozen=True)
class Prefix:
    """A unary operator written before its operand: ``symbol`` is the text before the operand."""

    symbol: str
    precedence: int
    operand: int


@dataclass(frozen=True)
class Ternary:
    """A ``Select``: ``form`` over ``{cond}``, ``{then}``, ``{orelse}``, each printed at least at its precedence.
    The result always binds at ``Precedence.TERNARY``."""

    form: str
    cond: int
    then: int
    orelse: int


# ``c ? a : b`` with every part tighter than the ternary itself (nested selects get parentheses)
C_TERNARY = Ternary("{cond} ? {then} : {orelse}", Precedence.OR, Precedence.OR, Precedence.OR)


def arithmetic_operators(comparison: Callable[[str, int], Infix]) -> dict[str, Infix]:
    """``+ - * /`` and the comparisons as nearly every target writes them; ``comparison`` is
    ``left_associative`` or ``non_chaining``."""
    table = {"+": left_associative("+", Precedence.SUM), "-": left_associative("-", Precedence.SUM),
             "*": left_associative("*", Precedence.PRODUCT), "/": left_associative("/", Precedence.PRODUCT)}
    table.update({op: comparison(op, Precedence.COMPARE) for op in COMPARE})
    return table


@dataclass(frozen=True)
class Place:
    """Where statements are printed: their nesting depth. A target adds the fields its loops need."""

    depth: int


class SharedLanes:
    """For printers of cooperating threads: counts the enclosing ``lanes`` loops (whose iterations the threads
    share) while a loop prints, so that a store outside all of them is made by one thread and one inside by each."""

    lanes_depth = 0

    def loop(self, loop: Loop, place: Place) -> list[str]:
        self.lanes_depth += loop.lanes
        try:
            return super().loop(loop, place)  # type: ignore[misc]
        finally:
            self.lanes_depth -= loop.lanes


# =============================================================================================
# The printer
# =============================================================================================
def _along(index: tuple[Expr, ...], n: int) -> tuple[Expr, ...]:
    """The position ``n`` elements further along the last axis."""
    return index[:-1] + (binop("+", index[-1], const(n)),)


class LoopPrinter(ABC):
    """Prints loop-IR expressions and statements from the class tables below; a target fills them in and
    implements the abstract hooks. Nothing here knows a target: no spelling, no layout, no library."""

    infix: ClassVar[Mapping[str, Infix]]
    prefix: ClassVar[Mapping[str, Prefix]]
    called: ClassVar[Mapping[str, str]]  # binary IR ops printed as a call: op -> function name
    ternary: ClassVar[Ternary] = C_TERNARY
    one_based: ClassVar[bool] = False
    reversed_index: ClassVar[bool] = False
    wrap_negative_operands: ClassVar[bool] = False
    indent: ClassVar[str] = "    "
    if_head: ClassVar[str]  # over {cond}
    else_line: ClassVar[str]
    block_end: ClassVar[str | None] = None  # the line closing a loop or an if, when the target has one
    empty_block: ClassVar[str | None] = None  # the statement of an empty body, when the target needs one
    statement_end: ClassVar[str] = ""
    store_forms: ClassVar[Mapping[str, str]]  # Store.mode -> template over {target} and {value}
    scratch_form: ClassVar[str]  # a Scratch: template over {var}, {length} and {type} (``type_name``)
    # a Buffer (a fused program's row buffer): template over {var}, {length} (printed) and {type}; "" where the
    # target declares it elsewhere (C hoists it to the region's top)
    buffer_form: ClassVar[str] = "{var} = buffer({type}, {length})"

    # -- hooks -----------------------------------------------------------------------------------
    @abstractmethod
    def constant(self, node: Const) -> str:
        """A literal of ``node.dtype``."""

    @abstractmethod
    def type_name(self, dtype: str) -> str:
        """The type of ``dtype`` as a cast spells it (``type_name(dtype)(x)``)."""

    def cast(self, expr: Cast) -> str:
        """A conversion, as a call of the type (an integer narrowed wraps around modulo 2^bits)."""
        return f"{self.type_name(expr.dtype)}({self.expr(expr.arg)})"

    @abstractmethod
    def call_name(self, fn: Function, dtype: str) -> str:
        """The target's spelling of ``fn`` on ``dtype`` arguments (its registry field)."""

    @abstractmethod
    def loop_header(self, loop: Loop, place: Place) -> str:
        """The line opening ``loop`` (its body follows one level deeper)."""

    def variable(self, var: Var) -> str:
        return var.name

    def position(self, expr: Expr) -> str:
        """One array position, already 1-based where the target is."""
        return self.expr(expr)

    def inside_loop(self, loop: Loop, place: Place) -> Place:
        return replace(place, depth=place.depth + 1)

    def inside_branch(self, place: Place) -> Place:
        return replace(place, depth=place.depth + 1)

    # -- expressions -----------------------------------------------------------------------------
    def expr(self, expr: Expr, parent: int = Precedence.TERNARY) -> str:
        """``expr`` as source, parenthesised when it binds looser than ``parent``."""
        text, precedence = self.node(expr)
        return f"({text})" if precedence < parent else text

    def operand(self, expr: Expr, parent: int) -> str:
        """An operand of an operator: ``expr`` at ``parent``, and wrapped when it starts with a minus where the
        target asks for that."""
        text = self.expr(expr, parent)
        return f"({text})" if self.wrap_negative_operands and text.startswith("-") else text

    def node(self, expr: Expr) -> tuple[str, int]:
        """The text of ``expr`` and how tightly it binds."""
        match expr:
            case Const():
                text = self.constant(expr)
                return text, (Precedence.UNARY if text.startswith("-") else Precedence.ATOM)
            case Var():
                return self.variable(expr), Precedence.ATOM
            case Load():
                return self.element(expr.array, expr.index), Precedence.ATOM
            case Cast():
                return self.cast(expr), Precedence.ATOM
            case Call():
                return self.call(self.call_name(_function(expr.fn), expr.dtype), expr.args), Precedence.ATOM
            case Select():
                form = self.ternary
                text = form.form.format(cond=self.expr(expr.cond, form.cond), then=self.expr(expr.then, form.then),
                                        orelse=self.expr(expr.orelse, form.orelse))
                return text, Precedence.TERNARY
            case UnOp():
                prefix = self.prefix[expr.op]
                return prefix.symbol + self.operand(expr.arg, prefix.operand), prefix.precedence
            case BinOp():
                return self.binary(expr)
        raise TullaxError(f"internal error: no printer for the loop IR node {expr!r}")

    def binary(self, expr: BinOp) -> tuple[str, int]:
        if expr.op in self.called:
            return self.call(self.called[expr.op], (expr.lhs, expr.rhs)), Precedence.ATOM
        form = self.infix[expr.op]
        left, right = self.operand(expr.lhs, form.left), self.operand(expr.rhs, form.right)
        return f"{left} {form.symbol} {right}", form.precedence

    def call(self, name: str, args: Sequence[Expr]) -> str:
        return f"{name}({', '.join(self.expr(a) for a in args)})"

    def element(self, array: str, index: Sequence[Expr]) -> str:
        return f"{array}[{self.index(array, index)}]"

    def index(self, array: str, index: Sequence[Expr]) -> str:
        """A 0-based row-major IR index list in the target's order and base."""
        positions = tuple(reversed(index)) if self.reversed_index else tuple(index)
        if self.one_based:
            positions = tuple(binop("+", p, const(1)) for p in positions)
        return ", ".join(self.position(p) for p in positions)

    # -- statements ------------------------------------------------------------------------------
    def block(self, stmts: Sequence[Stmt], place: Place) -> list[str]:
        return [line for stmt in stmts for line in self.statement(stmt, place)]

    def statement(self, stmt: Stmt, place: Place) -> list[str]:
        match stmt:
            case Loop():
                return self.loop(stmt, place)
            case If():
                return self.branch(stmt, place)
            case Let():
                line = self.let(stmt)
            case Accum():
                line = self.accumulate(stmt)
            case Store():
                line = self.store(stmt)
            case Scratch():
                line = self.scratch_form.format(var=stmt.var, length=stmt.length, type=self.type_name(stmt.dtype))
            case Buffer():
                if not self.buffer_form:
                    return []
                line = self.buffer_form.format(var=stmt.var, length=self.expr(stmt.length),
                                               type=self.type_name(stmt.dtype))
            case Shared():
                return self.shared(stmt, place)
            case Barrier():
                line = self.barrier()
            case VectorLoad():
                return self.vector_load(stmt, place)
            case VectorStore():
                return self.vector_store(stmt, place)
            case _:
                raise TullaxError(f"internal error: no printer for the loop IR statement {stmt!r}")
        return [self.indent * place.depth + line + self.statement_end]

    def shared(self, stmt: Shared, place: Place) -> list[str]:
        """A block's shared array (block-tiled kernels, ``tullax.compiler.tiles``): a printer that runs no
        block-tiled kernel never receives one (only the cuda backend's launch planner makes them)."""
        raise TullaxError(f"internal error: {type(self).__name__} prints no block-tiled kernel (shared {stmt.var})")

    def vector_load(self, stmt: VectorLoad, place: Place) -> list[str]:
        """Consecutive elements (along the last axis) into locals: as scalar reads here; a printer with vector
        types overrides."""
        lets = [Let(var, Load(stmt.array, _along(stmt.index, n), stmt.dtype)) for n, var in enumerate(stmt.vars)]
        return [line for let in lets for line in self.statement(let, place)]

    def vector_store(self, stmt: VectorStore, place: Place) -> list[str]:
        """Consecutive elements (along the last axis) set: as scalar stores here; a printer with vector types
        overrides."""
        stores = [Store(stmt.array, _along(stmt.index, n), value) for n, value in enumerate(stmt.values)]
        return [line for store in stores for line in self.statement(store, place)]

    def barrier(self) -> str:
        raise TullaxError(f"internal error: {type(self).__name__} prints no block-tiled kernel (a barrier)")

    def loop(self, loop: Loop, place: Place) -> list[str]:
        pad = self.indent * place.depth
        return [pad + self.loop_header(loop, place), *self.body(loop.body, self.inside_loop(loop, place)),
                *self.closing(place)]

    def branch(self, stmt: If, place: Place) -> list[str]:
        pad, inner = self.indent * place.depth, self.inside_branch(place)
        lines = [pad + self.if_head.format(cond=self.expr(stmt.cond)), *self.body(stmt.then, inner)]
        if stmt.orelse:
            lines += [pad + self.else_line, *self.body(stmt.orelse, inner)]
        return lines + self.closing(place)

    def body(self, stmts: Sequence[Stmt], place: Place) -> list[str]:
        lines = self.block(stmts, place)
        if not lines and self.empty_block is not None:
            return [self.indent * place.depth + self.empty_block]
        return lines

    def closing(self, place: Place) -> list[str]:
        return [] if self.block_end is None else [self.indent * place.depth + self.block_end]

    def let(self, stmt: Let) -> str:
        return f"{stmt.var} = {self.expr(stmt.value)}"

    def accumulate(self, stmt: Accum) -> str:
        value = self.expr(stmt.value)
        if stmt.op in self.called:  # max/min
            return f"{stmt.var} = {self.called[stmt.op]}({stmt.var}, {value})"
        return f"{stmt.var} {self.infix[stmt.op].symbol}= {value}"

    def store(self, stmt: Store) -> str:
        return self.store_forms[stmt.mode].format(target=self.element(stmt.array, stmt.index),
                                                  value=self.expr(stmt.value))


def _function(name: str) -> Function:
    try:
        return functions.get(name)
    except KeyError:
        raise TullaxError(f"internal error: the loop IR calls {name!r}, which is not in the function registry") \
            from None
