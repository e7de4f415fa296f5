"""Gradient steps as analysed Specs built from parts (no text round trip): a step is printed, lowered and
differentiated again like any spec the user wrote."""
from __future__ import annotations

from typing import Iterable, Mapping

from tullax.grad.algebra import Maybe
from tullax.spec.ir import (
    Access,
    Affine,
    Agreement,
    Expr,
    Idx,
    IndexVal,
    Indirect,
    Input,
    Num,
    Param,
    Range,
    Size,
    Spec,
    idx_affine,
    walk,
)
from tullax.spec.sizes import Sym

Axis = tuple[str, int]
# ``size(first) == size(second)``, labelled with the index that binds both ('Δ' where the seed's shape says so)
Fact = tuple[Axis, Axis, str]


def make_spec(ranks: Mapping[str, int], facts: Iterable[Fact], out: str, body: Maybe,
              ranges: Mapping[str, Range], *, free: tuple[str, ...] = (), assign: str = ":=", redop: str = "+",
              lhs: tuple[Idx, ...] | None = None, rank: int | None = None, finalizer: Expr | None = None) -> Spec:
    """An analysed Spec from parts; its inputs are found in the body, the finaliser, the left-hand side and the
    ranges. ``ranks`` gives the rank of every array it may read (``out`` included unless given by ``rank``), and
    ``facts`` the extents known equal: the step keeps those between arrays it reads."""
    body = body if body is not None else Num(0)
    if lhs is None and free:
        lhs = tuple(Affine.index(p) for p in free)
    rank = len(free) if rank is None else rank
    inputs = _inputs({out: rank, **ranks}, out, body, lhs, ranges, assign, finalizer)
    reduced = tuple(n for n in ranges if n not in free)
    if assign == ":=":
        out_shape = tuple(ranges[p].extent() for p in free)
    else:
        out_shape = tuple(Sym.extent(out, d) for d in range(rank))
    present = {i.name for i in inputs} | {out}
    agreements = tuple(Agreement(label, a, b) for a, b, label in facts if a[0] in present and b[0] in present)
    return Spec(redop=redop, out=out, lhs=lhs, assign=assign, body=body, finalizer=finalizer, inputs=inputs,
                free=free, reduced=reduced, ranges=tuple((n, ranges[n]) for n in free + reduced),
                agreements=tuple(dict.fromkeys(agreements)), out_shape=out_shape)


def _inputs(ranks: Mapping[str, int], out: str, body: Expr, lhs: tuple[Idx, ...] | None,
            ranges: Mapping[str, Range], assign: str, finalizer: Expr | None = None) -> tuple[Input, ...]:
    """Every name the step reads, in order of first use, with its kind: the given output ('='/'+='), then the
    body's and the finaliser's arrays, index arrays and scalars, then the arrays whose extents only the ranges
    read."""
    kinds: dict[str, str] = {}

    def note(name: str, kind: str) -> None:
        if name not in kinds:
            kinds[name] = kind
        elif kind == "array" and kinds[name] in ("index", "shape"):
            kinds[name] = "array"

    if assign != ":=":
        note(out, "array")
    for node in [*walk(body), *(walk(finalizer) if finalizer is not None else ())]:
        if isinstance(node, Access):
            note(node.array, "array")
            for idx in node.idx:
                if isinstance(idx, Indirect):
                    note(idx.array, "index")
        elif isinstance(node, Param):
            note(node.name, "scalar")
    for idx in lhs or ():
        if isinstance(idx, Indirect):
            note(idx.array, "index")
    for name in sorted(_size_arrays(body, lhs, ranges.values(), finalizer)):
        note(name, "shape")
    # an index array of unknown rank is a vector (ix[b]); a scalar has rank 0 whatever ``ranks`` says
    return tuple(Input(n, k, 0 if k == "scalar" else ranks.get(n, 1 if k == "index" else 0))
                 for n, k in kinds.items())


def _size_arrays(body: Expr, lhs: tuple[Idx, ...] | None, ranges: Iterable[Range],
                 finalizer: Expr | None = None) -> set[str]:
    """Arrays whose extents a spec reads symbolically: in its ranges, index constants and index values (of the
    body and the finaliser)."""
    syms = [s for rng in ranges for s in (rng.lo, rng.hi)]
    for node in [*walk(body), *(walk(finalizer) if finalizer is not None else ())]:
        if isinstance(node, IndexVal):
            syms.append(node.offset)
        elif isinstance(node, Size):  # size(A, d) as a value (a finaliser's ``_ / size(x,1)``)
            syms.append(Sym.extent(node.array, node.axis))
        elif isinstance(node, Access):
            syms += [idx_affine(i).const for i in node.idx]
            syms += [i.offset.const for i in node.idx if isinstance(i, Indirect)]
    syms += [idx_affine(i).const for i in lhs or ()]
    syms += [i.offset.const for i in lhs or () if isinstance(i, Indirect)]
    return set().union(*(s.arrays() for s in syms))
