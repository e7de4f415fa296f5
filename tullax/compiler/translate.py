"""Spec expressions (``tullax.spec.ir``) as loop-IR expressions.

* Values are computed in the kernel's compute dtype; index arithmetic stays integer (``int64``) and
  comparisons are bools until an arithmetic operation makes them 0/1.
* Function calls follow the registry (``tullax.spec.functions``): a ``call`` function is a ``Call`` of its
  name, an ``expand`` one is rewritten into calls and selects here, a ``structural`` one has its own rule.
* Accesses: plain/affine ones are in range by the inferred ranges; ``mod`` wraps with floor semantics,
  ``clamp`` clamps, a ``pad`` read outside is 0 (a lazy ``Select``), an indirect ``ix[e]`` is read into a
  temporary and checked: outside the axis a gather reads NaN (a scatter skips the element, see ``lower``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from tullax.compiler.emit import Emitter
from tullax.compiler.loops import (
    BOOL,
    COMPLEX,
    FLOATS,
    INDEX,
    NAN,
    REAL_OF,
    BinOp,
    Call,
    Cast,
    Const,
    Expr,
    Load,
    Select,
    UnOp,
    Var,
    binop,
    cast,
    conjunction,
    const,
)
from tullax.compiler.params import Params
from tullax.errors import TullaxError
from tullax.spec import functions, ir
from tullax.spec.ir import Affine, Idx, Indirect, Wrapped


def _integer_fill(dtype: str) -> int:
    """What an out-of-range gather reads in an integer result, as ``jnp.take``'s fill: the type's minimum (its
    maximum when unsigned)."""
    info = np.iinfo(dtype)
    return int(info.max if info.min == 0 else info.min)


@dataclass(frozen=True)
class Position:
    """Where an access reads or writes on one axis, and the conditions for that to be inside the axis."""

    index: Expr
    checks: tuple[Expr, ...] = ()
    pads: bool = False  # the checks are pad conditions (outside reads 0) rather than an index array's


@dataclass(frozen=True)
class Translator:
    """Translates with the kernel's parameters; size parameters and index temporaries come from ``emit``."""

    params: Params
    emit: Emitter
    hole: Expr | None = None  # the reduced value, where a finaliser is translated (``_``)

    @property
    def compute(self) -> str:
        return self.params.compute

    def wrapped(self, expr: Expr) -> Expr:
        """``expr`` as the narrow integer result type would hold it (``Params.wrap``), back in the compute dtype:
        what jnp's int32/uint8... arithmetic gives before a comparison, max/min or abs. Sums, differences and
        products need no wrapping until the end: they agree modulo 2^bits."""
        wrap = self.params.wrap
        if wrap is None or expr.dtype == BOOL or isinstance(expr, Const) or _within(expr, wrap):
            return expr
        return Cast(Cast(cast(expr, self.compute), wrap), self.compute)

    @property
    def real(self) -> str:
        """Real values' dtype: the compute dtype for a real spec; complex inputs stay complex where read."""
        return self.params.real

    def leaf(self, dtype: str) -> str:
        """The dtype a value read from an input of ``dtype`` is computed in."""
        return _COMPLEX_OF[self.real] if dtype in COMPLEX else self.real

    def value(self, expr: ir.Expr) -> Expr:
        """``expr`` in the compute dtype."""
        return cast(self.translate(expr), self.compute)

    def translate(self, expr: ir.Expr) -> Expr:
        if isinstance(expr, ir.Num):
            if isinstance(expr.value, complex):  # a derived gradient's 0.5im
                return Const(expr.value, _COMPLEX_OF[self.real])
            if isinstance(expr.value, bool) or not isinstance(expr.value, int):
                return Const(float(expr.value), self.real)
            return const(expr.value)
        if isinstance(expr, ir.Param):
            arg = self.params.scalar(expr.name)
            return cast(Var(arg.name, arg.dtype), self.leaf(arg.dtype))
        if isinstance(expr, ir.IndexVal):
            return binop("+", self.emit.index_var(expr.name), self.emit.size(expr.offset))
        if isinstance(expr, ir.Size):
            return self.emit.extent(expr.array, expr.axis)
        if isinstance(expr, ir.Hole):
            assert self.hole is not None, "_ outside a finaliser"
            return self.hole
        if isinstance(expr, ir.Access):
            return self.access(expr)
        if isinstance(expr, ir.Unary):
            arg = self.translate(expr.arg)
            if arg.dtype == BOOL:
                arg = cast(arg, self.real)
            if isinstance(arg, Const):
                return Const(-arg.value, arg.dtype)
            return UnOp("neg", arg, arg.dtype)
        if isinstance(expr, ir.Binary):
            return self.binary(expr)
        assert isinstance(expr, ir.Call)
        args = [self.translate(a) for a in expr.args]
        if expr.fn in _WRAPPED_ARGUMENTS:
            args = [self.wrapped(a) for a in args[:_WRAPPED_ARGUMENTS[expr.fn]]] + args[_WRAPPED_ARGUMENTS[expr.fn]:]
        return lower_call(expr.fn, args, self.real)

    def binary(self, expr: ir.Binary) -> Expr:
        lhs, rhs = self.translate(expr.lhs), self.translate(expr.rhs)
        if expr.op in ir.COMPARISONS:
            lhs, rhs = unify(lhs, rhs, self.real)
            return binop(expr.op, self.wrapped(lhs), self.wrapped(rhs))
        wide = _wider(lhs, rhs, self.real)
        if expr.op == "^":
            if isinstance(rhs, Const) and rhs.dtype == INDEX:  # an exact integer power
                base = cast(lhs, _wider(lhs, lhs, self.real))
                return BinOp("^", base, rhs, base.dtype)
            return BinOp("^", cast(lhs, wide), cast(rhs, wide), wide)
        if expr.op == "/":
            return BinOp("/", cast(lhs, wide), cast(rhs, wide), wide)
        lhs, rhs = unify(lhs, rhs, self.real)
        return binop(expr.op, lhs, rhs)

    def access(self, acc: ir.Access) -> Expr:
        """A read: position per axis, with pad and indirect checks folded into a lazy Select."""
        arg = self.params.array(acc.array)
        pad_checks: list[Expr] = []
        ind_checks: list[Expr] = []
        index: list[Expr] = []
        for axis, idx in enumerate(acc.idx):
            pos = self.position(idx, acc.array, axis)
            (pad_checks if pos.pads else ind_checks).extend(pos.checks)
            index.append(pos.index)
        leaf = self.leaf(arg.dtype)
        value: Expr = cast(Load(arg.name, tuple(index), arg.dtype), leaf)
        if ind_checks:  # an index array pointing outside the axis: the gather reads NaN (integers: jnp.take's fill)
            missing = (Const(_integer_fill(self.params.wrap or self.compute), self.compute) if self.compute == INDEX
                       else cast(Const(NAN, self.real), leaf))
            value = Select(conjunction(ind_checks), value, missing, leaf)
        if pad_checks:
            value = Select(conjunction(pad_checks), value, cast(Const(0.0, self.real), leaf), leaf)
        return value

    def affine(self, aff: Affine) -> Expr:
        """An affine position; with div > 1 only under a guard that checked divisibility: exact."""
        pos = self.emit.linear(aff.terms, aff.const)
        if aff.div != 1:
            pos = binop("//", pos, const(aff.div))
        return pos

    def position(self, idx: Idx, array: str, axis: int) -> Position:
        """The position of ``idx`` on ``array``'s ``axis``. The extent becomes a size parameter only where a
        check or a wrap needs it."""
        if isinstance(idx, Affine):
            return Position(self.affine(idx))
        if isinstance(idx, Wrapped):
            inner = self.emit.linear(idx.inner.terms, idx.inner.const)
            extent = self.emit.extent(array, axis)
            if idx.kind == "mod":
                return Position(binop("mod", inner, extent))
            if idx.kind == "clamp":
                return Position(binop("min", binop("max", inner, const(0)), binop("-", extent, const(1))))
            checks = []
            if idx.inner.div != 1:
                checks.append(binop("==", binop("mod", inner, const(idx.inner.div)), const(0)))
                inner = binop("//", inner, const(idx.inner.div))
            checks += [binop(">=", inner, const(0)), binop("<", inner, extent)]
            return Position(inner, tuple(checks), pads=True)
        assert isinstance(idx, Indirect)
        temp = self.index_temp(idx)
        extent = self.emit.extent(array, axis)
        if idx.plain:
            return Position(temp, (binop(">=", temp, const(0)), binop("<", temp, extent)), pads=idx.pad)
        # scale*ix[e] + offset: a value read so large that the int64 sum could wrap is outside too (the offset
        # is within INDEX_LIMIT, checked with the shapes)
        limit = const((ir.INDEX_LIMIT - 1) // abs(idx.scale))
        pos = binop("+", binop("*", const(idx.scale), temp) if idx.scale != 1 else temp,
                     self.emit.linear(idx.offset.terms, idx.offset.const))
        checks = (binop(">=", temp, binop("-", const(0), limit)), binop("<=", temp, limit),
                  binop(">=", pos, const(0)), binop("<", pos, extent))
        return Position(pos, checks, pads=idx.pad)

    def index_temp(self, idx: Indirect) -> Var:
        """``ix[e]`` read once into a temporary where e is known (ix[e] itself is in range by e's range)."""
        arg = self.params.array(idx.array)
        pos = self.emit.linear(idx.inner.terms, idx.inner.const)
        read = Indirect(idx.array, idx.inner)  # the read alone: ix[i]+j and ix[i]+k share one temporary
        return self.emit.index_temp(read, cast(Load(arg.name, (pos,), arg.dtype), INDEX))


# =============================================================================================
# Function calls
# =============================================================================================
def as_bool(expr: Expr) -> Expr:
    if expr.dtype == BOOL:
        return expr
    return binop("!=", expr, cast(const(0), expr.dtype) if expr.dtype != INDEX else const(0))


def unify(a: Expr, b: Expr, compute: str) -> tuple[Expr, Expr]:
    """Both integer: stay integer; otherwise both in the real dtype ``compute`` (bools become 0/1), or in the
    complex dtype of either."""
    if a.dtype == INDEX and b.dtype == INDEX:
        return a, b
    wide = _wider(a, b, compute)
    return cast(a, wide), cast(b, wide)


def _wider(a: Expr, b: Expr, real: str) -> str:
    """The dtype arithmetic on ``a`` and ``b`` computes in: complex when either is, else the real ``real``."""
    return next((x.dtype for x in (a, b) if x.dtype in COMPLEX), real)


_COMPLEX_OF = dict(zip(FLOATS, COMPLEX))


def lower_call(fn: str, args: list[Expr], compute: str) -> Expr:
    """The call of registry function ``fn`` on translated ``args`` (``compute``: the dtype of real values)."""
    if len(args) == 1 and args[0].dtype in COMPLEX:
        return _complex_call(fn, args[0])
    entry = functions.FUNCTIONS.get(fn)
    if entry is not None and entry.lowering in _RULES:
        rule = _RULES[entry.lowering].get(fn)
        if rule is not None:
            return rule(args, compute)
    if entry is None or entry.lowering != "call":
        raise TullaxError(f"function {fn} is not supported by the loop backends")
    if fn == "abs" and args[0].dtype == INDEX:  # |i - j| stays index arithmetic
        return Call("abs", tuple(args), INDEX)
    return Call(fn, tuple(cast(x, compute) for x in args), compute)


def _complex_call(fn: str, x: Expr) -> Expr:
    """``fn`` of a complex value: ``real``/``imag``/``abs`` are real of its precision, the others (``conj``, the
    holomorphic functions; spec.valuetype refused the rest) complex."""
    real = functions.get(fn).on_complex == "real-valued"
    return Call(fn, (x,), REAL_OF[x.dtype] if real else x.dtype)


def _ifelse(args: list[Expr], compute: str) -> Expr:
    cond, then, other = args
    then, other = unify(then, other, compute)
    return Select(as_bool(cond), then, other, then.dtype)


def _extremum(fn: str) -> Callable[[list[Expr], str], Expr]:
    def rule(args: list[Expr], compute: str) -> Expr:
        a, b = unify(*args, compute)
        return binop(fn, a, b)
    return rule


def _real(args: list[Expr], compute: str) -> Expr:
    """Values are real here: ``conj`` and ``real`` are the value itself."""
    (x,) = args
    return x if x.dtype != BOOL else cast(x, compute)


def _imag(args: list[Expr], compute: str) -> Expr:
    return Const(0.0, compute)


def _relu(args: list[Expr], compute: str) -> Expr:
    """max(x, 0), NaN-propagating as jax.nn.relu (a select on x > 0 gave 0 at NaN)."""
    x, zero = cast(args[0], compute), Const(0.0, compute)
    return binop("max", x, zero)


def _sign(args: list[Expr], compute: str) -> Expr:
    """x > 0 ? 1 : (x < 0 ? -1 : x): C has no sign(); zeros and NaN come out as themselves, as in jnp.sign."""
    x, zero = cast(args[0], compute), Const(0.0, compute)
    negative = Select(binop("<", x, zero), Const(-1.0, compute), x, compute)
    return Select(binop(">", x, zero), Const(1.0, compute), negative, compute)


def _exp_minus_abs(x: Expr, compute: str) -> Expr:
    """exp(-|x|): never overflows."""
    return Call("exp", (UnOp("neg", Call("abs", (x,), compute), compute),), compute)


def _sigmoid(args: list[Expr], compute: str) -> Expr:
    """1/(1+exp(-x)) for x >= 0, exp(x)/(1+exp(x)) below: through exp(-|x|)."""
    x, zero, one = cast(args[0], compute), Const(0.0, compute), Const(1.0, compute)
    e = _exp_minus_abs(x, compute)
    pos = BinOp("/", one, BinOp("+", one, e, compute), compute)
    neg = BinOp("/", e, BinOp("+", one, e, compute), compute)
    return Select(binop(">=", x, zero), pos, neg, compute)


def _softplus(args: list[Expr], compute: str) -> Expr:
    """log(1+exp(x)) = max(x,0) + log1p(exp(-|x|))."""
    x, zero = cast(args[0], compute), Const(0.0, compute)
    return BinOp("+", binop("max", x, zero), Call("log1p", (_exp_minus_abs(x, compute),), compute), compute)


def _within(expr: Expr, wrap: str) -> bool:
    """``expr`` holds a value of ``wrap`` already: a load of a type it holds, or a value wrapped before."""
    inner = expr.arg if isinstance(expr, Cast) else expr
    if isinstance(inner, Cast) and inner.dtype == wrap:
        return True
    return isinstance(inner, Load) and np.can_cast(inner.dtype, wrap)


# functions whose value on integers depends on more than their arguments modulo 2^bits: how many leading
# arguments a narrow integer kernel wraps first (``Translator.wrapped``; ifelse: its condition)
_WRAPPED_ARGUMENTS = {"abs": 1, "relu": 1, "max": 2, "min": 2, "ifelse": 1}

Rule = Callable[[list[Expr], str], Expr]
# the rules of the registry's "structural" and "expand" functions (a "call" function needs none)
_STRUCTURAL: dict[str, Rule] = {"ifelse": _ifelse, "max": _extremum("max"), "min": _extremum("min"),
                                "conj": _real, "real": _real, "imag": _imag}
_EXPANSIONS: dict[str, Rule] = {"relu": _relu, "sign": _sign, "sigmoid": _sigmoid, "softplus": _softplus}
_RULES = {"structural": _STRUCTURAL, "expand": _EXPANSIONS}
