"""The tokens of the spec language: numbers, names, operators, and the end of the text."""
from __future__ import annotations

import re
from dataclasses import dataclass

from tullax.errors import SpecError

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


__all__ = ["Token", "tokenize"]
