"""The spec IR: frozen, hashable dataclasses shared by every stage.

Source spans ride along for error messages but take no part in equality or hashing, so two spellings of
the same spec give equal (and equally hashed) trees.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterator, Union

from tullax.spec.sizes import Sym

Span = tuple[int, int]


def _span() -> Span:
    return field(default=(0, 0), compare=False, hash=False, repr=False)


# ---------------------------------------------------------------------------------------------
# Index expressions (what stands between the brackets)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Affine:
    """``(sum(coef * index) + const) / div``; ``div`` > 1 only in derived gradient specs, inside ``pad``."""

    terms: tuple[tuple[str, int], ...] = ()
    const: Sym = Sym(0)
    div: int = 1
    span: Span = _span()

    @staticmethod
    def index(name: str) -> "Affine":
        return Affine(((name, 1),))

    @property
    def plain(self) -> str | None:
        """The index name when this is a bare index (``A[i]``), else None."""
        if len(self.terms) == 1 and self.terms[0][1] == 1 and self.const == Sym(0) and self.div == 1:
            return self.terms[0][0]
        return None

    def coef(self, name: str) -> int:
        return dict(self.terms).get(name, 0)

    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.terms)


@dataclass(frozen=True)
class Wrapped:
    """``mod(e)``, ``clamp(e)`` or ``pad(e)``: an access that wraps, clamps or reads zero outside the axis."""

    kind: str
    inner: Affine
    span: Span = _span()


@dataclass(frozen=True)
class Indirect:
    """``ix[e]``: the position is read from the integer array ``array`` at ``e``. A read outside the axis gives
    NaN (as ``jnp.take``'s fill), or 0 under ``pad`` (``pad(ix[e])``): how a gradient reads the cotangent at a
    scatter's positions, where the scatter dropped the element (as ``.at[].add(mode='drop')``'s gradient).
    Inside affine arithmetic (``ix[e]+j``, ``2K[j]+i``) the position is ``scale*array[e] + offset``."""

    array: str
    inner: Affine
    span: Span = _span()
    pad: bool = False
    scale: int = 1
    offset: Affine = Affine()

    @property
    def plain(self) -> bool:
        """A bare ``ix[e]`` (no arithmetic around the read)."""
        return self.scale == 1 and self.offset == Affine()


Idx = Union[Affine, Wrapped, Indirect]


def idx_affine(idx: Idx) -> Affine:
    """The affine part of any index expression (of an indirect one: where the index array is read)."""
    return idx if isinstance(idx, Affine) else idx.inner


def idx_names(idx: Idx) -> tuple[str, ...]:
    """Every index a position depends on (an indirect one's offset included), in order, without repeats."""
    names = idx_affine(idx).names()
    if isinstance(idx, Indirect) and not idx.plain:
        names += tuple(n for n in idx.offset.names() if n not in names)
    return names


# ---------------------------------------------------------------------------------------------
# Body expressions
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Num:
    value: Union[int, float]
    span: Span = _span()


@dataclass(frozen=True)
class Name:
    """A bare identifier as parsed; analysis turns it into a Param or an IndexVal."""

    name: str
    span: Span = _span()


@dataclass(frozen=True)
class Param:
    """A scalar input."""

    name: str
    span: Span = _span()


@dataclass(frozen=True)
class IndexVal:
    """The integer value of an index (plus ``offset``, set when a free index is shifted to start at 0)."""

    name: str
    offset: Sym = Sym(0)
    span: Span = _span()


@dataclass(frozen=True)
class Access:
    array: str
    idx: tuple[Idx, ...]
    span: Span = _span()


@dataclass(frozen=True)
class Unary:
    op: str  # only "-"
    arg: "Expr"
    span: Span = _span()


@dataclass(frozen=True)
class Binary:
    op: str  # + - * / ^ < <= > >= == !=
    lhs: "Expr"
    rhs: "Expr"
    span: Span = _span()


@dataclass(frozen=True)
class Call:
    fn: str
    args: tuple["Expr", ...]
    span: Span = _span()


@dataclass(frozen=True)
class Hole:
    """``_`` in a finaliser (``|> relu(_ + b[j])``): the value the reduction produced for this element."""

    span: Span = _span()


@dataclass(frozen=True)
class Size:
    """``size(A, d)``: the extent of ``array`` along axis ``d`` (0-based, as ``explain`` prints it), an integer."""

    array: str
    axis: int
    span: Span = _span()


Expr = Union[Num, Name, Param, IndexVal, Access, Unary, Binary, Call, Hole, Size]

COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")
ARITHMETIC = ("+", "-", "*", "/", "^")

# Generated code computes positions, guards and loop bounds in int64: every range bound and every position is
# kept within +-INDEX_LIMIT (checked for the actual shapes), so each of those plus or minus an extent still fits.
INDEX_LIMIT = 2**62
REDUCTIONS = ("+", "*", "max", "min", "logsumexp")
_REDUCTION_IDENTITY = {"+": 0.0, "*": 1.0, "max": -float("inf"), "min": float("inf"), "logsumexp": -float("inf")}


def reduction_identity(redop: str, dtype: str = "float64") -> float | int:
    """The initial value of reduction ``redop`` in ``dtype`` (a NumPy dtype's name), for every lowering: an
    integer max/min starts at the type's extreme (integers have no infinities)."""
    if redop in ("max", "min") and dtype.startswith(("int", "uint")):
        import numpy as np

        info = np.iinfo(dtype)
        return int(info.min if redop == "max" else info.max)
    return _REDUCTION_IDENTITY[redop]


# all/any: parsed, then analysed as (min)/(max) of 0/1 values (spec.frontend); the result is made bool by api.options
BOOLEAN_REDUCTIONS = {"&": "min", "|": "max"}
ASSIGNMENTS = (":=", "=", "+=", "*=")  # "*=": multiply into the given array, with the (*) reduction
WRAPPERS = ("mod", "clamp", "pad")


def children(expr: Expr) -> tuple[Expr, ...]:
    if isinstance(expr, Unary):
        return (expr.arg,)
    if isinstance(expr, Binary):
        return (expr.lhs, expr.rhs)
    if isinstance(expr, Call):
        return expr.args
    return ()


def walk(expr: Expr) -> Iterator[Expr]:
    """Every node of ``expr``, parents before children, left to right."""
    yield expr
    for child in children(expr):
        yield from walk(child)


def accesses(expr: Expr) -> Iterator[Access]:
    return (node for node in walk(expr) if isinstance(node, Access))


def arrays_read(body: Expr, lhs: tuple[Idx, ...] | None = None) -> set[str]:
    """Every array a spec reads: those ``body`` accesses, the index arrays inside their positions and the
    index arrays of ``lhs`` (a scatter's positions)."""
    read = set()
    for access in accesses(body):
        read.add(access.array)
        read.update(idx.array for idx in access.idx if isinstance(idx, Indirect))
    read.update(idx.array for idx in lhs or () if isinstance(idx, Indirect))
    return read


def spec_exprs(spec: "ParsedSpec | Spec") -> tuple[Expr, ...]:
    """The expressions of a spec: its body, then its finaliser (which reads arrays at the free indices)."""
    return (spec.body,) if spec.finalizer is None else (spec.body, spec.finalizer)


def spec_accesses(spec: "ParsedSpec | Spec") -> Iterator[Access]:
    """Every access of the body and of the finaliser."""
    return (acc for expr in spec_exprs(spec) for acc in accesses(expr))


def map_expr(expr: Expr, fn) -> Expr:
    """Rebuild ``expr`` bottom-up, applying ``fn`` to every node after its children."""
    if isinstance(expr, Unary):
        expr = replace(expr, arg=map_expr(expr.arg, fn))
    elif isinstance(expr, Binary):
        expr = replace(expr, lhs=map_expr(expr.lhs, fn), rhs=map_expr(expr.rhs, fn))
    elif isinstance(expr, Call):
        expr = replace(expr, args=tuple(map_expr(a, fn) for a in expr.args))
    return fn(expr)


def integer_literal(expr: Expr) -> int | None:
    """The value of an integer literal, negative ones included (``x^-1``); None for any other expression.
    An integer exponent is exact repeated multiplication, fine for negative bases, where ``x^0.5`` is not."""
    if isinstance(expr, Num) and isinstance(expr.value, int):
        return expr.value
    if isinstance(expr, Unary) and isinstance(expr.arg, Num) and isinstance(expr.arg.value, int):
        return -expr.arg.value
    return None


# ---------------------------------------------------------------------------------------------
# Parsed and analysed specs
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ParsedSpec:
    """The syntax tree of one spec line, before any name is resolved."""

    redop: str
    out: str
    lhs: tuple[Idx, ...] | None  # None: a scalar result (no brackets)
    assign: str
    body: Expr
    finalizer: Expr | None  # over Hole (``_``); ``|> f`` is ``f(_)``
    source: str = field(default="", compare=False, hash=False, repr=False)
    ranges: tuple[tuple[str, "Range"], ...] = ()  # ``(k in lo:hi)`` clauses written after the expression


@dataclass(frozen=True)
class Range:
    """``lo <= index < hi``, both symbolic in the input extents."""

    lo: Sym
    hi: Sym

    def extent(self) -> Sym:
        return self.hi - self.lo


@dataclass(frozen=True)
class Input:
    """One input of a spec. ``kind``: 'array' (data), 'scalar' (parameter), 'index' (integers for ``ix[..]``)
    or 'shape' (only its extents are read, by the ranges of a derived gradient spec)."""

    name: str
    kind: str
    rank: int


@dataclass(frozen=True)
class Agreement:
    """Two axes that bind the same index and must have equal extents."""

    index: str
    first: tuple[str, int]
    second: tuple[str, int]


@dataclass(frozen=True)
class Spec:
    """An analysed spec: names resolved, free and reduced indices, symbolic ranges. Hashable: it is the
    cache key and JAX's static argument."""

    redop: str
    out: str
    lhs: tuple[Idx, ...] | None
    assign: str
    body: Expr
    finalizer: Expr | None  # over Hole (``_``), the reduced value; reads arrays only at the free indices
    inputs: tuple[Input, ...]
    free: tuple[str, ...]
    reduced: tuple[str, ...]
    ranges: tuple[tuple[str, Range], ...]
    agreements: tuple[Agreement, ...] = ()
    out_shape: tuple[Sym, ...] = ()  # extents of a ':=' result; for '='/'+=' the given array's own shape
    scan: "Any" = None  # a ``tullax.spec.scan.Scan`` when one index runs sequentially (a recurrence)

    def __hash__(self) -> int:
        # Every plan, cache and jax lookup hashes the spec, and a field-wise hash walks its whole tree each
        # time; the fields never change, so the first hash is kept on the spec (not pickled: ``__getstate__``)
        found = self.__dict__.get("_hash")
        if found is None:
            found = hash(tuple(getattr(self, f.name) for f in fields(self)))
            object.__setattr__(self, "_hash", found)
        return found

    def __getstate__(self) -> dict:
        # a str's hash differs between processes, and the c backend pickles specs into the compile cache
        return {name: value for name, value in self.__dict__.items() if name != "_hash"}

    @property
    def range_of(self) -> dict[str, Range]:
        return dict(self.ranges)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs)

    def input(self, name: str) -> Input:
        for item in self.inputs:
            if item.name == name:
                return item
        raise KeyError(name)

    @property
    def indices(self) -> tuple[str, ...]:
        return self.free + self.reduced

    @property
    def is_scatter(self) -> bool:
        """True when the left-hand side is not a list of distinct plain indices (``+=`` into computed places)."""
        return self.lhs is not None and any(
            not (isinstance(i, Affine) and i.plain) for i in self.lhs)
