"""Symbolic sizes: integer expressions in the extents of the input arrays.

Range inference happens before any shape is known, so index ranges are symbolic: a linear combination of
atoms (an array extent, a floor division, a max or a min of other sizes) plus a constant. The canonical form
makes equal sizes compare and hash equal, so specs that only differ in spelling share one cache entry.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Union

Shapes = Mapping[str, tuple[int, ...]]


@dataclass(frozen=True, order=True)
class Extent:
    """The extent of ``array`` along ``axis`` (0-based)."""

    array: str
    axis: int

    def eval(self, shapes: Shapes) -> int:
        return int(shapes[self.array][self.axis])

    def __str__(self) -> str:
        return f"size({self.array},{self.axis})"


@dataclass(frozen=True)
class FloorDiv:
    num: "Sym"
    den: int

    def eval(self, shapes: Shapes) -> int:
        return self.num.eval(shapes) // self.den

    def __str__(self) -> str:
        return f"fld({self.num},{self.den})"


@dataclass(frozen=True)
class Extremum:
    """``max`` or ``min`` of several sizes (kept sorted so the form is canonical)."""

    kind: str
    args: tuple["Sym", ...]

    def eval(self, shapes: Shapes) -> int:
        vals = [a.eval(shapes) for a in self.args]
        return max(vals) if self.kind == "max" else min(vals)

    def __str__(self) -> str:
        return f"{self.kind}({', '.join(map(str, self.args))})"


Atom = Union[Extent, FloorDiv, Extremum]


def _atom_key(atom: Atom) -> str:
    return f"{type(atom).__name__}:{atom}"


@dataclass(frozen=True)
class Sym:
    """``const + sum(coef * atom)``, terms sorted, no zero coefficients."""

    const: int = 0
    terms: tuple[tuple[Atom, int], ...] = ()

    # -- construction -------------------------------------------------------------------------
    @staticmethod
    def of(value: "int | Sym | Atom") -> "Sym":
        if isinstance(value, Sym):
            return value
        if isinstance(value, int):
            return Sym(int(value))
        return Sym(0, ((value, 1),))

    @staticmethod
    def extent(array: str, axis: int) -> "Sym":
        return Sym.of(Extent(array, axis))

    def _combine(self, other: "int | Sym", sign: int) -> "Sym":
        other = Sym.of(other)
        coefs: dict[str, tuple[Atom, int]] = {_atom_key(a): (a, c) for a, c in self.terms}
        for atom, coef in other.terms:
            key = _atom_key(atom)
            old = coefs.get(key, (atom, 0))[1]
            coefs[key] = (atom, old + sign * coef)
        terms = tuple(sorted(((a, c) for a, c in coefs.values() if c != 0), key=lambda t: _atom_key(t[0])))
        return Sym(self.const + sign * other.const, terms)

    def __add__(self, other: "int | Sym") -> "Sym":
        return self._combine(other, 1)

    def __radd__(self, other: int) -> "Sym":
        return self._combine(other, 1)

    def __sub__(self, other: "int | Sym") -> "Sym":
        return self._combine(other, -1)

    def __rsub__(self, other: int) -> "Sym":
        return Sym.of(other)._combine(self, -1)

    def __neg__(self) -> "Sym":
        return Sym(-self.const, tuple((a, -c) for a, c in self.terms))

    def __mul__(self, k: int) -> "Sym":
        if k == 0:
            return Sym(0)
        return Sym(self.const * k, tuple((a, c * k) for a, c in self.terms))

    __rmul__ = __mul__

    # -- queries ------------------------------------------------------------------------------
    @property
    def is_const(self) -> bool:
        return not self.terms

    def eval(self, shapes: Shapes) -> int:
        return self.const + sum(c * a.eval(shapes) for a, c in self.terms)

    def arrays(self) -> set[str]:
        """Names of the arrays whose extents this size reads."""
        found: set[str] = set()
        for atom, _ in self.terms:
            if isinstance(atom, Extent):
                found.add(atom.array)
            elif isinstance(atom, FloorDiv):
                found |= atom.num.arrays()
            else:
                for arg in atom.args:
                    found |= arg.arrays()
        return found

    def rename_arrays(self, mapping: Mapping[str, str]) -> "Sym":
        out = Sym(self.const)
        for atom, coef in self.terms:
            out = out + _rename_atom(atom, mapping) * coef
        return out

    def __str__(self) -> str:
        parts: list[str] = []
        for atom, coef in self.terms:
            text = str(atom) if abs(coef) == 1 else f"{abs(coef)}*{atom}"
            parts.append(("-" if coef < 0 else "+") + text)
        if self.const or not parts:
            parts.append(("-" if self.const < 0 else "+") + str(abs(self.const)))
        text = "".join(parts)
        return text[1:] if text.startswith("+") else text


def _rename_atom(atom: Atom, mapping: Mapping[str, str]) -> Sym:
    if isinstance(atom, Extent):
        return Sym.extent(mapping.get(atom.array, atom.array), atom.axis)
    if isinstance(atom, FloorDiv):
        return floordiv(atom.num.rename_arrays(mapping), atom.den)
    return extremum(atom.kind, [a.rename_arrays(mapping) for a in atom.args])


def floordiv(num: Sym, den: int) -> Sym:
    """``num // den`` (floor), folded when ``num`` is constant or ``den`` is 1."""
    if den < 0:
        return floordiv(-num, -den)
    if den == 1:
        return num
    if num.is_const:
        return Sym(num.const // den)
    return Sym.of(FloorDiv(num, den))


def ceildiv(num: Sym, den: int) -> Sym:
    return -floordiv(-num, den)


def extremum(kind: str, args: "list[Sym]") -> Sym:
    """``max``/``min`` of sizes, dropping candidates that another one provably dominates."""
    pick = max if kind == "max" else min
    unique: dict[tuple, Sym] = {}
    for arg in args:
        if isinstance(arg, Sym) and len(arg.terms) == 1 and arg.const == 0 and arg.terms[0][1] == 1 \
                and isinstance(arg.terms[0][0], Extremum) and arg.terms[0][0].kind == kind:
            nested = arg.terms[0][0].args
        else:
            nested = (arg,)
        for item in nested:
            key = item.terms  # same symbolic part: keep the dominating constant
            if key in unique:
                unique[key] = Sym(pick(unique[key].const, item.const), key)
            else:
                unique[key] = item
    kept = sorted(unique.values(), key=str)
    if len(kept) == 1:
        return kept[0]
    return Sym.of(Extremum(kind, tuple(kept)))


def smax(*args: Sym) -> Sym:
    return extremum("max", list(args))


def smin(*args: Sym) -> Sym:
    return extremum("min", list(args))
