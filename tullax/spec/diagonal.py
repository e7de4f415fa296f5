"""Diagonal writes: ``D[i,i] := body`` (an index repeated on the left of ':=') fills the diagonal and leaves
zeros everywhere else.

The parsed spec is rewritten before analysis: every repetition of an index gets a new index over the same
range, and the body is selected on the diagonal, ``D[i,i1] := ifelse(i == i1, body, 0)``. The rest of
tullax (ranges, lowering, every backend, the naive evaluator, gradients) then sees an ordinary spec; the
gradient of ``D[i,i] := A[i]`` reads the diagonal of ΔD. The select is exact (no ``0*body``, which would turn
an inf or NaN into NaN off the diagonal). A finaliser or another reduction than (+) would see the zeros
off the diagonal, so with a reduced index only (+) without a finaliser is accepted.
"""
from __future__ import annotations

from dataclasses import replace

from tullax.errors import SpecError
from tullax.spec.ir import (
    Access,
    Affine,
    Binary,
    Call,
    Hole,
    Indirect,
    Name,
    Num,
    ParsedSpec,
    accesses,
    idx_names,
    map_expr,
    walk,
)


def diagonal_write(parsed: ParsedSpec) -> tuple[ParsedSpec, dict[str, str]]:
    """``parsed`` with its repeated left-hand indices replaced by new ones, and {new index: the index whose
    range it copies}; unchanged (and {}) when no index repeats or the spec is not a plain ':='."""
    lhs = parsed.lhs or ()
    plain = [idx.plain if isinstance(idx, Affine) else None for idx in lhs]
    if parsed.assign != ":=" or None in plain or len(set(plain)) == len(plain):
        return parsed, {}
    taken = _names(parsed)
    seen: set[str] = set()
    copies: dict[str, str] = {}
    new_lhs = []
    for idx, name in zip(lhs, plain):
        if name in seen:
            new = next(f"{name}{n}" for n in range(1, len(taken) + 2) if f"{name}{n}" not in taken)
            taken.add(new)
            copies[new] = name
            idx = replace(idx, terms=((new, 1),))
        seen.add(name)
        new_lhs.append(idx)
    reduced = {n for acc in accesses(parsed.body) for i in acc.idx for n in idx_names(i)} - seen
    body = parsed.body
    if reduced and (parsed.redop != "+" or parsed.finalizer):
        raise SpecError(f"a diagonal write ({parsed.out}[{','.join(plain)}]) that reduces over "
                        f"{', '.join(sorted(reduced))} only sums, without a finaliser: the other reductions and "
                        f"the finaliser would see the zeros off the diagonal. Reduce into a vector first, then "
                        f"place it: d[{plain[0]}] := ...; {parsed.out}[{','.join(plain)}] := d[{plain[0]}]",
                        parsed.source or None)
    if parsed.finalizer is not None:  # one term per element: the reduction is the identity; _ is the body
        body = map_expr(parsed.finalizer, lambda node: body if isinstance(node, Hole) else node)
    for new, old in reversed(copies.items()):
        body = Call("ifelse", (Binary("==", Name(old), Name(new)), body, Num(0)))
    return replace(parsed, lhs=tuple(new_lhs), body=body, redop="+", finalizer=None), copies


def _names(parsed: ParsedSpec) -> set[str]:
    """Every name the spec text uses: result, arrays, index arrays, indices and bare names."""
    names = {parsed.out}
    for node in walk(parsed.body):
        if isinstance(node, Access):
            names.add(node.array)
            for idx in node.idx:
                names.update(idx_names(idx))
                if isinstance(idx, Indirect):
                    names.add(idx.array)
        elif isinstance(node, Name):
            names.add(node.name)
    for idx in parsed.lhs or ():
        names.update(idx_names(idx))
    return names
