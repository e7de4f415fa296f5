"""The parts of the grammar that name sizes: ``size(A, d)`` in expressions and ``(k in lo:hi)`` range clauses.

A range clause gives an index its range inside the spec text, as Tullio writes it: ``y[i] := x[i+k]*w[k]
(k in 0:3)``. Bounds are integer expressions in the input extents, written as ``explain`` and the canonical text
print them (``0:size(x,1)``, ``1:size(x,0)-2``, ``0:fld(size(x,0),2)``, ``max(..)``/``min(..)``), so every
canonical text parses back. Axes count from 0 (``size(x,0)`` is the number of rows), as ``explain`` prints them.

Decision (issue 13): a clause is HALF-OPEN and 0-based. ``(k in 0:3)`` is k = 0, 1, 2, where Julia's ``0:3``
would also include 3. Reasons:

* one convention for a range in the whole library: ``ranges={"k": (0, 3)}``, the ranges ``explain`` prints for
  every index (``i in 0:size(x,0)``), Python's ``range(0, 3)`` and slices ``x[0:3]`` are all half-open; a
  clause that meant something else than the same two numbers in ``ranges=`` would be the trap;
* positions are 0-based, and a half-open range over an axis is ``0:size(x,d)``, exactly the axis; an inclusive
  one would be ``0:size(x,d)-1`` everywhere, and ``explain``/canonical texts print clauses back;
* a Tullio clause over the positions of a 1-based array, ``(k in 1:3)`` (the first three), becomes
  ``(k in 0:3)`` here: the same elements, the same count, the upper bound unchanged.

To make the choice impossible to misread: ``explain`` spells out the values (``k in 0:3 -> k = 0, 1, 2``), and
the forms a Julia reader would take differently are SpecErrors that say what to write: ``1:n`` with two literal
bounds (Tullio's 1-based start: ``(k in 0:3)`` here for the first three positions; for k = 1, 2 write Python's
``(k in range(1, 3))``, which nobody misreads, or ``ranges={"k": (1, 3)}``), ``end`` in a bound (``0:size(x,d)``
reaches the last position), and an empty backwards range.
"""
from __future__ import annotations

from typing import Any

from tullax.spec.ir import Range, Size
from tullax.spec.sizes import Sym, extremum, floordiv

# ``parser`` below is the parser of ``tullax.spec.parse`` (not imported: it imports this module)
Parser = Any


def at_range_clause(parser: Parser, offset: int = 0) -> bool:
    """True when the tokens from ``offset`` on start ``(name in``."""
    first, name, word = parser.peek(offset), parser.peek(offset + 1), parser.peek(offset + 2)
    return first.text == "(" and first.kind == "op" and name.kind == "name" and word.kind == "name" \
        and word.text == "in"


def range_clauses(parser: Parser) -> tuple[tuple[str, Range], ...]:
    """Every ``(k in lo:hi)`` at the end of the spec, in text order."""
    found: dict[str, Range] = {}
    while at_range_clause(parser):
        parser.advance()
        tok = parser.advance()
        parser.advance()  # in
        if parser.tok.kind == "name" and parser.tok.text == "range" and parser.peek().text == "(":
            lo, hi = _python_range(parser, tok)  # (k in range(1, 3)): Python's spelling, never misread
        else:
            lo = _sum(parser)
            parser.expect(":", f"':' between the bounds of {tok.text}'s range, as in ({tok.text} in 0:3)")
            hi = _sum(parser)
            if lo.is_const and lo.const == 1 and hi.is_const and hi.const > 1:
                raise parser.error(_one_based_message(tok.text, hi.const), tok)
        parser.expect(")", f"')' closing the range of {tok.text}")
        if tok.text in found:
            raise parser.error(f"index {tok.text} is given two ranges", tok)
        if hi.is_const and lo.is_const and hi.const < lo.const:
            raise parser.error(f"the range {lo}:{hi} of {tok.text} is empty backwards: ranges are half-open, "
                               f"lo:hi runs from lo to hi-1", tok)
        found[tok.text] = Range(lo, hi)
    if parser.at("(") and parser.peek().kind == "name" and parser.peek(2).kind == "end":
        raise parser.error("a range clause reads (k in lo:hi)")
    return tuple(found.items())


def _python_range(parser: Parser, tok: Any) -> tuple[Sym, Sym]:
    parser.advance()  # range
    parser.advance()  # (
    lo = _sum(parser)
    parser.expect(",", f"',' between the bounds, as in ({tok.text} in range(1, 3))")
    hi = _sum(parser)
    parser.expect(")", "')' closing range(")
    return lo, hi


def _one_based_message(name: str, hi: int) -> str:
    values = ", ".join(str(v) for v in range(1, hi)) if hi <= 5 else f"1, 2, ..., {hi - 1}"
    return (f"({name} in 1:{hi}) reads differently in Julia: ranges here are 0-based and half-open, so it would be "
            f"{name} = {values}, while Tullio's 1:{hi} (the first {hi} positions of a 1-based array) is "
            f"({name} in 0:{hi}) here; to mean {name} = {values}, write ({name} in range(1, {hi})) or pass "
            f"ranges={{{name!r}: (1, {hi})}}")


def format_clause(name: str, lo: Sym, hi: Sym) -> str:
    """A range clause as the canonical text prints it: ``(k in 0:3)``; ``(k in range(1, 3))`` where ``1:3``
    would be refused as a Julia-style range."""
    if lo.is_const and lo.const == 1 and hi.is_const and hi.const > 1:
        return f"({name} in range(1, {hi}))"
    return f"({name} in {lo}:{hi})"


def size_call(parser: Parser, tok: Any) -> Size:
    """``size(A, d)`` after its name: the extent of A along axis d (0-based)."""
    array, axis = _size_args(parser, tok)
    return Size(array, axis, span=parser.span(tok))


def _size_args(parser: Parser, tok: Any) -> tuple[str, int]:
    parser.advance()  # (
    name = parser.tok
    if name.kind != "name":
        raise parser.error("size(A, d) takes an array name and an axis (counted from 0), as in size(x,1)")
    parser.advance()
    parser.expect(",", "',' and the axis (counted from 0), as in size(x,1)")
    axis = parser.tok
    if axis.kind != "num" or not axis.text.isdigit():
        raise parser.error("the axis of size(A, d) is a non-negative integer literal, counted from 0 as explain "
                           "prints it (size(x,0) is the number of rows)")
    parser.advance()
    parser.expect(")", "')' closing size(")
    if int(axis.text) > 64:
        raise parser.error(f"axis {axis.text} is beyond any array's rank", axis)
    return name.text, int(axis.text)


def _sum(parser: Parser) -> Sym:
    sign = -1 if parser.at("-") else 1
    if parser.at("-") or parser.at("+"):
        parser.advance()
    total = _product(parser) * sign
    while parser.at("+") or parser.at("-"):
        sign = -1 if parser.advance().text == "-" else 1
        total = total + _product(parser) * sign
    return total


def _product(parser: Parser) -> Sym:
    value = _atom(parser)
    while parser.at("*"):
        tok = parser.advance()
        other = _atom(parser)
        if not (value.is_const or other.is_const):
            raise parser.error("a range bound is linear in the sizes: the product of two sizes is not allowed", tok)
        value = value * other.const if other.is_const else other * value.const
    return value


def _atom(parser: Parser) -> Sym:
    tok = parser.tok
    if tok.kind == "num" and tok.text.isdigit():
        parser.advance()
        return Sym(parser.integer(tok))
    if tok.kind == "name" and tok.text == "size" and parser.peek().text == "(":
        parser.advance()
        return Sym.extent(*_size_args(parser, tok))
    if tok.kind == "name" and tok.text in ("fld", "max", "min") and parser.peek().text == "(":
        parser.advance()
        parser.advance()
        args = [_sum(parser)]
        while parser.at(","):
            parser.advance()
            args.append(_sum(parser))
        parser.expect(")", f"')' closing {tok.text}(")
        if tok.text != "fld":
            return extremum(tok.text, args)
        if len(args) != 2 or not args[1].is_const or args[1].const < 1:
            raise parser.error("fld(a, n) divides a size by a positive integer n", tok)
        return floordiv(args[0], args[1].const)
    if tok.text == "(":
        parser.advance()
        with parser.deeper():  # nesting is bounded as in a body (MAX_DEPTH), before Python's stack
            value = _sum(parser)
        parser.expect(")", "')'")
        return value
    if tok.text == "-":
        parser.advance()
        with parser.deeper():
            return -_atom(parser)
    if tok.kind == "name" and tok.text == "end":
        raise parser.error("end is not a range bound (it is the last position of an axis inside brackets, "
                           "x[i,end]): ranges here are half-open, so 0:size(x,d) runs to the last position of "
                           "axis d of x, and 0:size(x,d)-1 stops before it", tok)
    found = "the end of the spec" if tok.kind == "end" else repr(tok.text)
    raise parser.error(f"a range bound is an integer, size(A,d) or a sum of them, not {found}")
