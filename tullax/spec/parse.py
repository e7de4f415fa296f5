"""Parse one spec line into a ParsedSpec (docs/design.md, section 1). Nothing here ever executes the text."""
from __future__ import annotations

from tullax.errors import SpecError
from tullax.spec import functions
from tullax.spec.functions import FUNCTIONS, UNARY
from tullax.spec.ir import (
    ASSIGNMENTS,
    BOOLEAN_REDUCTIONS,
    COMPARISONS,
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
    children,
    walk,
)
from tullax.spec.padvalue import padded_read
from tullax.spec.parse_index import MAX_DEPTH, IndexGrammar
from tullax.spec.ranges import at_range_clause, range_clauses, size_call
from tullax.spec.tokens import Token, tokenize

# Reductions written as calls, as NumPy code would: in a spec the reduction is implicit in the indices
_IMPLICIT = ("reductions are implicit: an index on the right that is not on the left is reduced over, so "
             "y[i] := x[i,j] sums over j")
IMPLICIT_REDUCTIONS = {
    "sum": f"sum(...) is not a function: {_IMPLICIT}",
    "prod": f"prod(...) is not a function: {_IMPLICIT}; for a product write (*) y[i] := x[i,j]",
    "mean": f"mean(...) is not a function: {_IMPLICIT}; for a mean divide after it: "
            f"y[i] := x[i,j] |> _ / size(x,1)",
    "maximum": f"maximum(...) is not a function: {_IMPLICIT}; for a maximum write (max) y[i] := x[i,j]",
    "minimum": f"minimum(...) is not a function: {_IMPLICIT}; for a minimum write (min) y[i] := x[i,j]",
}

class _Parser(IndexGrammar):
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
            if self.at("*") and self.peek().kind == "op" and self.peek().text == "*" and self.peek().col == \
                    self.tok.col + 1:
                raise self.error("'**' is not the power operator in a spec: write '^', as in x[i]^2")
            op = self.advance().text
            value = Binary(op, value, self.unary(), span=self.span(start))
        return value

    def unary(self) -> Expr:
        # every nesting (parentheses, calls, signs, powers) passes through here: bound it before Python's stack
        with self.deeper():
            return self.signed()

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
        if tok.text in IMPLICIT_REDUCTIONS:
            raise self.error(IMPLICIT_REDUCTIONS[tok.text], tok)
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
    if " scan" in source:  # a recurrence's clause: analysed apart (tullax.spec.scan), blanked here
        from tullax.spec.scan import split_scan

        source, _ = split_scan(source.strip())
    return _Parser(source.strip()).spec()
