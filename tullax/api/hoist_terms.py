"""Terms that read no row hoisted out of row kernels: ``softplus(W1[i+1,j])`` in a program over the rows
``(b,t)`` is the same for every row, so it is computed once, over the whole of ``W1`` (by its JAX function), and
the kernels read the array ``softplus_W1[i+1,j]`` instead (issue 50: the derived scan adjoint's gradient kernels
otherwise recompute a weight's softplus at every step).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

_CALL = re.compile(r"(?<![\w.])([^\W\d]\w*)\(\s*([^\W\d]\w*)\[([^\[\]()]*)\]\s*\)")
_ACCESS = re.compile(r"(?<![\w.])([^\W\d]\w*)\[([^\[\]]*)\]")


@dataclass(frozen=True)
class Hoisted:
    """``texts`` reading the hoisted arrays; ``arrays``: each hoisted array's name -> (function, input)."""

    texts: tuple[str, ...]
    arrays: dict[str, tuple[str, str]]

    def values(self, env: Mapping[str, Any]) -> dict[str, Any]:
        """The hoisted arrays, from the inputs in ``env``."""
        import importlib

        from tullax.spec.functions import get

        found = {}
        for name, (function, array) in self.arrays.items():
            module, _, attr = get(function).jnp.rpartition(".")
            found[name] = getattr(importlib.import_module(module), attr)(env[array])
        return found


_PAD = re.compile(r"pad\(\s*([^\W\d]\w*)\s*(?:([+-])\s*(\d+))?\s*\)")


def unpad(text: str, shapes: Mapping[str, tuple[int, ...]]) -> str:
    """``text`` with each ``pad(i+c)`` index of an input read plainly where, at these input ``shapes``, it never
    leaves the input's axis (``i``'s range the shortest axis ``i`` plainly indexes, the result's own included):
    ``softplus(W1[pad(i+1),j])`` of ``Δu[b,t,i]`` is then a weight's call that ``hoist_terms`` computes once
    (a padded read stays: softplus of the padding's zero is not zero)."""
    head, _, body = text.partition(":=")
    extent: dict[str, int] = {}
    for found in _ACCESS.finditer(text):
        array, index = found.group(1), [i.strip() for i in found.group(2).split(",")]
        shape = shapes.get(array.removeprefix("Δ") if found.start() < len(head) else array)
        for axis, name in enumerate(index):
            if shape is not None and len(shape) == len(index) and name.isidentifier():
                extent[name] = min(extent.get(name, shape[axis]), shape[axis])

    def read(found: re.Match) -> str:
        array, index = found.group(1), found.group(2).split(",")
        shape = shapes.get(array)
        if shape is None or len(shape) != len(index):
            return found.group(0)

        def plain(axis: int, part: str) -> str:
            pad = _PAD.fullmatch(part.strip())
            if pad is None or pad.group(1) not in extent:
                return part
            name, sign, step = pad.groups()
            shift = int(step or 0) * (-1 if sign == "-" else 1)
            inside = 0 <= shift and extent[name] - 1 + shift < shape[axis] and extent[name] > 0
            return (name + (f"{sign}{step}" if sign else "")) if inside else part
        return f"{array}[{','.join(plain(axis, part) for axis, part in enumerate(index))}]"

    return head + ":=" + _ACCESS.sub(read, body) if body else text


def hoist_terms(texts: Sequence[str], rows: Sequence[str], inputs: Sequence[str]) -> Hoisted:
    """``texts`` with every unary call on one element of an input that no text indexes by a row (a weight)
    replaced by a read of that call over the whole input."""
    from tullax.spec.functions import FUNCTIONS

    row = re.compile(r"(?<![\w.])(" + "|".join(re.escape(r) for r in rows) + r")(?![\w])") if rows else None
    joined = "\n".join(t.split(":=", 1)[1] if ":=" in t else t for t in texts)
    by_row = {m.group(1) for m in _ACCESS.finditer(joined) if row is not None and row.search(m.group(2))}
    weights = set(inputs) - by_row
    taken = set(re.findall(r"[^\W\d]\w*", "\n".join(texts)))
    arrays: dict[str, tuple[str, str]] = {}
    names: dict[tuple[str, str], str] = {}

    def swap(found: re.Match) -> str:
        function, array, index = found.groups()
        f = FUNCTIONS.get(function)
        if array not in weights or f is None or f.arity != 1 or not f.jnp:
            return found.group(0)
        key = (function, array)
        if key not in names:
            name, k = f"{function}_{array}", 1
            while name in taken:
                name, k = f"{function}_{array}_{k}", k + 1
            taken.add(name)
            names[key] = name
            arrays[name] = key
        return f"{names[key]}[{index}]"

    return Hoisted(tuple(_CALL.sub(swap, t) for t in texts), arrays)


__all__ = ["Hoisted", "hoist_terms", "unpad"]
