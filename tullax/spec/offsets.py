"""A ':=' result starts at position 0: a free index whose INFERRED range starts elsewhere is refused (issue 44).

Tullio's offset-array rule gives ``y[i] := x[i-1]`` the range ``i in 1:size(x,0)+1``; shifting that to start
at 0 throws the offset away (``y`` would be ``x`` itself, and ``x[i+k-1]*w[k]``, ``x[i+k]*w[k]`` and
``x[i+k+1]*w[k]`` would all compute the same), which no NumPy reader expects. So unless the user wrote the
range (``ranges=`` or a ``(i in lo:hi)`` clause: then position 0 of the result is ``i = lo``, as asked), such a
spec is a SpecError under the access that moved the start, saying what it would compute and what to write.
"""
from __future__ import annotations

from typing import Any, Callable, Collection

from tullax.spec.ir import Access, Affine, Indirect, ParsedSpec, Range, Spec, Wrapped, spec_accesses
from tullax.spec.ranges import format_clause
from tullax.spec.sizes import Extent, Extremum, FloorDiv, Sym
from tullax.spec.text import format_access, format_spec

Context = Any  # analyze's error context (not imported: analyze imports this module)
# the range of ``name`` that keeps ``array``'s axis ``axis`` indexed by ``idx`` in bounds, over the known ranges
BoundsFor = Callable[[Affine, str, int, str], Range]


def refuse_erased_offsets(spec: Spec, parsed: ParsedSpec, explicit: Collection[str], bounds_for: BoundsFor,
                          shifted: Callable[[Spec], Spec] | None, ctx: Context) -> None:
    """Raise a SpecError for the first free index of a ':=' spec whose inferred range does not start at 0
    (``shifted`` moves the free indices to start at 0: what it would compute; None: not worth printing)."""
    for name in erased_offsets(spec, explicit):
        found = _culprit(parsed, name, spec.range_of[name].lo, bounds_for)
        raise ctx.error(_message(spec, name, found, shifted(spec) if shifted else None, explicit),
                        found[0].span if found else _lhs_span(parsed, name))


def erased_offsets(spec: Spec, explicit: Collection[str]) -> tuple[str, ...]:
    """The free indices of a ':=' ``spec`` (ranges as inferred) that do not start at 0 and whose range the user
    did not write."""
    if spec.assign != ":=":
        return ()
    return tuple(name for name in spec.free if not _always_zero(spec.range_of[name].lo) and name not in explicit)


def _always_zero(value: Sym) -> bool:
    """Whether ``value`` is 0 for every shape (extents are never negative): ``max(-size(x,0)-2, 0)`` is."""
    return _bounds(value) == (0, 0)


def _bounds(value: Any) -> tuple[int | None, int | None]:
    """(lowest, highest) ``value`` (a Sym or one of its atoms) can take with extents >= 0; None: unbounded."""
    if isinstance(value, Sym):
        low, high = value.const, value.const
        for atom, coef in value.terms:
            a_low, a_high = _bounds(atom)
            low = None if low is None or (a_low if coef > 0 else a_high) is None else \
                low + coef * (a_low if coef > 0 else a_high)
            high = None if high is None or (a_high if coef > 0 else a_low) is None else \
                high + coef * (a_high if coef > 0 else a_low)
        return low, high
    if isinstance(value, Extremum):
        lows, highs = zip(*(_bounds(arg) for arg in value.args))
        if value.kind == "max":
            known = [b for b in lows if b is not None]
            return (max(known) if known else None), (None if None in highs else max(highs))
        known = [b for b in highs if b is not None]
        return (None if None in lows else min(lows)), (min(known) if known else None)
    if isinstance(value, FloorDiv) and value.den > 0:
        low, high = _bounds(value.num)
        return (None if low is None else low // value.den), (None if high is None else high // value.den)
    return (0, None) if isinstance(value, Extent) else (None, None)


def _culprit(parsed: ParsedSpec, name: str, lo: Sym, bounds_for: BoundsFor) -> tuple[Access, int] | None:
    """The access (and axis) whose bounds move ``name``'s start to ``lo``; else the first that moves it at all."""
    moving: list[tuple[Access, int]] = []
    for acc in spec_accesses(parsed):
        for axis, idx in enumerate(acc.idx):
            if isinstance(idx, Indirect):  # ix[i+1]: the read of the index array bounds i
                acc, axis, idx = Access(idx.array, (idx.inner,), idx.span), 0, idx.inner
            if not isinstance(idx, Affine) or idx.plain or name not in idx.names() or idx.div != 1:
                continue
            start = bounds_for(idx, acc.array, axis, name).lo
            if start == lo:
                return acc, axis
            if start != Sym(0):
                moving.append((acc, axis))
    return moving[0] if moving else None


def _lhs_span(parsed: ParsedSpec, name: str) -> tuple[int, int] | None:
    return next((idx.span for idx in parsed.lhs or () if isinstance(idx, Affine) and idx.plain == name), None)


def _message(spec: Spec, name: str, found: tuple[Access, int] | None, shifted: Spec | None,
             explicit: Collection[str]) -> str:
    rng = spec.range_of[name]
    computes = valid = ""
    if shifted is not None:
        # the clauses of the ranges the user wrote, so the text it would compute is a whole spec
        text = format_spec(shifted)  # prints a clause itself for a reduction the body never mentions
        text += "".join(f"  {format_clause(n, r.lo, r.hi)}" for n, r in shifted.ranges
                        if n in explicit and f"({n} in " not in text)
        conv = " (a valid convolution is x[i+k]*w[k])" if spec.reduced else ""
        computes = f" and this would compute {text}"
        valid = f"{text} for the valid part from position 0{conv}, "
    where = pad = ""
    index_arrays = {i.name for i in spec.inputs if i.kind == "index"}
    if found is not None:
        acc, axis = found
        where = f" (where {format_access(acc.array, acc.idx)} stays inside {acc.array})"
        padded = tuple(Wrapped("pad", i) if d == axis else i for d, i in enumerate(acc.idx))
        if acc.array not in index_arrays:  # no pad(..) inside an index array's brackets
            pad = f"{format_access(acc.array, padded)} for a shifted read with 0 outside {acc.array}, "
    return (f"index {name} of the result would run over {rng.lo}:{rng.hi}{where}, which does not start at 0: a "
            f"':=' result starts at position 0, so the offset would be dropped{computes} (position 0 holding "
            f"{name} = {rng.lo}). Write what you mean: {pad}{valid}or give {name} its range yourself, "
            f"{format_clause(name, rng.lo, rng.hi)} or ranges={{{name!r}: (lo, hi)}}, to keep this result")


__all__ = ["refuse_erased_offsets", "erased_offsets"]
