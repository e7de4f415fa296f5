"""Recurrences (issue 48): the ``(t scan)`` clause, parsed and analysed.

``h[b,t,n] := lam[n]*h[b,t-1,n] + x[b,t,n]  (t scan from h0)`` makes ``t`` a sequential index: it runs 0, 1, ...
(``(t scan reverse)``: downwards) and the body may read the result at earlier positions along ``t`` (later ones
for ``reverse``) at constant offsets; on its other axes a self-read uses the result's own index there or a
summed index (a state that mixes its lanes). Reads before the start give the initial state: 0, or ``h0`` shaped
as the result without ``t`` (with offsets up to d > 1, a leading axis of d, most recent last; for ``reverse``,
nearest first).

The analysed ``Spec`` keeps the self-reads as accesses of the result (``h[b,t-1,n]``, what ``explain`` prints)
and carries a ``Scan`` record. Every other stage reads it through ``unrolled``: the same spec with the
self-reads turned into reads of one more input, the trajectory ``h̃`` with the initial state laid next to the
result (length T + d along ``t``: forward ``[h0, h]``, read at ``t+d-k``; reverse ``[h, h0]``, read at
``t+k``). Over ``h̃`` the spec is an ordinary one, so the loop lowering, the lax.scan lowering and the gradient
derivation work on it unchanged.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Mapping

from tullax.errors import SpecError
from tullax.spec.ir import (
    Access,
    Affine,
    Agreement,
    Expr,
    Input,
    Name,
    ParsedSpec,
    Range,
    Spec,
    Wrapped,
    accesses,
    idx_names,
    map_expr,
    walk,
)
from tullax.spec.sizes import Extent, Extremum, FloorDiv, Sym

_CLAUSE = re.compile(r"\(\s*([A-Za-z_]\w*)\s+scan\b([^()]*)\)")
TRAJECTORY = "ʹtrajectory"  # the placeholder input of ``unrolled``: no user name can spell it


@dataclass(frozen=True)
class Scan:
    """The scan clause of an analysed spec: ``index`` runs sequentially (``reverse``: downwards); ``init``: the
    input holding the initial state (None: zeros); ``depth``: the largest offset of a self-read; ``axis``: the
    position of ``index`` among the result's axes."""

    index: str
    axis: int
    depth: int = 1
    reverse: bool = False
    init: str | None = None

    def clause(self) -> str:
        words = [self.index, "scan"] + (["reverse"] if self.reverse else []) + (
            ["from", self.init] if self.init else [])
        return "(" + " ".join(words) + ")"


@dataclass(frozen=True)
class Clause:
    """A scan clause as written: where it stands in the text, for carets."""

    index: str
    reverse: bool
    init: str | None
    column: int


def split_scan(text: str) -> tuple[str, Clause | None]:
    """The spec text with its scan clause blanked out (columns unchanged, for carets) and the clause, if any."""
    found = list(_CLAUSE.finditer(text))
    if not found:
        return text, None
    if len(found) > 1:
        raise SpecError("a spec has at most one scan clause: one index runs sequentially", text, found[1].start())
    match = found[0]
    words = match.group(2).split()
    reverse, init = False, None
    while words:
        word = words.pop(0)
        if word == "reverse" and not reverse:
            reverse = True
        elif word == "from" and words and init is None and re.fullmatch(r"[A-Za-z_]\w*", words[0]):
            init = words.pop(0)
        else:
            raise SpecError(f"a scan clause reads ({match.group(1)} scan), ({match.group(1)} scan from h0) or "
                            f"({match.group(1)} scan reverse), not {word!r}", text, match.start())
    blanked = text[:match.start()] + " " * (match.end() - match.start()) + text[match.end():]
    return blanked, Clause(match.group(1), reverse, init, match.start())


# ---------------------------------------------------------------------------------------------
# Analysis
# ---------------------------------------------------------------------------------------------
def prepare(parsed: ParsedSpec, clause: Clause, step_depth: int = 0) -> tuple[ParsedSpec, Scan]:
    """Check the self-reads of ``parsed`` against the clause and hide them from range inference: each becomes a
    read of ``TRAJECTORY`` through ``pad`` along ``t`` (no range constraint; the real offset kept inside).
    ``step_depth``: the deepest read of the result by the other statements of a scan program's step
    (``tullax.spec.scan_program``); the statement itself then need not read its result."""
    source, t = parsed.source, clause.index

    def error(message: str, span: tuple[int, int] | None = None) -> SpecError:
        return SpecError(message, source, span[0] if span else clause.column)

    if parsed.assign != ":=":
        raise error(f"a scan defines its result with ':=' (it writes every position along {t})")
    if parsed.lhs is None or not any(isinstance(i, Affine) and i.plain == t for i in parsed.lhs):
        used = any(t in idx_names(i) for a in accesses(parsed.body) for i in a.idx)
        raise error(f"the scan index {t} must be an index of the result (on the left, plainly)"
                    + (f": here it is summed, and a sum has no order to run {t} in" if used else ""))
    if parsed.finalizer is not None and any(a.array == parsed.out for a in accesses(parsed.finalizer)):
        raise error("the finaliser cannot read the result of a scan: read it before |>")
    axis = next(a for a, i in enumerate(parsed.lhs) if isinstance(i, Affine) and i.plain == t)
    depth = 0
    for acc in accesses(parsed.body):
        if acc.array == parsed.out:
            depth = max(depth, _check_self_read(acc, parsed, axis, clause, error))
        elif any(t in idx_names(i) for i in acc.idx):
            for i in acc.idx:
                if t in idx_names(i) and not (isinstance(i, Affine) and i.plain == t):
                    raise error(f"in a scan, inputs are read at {t} itself (a shifted read {_text(i)} would shorten "
                                f"the range of {t}): pass a shifted copy of {acc.array}", i.span or acc.span)
    for node in walk(parsed.body):
        if isinstance(node, Name) and node.name == t:
            raise error(f"the value of the scan index {t} is not available in the body yet: pass it as an "
                        f"input array indexed by {t}", node.span)
    depth = max(depth, step_depth)
    if depth == 0:
        raise error(f"a scan reads its result at an earlier position along {t} ({parsed.out}[..{t}-1..]); this "
                    f"spec does not: drop the scan clause")
    init_name = clause.init
    if init_name is not None and (init_name == parsed.out or any(a.array == init_name for a in accesses(parsed.body))):
        raise error(f"{init_name} is the initial state of the scan: it cannot also be read in the body")

    def hide(node: Expr) -> Expr:
        if isinstance(node, Access) and node.array == parsed.out:
            idx = list(node.idx)
            idx[axis] = Wrapped("pad", idx[axis], span=idx[axis].span)
            return Access(TRAJECTORY, tuple(idx), span=node.span)
        return node

    scan = Scan(t, axis, depth, clause.reverse, init_name)
    return replace(parsed, body=map_expr(parsed.body, hide)), scan


def _text(idx) -> str:
    from tullax.spec.text import format_idx

    return format_idx(idx)


def _check_self_read(acc: Access, parsed: ParsedSpec, axis: int, clause: Clause, error) -> int:
    """The offset k of a self-read (``t-k`` forward, ``t+k`` reverse), after checking its positions."""
    t = clause.index
    if len(acc.idx) != len(parsed.lhs):
        raise error(f"{acc.array} has {len(parsed.lhs)} axes, read with {len(acc.idx)}", acc.span)
    pos = acc.idx[axis]
    if not isinstance(pos, Affine) or pos.names() != (t,) or pos.coef(t) != 1 or pos.div != 1 \
            or not pos.const.is_const:
        raise error(f"a scan reads its result at constant offsets along {t} ({t}-1, {t}-2, ...), not at "
                    f"{_text(pos)}", pos.span or acc.span)
    offset = pos.const.const
    if clause.reverse and offset <= 0:
        raise error(f"a reverse scan reads its result at later positions ({t}+1, {t}+2, ...): {_text(pos)} is not "
                    f"computed yet", pos.span or acc.span)
    if not clause.reverse and offset >= 0:
        hint = "" if offset == 0 else f"; to run {t} downwards write ({t} scan reverse)"
        raise error(f"a scan reads its result at earlier positions ({t}-1, {t}-2, ...): {_text(pos)} is not "
                    f"computed yet{hint}", pos.span or acc.span)
    lhs_names = [i.plain for i in parsed.lhs]
    for d, idx in enumerate(acc.idx):
        if d == axis:
            continue
        plain = idx.plain if isinstance(idx, Affine) else None
        if plain is None or plain == t or (plain in lhs_names and plain != lhs_names[d]):
            raise error(f"a self-read of a scan uses, on each other axis, the result's own index there "
                        f"({lhs_names[d]}) or a summed index (a state that mixes), not {_text(idx)}",
                        idx.span or acc.span)
    return abs(offset)


def finish(spec: Spec, scan: Scan, source: str) -> Spec:
    """The analysed spec of ``prepare``'s output: the self-reads restored, the trajectory dropped from the
    inputs and agreements (an index it bound takes its range from another array bound with it), the initial
    state added as an input, and ``t`` ranged by the inputs alone."""
    t = scan.index
    ranges = dict(spec.ranges)
    for name, rng in spec.ranges:
        if _mentions(rng.lo, TRAJECTORY) or _mentions(rng.hi, TRAJECTORY):
            other = next((a.second for a in spec.agreements if a.index == name and a.first[0] == TRAJECTORY
                          and a.second[0] != TRAJECTORY), None)
            if other is None or rng.lo != Sym(0) or rng.hi != Sym.extent(TRAJECTORY, a_axis(spec, name)):
                raise SpecError(f"the range of index {name} can only come from the result itself: give it, e.g. "
                                f"ranges={{{name!r}: 10}} or ({name} in 0:10)", source)
            ranges[name] = Range(Sym(0), Sym.extent(*other))
    spec = replace(spec, ranges=tuple(ranges.items()),
                   out_shape=tuple(ranges[name].extent() for name in spec.free))
    rng = spec.range_of[t]
    if rng.lo != Sym(0):
        raise SpecError(f"a scan index runs from 0: {t} has the range {rng.lo}:{rng.hi}", source)

    def restore(node: Expr) -> Expr:
        if isinstance(node, Access) and node.array == TRAJECTORY:
            idx = list(node.idx)
            idx[scan.axis] = idx[scan.axis].inner
            return Access(spec.out, tuple(idx), span=node.span)
        return node

    inputs = tuple(i for i in spec.inputs if i.name != TRAJECTORY)
    agreements = tuple(a for a in spec.agreements if TRAJECTORY not in (a.first[0], a.second[0]))
    if scan.init is not None:
        rank = len(spec.lhs) - (1 if scan.depth == 1 else 0)
        inputs += (Input(scan.init, "array", rank),)
        lead = 0 if scan.depth == 1 else 1
        for d, name in enumerate(spec.free):
            if d == scan.axis:
                continue
            bound = _bound_axis(spec.range_of[name])
            if bound is not None:
                agreements += (Agreement(name, bound, (scan.init, lead + d - (d > scan.axis))),)
    return replace(spec, body=map_expr(spec.body, restore), inputs=inputs, agreements=agreements, scan=scan)


def a_axis(spec: Spec, name: str) -> int:
    """The trajectory's axis that binds index ``name`` (from the agreements)."""
    return next(a.first[1] for a in spec.agreements if a.index == name and a.first[0] == TRAJECTORY)


def _bound_axis(rng: Range) -> tuple[str, int] | None:
    if rng.lo == Sym(0) and len(rng.hi.terms) == 1 and rng.hi.terms[0][1] == 1 and rng.hi.const == 0 \
            and isinstance(rng.hi.terms[0][0], Extent):
        atom = rng.hi.terms[0][0]
        return atom.array, atom.axis
    return None


def _mentions(sym: Sym, array: str) -> bool:
    for atom, _ in sym.terms:
        if isinstance(atom, Extent) and atom.array == array:
            return True
        if isinstance(atom, FloorDiv) and _mentions(atom.num, array):
            return True
        if isinstance(atom, Extremum) and any(_mentions(a, array) for a in atom.args):
            return True
    return False


# ---------------------------------------------------------------------------------------------
# The unrolled view every later stage works on
# ---------------------------------------------------------------------------------------------
def trajectory_position(scan: Scan, pos: Affine) -> Affine:
    """A self-read's position along ``t`` (``t-k`` / ``t+k``) as a position in the trajectory h̃."""
    shift = scan.depth if not scan.reverse else 0
    return replace(pos, const=pos.const + shift)


def unrolled(spec: Spec, name: str = TRAJECTORY) -> Spec:
    """``spec`` without its scan clause, its self-reads reading input ``name`` (the trajectory h̃, of the
    result's rank, T + depth long along ``t``) instead, the initial state a 'shape' input."""
    scan: Scan = spec.scan

    def swap(node: Expr) -> Expr:
        if isinstance(node, Access) and node.array == spec.out:
            idx = list(node.idx)
            idx[scan.axis] = trajectory_position(scan, idx[scan.axis])
            return Access(name, tuple(idx), span=node.span)
        return node

    # the initial state stays, for its extents only (a batch index may take its range from it)
    inputs = tuple(replace(i, kind="shape") if i.name == scan.init else i for i in spec.inputs) + (
        Input(name, "array", len(spec.lhs)),)
    agreements = tuple(a for a in spec.agreements if scan.init not in (a.first[0], a.second[0]))
    return replace(spec, body=map_expr(spec.body, swap), inputs=inputs, agreements=agreements, scan=None)


def scan_shapes(spec: Spec, shapes: Mapping[str, tuple[int, ...]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of the trajectory h̃ and of the initial state, for inputs of these ``shapes``."""
    scan: Scan = spec.scan
    out = [int(s.eval(shapes)) for s in spec.out_shape]
    trajectory = tuple(out[:scan.axis] + [out[scan.axis] + scan.depth] + out[scan.axis + 1:])
    rest = tuple(out[:scan.axis] + out[scan.axis + 1:])
    return trajectory, rest if scan.depth == 1 else (scan.depth,) + rest


def check_scan_shapes(spec: Spec, shapes: Mapping[str, tuple[int, ...]], check) -> None:
    """``check`` (``shapes.check_shapes``) on the unrolled spec, and the initial state's shape."""
    from tullax.errors import ShapeError

    scan: Scan = spec.scan
    flat = unrolled(spec)
    known = {name: tuple(shape) for name, shape in shapes.items()}
    for inp in flat.inputs:  # ranks first: the shapes of the trajectory are computed from them
        if inp.name not in (TRAJECTORY, scan.init) and len(known.get(inp.name, ())) != inp.rank:
            check(flat, {**known, TRAJECTORY: (1,) * len(spec.lhs)})
    trajectory, init = scan_shapes(spec, known)
    try:
        check(flat, {**known, TRAJECTORY: trajectory})
    except ShapeError as err:  # name the state as the user wrote it
        where = "its positions then the initial state" if scan.reverse else "the initial state then its positions"
        raise ShapeError(str(err).replace(TRAJECTORY, f"{spec.out} (as the scan reads it: {where} along "
                                                      f"{scan.index})")) from None
    if scan.init is not None and tuple(shapes[scan.init]) != init:
        lead = "" if scan.depth == 1 else f" with a leading axis of {scan.depth} (the deepest self-read)"
        raise ShapeError(f"the initial state {scan.init} of the scan has shape {tuple(shapes[scan.init])}; it "
                         f"should have the result's shape without {scan.index}{lead}: {init}")


__all__ = ["Scan", "Clause", "split_scan", "prepare", "finish", "unrolled", "TRAJECTORY", "trajectory_position"]
