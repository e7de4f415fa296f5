"""Analysis of what the finaliser, ``size(A, d)`` and ``(k in lo:hi)`` clauses add to a spec (kept apart from
``analyze`` so that module stays about indices and ranges).

* A finaliser runs once per result element, after the reduction: it may read scalars, index values and
  arrays only at the result's (free) indices. ``_`` is the reduced value.
* ``size(A, d)`` reads an extent: ``A`` is an input; when nothing indexes it, a 'shape' input (only its
  shape is read), as in derived gradient specs.
* A range clause and ``ranges=`` naming the same index must give the same range.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping

from tullax.spec.ir import Expr, IndexVal, Input, ParsedSpec, Range, Size, idx_affine, spec_exprs, walk
from tullax.spec.sizes import Extent, Extremum, FloorDiv, Sym

Context = Any  # analyze's error context (not imported: analyze imports this module)


def check_finalizer(finalizer: Expr, free: tuple[str, ...], ctx: Context) -> None:
    """Every index the finaliser uses is a free index (it runs after the reduction is over)."""
    from tullax.spec.ir import Access

    for node in walk(finalizer):
        names: tuple[str, ...] = ()
        if isinstance(node, IndexVal):
            names = (node.name,)
        elif isinstance(node, Access):
            names = tuple(n for idx in node.idx for n in idx_affine(idx).names())
        for name in names:
            if name not in free:
                raise ctx.error(
                    f"the finaliser runs once per result element, after the reduction: it can use the result's "
                    f"indices ({', '.join(free) or 'none'}) but not {name}; a term that depends on {name} belongs "
                    f"before |>", node.span)


def _sym_axes(sym: Sym) -> Iterator[tuple[str, int]]:
    for atom, _ in sym.terms:
        if isinstance(atom, Extent):
            yield atom.array, atom.axis
        elif isinstance(atom, FloorDiv):
            yield from _sym_axes(atom.num)
        elif isinstance(atom, Extremum):
            for arg in atom.args:
                yield from _sym_axes(arg)


def sized_inputs(parsed: ParsedSpec, found: tuple[Input, ...], index_names: list[str],
                 ctx: Context) -> tuple[Input, ...]:
    """'shape' inputs for arrays whose extents ``size(A, d)`` or a range clause reads and nothing indexes;
    checks that every axis so read exists."""
    axes: list[tuple[str, int, tuple[int, int] | None]] = []
    for expr in spec_exprs(parsed):
        axes += [(n.array, n.axis, n.span) for n in walk(expr) if isinstance(n, Size)]
    for _, rng in parsed.ranges:
        axes += [(a, d, None) for sym in (rng.lo, rng.hi) for a, d in _sym_axes(sym)]
    known = {inp.name: inp for inp in found}
    shape_rank: dict[str, int] = {}
    for array, axis, span in axes:
        if array in index_names:
            raise ctx.error(f"size({array},{axis}) names an index, not an array", span)
        if array == parsed.out and parsed.assign == ":=":
            raise ctx.error(f"size({array},{axis}) reads the result being defined with ':=', which has no "
                            f"shape yet", span)
        inp = known.get(array)
        if inp is not None and inp.kind == "scalar":
            raise ctx.error(f"size({array},{axis}): {array} is a scalar parameter, it has no axes", span)
        if inp is not None and axis >= inp.rank:
            raise ctx.error(f"size({array},{axis}) reads axis {axis} (axes count from 0) but {array} has rank "
                            f"{inp.rank}", span)
        if inp is None and not (array == parsed.out and parsed.assign != ":="):
            shape_rank[array] = max(shape_rank.get(array, 0), axis + 1)
    return tuple(Input(name, "shape", rank) for name, rank in shape_rank.items())


def merge_ranges(parsed: ParsedSpec, explicit: Mapping[str, Any], ctx: Context,
                 as_range: Callable[[str, Any, Context], Range]) -> dict[str, Any]:
    """``ranges=`` and the spec's own ``(k in lo:hi)`` clauses as one mapping; both naming an index must agree
    (``as_range`` reads a ``ranges=`` value)."""
    merged: dict[str, Any] = dict(explicit)
    for name, rng in parsed.ranges:
        if name in merged:
            given = as_range(name, merged[name], ctx)
            if given != rng:
                raise ctx.error(f"index {name} has the range {rng.lo}:{rng.hi} in the spec but ranges= gives "
                                f"{given.lo}:{given.hi} (half-open, as (lo, hi)): give it once, or the same")
        merged[name] = rng
    return merged


__all__ = ["check_finalizer", "merge_ranges", "sized_inputs", "Range"]
