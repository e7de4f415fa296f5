"""The naive evaluator: the ground truth for the forward semantics of docs/design.md, section 1.

``naive_eval`` runs a spec with Python loops over every index value and a tiny interpreter of the body. It
shares nothing with the backends but the analysed Spec and the function registry's NumPy implementations (no
jax, no lowering), so a backend that agrees with it agrees with the spec language. It is slow: use tiny sizes.
"""
from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Mapping

import numpy as np

from tullax.errors import ShapeError
from tullax.spec import functions
from tullax.spec.ir import (
    Access,
    Affine,
    Binary,
    Call,
    Expr,
    Hole,
    Idx,
    IndexVal,
    Indirect,
    Num,
    Param,
    Size,
    Spec,
    Unary,
    Wrapped,
    integer_literal,
)

Point = dict[str, int]


# =============================================================================================
def naive_eval(spec: Spec, env: Mapping[str, Any]) -> np.ndarray:
    """The result of ``spec`` on ``env`` (input name -> array or number), computed element by element in
    float64 (complex128 when an input is complex). Out-of-range plain/affine accesses and index arrays holding
    positions outside their axis raise ShapeError, as eager calls do."""
    arrays = {name: np.asarray(env[name]) for name in spec.input_names}
    shapes = {name: a.shape for name, a in arrays.items()}
    ranges = {name: (r.lo.eval(shapes), r.hi.eval(shapes)) for name, r in spec.ranges}
    complex_io = any(np.iscomplexobj(arrays[i.name]) for i in spec.inputs if i.kind in ("array", "scalar"))
    kind = np.complex128 if complex_io else np.float64
    ev = _Evaluator(spec, arrays, shapes, kind)
    with np.errstate(all="ignore"):
        if spec.is_scatter:
            return _naive_scatter(ev, ranges)
        return _naive_reduce(ev, ranges)


def _values(ranges: Mapping[str, tuple[int, int]], names: tuple[str, ...]):
    """Every combination of the index values of ``names`` (nothing when one range is empty)."""
    return itertools.product(*(range(ranges[n][0], ranges[n][1]) for n in names))


def _naive_reduce(ev: "_Evaluator", ranges) -> np.ndarray:
    spec = ev.spec
    if spec.assign == ":=":
        for name in spec.free:
            if ranges[name][1] < ranges[name][0]:
                raise ShapeError(f"index {name} has an empty range {ranges[name]}")
        out = np.zeros(tuple(ranges[n][1] - ranges[n][0] for n in spec.free), ev.kind)
    else:
        out = ev.arrays[spec.out].astype(ev.kind, copy=True)
    for free_values in _values(ranges, spec.free):
        point = dict(zip(spec.free, free_values))
        terms = []
        for reduced_values in _values(ranges, spec.reduced):
            point.update(zip(spec.reduced, reduced_values))
            terms.append(ev.body(point))
        value = _reduce(spec.redop, terms, ev.kind)
        if spec.finalizer is not None:  # once per element, reading at the free indices only
            ev.hole = value
            value = ev.eval(spec.finalizer, dict(zip(spec.free, free_values)))
        where = tuple(v - ranges[n][0] if spec.assign == ":=" else v for n, v in zip(spec.free, free_values))
        if spec.assign == "+=":
            out[where] += value
        elif spec.assign == "*=":
            out[where] *= value
        else:
            out[where] = value
    return out


def _naive_scatter(ev: "_Evaluator", ranges) -> np.ndarray:
    spec = ev.spec
    out = ev.arrays[spec.out].astype(ev.kind, copy=True)
    for values in _values(ranges, spec.reduced):
        point = dict(zip(spec.reduced, values))
        where = [ev.position(spec.out, axis, idx, point) for axis, idx in enumerate(spec.lhs)]
        value = ev.body(point)
        if None not in where:  # a pad position outside the output: the value goes nowhere
            out[tuple(where)] += value
    return out


def _reduce(redop: str, terms: list, kind) -> Any:
    if redop == "+":
        return kind(sum(terms, kind(0)))
    if redop == "*":
        return kind(math.prod(terms, start=kind(1)))
    if redop in ("max", "min"):
        if not terms:
            return kind(-np.inf if redop == "max" else np.inf)
        return kind(np.max(terms) if redop == "max" else np.min(terms))
    return _logsumexp(terms, kind)


def _logsumexp(terms: list, kind) -> Any:
    if not terms:
        return kind(-np.inf)
    top = np.max(np.real(terms))
    if not np.isfinite(top):
        return kind(top)  # all -inf gives -inf; any +inf gives +inf
    return kind(top + np.log(sum(np.exp(t - top) for t in terms)))


def _call(fn: str, args: tuple, kind) -> Any:
    # the structural functions have no NumPy entry in the registry: a lazy select, and max/min that give NaN
    # when either side is NaN (as XLA's maximum/minimum do, where Python's max would depend on the order)
    if fn == "ifelse":
        cond, then, other = args
        return then if cond != 0 else other
    if fn in ("max", "min"):
        a, b = args
        if np.isnan(a) or np.isnan(b):
            return kind(np.nan)
        return (a if a >= b else b) if fn == "max" else (a if a <= b else b)
    return kind(functions.get(fn).numpy(*args))


class _Evaluator:
    """Evaluates the body at one point (a value for every index): an interpreter, one node at a time."""

    def __init__(self, spec: Spec, arrays: dict[str, np.ndarray], shapes, kind):
        self.spec, self.arrays, self.shapes, self.kind = spec, arrays, shapes, kind
        self.hole: Any = None  # the reduced value of the element being finalised (``_``)

    def body(self, point: Point) -> Any:
        return self.eval(self.spec.body, point)

    def eval(self, expr: Expr, point: Point) -> Any:
        kind = self.kind
        if isinstance(expr, Num):
            return kind(expr.value)
        if isinstance(expr, Param):
            return kind(self.arrays[expr.name])
        if isinstance(expr, IndexVal):
            return kind(point[expr.name] + expr.offset.eval(self.shapes))
        if isinstance(expr, Size):
            return kind(self.shapes[expr.array][expr.axis])
        if isinstance(expr, Hole):
            return self.hole
        if isinstance(expr, Access):
            return self.read(expr, point)
        if isinstance(expr, Unary):
            return -self.eval(expr.arg, point)
        if isinstance(expr, Call):
            return _call(expr.fn, tuple(self.eval(a, point) for a in expr.args), kind)
        assert isinstance(expr, Binary), expr
        lhs = self.eval(expr.lhs, point)
        exponent = integer_literal(expr.rhs) if expr.op == "^" else None
        if exponent is not None:
            return _int_power(lhs, exponent, kind)
        rhs = self.eval(expr.rhs, point)
        return _BINARY[expr.op](lhs, rhs, kind)

    def read(self, acc: Access, point: Point) -> Any:
        where = []
        for axis, idx in enumerate(acc.idx):
            pos = self.position(acc.array, axis, idx, point)
            if pos is None:  # pad outside the axis
                return self.kind(0)
            where.append(pos)
        return self.kind(self.arrays[acc.array][tuple(where)])

    def affine(self, aff: Affine, point: Point) -> int:
        return sum(coef * point[name] for name, coef in aff.terms) + aff.const.eval(self.shapes)

    def position(self, array: str, axis: int, idx: Idx, point: Point) -> int | None:
        """The position ``idx`` reads on ``axis`` of ``array`` at ``point``; None: outside, under pad."""
        extent = self.shapes[array][axis]
        if isinstance(idx, Affine):
            return self.in_bounds(array, axis, self.affine(idx, point))
        if isinstance(idx, Indirect):
            at = self.in_bounds(idx.array, 0, self.affine(idx.inner, point))
            pos = idx.scale * int(self.arrays[idx.array][at]) + self.affine(idx.offset, point)
            if idx.pad and not 0 <= pos < extent:  # pad(ix[e]) outside the axis
                return None
            if not 0 <= pos < extent:
                what = "is" if idx.plain else f"puts position {pos}"
                raise ShapeError(f"{idx.array}[{at}] = {int(self.arrays[idx.array][at])} {what} outside axis "
                                 f"{axis} of {array} (extent {extent})")
            return pos
        raw = self.affine(idx.inner, point)
        if extent == 0 and idx.kind != "pad":
            raise ShapeError(f"{idx.kind}(..) on the empty axis {axis} of {array}")
        if idx.kind == "mod":
            return raw % extent
        if idx.kind == "clamp":
            return min(max(raw, 0), extent - 1)
        assert isinstance(idx, Wrapped) and idx.kind == "pad"
        if raw % idx.inner.div:
            return None
        raw //= idx.inner.div
        return raw if 0 <= raw < extent else None

    def in_bounds(self, array: str, axis: int, pos: int) -> int:
        extent = self.shapes[array][axis]
        if not 0 <= pos < extent:
            raise ShapeError(f"position {pos} is outside axis {axis} of {array} (extent {extent})")
        return pos


def _int_power(base, exponent: int, kind):
    """Exact repeated multiplication (negative bases are fine), like jax's integer_pow."""
    result = kind(1)
    for _ in range(abs(exponent)):
        result = result * base
    return kind(1) / result if exponent < 0 else result


_BINARY: dict[str, Callable] = {
    "+": lambda a, b, k: a + b,
    "-": lambda a, b, k: a - b,
    "*": lambda a, b, k: a * b,
    "/": lambda a, b, k: a / b,
    # the scalars' ``**`` is C's pow (C99 Annex F, as jnp and every backend: (-inf)^0.5 is inf); np.power
    # gives NaN there
    "^": lambda a, b, k: k(k(a) ** k(b)),
    "<": lambda a, b, k: k(a < b),
    "<=": lambda a, b, k: k(a <= b),
    ">": lambda a, b, k: k(a > b),
    ">=": lambda a, b, k: k(a >= b),
    "==": lambda a, b, k: k(a == b),
    "!=": lambda a, b, k: k(a != b),
}


__all__ = ["naive_eval"]
