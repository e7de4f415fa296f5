"""Affine forms over integer indices: THE algebra of ``(Σ coef*index + const) / div``.

An ``AffineForm`` is exact arithmetic on what stands inside an index expression (``ir.Affine``) and on the
linear conditions built from them: coefficients are integers, the constant is a symbolic size (``Sym``, so
``i + size(x,0) - 1`` is one form) and ``div`` >= 1 divides the whole (a solved ``2i = m`` gives ``m/2``).

Two spellings of one value:
- the forms arithmetic returns keep their terms in order of first appearance (left operand first) and drop
  zero coefficients, so a caller that prints the terms in order gets the order it wrote them in;
- ``normalized()`` is the canonical form: no common factor between the coefficients, the constant and
  ``div``, positive terms first then negative ones, each group by name. Two forms with the same value have
  the same normal form, so it is the one to compare, hash or print where the spelling must not matter.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Mapping

from tullax.spec.ir import Affine
from tullax.spec.sizes import Shapes, Sym

Terms = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class AffineForm:
    """``(Σ coef*index + const) / div`` with integer coefficients, a symbolic constant and ``div`` >= 1."""

    terms: Terms = ()
    const: Sym = Sym(0)
    div: int = 1

    # -- construction -------------------------------------------------------------------------
    @staticmethod
    def of(aff: Affine) -> AffineForm:
        """The form of an index expression, its terms in their order (not normalized)."""
        return AffineForm(tuple((n, c) for n, c in aff.terms if c), aff.const, aff.div)

    @staticmethod
    def index(name: str) -> AffineForm:
        return AffineForm(((name, 1),))

    @staticmethod
    def constant(value: int | Sym) -> AffineForm:
        return AffineForm((), Sym.of(value))

    @staticmethod
    def canonical(coefs: Mapping[str, int], const: Sym, div: int = 1) -> AffineForm:
        """The normal form of ``(Σ coefs[n]*n + const) / div`` (see the module docstring); ``div`` may be
        negative here, the sign moves to the numerator."""
        if div < 0:
            coefs, const, div = {n: -c for n, c in coefs.items()}, -const, -div
        kept = {n: c for n, c in coefs.items() if c}
        g = math.gcd(div, *kept.values(), const.const, *(c for _, c in const.terms))
        if g > 1:
            kept = {n: c // g for n, c in kept.items()}
            const = Sym(const.const // g, tuple((a, c // g) for a, c in const.terms))
            div //= g
        order = sorted(kept.items(), key=lambda kv: (kv[1] < 0, kv[0]))  # positive terms first: m-k
        return AffineForm(tuple(order), const, div)

    def normalized(self) -> AffineForm:
        return AffineForm.canonical(dict(self.terms), self.const, self.div)

    def to_affine(self) -> Affine:
        """The index expression ``ir.Affine`` of this form, terms in this form's order."""
        return Affine(self.terms, self.const, self.div)

    # -- queries ------------------------------------------------------------------------------
    def coef(self, name: str) -> int:
        return dict(self.terms).get(name, 0)

    def coefs(self) -> dict[str, int]:
        return dict(self.terms)

    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.terms)

    @property
    def plain(self) -> str | None:
        """The index name when this form is a bare index (``i``), else None."""
        if len(self.terms) == 1 and self.terms[0][1] == 1 and self.const == Sym(0) and self.div == 1:
            return self.terms[0][0]
        return None

    def eval(self, point: Mapping[str, int | Fraction], shapes: Shapes) -> Fraction:
        """The exact value at ``point`` (a value per index name), sizes taken from ``shapes``."""
        total = Fraction(self.const.eval(shapes)) + sum(Fraction(point[n]) * c for n, c in self.terms)
        return total / self.div

    # -- arithmetic ---------------------------------------------------------------------------
    def scale(self, k: int) -> AffineForm:
        """``k`` times this form."""
        return _combine([(self, k)], self.div)

    def __neg__(self) -> AffineForm:
        return self.scale(-1)

    def __add__(self, other: AffineForm) -> AffineForm:
        div = math.lcm(self.div, other.div)
        return _combine([(self, div // self.div), (other, div // other.div)], div)

    def __sub__(self, other: AffineForm) -> AffineForm:
        return self + (-other)

    def substitute(self, solutions: Mapping[str, AffineForm]) -> AffineForm:
        """Replace every index ``t`` that ``solutions`` names by its form, all at once (a solution's own
        indices are not substituted again)."""
        if not any(n in solutions for n, _ in self.terms):
            return self
        kept = AffineForm(tuple((n, c) for n, c in self.terms if n not in solutions), self.const, self.div)
        out = kept
        for name, coef in self.terms:
            if name in solutions:
                out = out + AffineForm(solutions[name].terms, solutions[name].const,
                                       solutions[name].div * self.div).scale(coef)
        return out

    def solve_for(self, name: str, value: AffineForm) -> AffineForm:
        """The form of index ``name`` that makes this form equal ``value`` (a form over other indices):
        writing this form as ``(c*name + rest) / div``, that is ``(div*value - rest) / c`` (exact, so it has
        a divisor when ``|c|`` > 1)."""
        c = self.coef(name)
        if c == 0 or value.coef(name):
            raise ValueError(f"cannot solve for {name!r}: it must occur in the form and not in the value")
        rest = AffineForm(tuple((n, k) for n, k in self.terms if n != name), self.const)
        numerator = AffineForm(value.terms, value.const).scale(self.div) - rest.scale(value.div)
        sign = 1 if c > 0 else -1
        return AffineForm(numerator.terms, numerator.const, value.div * abs(c)).scale(sign)


def _combine(parts: list[tuple[AffineForm, int]], div: int) -> AffineForm:
    """``Σ k * numerator(form)`` over ``div``: terms in order of first appearance, zero coefficients dropped."""
    coefs: dict[str, int] = {}
    const = Sym(0)
    for form, k in parts:
        for name, coef in form.terms:
            coefs[name] = coefs.get(name, 0) + k * coef
        if form.const != Sym(0):  # Sym arithmetic is costly and most constants are 0
            const = const + (form.const if k == 1 else form.const * k)
    return AffineForm(tuple((n, c) for n, c in coefs.items() if c), const, div)
