"""Resolve names, classify indices and infer symbolic ranges: ParsedSpec -> Spec (docs/design.md, section 1)."""
from __future__ import annotations

import operator
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Mapping, Union

from tullax.errors import SpecError
from tullax.spec.clauses import check_finalizer, merge_ranges, sized_inputs
from tullax.spec.diagonal import diagonal_write
from tullax.spec.ir import (
    INDEX_LIMIT,
    Access,
    Affine,
    Agreement,
    Expr,
    Idx,
    IndexVal,
    Indirect,
    Input,
    Name,
    Param,
    ParsedSpec,
    Range,
    Spec,
    Wrapped,
    accesses,
    idx_names,
    map_expr,
    spec_accesses,
    spec_exprs,
    walk,
)
from tullax.spec.offsets import erased_offsets, refuse_erased_offsets
from tullax.spec.recurrence import check_self_reads
from tullax.spec.sizes import (
    Sym,
    ceildiv,
    floordiv,
    smax,
    smin,
)

RangeArg = Union[int, tuple[int, int], Range]


@dataclass(frozen=True)
class Occurrence:
    """One bracket position: ``array``'s axis ``axis`` is indexed by ``idx``."""

    array: str
    axis: int
    idx: Idx


@dataclass(frozen=True)
class Constraint:
    """``0 <= expr < extent(array, axis)``, from a shifted or scaled access that must stay in bounds."""

    expr: Affine
    array: str
    axis: int


# Every index is a nested loop in the generated code, and guards add blocks too: Python (the Numba printer's
# target) refuses more than 20 statically nested blocks.
MAX_INDICES = 16


def analyze(parsed: ParsedSpec, ranges: Mapping[str, RangeArg] | None = None) -> Spec:
    """Turn a parsed spec into an analysed, hashable Spec, or raise SpecError pointing into the source."""
    found = _analyse(parsed, ranges)
    shifted = None if found.copies else _shift_free_to_zero  # a diagonal write's rewritten text says nothing
    refuse_erased_offsets(found.spec, found.parsed, found.written, found.bounds_for, shifted, _Context(parsed.source))
    return _shift_free_to_zero(found.spec)


def inferred_free_ranges(parsed: ParsedSpec, ranges: Mapping[str, RangeArg] | None = None,
                         ) -> tuple[dict[str, Range], tuple[str, ...]]:
    """Every free index's range as inferred (before it is moved to start at 0), and the free indices of a ':='
    spec that ``analyze`` refuses because that range does not start at 0: range clauses giving those ranges keep
    the result the inference describes."""
    found = _analyse(parsed, ranges)
    free = {name: found.spec.range_of[name] for name in found.spec.free if name not in found.copies}
    return free, tuple(n for n in erased_offsets(found.spec, found.written) if n not in found.copies)


@dataclass(frozen=True)
class _Analysed:
    """A spec with its ranges as inferred (free indices not yet moved to start at 0), the parsed spec after the
    diagonal write, the indices whose range the user wrote, every index's range and the indices a diagonal write
    added (each repeats one the user wrote, with its range)."""

    spec: Spec
    parsed: ParsedSpec
    written: frozenset[str]
    known: Mapping[str, Range]
    copies: frozenset[str]

    def bounds_for(self, idx: Affine, array: str, axis: int, name: str) -> Range:
        """The range of ``name`` that keeps axis ``axis`` of ``array``, indexed by ``idx``, in bounds."""
        return _bounds_for(Constraint(idx, array, axis), name, dict(self.known))


def _analyse(parsed: ParsedSpec, ranges: Mapping[str, RangeArg] | None) -> _Analysed:
    ctx = _Context(parsed.source)
    parsed, copies = diagonal_write(parsed)  # D[i,i] := A[i]: a new index per repetition, zeros off the diagonal
    _check_lhs(parsed, ctx)
    occurrences = _occurrences(parsed)
    index_names = _index_names(parsed, occurrences, ranges or {})
    inputs = _inputs(parsed, index_names, ctx)
    arrays = {i.name for i in inputs if i.kind != "scalar"}
    body = _resolve_names(parsed.body, index_names, arrays, ctx)
    free, reduced = _free_and_reduced(parsed, body, index_names)
    finalizer = None
    if parsed.finalizer is not None:
        finalizer = _resolve_names(parsed.finalizer, index_names, arrays, ctx)
        check_finalizer(finalizer, free, ctx)
    if len(free) + len(reduced) > MAX_INDICES:
        raise ctx.error(f"the spec has {len(free) + len(reduced)} indices ({', '.join(free + reduced)}); tullax "
                        f"allows {MAX_INDICES}, one nested loop each (Python compiles at most 20 nested blocks): "
                        f"reshape the arrays to merge axes")
    explicit = merge_ranges(parsed, ranges or {}, ctx, _explicit_range)
    known, agreements = _infer_ranges(parsed, occurrences, free + reduced, explicit, ctx, copies)
    spec = Spec(
        redop=parsed.redop, out=parsed.out, lhs=parsed.lhs, assign=parsed.assign, body=body,
        finalizer=finalizer, inputs=inputs, free=free, reduced=reduced,
        ranges=tuple((name, known[name]) for name in free + reduced), agreements=agreements,
    )
    written = frozenset(explicit) | {new for new, old in copies.items() if old in explicit}
    return _Analysed(spec, parsed, written, MappingProxyType(dict(known)), frozenset(copies))


class _Context:
    """The source text, to point a caret into it."""

    def __init__(self, source: str):
        self.source = source

    def error(self, message: str, span: tuple[int, int] | None = None) -> SpecError:
        col = span[0] if span and self.source else None
        return SpecError(message, self.source or None, col)


# ---------------------------------------------------------------------------------------------
def _check_lhs(parsed: ParsedSpec, ctx: _Context) -> None:
    if parsed.lhs is None:
        return
    plain = [i.plain if isinstance(i, Affine) else None for i in parsed.lhs]
    scatter = any(p is None for p in plain)
    if scatter and parsed.assign != "+=":
        bad = next(i for i, p in zip(parsed.lhs, plain) if p is None)
        raise ctx.error(
            "the left-hand side must list plain, distinct indices; to write into computed positions "
            "(a shift, mod/clamp/pad or ix[..]), scatter with += into an existing array", bad.span)
    if scatter and (parsed.redop != "+" or parsed.finalizer):
        raise ctx.error("a scatter (+= into computed positions) only sums: no reduction or |> finaliser")
    seen: set[str] = set()
    for idx, name in zip(parsed.lhs, plain):
        if name is not None and name in seen:
            raise ctx.error(f"index {name} appears twice on the left-hand side of '{parsed.assign}': only a new "
                            f"result ':=' can be a diagonal write; to add into the diagonal of an existing "
                            f"array write the select, as in D[i,j] {parsed.assign} ifelse(i == j, A[i], 0)",
                            idx.span)
        if name is not None:
            seen.add(name)


def _lhs_occurrences(parsed: ParsedSpec) -> list[Occurrence]:
    if parsed.assign == ":=" or parsed.lhs is None:
        return []
    return [Occurrence(parsed.out, axis, idx) for axis, idx in enumerate(parsed.lhs)]


def _occurrences(parsed: ParsedSpec) -> list[Occurrence]:
    """Every bracket position, in text order; an indirect ``ix[e]`` adds the occurrence of ``ix``."""
    found: list[Occurrence] = []
    for acc in list(_lhs_access(parsed)) + list(spec_accesses(parsed)):
        for axis, idx in enumerate(acc.idx):
            found.append(Occurrence(acc.array, axis, idx))
            if isinstance(idx, Indirect):
                found.append(Occurrence(idx.array, 0, idx.inner))
    return found


def _lhs_access(parsed: ParsedSpec) -> list[Access]:
    if parsed.lhs is None:
        return []
    if parsed.assign == ":=":  # a new result has no extents yet to bound anything
        return []
    return [Access(parsed.out, parsed.lhs)]


def _index_names(parsed: ParsedSpec, occurrences: list[Occurrence], ranges: Mapping[str, RangeArg]) -> list[str]:
    names: list[str] = []
    for idx in list(parsed.lhs or ()) + [o.idx for o in occurrences]:
        for name in idx_names(idx):
            if name not in names:
                names.append(name)
    # a name given a range (`(k in 0:5)` or ranges={'k': 5}) is an index even where no array is indexed by it:
    # `y[i] := x[i]*k (k in 0:5)` sums x[i]*k over k, it does not take k as a scalar argument
    bare = {n.name for n in walk(parsed.body) if isinstance(n, Name)}
    for name in [n for n, _ in parsed.ranges] + [n for n in ranges if n in bare]:
        if name not in names:
            names.append(name)
    return names


def _inputs(parsed: ParsedSpec, index_names: list[str], ctx: _Context) -> tuple[Input, ...]:
    """Inputs in order of first appearance on the right (the given output first for = and +=)."""
    order: list[str] = []
    ranks: dict[str, int] = {}
    data: set[str] = set()
    spans: dict[str, tuple[int, int]] = {}

    def note(name: str, rank: int | None, span, as_data: bool) -> None:
        if name in index_names:
            raise ctx.error(f"{name} is used both as an index and as an array", span)
        if name not in order:
            order.append(name)
            spans[name] = span
        if rank is not None:
            if ranks.setdefault(name, rank) != rank:
                raise ctx.error(f"{name} is indexed with {rank} indices here but with {ranks[name]} "
                                "elsewhere: an array has one rank", span)
        if as_data:
            data.add(name)

    check_self_reads(parsed, ctx)  # the result on the right: only at the position written, and not for ':='
    if parsed.assign != ":=":
        note(parsed.out, len(parsed.lhs or ()), (0, 0), True)
    for node in (node for expr in spec_exprs(parsed) for node in walk(expr)):
        if isinstance(node, Access):
            note(node.array, len(node.idx), node.span, True)
            for idx in node.idx:
                if isinstance(idx, Indirect):
                    note(idx.array, 1, idx.span, False)
        elif isinstance(node, Name) and node.name not in index_names:
            if node.name == parsed.out:  # `s = s + x[i]`: a running sum written out by hand
                raise ctx.error(f"{node.name} is the result being defined; it cannot appear on the right. A sum "
                                f"over the indices missing on the left is implicit: write `{node.name} := ...` "
                                f"with only the summed term (`{node.name} += ...` adds it to a given "
                                f"{node.name})", node.span)
            if node.name in ranks:
                raise ctx.error(f"{node.name} is an array: index it, as in {node.name}[i]", node.span)
            note(node.name, None, node.span, True)
    for idx in parsed.lhs or ():
        if isinstance(idx, Indirect):
            note(idx.array, 1, idx.span, False)
    if parsed.out in index_names:
        raise ctx.error(f"{parsed.out} is used both as the result and as an index")
    for name in order:  # a bare name that was also indexed somewhere
        if name not in ranks and any(isinstance(n, Access) and n.array == name for n in walk(parsed.body)):
            raise ctx.error(f"{name} is an array: index it, as in {name}[i]", spans[name])
    found = tuple(Input(name, _kind(name, ranks, data), ranks.get(name, 0)) for name in order)
    return found + sized_inputs(parsed, found, index_names, ctx)


def _kind(name: str, ranks: dict[str, int], data: set[str]) -> str:
    if name not in ranks:
        return "scalar"
    return "array" if name in data else "index"


def _resolve_names(body: Expr, index_names: list[str], arrays: set[str], ctx: _Context) -> Expr:
    def fix(node: Expr) -> Expr:
        if isinstance(node, Name):
            if node.name in index_names:
                return IndexVal(node.name, span=node.span)
            if node.name in arrays:
                raise ctx.error(f"{node.name} is an array: index it, as in {node.name}[i]", node.span)
            return Param(node.name, span=node.span)
        return node
    return map_expr(body, fix)


def _free_and_reduced(parsed: ParsedSpec, body: Expr, index_names: list[str]) -> tuple[tuple, tuple]:
    lhs = parsed.lhs or ()
    plain = [i.plain for i in lhs if isinstance(i, Affine)]
    if any(not (isinstance(i, Affine) and i.plain) for i in lhs):  # scatter: every index is iterated
        free: tuple[str, ...] = ()
    else:
        free = tuple(p for p in plain if p)
    reduced = tuple(n for n in index_names if n not in free)
    body_indices = {n.name for n in walk(body) if isinstance(n, IndexVal)}
    reduced += tuple(sorted(body_indices - set(free) - set(reduced)))
    reduced += tuple(n for n, _ in parsed.ranges if n not in free and n not in reduced)  # (k in ..) alone
    return free, reduced


# ---------------------------------------------------------------------------------------------
# Range inference
# ---------------------------------------------------------------------------------------------
def _explicit_range(name: str, value: RangeArg, ctx: _Context) -> Range:
    if isinstance(value, Range):
        return value
    if isinstance(value, range) and value.step != 1:
        raise ctx.error(f"ranges[{name!r}] = {value!r} has a step: ranges are contiguous; write the stride into "
                        f"the spec instead (x[{value.step}{name}] with ranges={{{name!r}: {len(value)}}})")
    if isinstance(value, range):
        lo, hi = value.start, value.stop
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        lo, hi = _range_int(name, value[0], value, ctx), _range_int(name, value[1], value, ctx)
    else:
        lo, hi = 0, _range_int(name, value, value, ctx)
    if hi < lo:
        raise ctx.error(f"ranges[{name!r}] = {value!r} is empty backwards: stop must be >= start")
    if max(abs(lo), abs(hi)) > INDEX_LIMIT:
        raise ctx.error(f"ranges[{name!r}] = {value!r} is beyond the 2^62 that tullax's int64 index arithmetic "
                        f"allows")
    return Range(Sym(lo), Sym(hi))


def _range_int(name: str, bound: object, value: object, ctx: _Context) -> int:
    """An integer bound of an explicit range: Python and NumPy integers, never bools or floats."""
    if isinstance(bound, bool) or not hasattr(bound, "__index__"):
        raise ctx.error(f"ranges[{name!r}] must be an int or a (start, stop) pair, got {value!r}")
    return operator.index(bound)


def _infer_ranges(parsed: ParsedSpec, occurrences: list[Occurrence], indices: tuple[str, ...],
                  explicit: Mapping[str, RangeArg], ctx: _Context, copies: Mapping[str, str] = MappingProxyType({})):
    for name in explicit:
        if name not in indices:
            raise ctx.error(f"ranges names {name!r}, which is not an index of this spec "
                            f"(indices: {', '.join(indices) or 'none'})")
    known = {name: _explicit_range(name, value, ctx) for name, value in explicit.items()}
    bindings: dict[str, list[tuple[str, int]]] = {}
    constraints: list[Constraint] = []
    for occ in occurrences:
        if not isinstance(occ.idx, Affine):
            continue
        if occ.idx.plain:
            bindings.setdefault(occ.idx.plain, []).append((occ.array, occ.axis))
        elif occ.idx.terms:
            if occ.idx.div != 1:
                raise ctx.error("a divided index is only allowed inside pad(..)", occ.idx.span)
            constraints.append(Constraint(occ.idx, occ.array, occ.axis))
    for occ in occurrences:
        if isinstance(occ.idx, Wrapped) and occ.idx.inner.div != 1 and occ.idx.kind != "pad":
            raise ctx.error("a divided index is only allowed inside pad(..)", occ.idx.span)
    agreements: list[Agreement] = []
    for name, axes in bindings.items():
        unique = list(dict.fromkeys(axes))
        if name not in known:
            known[name] = Range(Sym(0), Sym.extent(*unique[0]))
        agreements += [Agreement(name, unique[0], other) for other in unique[1:]]
    used = _solve_unknowns(constraints, known)
    _bind_wrapped_only(occurrences, known)
    used |= _solve_unknowns(constraints, known)
    rest = [con for con in constraints if id(con) not in used]
    _narrow(rest, known, set(known) - set(explicit), set(explicit), indices, parsed)
    for new, old in copies.items():  # a diagonal write's new index runs over the range of the one it repeats
        if old in known and new not in explicit:
            known[new] = known[old]
    for name in indices:
        if name not in known:
            raise ctx.error(_unbound_message(name, parsed), _first_span(parsed, name))
    return known, tuple(agreements)


def _bind_wrapped_only(occurrences: list[Occurrence], known: dict[str, Range]) -> None:
    """An index still unbound that appears only inside mod/clamp/pad, all on ONE axis, runs over that axis:
    ``y[i] := x[mod(i+1)]`` is as long as x (as the README promises); on several axes it stays ambiguous.
    A padded window read with a stride or a padding offset (``pad(s*i + d*k - p)``) runs as a convolution's
    output does (``_padded_window``)."""
    axes: dict[str, set[tuple[str, int]]] = {}
    inners: dict[str, set[tuple[str, Affine]]] = {}
    for occ in occurrences:
        if isinstance(occ.idx, Wrapped):
            for name in occ.idx.inner.names():
                axes.setdefault(name, set()).add((occ.array, occ.axis))
                inners.setdefault(name, set()).add((occ.idx.kind, occ.idx.inner))
    for name, where in axes.items():
        if name not in known and len(where) == 1:
            (array, axis), = where
            found = inners[name]
            window = _padded_window(name, next(iter(found))[1], array, axis, known) \
                if len(found) == 1 and next(iter(found))[0] == "pad" else None
            known[name] = window or Range(Sym(0), Sym.extent(array, axis))


def _padded_window(name: str, inner: Affine, array: str, axis: int, known: dict[str, Range]) -> Range | None:
    """The range of ``name`` in ``pad(s*name + rest - p)`` as PyTorch's and lax's convolutions give it, padded by
    ``p`` on both sides: ``floor((N + 2p - span - 1)/s) + 1`` outputs, ``span`` the extent of ``rest`` (the window
    over the other, known, indices), N the axis. Only with a stride ``s > 1`` or an offset ``p > 0``: a plain
    ``pad(i+k)`` or ``pad(i-k)`` runs over the axis as before (the padding then only guards the reads). None
    when the read is not of this form."""
    coef = inner.coef(name)
    if inner.div != 1 or coef < 1 or not inner.const.is_const or inner.const.const > 0:
        return None
    if any(n != name and n not in known for n in inner.names()):
        return None
    offset = -inner.const.const
    if (coef == 1 and offset == 0) or len(inner.terms) < 2:
        return None  # no stride or offset, or no window: a shift (pad(i-1)) keeps the axis's length
    rest_lo, rest_hi = _term_bounds(replace(inner, const=Sym(0)), name, known)
    if not (rest_lo.is_const and rest_lo.const == 0):
        return None  # a window that starts anywhere but at its output's position: not a convolution's
    top = Sym.extent(array, axis) - 1 + 2 * offset - rest_hi
    return Range(Sym(0), smax(floordiv(top, coef) + 1, Sym(0)))


def _unbound_message(name: str, parsed: ParsedSpec) -> str:
    on_left = {n for idx in parsed.lhs or () for n in idx_names(idx)}
    on_right = list(dict.fromkeys(n for acc in accesses(parsed.body) for idx in acc.idx
                                  for n in idx_names(idx)))
    as_value = {node.name for node in walk(parsed.body) if isinstance(node, Name)}
    if name in on_left and name not in on_right and name not in as_value:
        only_right = [n for n in on_right if n not in on_left]
        hint = f" (is {' or '.join(only_right)} a typo for {name}?)" if only_right else ""
        return (f"index {name} is on the left but nowhere on the right{hint}: every index of the result must "
                f"index an input, or be given a range explicitly, e.g. ranges={{{name!r}: 10}}")
    return (f"cannot infer the range of index {name}: no array is indexed by it plainly, and no "
            f"shifted access bounds it; give it explicitly, e.g. ranges={{{name!r}: 10}}")


def _first_span(parsed: ParsedSpec, name: str) -> tuple[int, int] | None:
    for idx in list(parsed.lhs or ()) + [i for a in accesses(parsed.body) for i in a.idx]:
        if name in idx_names(idx):
            return idx.span
    for node in walk(parsed.body):
        if isinstance(node, Name) and node.name == name:
            return node.span
    return None


def _term_bounds(expr: Affine, skip: str, known: dict[str, Range]) -> tuple[Sym, Sym]:
    """Smallest and largest value of ``expr`` minus its ``skip`` term, over the known ranges."""
    low, high = expr.const, expr.const
    for name, coef in expr.terms:
        if name == skip:
            continue
        rng = known[name]
        first, last = rng.lo * coef, (rng.hi - 1) * coef
        low, high = (low + first, high + last) if coef > 0 else (low + last, high + first)
    return low, high


def _bounds_for(con: Constraint, name: str, known: dict[str, Range]) -> Range:
    """The values of ``name`` that keep ``con`` in bounds for EVERY value of the other indices."""
    coef = con.expr.coef(name)
    rest_lo, rest_hi = _term_bounds(con.expr, name, known)
    top = Sym.extent(con.array, con.axis) - 1
    if coef > 0:
        return Range(ceildiv(-rest_lo, coef), floordiv(top - rest_hi, coef) + 1)
    return Range(ceildiv(rest_hi - top, -coef), floordiv(rest_lo, -coef) + 1)


def _solve_unknowns(constraints: list[Constraint], known: dict[str, Range]) -> set[int]:
    """Give a range to every index that is the one unknown of some constraint, until nothing changes.
    Returns the ids of the constraints used: they hold by construction and must not narrow again."""
    used: set[int] = set()
    progress = True
    while progress:
        progress = False
        for con in constraints:
            unknown = [n for n in con.expr.names() if n not in known]
            if len(unknown) == 1:
                known[unknown[0]] = _bounds_for(con, unknown[0], known)
                used.add(id(con))
                progress = True
    return used


def _narrow(constraints: list[Constraint], known: dict[str, Range], narrowable: set[str], explicit: set[str],
            indices: tuple[str, ...], parsed: ParsedSpec) -> None:
    """Shrink plainly bound indices so shifted accesses stay in bounds: one target per constraint, a free
    index first (the result gets smaller rather than a sum losing terms), else the last index used.

    A constraint on an explicitly ranged index never shrinks a reduction: the user fixed that range, and a sum
    silently losing terms for it would be a wrong result; the shape check then reports the access instead."""
    free = [i.plain for i in parsed.lhs or () if isinstance(i, Affine) and i.plain]
    for con in constraints:
        names = [n for n in con.expr.names() if n in known]
        if len(names) != len(con.expr.names()):
            continue
        targets = [n for n in names if n in narrowable]
        if explicit & set(names):
            targets = [n for n in targets if n in free]
        if not targets:
            continue
        preferred = [n for n in targets if n in free] or sorted(targets, key=indices.index)[-1:]
        target = preferred[0]
        bound = _bounds_for(con, target, known)
        old = known[target]
        known[target] = Range(smax(old.lo, bound.lo), smin(old.hi, bound.hi))


# ---------------------------------------------------------------------------------------------
# Shifting free indices to start at 0
# ---------------------------------------------------------------------------------------------
def _shift_free_to_zero(spec: Spec) -> Spec:
    """For ':=' every free index runs from 0: substitute i -> i + lo in the body (docs/design.md, section 1). An
    inferred start other than 0 was refused before (``tullax.spec.offsets``): only a range the user wrote shifts."""
    rng = spec.range_of
    if spec.assign != ":=":
        return replace(spec, out_shape=tuple(Sym.extent(spec.out, d) for d in range(len(spec.lhs or ()))))
    shifts = {name: rng[name].lo for name in spec.free if rng[name].lo != Sym(0)}
    out_shape = tuple(rng[name].extent() for name in spec.free)
    if not shifts:
        return replace(spec, out_shape=out_shape)
    body = shift_indices(spec.body, shifts)
    finalizer = None if spec.finalizer is None else shift_indices(spec.finalizer, shifts)
    new_ranges = tuple((n, Range(Sym(0), r.extent()) if n in shifts else r) for n, r in spec.ranges)
    return replace(spec, body=body, finalizer=finalizer, ranges=new_ranges, out_shape=out_shape)


def shift_affine(aff: Affine, shifts: Mapping[str, Sym]) -> Affine:
    extra = Sym(0)
    for name, coef in aff.terms:
        if name in shifts:
            extra = extra + shifts[name] * coef
    return replace(aff, const=aff.const + extra) if extra != Sym(0) else aff


def shift_idx(idx: Idx, shifts: Mapping[str, Sym]) -> Idx:
    if isinstance(idx, Affine):
        return shift_affine(idx, shifts)
    if isinstance(idx, Indirect) and not idx.plain:
        return replace(idx, inner=shift_affine(idx.inner, shifts), offset=shift_affine(idx.offset, shifts))
    return replace(idx, inner=shift_affine(idx.inner, shifts))


def shift_indices(body: Expr, shifts: Mapping[str, Sym]) -> Expr:
    """Substitute ``i -> i + shift`` for every index in ``shifts``."""
    def fix(node: Expr) -> Expr:
        if isinstance(node, Access):
            return replace(node, idx=tuple(shift_idx(i, shifts) for i in node.idx))
        if isinstance(node, IndexVal) and node.name in shifts:
            return replace(node, offset=node.offset + shifts[node.name])
        return node
    return map_expr(body, fix)


__all__ = ["analyze", "inferred_free_ranges", "shift_indices", "Occurrence", "Constraint"]
