"""The index grammar of the spec language: positions inside brackets (affine forms, ``end``, ``mod``/``clamp``/
``pad``, ``pad(e, value)``, one indirect term ``ix[..]`` per position) and the integer literals they hold.

``IndexGrammar`` is a part of the parser (``tullax.spec.parse._Parser`` derives from it): its methods read the
parser's token cursor (``tok``, ``peek``, ``advance``, ``at``, ``expect``, ``span``, ``error``) and the two
fields the parser sets in ``__init__``, ``indirects`` (the indirect terms of the current position, None where
one may not appear) and ``pad_values`` (the ``pad(e, value)`` values of the last index list).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import replace
from typing import Iterator

from tullax.spec.ir import (
    INDEX_LIMIT,
    WRAPPERS,
    Affine,
    Expr,
    Idx,
    Indirect,
    Name,
    Num,
    Unary,
    Wrapped,
)
from tullax.spec.sizes import Sym
from tullax.spec.tokens import Token

# Deepest nesting accepted (parentheses, calls, signs, in a body, an index or a range bound): every later stage
# (analysis, gradients, lowering, printers, Python's and Numba's compilers) recurses over the tree, and the parser
# itself recurses per level, so a deeper one would end in a RecursionError.
MAX_DEPTH = 64

END = "<end>"  # the key of 'end' in a linear form: not an identifier, so never an index's name
IND = "<ind>"  # the key of the one indirect term of a position (``ix[i]+j``)


class IndexGrammar:
    """The index positions of an access (see the module docstring)."""

    @contextmanager
    def deeper(self) -> Iterator[None]:
        """One more level of nesting (``self.nesting`` counts them), refused beyond MAX_DEPTH before Python's
        stack runs out."""
        self.nesting += 1
        try:
            if self.nesting > MAX_DEPTH:
                raise self.error(f"the expression nests more than {MAX_DEPTH} levels deep, tullax's limit: split it "
                                 f"into several kernels (or drop redundant parentheses)")
            yield
        finally:
            self.nesting -= 1

    def index_list(self, array: str) -> tuple[Idx, ...]:
        values: list[Expr | None] = []
        items = [self.index(Sym.extent(array, 0) - 1, values)]
        while self.at(","):
            self.advance()
            items.append(self.index(Sym.extent(array, len(items)) - 1, values))
        self.expect("]", "',' or ']'")
        self.pad_values = values
        return tuple(items)

    def index(self, end: Sym, values: list[Expr | None]) -> Idx:
        """One position; ``end`` is the last position of the axis it addresses (Julia's ``end``). The value of
        a ``pad(e, value)`` is appended to ``values`` (None for every other position)."""
        tok = self.tok
        values.append(None)
        if tok.kind == "name" and tok.text in WRAPPERS and self.peek().text == "(":
            self.advance()
            self.advance()
            if tok.text == "pad" and self.tok.kind == "name" and self.peek().text == "[":
                read = self.index(end, [])  # pad(ix[e]): an indirect read that gives 0 outside the axis
                if not isinstance(read, Indirect):
                    raise self.error("pad(..) of an indirect term whose factor cancels: write the position "
                                     "without it", tok)
                if self.at(","):
                    raise self.error("pad(ix[e], value) is not supported: a padded indirect read gives 0 outside "
                                     "the axis; for another value v, pass x - v and add v to what pad(ix[e]) reads "
                                     "(x[pad(ix[i]+j)] + v)", tok)
                self.expect(")", f"')' closing {tok.text}(")
                return replace(read, pad=True, span=self.span(tok))
            self.indirects = None  # no ix[..] inside mod/clamp/pad (but pad(ix[e]) above)
            inner = self.affine(end)
            if tok.text == "pad" and self.at(","):
                values[-1] = self.pad_value(inner, tok)
            self.expect(")", f"')' closing {tok.text}(")
            return Wrapped(tok.text, inner, span=self.span(tok))
        return self.position(end)

    def position(self, end: Sym) -> Idx:
        """An affine position that may hold one indirect term: ``ix[i]``, ``ix[i]+j``, ``2K[j]+i-1``."""
        start = self.tok
        self.indirects = []
        aff = self.affine(end)
        if not self.indirects:
            return aff
        (ind,) = self.indirects
        coef = dict(aff.terms).get(IND, 0)
        if aff.div != 1:
            raise self.error("a position with an indirect term cannot divide", start)
        if coef == 0:
            return replace(aff, terms=tuple(t for t in aff.terms if t[0] != IND))
        if abs(coef) > INDEX_LIMIT:
            raise self.error(f"the factor {coef} of an indirect term is beyond the 2^62 that tullax's int64 "
                             f"index arithmetic allows", start)
        offset = Affine(tuple(t for t in aff.terms if t[0] != IND), aff.const)
        return replace(ind, scale=coef, offset=offset, span=self.span(start))

    def indirect(self) -> Indirect:
        """``ix[e]`` inside a position (``self.indirects`` collects it; one per position)."""
        tok = self.advance()
        self.advance()
        if self.indirects is None:
            raise self.error("an indirect index cannot be nested or wrapped in mod/clamp (pad(ix[e]+j) "
                             "reads 0 outside): write it in a position of its own, as in x[ix[i]+j]", tok)
        if self.indirects:
            raise self.error("a position holds one indirect term: x[ix[i]+jx[j]] needs two kernels "
                             "(or one index array of their sums)", tok)
        outer, self.indirects = self.indirects, None
        inner = self.affine(Sym.extent(tok.text, 0) - 1)
        self.indirects = outer
        if inner.div != 1:
            raise self.error("an indirect index cannot divide", tok)
        self.expect("]", f"']' closing {tok.text}[")
        ind = Indirect(tok.text, inner, span=self.span(tok))
        self.indirects.append(ind)
        return ind

    def pad_value(self, inner: Affine, pad: Token) -> Expr:
        """The ``value`` of ``pad(e, value)``: a number (signed; ``Inf`` too) or the name of a scalar input."""
        self.advance()
        start = self.tok
        sign = self.advance().text if self.at("-") or self.at("+") else ""
        tok = self.tok
        if tok.kind not in ("num", "name") or self.peek().text in ("[", "("):
            raise self.error("the value of pad(e, value) is a number or the name of a scalar input: for an "
                             "expression, read x[pad(e)] and select with ifelse", tok)
        self.advance()
        if tok.kind == "num" or tok.text in ("inf", "Inf"):  # -Inf pads a max pooling
            number = math.inf if tok.kind == "name" else \
                float(tok.text) if any(c in tok.text for c in ".eE") else self.integer(tok)
            value: Expr = Num(-number if sign == "-" else number, span=self.span(start))
        else:
            value = Name(tok.text, span=self.span(tok))
            value = Unary("-", value, span=self.span(start)) if sign == "-" else value
        if inner.div != 1 or not inner.terms:
            raise self.error("pad(e, value) needs an index in e and no division", pad)
        return value

    def affine(self, end: Sym | None) -> Affine:
        start = self.tok
        lin = self.lin_sum()
        if END in lin and end is None:
            raise self.error("'end' (the last position of an axis) needs an existing array: the result of ':=' "
                             "has no shape yet", start)
        ends = lin.pop(END, 0)
        div = 1
        if self.at("/"):
            self.advance()
            tok = self.tok
            if tok.kind != "num" or not tok.text.isdigit() or self.integer(tok) < 1:
                raise self.error("an index can only be divided by a positive integer", tok)
            div = self.integer(self.advance())
        const = Sym(lin.pop("", 0)) + (end * ends if ends else 0)
        terms = tuple(sorted((k, v) for k, v in lin.items() if v != 0))
        if div > 1 and not terms:
            raise self.error("dividing a constant index makes no sense", start)
        return Affine(terms, const, div, span=self.span(start))

    def lin_sum(self) -> dict[str, int]:
        sign = 1
        if self.at("-") or self.at("+"):
            sign = -1 if self.advance().text == "-" else 1
        total = _scale(self.lin_product(), sign)
        while self.at("+") or self.at("-"):
            sign = -1 if self.advance().text == "-" else 1
            total = _add(total, _scale(self.lin_product(), sign))
        return total

    def lin_product(self) -> dict[str, int]:
        value = self.lin_atom()
        while self.at("*") or (self.tokens[self.pos - 1].kind == "num"
                               and (self.tok.kind == "name" or self.at("("))):  # implicit 2i, 2(i+1)
            tok = self.tok
            if self.at("*"):
                self.advance()
            value = _mul(value, self.lin_atom(), self, tok)
        if self.at("^"):
            raise self.error("an index must be affine: no powers")
        return value

    def lin_atom(self) -> dict[str, int]:
        tok = self.tok
        if tok.kind == "num":
            self.advance()
            if not tok.text.isdigit():
                raise self.error(f"index positions are integers, not {tok.text}", tok)
            return {"": self.integer(tok)}
        if tok.kind == "name" and tok.text == "end":
            self.advance()
            return {END: 1}
        if tok.kind == "name":
            if self.peek().text == "(":
                raise self.error(f"{tok.text}(...) cannot be nested inside an index expression", tok)
            if self.peek().text == "[":
                self.indirect()
                return {IND: 1}
            self.advance()
            return {tok.text: 1}
        if tok.text == "(":
            self.advance()
            with self.deeper():
                value = self.lin_sum()
            self.expect(")", "')'")
            return value
        found = "the end of the spec" if tok.kind == "end" else repr(tok.text)
        raise self.error(f"expected an index (a name, an integer, i+1, 2i, mod(..), pad(..), ix[..]) "
                         f"but found {found}")

    def integer(self, tok: Token) -> int:
        """An integer literal; generated code holds it in int64, so a larger one is the literal's fault."""
        if len(tok.text) > 19 or int(tok.text) >= 2**63:
            shown = tok.text if len(tok.text) <= 24 else tok.text[:20] + "..."
            raise self.error(f"the integer {shown} does not fit in int64: write it as a float (e.g. 1e30) "
                             f"or make it smaller", tok)
        return int(tok.text)


def _scale(lin: dict[str, int], k: int) -> dict[str, int]:
    return {name: coef * k for name, coef in lin.items()}


def _add(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    out = dict(a)
    for name, coef in b.items():
        out[name] = out.get(name, 0) + coef
    return out


def _mul(a: dict[str, int], b: dict[str, int], parser: IndexGrammar, tok: Token) -> dict[str, int]:
    if set(a) <= {""}:
        return _scale(b, a.get("", 0))
    if set(b) <= {""}:
        return _scale(a, b.get("", 0))
    raise parser.error("an index must be affine: the product of two indices is not allowed", tok)


__all__ = ["END", "IND", "MAX_DEPTH", "IndexGrammar"]
