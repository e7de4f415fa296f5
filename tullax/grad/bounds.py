"""Symbolic size reasoning for the gradients: what is provably inside a range, and comparisons for the rest.

Gradients only know sizes symbolically; an inverted access needs ``pad`` and a solved index needs a range
guard unless the extents the spec relates (agreeing axes, the seed having the result's shape) prove it stays
in bounds. Every "provably" here is a sufficient check: a False only costs a guard that always holds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from tullax.grad.algebra import compare
from tullax.spec.affine import AffineForm
from tullax.spec.ir import Expr, Range
from tullax.spec.sizes import Extent, Extremum, FloorDiv, Sym, extremum, floordiv

Axis = tuple[str, int]

# How deep _ge unfolds nested max/min before giving up (each level tries every argument): far more than any
# spec nests, small enough that a pathological size cannot blow up the derivation.
_MAX_EXTREMUM_DEPTH = 6


@dataclass(frozen=True)
class KnownSizes:
    """Extents known equal (agreeing axes, the seed having the result's shape): canonical forms and bounds."""

    equal: Mapping[Axis, Sym] = field(default_factory=lambda: MappingProxyType({}))

    def with_equal(self, axis: Axis, extent: Sym) -> KnownSizes:
        return KnownSizes(MappingProxyType({**self.equal, axis: extent}))

    def canon(self, sym: Sym) -> Sym:
        out = Sym(sym.const)
        for atom, coef in sym.terms:
            out = out + self._atom(atom) * coef
        return out

    def _atom(self, atom) -> Sym:
        if isinstance(atom, Extent):
            key = (atom.array, atom.axis)
            return self.canon(self.equal[key]) if key in self.equal else Sym.of(atom)
        if isinstance(atom, FloorDiv):
            return floordiv(self.canon(atom.num), atom.den)
        return extremum(atom.kind, [self.canon(a) for a in atom.args])

    def at_least(self, a: Sym, b: Sym) -> bool:
        """a >= b provably."""
        return _ge(self.canon(a), self.canon(b))

    def bounds(self, form: AffineForm, ranges: Mapping[str, Range]) -> tuple[Sym, Sym]:
        """Smallest and largest value of an undivided affine form over ``ranges``."""
        low = high = form.const
        for name, coef in form.terms:
            rng = ranges[name]
            first, last = rng.lo * coef, (rng.hi - 1) * coef
            low, high = (low + first, high + last) if coef > 0 else (low + last, high + first)
        return low, high

    def within(self, form: AffineForm, lo: Sym, hi: Sym, ranges: Mapping[str, Range]) -> tuple[bool, bool]:
        """(lo <= form provably, form < hi provably) for every value of ``ranges``."""
        if form.div != 1:
            return False, False
        low, high = self.bounds(form, ranges)
        return self.at_least(low, lo), self.at_least(hi - 1, high)

    def range_conditions(self, form: AffineForm, rng: Range, ranges: Mapping[str, Range]) -> list[Expr]:
        """Comparisons saying lo <= form < hi, leaving out the sides that hold for every value in ``ranges``."""
        low_ok, high_ok = self.within(form, rng.lo, rng.hi, ranges)
        conds = []
        if not low_ok:
            conds.append(compare(">=", form, rng.lo))
        if not high_ok:
            conds.append(compare("<", form, rng.hi))
        return conds


def _ge(a: Sym, b: Sym, depth: int = 0) -> bool:
    diff = a - b
    if diff.is_const:
        return diff.const >= 0
    if depth > _MAX_EXTREMUM_DEPTH:
        return False
    for side, sym in (("a", a), ("b", b)):
        for atom, coef in sym.terms:
            if isinstance(atom, Extremum) and coef == 1:
                rest = sym - Sym.of(atom)
                parts = [arg + rest for arg in atom.args]
                if side == "a":  # min(..) >= b needs every argument; max(..) >= b needs one
                    checks = [_ge(p, b, depth + 1) for p in parts]
                    return all(checks) if atom.kind == "min" else any(checks)
                checks = [_ge(a, p, depth + 1) for p in parts]
                return all(checks) if atom.kind == "max" else any(checks)
    return False
