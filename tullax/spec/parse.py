"""Parse one spec line into a ParsedSpec (DESIGN section 1). Nothing here ever executes the text."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from tullax.errors import SpecError
from tullax.spec import functions
from tullax.spec.functions import FUNCTIONS, UNARY
from tullax.spec.ir import (
    ASSIGNMENTS,
    BOOLEAN_REDUCTIONS,
    COMPARISONS,
    INDEX_LIMIT,
    REDUCTIONS,
    WRAPPERS,
    Access,
    Affine,
    Binary,
    Call,
    Expr,
    Hole,
    Idx,
    Indirect,
    Name,
    Num,
    ParsedSpec,
    Unary,
    Wrapped,
    children,
    walk,
)
from tullax.spec.padvalue import padded_read
from tullax.spec.ranges import at_range_clause, range_clauses, size_call
from tullax.spec.sizes import Sym

# Deepest expression tree accepted: every later stage (analysis, gradients, lowering, printers, Python's and
# Numba's compilers) recurses over the tree, and a deeper one would end in a RecursionError.
MAX_DEPTH = 64
_END = "<end>"  # the key of 'end' in a linear form: not an identifier, so never an index's name
_IND = "<ind>"  # the key of the one indirect term of a position (``ix[i]+j``)

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>[^\W\d]\w*)
  | (?P<op>:=|\+=|\*=|\|>|<=|>=|==|!=|[-+*/^<>=()\[\],:&|])
""", re.VERBOSE | re.UNICODE)


@dataclass(frozen=True)
class Token:
    kind: str  # num, name, op, end
    text: str
    col: int


def tokenize(source: str) -> list[Token]:
    tokens: list[Token] = []
    pos = 0
    while pos < len(source):
        match = _TOKEN.match(source, pos)
        if match is None:
            raise SpecError(f"unexpected character {source[pos]!r}", source, pos)
        if match.lastgroup != "ws":
            tokens.append(Token(match.lastgroup, match.group(), pos))
        pos = match.end()
    tokens.append(Token("end", "", len(source)))
    return tokens


class _Parser:
    """Recursive descent over the token list; one instance per call of ``parse_spec``."""

    def __init__(self, source: str):
        self.source = source
        self.tokens = tokenize(source)
        self.pos = 0
        self.nesting = 0  # how deep unary() is nested right now
        self.pad_values: list[Expr | None] = []  # per position of the last index list: pad(e, value)'s value
        self.indirects: list[Indirect] | None = None  # the ix[..] of the position being read; None: not allowed
        self.finalizing = False  # inside the expression after |>, where _ is the reduced value

    # -- helpers --------------------------------------------------------------------------------
    @property
    def tok(self) -> Token:
        return self.tokens[self.pos]

    def peek(self, offset: int = 1) -> Token:
        return self.tokens[min(self.pos + offset, len(self.tokens) - 1)]

    def advance(self) -> Token:
        tok = self.tok
        self.pos += 1
        return tok

    def at(self, text: str) -> bool:
        return self.tok.kind in ("op", "name") and self.tok.text == text

    def error(self, message: str, tok: Token | None = None) -> SpecError:
        tok = tok or self.tok
        return SpecError(message, self.source, tok.col)

    def expect(self, text: str, what: str | None = None) -> Token:
        if not self.at(text):
            found = "the end of the spec" if self.tok.kind == "end" else repr(self.tok.text)
            raise self.error(f"expected {what or repr(text)} but found {found}")
        return self.advance()

    def span(self, start: Token) -> tuple[int, int]:
        prev = self.tokens[self.pos - 1]
        return (start.col, prev.col + len(prev.text))

    # -- spec -----------------------------------------------------------------------------------
    def spec(self) -> ParsedSpec:
        tok = self.tok
        if self.tok.kind == "end":
            raise self.error("empty spec: write something like  C[i,j] := A[i,k]*B[k,j]")
        explicit = self.at("(")
        redop = self.redop()
        out, lhs = self.lhs()
        if not (self.tok.kind == "op" and self.tok.text in ASSIGNMENTS):
            raise self.error("expected ':=', '=', '+=' or '*=' after the left-hand side")
        if self.tok.text == "*=":  # y[i] *= x[i,j] multiplies every term in, as the loop it reads as would
            if explicit and redop != "*":
                raise self.error(f"'*=' multiplies every term into the given array (the (*) reduction); to "
                                 f"multiply by a ({redop}) reduction write it out: {out}[..] = {out}[..]*(...) "
                                 f"with the reduction in its own kernel", tok)
            redop = "*"
        assign = self.advance().text
        if assign == ":=" and any(out in idx_arrays(i) for i in lhs or ()):
            raise self.error(f"'end' on the left of ':=' has no meaning: {out} does not exist yet (use '=' or '+=' "
                             f"to write into an existing {out})", tok)
        body = self.expr()
        if expr_depth(body) > MAX_DEPTH:
            raise SpecError(f"the expression is {expr_depth(body)} operations deep, more than tullax's limit of "
                            f"{MAX_DEPTH} (every stage after the parser recurses over it): split it into several "
                            f"kernels, or sum over an index instead of writing the terms out")
        if assign == "*=" and self.at("|>"):
            raise self.error("'*=' takes no |> finaliser: compute the factor first (m[i] := ... |> f), then "
                             "multiply it in (y[i] *= m[i])")
        finalizer = self.finalizer() if self.at("|>") else None
        ranges = range_clauses(self)
        if self.tok.kind != "end":
            raise self.error(f"unexpected {self.tok.text!r} after the end of the expression")
        return ParsedSpec(redop, out, lhs, assign, body, finalizer, source=self.source, ranges=ranges)

    def finalizer(self) -> Expr:
        """``|> f`` (a one-argument function, short for ``f(_)``) or ``|> expr`` over ``_``, the reduced value."""
        bar = self.advance()
        tok = self.tok
        if tok.kind == "name" and tok.text in UNARY and (self.peek().kind == "end" or at_range_clause(self, 1)):
            self.advance()
            return Call(tok.text, (Hole(span=self.span(tok)),), span=self.span(tok))
        if tok.kind == "end" or (tok.kind == "name" and (self.peek().kind == "end" or at_range_clause(self, 1))):
            raise self.error(f"'|>' needs a one-argument function, one of: {', '.join(UNARY)}; or an expression "
                             f"of _, the reduced value, as in |> relu(_ + b[j])")
        self.finalizing = True
        try:
            value = self.expr()
        finally:
            self.finalizing = False
        if expr_depth(value) > MAX_DEPTH:
            raise self.error(f"the finaliser is {expr_depth(value)} operations deep, more than tullax's limit of "
                             f"{MAX_DEPTH}: split it into several kernels", bar)
        if not any(isinstance(node, Hole) for node in walk(value)):
            raise self.error("the finaliser does not use _ (the reduced value): write |> f or an expression "
                             "of _, as in |> _ / size(x,1)", bar)
        return value

    def redop(self) -> str:
        if not self.at("("):
            return "+"
        self.advance()
        tok = self.advance()
        if tok.text not in REDUCTIONS and tok.text not in BOOLEAN_REDUCTIONS:
            raise self.error(f"unknown reduction {tok.text!r}: use one of {' '.join(REDUCTIONS)} & |", tok)
        self.expect(")", "')' closing the reduction")
        return tok.text

    def lhs(self) -> tuple[str, tuple[Idx, ...] | None]:
        tok = self.tok
        if tok.kind != "name":
            raise self.error("expected the name of the result, as in  C[i,j] := ...")
        self.advance()
        if not self.at("["):
            return tok.text, None
        self.advance()
        if self.at("]"):
            self.advance()
            return tok.text, None
        idx = self.index_list(tok.text)
        if any(v is not None for v in self.pad_values):
            raise self.error("pad(e, value) reads a value outside an axis: on the left it has no meaning "
                             "(a padded scatter position outside the output is dropped)", tok)
        return tok.text, idx

    # -- index expressions ----------------------------------------------------------------------
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
        coef = dict(aff.terms).get(_IND, 0)
        if aff.div != 1:
            raise self.error("a position with an indirect term cannot divide", start)
        if coef == 0:
            return replace(aff, terms=tuple(t for t in aff.terms if t[0] != _IND))
        if abs(coef) > INDEX_LIMIT:
            raise self.error(f"the factor {coef} of an indirect term is beyond the 2^62 that tullax's int64 "
                             f"index arithmetic allows", start)
        offset = Affine(tuple(t for t in aff.terms if t[0] != _IND), aff.const)
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
        if _END in lin and end is None:
            raise self.error("'end' (the last position of an axis) needs an existing array: the result of ':=' "
                             "has no shape yet", start)
        ends = lin.pop(_END, 0)
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
            return {_END: 1}
        if tok.kind == "name":
            if self.peek().text == "(":
                raise self.error(f"{tok.text}(...) cannot be nested inside an index expression", tok)
            if self.peek().text == "[":
                self.indirect()
                return {_IND: 1}
            self.advance()
            return {tok.text: 1}
        if tok.text == "(":
            self.advance()
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

    # -- body expressions -----------------------------------------------------------------------
    def expr(self) -> Expr:
        start = self.tok
        lhs = self.additive()
        if self.tok.kind == "op" and self.tok.text in COMPARISONS:
            op = self.advance().text
            rhs = self.additive()
            lhs = Binary(op, lhs, rhs, span=self.span(start))
            if self.tok.kind == "op" and self.tok.text in COMPARISONS:
                raise self.error("chained comparisons are ambiguous: add parentheses")
        return lhs

    def additive(self) -> Expr:
        start = self.tok
        value = self.multiplicative()
        while self.at("+") or self.at("-"):
            op = self.advance().text
            value = Binary(op, value, self.multiplicative(), span=self.span(start))
        return value

    def multiplicative(self) -> Expr:
        start = self.tok
        value = self.unary()
        while self.at("*") or self.at("/"):
            op = self.advance().text
            value = Binary(op, value, self.unary(), span=self.span(start))
        return value

    def unary(self) -> Expr:
        # every nesting (parentheses, calls, signs, powers) passes through here: bound it before Python's stack
        self.nesting += 1
        if self.nesting > MAX_DEPTH:
            raise self.error(f"the expression nests more than {MAX_DEPTH} levels deep, tullax's limit: split it "
                             f"into several kernels")
        try:
            return self.signed()
        finally:
            self.nesting -= 1

    def signed(self) -> Expr:
        start = self.tok
        if self.at("-"):
            self.advance()
            return Unary("-", self.unary(), span=self.span(start))
        if self.at("+"):
            self.advance()
            return self.unary()
        return self.power()

    def power(self) -> Expr:
        start = self.tok
        base = self.primary()
        if self.at("^"):
            self.advance()
            return Binary("^", base, self.unary(), span=self.span(start))  # right-associative
        return base

    def primary(self) -> Expr:
        tok = self.tok
        if tok.kind == "num":
            self.advance()
            value = float(tok.text) if any(c in tok.text for c in ".eE") else self.integer(tok)
            return Num(value, span=self.span(tok))
        if tok.kind == "name":
            return self.name_expr()
        if tok.text == "(":
            self.advance()
            value = self.expr()
            self.expect(")", "')'")
            return value
        found = "the end of the spec" if tok.kind == "end" else repr(tok.text)
        raise self.error(f"expected a number, a name, an array access or '(' but found {found}")

    def name_expr(self) -> Expr:
        tok = self.advance()
        if tok.text == "_":
            if not self.finalizing:
                raise self.error("_ stands for the reduced value: it only appears after |>, as in "
                                 "|> relu(_ + b[j])", tok)
            return Hole(span=self.span(tok))
        if self.at("["):
            self.advance()
            if self.at("]"):
                raise self.error(f"{tok.text}[] has no indices: write {tok.text} for a scalar input")
            idx = self.index_list(tok.text)
            access = Access(tok.text, idx, span=self.span(tok))
            values = [v for v in self.pad_values if v is not None]
            if not values:
                return access
            if any(v != values[0] for v in values):
                raise self.error("one access pads with one value: pad(.., value) differs between its axes", tok)
            return padded_read(access, self.pad_values)
        if self.at("(") and not at_range_clause(self):  # `s  (k in 0:3)`: a name, then a range clause
            return self.call(tok)
        return Name(tok.text, span=self.span(tok))

    def call(self, tok: Token) -> Expr:
        if tok.text == "size":
            return size_call(self, tok)
        if tok.text in WRAPPERS:
            raise self.error(f"{tok.text}(...) wraps an index: use it inside brackets, as in x[{tok.text}(i+k)]",
                             tok)
        counts = functions.arities(tok.text)
        if not counts:
            raise self.error(f"unknown function {tok.text!r}: allowed are {', '.join(FUNCTIONS)}", tok)
        self.advance()
        args = [self.expr()]
        while self.at(","):
            self.advance()
            args.append(self.expr())
        self.expect(")", "',' or ')'")
        entry = functions.resolve(tok.text, len(args))
        if entry is None:
            variadic = tok.text in FUNCTIONS and FUNCTIONS[tok.text].variadic
            takes = " or ".join(map(str, counts)) + (" or more" if variadic else "")
            raise self.error(f"{tok.text} takes {takes} argument{'s' * (counts[-1] > 1)}, got {len(args)}", tok)
        call = Call(entry.name, tuple(args[:entry.arity]), span=self.span(tok))
        for arg in args[entry.arity:]:  # max(a, b, c) is max(max(a, b), c)
            call = Call(entry.name, (call, arg), span=self.span(tok))
        return call


def _scale(lin: dict[str, int], k: int) -> dict[str, int]:
    return {name: coef * k for name, coef in lin.items()}


def _add(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    out = dict(a)
    for name, coef in b.items():
        out[name] = out.get(name, 0) + coef
    return out


def _mul(a: dict[str, int], b: dict[str, int], parser: _Parser, tok: Token) -> dict[str, int]:
    if set(a) <= {""}:
        return _scale(b, a.get("", 0))
    if set(b) <= {""}:
        return _scale(a, b.get("", 0))
    raise parser.error("an index must be affine: the product of two indices is not allowed", tok)


def idx_arrays(idx: Idx) -> set[str]:
    """The arrays whose extents a position reads (through 'end')."""
    aff = idx if isinstance(idx, Affine) else idx.inner
    return aff.const.arrays()


def expr_depth(expr: Expr) -> int:
    """The depth of an expression tree, computed without recursion (the tree may be deeper than the stack)."""
    deepest, stack = 0, [(expr, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children(node))
    return deepest


def parse_spec(source: str) -> ParsedSpec:
    """Parse ``source`` into a ParsedSpec, raising SpecError with a caret under the offending column."""
    if not isinstance(source, str):
        raise SpecError(f"a spec is a string, got {type(source).__name__}")
    if "\n" in source.strip():
        raise SpecError("a spec is one line")
    return _Parser(source.strip()).spec()
