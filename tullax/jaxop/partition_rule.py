"""How JAX's SPMD partitioner may split a kernel, read off its index notation: one factor per index, einsum's rule.

Each axis of each input, and of the result, gets a factor:

* an axis read (or written) plainly by an index (``W[k,i]``: axis 0 by ``k``) gets that index's factor;
* any other axis (shifted, strided, windowed, ``mod``/``clamp``/``pad``, read through an index array, or a
  constant) gets a factor of its own that must stay replicated: the partitioner gathers only that axis.

An index may be split across devices only where every position it appears in is plain, or a window running from
it to the axis's end (``x[i+k]``, ``k`` from 0, ``i`` over the valid positions: each device's block of ``x`` gets
the ``max(k)`` elements after it from its neighbour, a halo; ``k`` stays whole), or padded windows
(``pad(m±k+c)``: ``Δx[m] := Δy[pad(m-k)]*w[k]``, a window's input gradient; ``x[pad(i-1)] - 2*x[i] + x[pad(i+1)]``,
several on one axis read plainly too; a "same" convolution ``x[pad(i+k-2)]``) of an index otherwise read only
plainly: each device reads each such axis around its block, zero outside it (for a summed index, only on axes
it does not read plainly), and the body does not read its value (``IndexVal``) or an extent (``Size``). Then:

* a free index (on the result's left-hand side): each device runs the kernel on its block, and its result
  block is the result's block along that index (``FREE``);
* a table's axis read only through a bare index array (``out[b,d] := W[ix[b],d]``, the body linear in that read,
  a ``+`` sum): split like a summed index, each device reads only the rows it holds (zero for the others), then
  the psum; a scatter's positions (``ΔW[ix[b],d] += ...``): the result's rows split like a free index, each device
  adding only into its rows (``rows``: each device's index array is shifted by its block's start);
* a summed index: each device reduces its block, then the reduction's collective combines the devices'
  results (``combine``): psum for ``+``, pmax/pmin for max/min, a max-shifted sum for logsumexp. Not for
  ``*``, a finaliser (``|> f`` applies after the whole reduction) or a '=' update; a '+=' update adds the
  given array once, after the collective (``tullax.jaxop.partition``). A scatter's positions
  (``ΔW[ix[b],d] += ...``) are summed this way too.

Pure: a Spec in, a frozen ``Factors`` out; the jax side is ``tullax.jaxop.partition``.
"""
from __future__ import annotations

from dataclasses import dataclass

from tullax.spec.ir import (
    Access,
    Affine,
    Binary,
    IndexVal,
    Indirect,
    Size,
    Spec,
    Unary,
    Wrapped,
    idx_names,
    spec_accesses,
    spec_exprs,
    walk,
)
from tullax.spec.sizes import Sym

COMBINES = {"+": "psum", "max": "pmax", "min": "pmin", "logsumexp": "logsumexp"}


@dataclass(frozen=True)
class Factors:
    """The sharding rule of one spec. ``operands``: per input, per axis, its factor; ``result``: per result axis.
    ``free``: factors of free indices that may be split; ``summed``: factors of summed indices that may be split
    (then combined by ``combine``); every other factor is in ``replicated``. ``index``: factor -> the index it
    stands for (replicated axes of their own have none). ``halo``: per windowed axis (``x[i+k]``) its factor, the
    factor of the index split with it, the window index (or None), the constant offset and whether it is a padded
    window (``Δy[pad(m-k+c)]``): split with that index, each device's block extended by the elements around it
    (``tullax.jaxop.halo``)."""

    operands: tuple[tuple[str, ...], ...]
    result: tuple[str, ...]
    free: tuple[str, ...]
    summed: tuple[str, ...]
    replicated: tuple[str, ...]
    combine: str
    index: tuple[tuple[str, str], ...]
    halo: tuple[tuple[str, str, str | None, int, bool], ...] = ()
    rows: tuple[tuple[str, str], ...] = ()  # a table axis split by rows: (its factor, the index array)

    @property
    def index_of(self) -> dict[str, str]:
        return dict(self.index)

    def text(self) -> str:
        """The rule in einsum notation (``k i, k j -> i j``), for messages and tests."""
        operands = ", ".join(" ".join(axes) for axes in self.operands)
        return f"{operands} -> {' '.join(self.result)}"


def factors(spec: Spec, shapes: dict[str, tuple[int, ...]] | None = None) -> Factors:
    """The sharding rule of ``spec`` (see the module docstring); ``shapes`` (the inputs' global shapes) pick which
    index of a padded window ``pad(i+k+c)`` is split, the longer one (``_pad_window``)."""
    names: dict[str, str] = {}  # index -> factor
    own: list[str] = []  # factors of axes that are not plain

    def of_index(index: str) -> str:
        if index not in names:
            names[index] = f"f{len(names)}"
        return names[index]

    def fresh() -> str:
        own.append(f"r{len(own)}")
        return own[-1]

    whole: set[str] = set()  # indices that must not be split
    halos: list[tuple[str, int, str, str | None, int]] = []  # array, axis, split index, window index, offset
    axes: dict[str, list[str | None]] = {item.name: [None] * item.rank for item in spec.inputs}

    pads: list[tuple[str, int, str, str | None, int, int]] = []  # the same and the window's sign: pad(m±k+c)
    read: set[str] = set()  # indices read anywhere but plainly or in a padded window
    padded = _padded_axes(spec, axes, shapes)  # (array, axis) -> the index its padded windows are split with

    def place(array: str, position: int, idx: object) -> None:
        plain = idx.plain if isinstance(idx, Affine) else None
        if not isinstance(idx, Wrapped) and plain is None:
            read.update(idx_names(idx))
        if plain is not None and padded.get((array, position)) == plain:  # x[i] beside x[pad(i+1)]: a window too
            pads.append((array, position, plain, None, 0, 1))
            _claim_window(axes, array, position, fresh)
            return
        if isinstance(idx, Indirect):  # the index array's own axis may be plain; the data axis: see _table
            inner = idx.inner.plain
            if inner is not None and idx.array in axes and not idx.offset.terms and axes[idx.array]:
                _claim(axes, idx.array, 0, of_index(inner), whole, inner, names)
            else:
                whole.update(idx.inner.names())
            whole.update(idx.offset.names())
        elif isinstance(idx, Wrapped):
            window = _pad_window(spec, idx, array, shapes)
            if window is None or padded.get((array, position)) != window[0]:
                whole.update(idx.inner.names())
            else:  # Δy[pad(m-k)]: m may be split, each device reading a window around its block, zero outside
                whole.update(window[1:2] if window[1] else ())
                pads.append((array, position, *window))
                _claim_window(axes, array, position, fresh)
                return
        elif isinstance(idx, Affine) and plain is None:
            window = _window(spec, array, position, idx)
            if window is None or array not in axes or axes[array][position] is not None:
                whole.update(idx.names())
            else:  # x[i+k]: i may be split, each device's block of x extended by a halo from its neighbour
                whole.update(window[1:2] if window[1] else ())
                halos.append((array, position, *window))
        if array not in axes or position >= len(axes[array]):
            return
        if plain is not None:
            _claim(axes, array, position, of_index(plain), whole, plain, names)
        else:
            _claim(axes, array, position, fresh(), whole, None, names)

    for access in spec_accesses(spec):
        for position, idx in enumerate(access.idx):
            place(access.array, position, idx)
    for idx in spec.lhs or ():  # a scatter's index array: its axis is read plainly by the summed index
        if isinstance(idx, Indirect) and idx.inner.plain is not None and axes.get(idx.array):
            _claim(axes, idx.array, 0, of_index(idx.inner.plain), whole, idx.inner.plain, names)
    if spec.scan is not None:
        _recurrence(spec, axes, of_index, whole, names)
    lhs_names = [idx.plain for idx in spec.lhs or () if isinstance(idx, Affine)]
    summable = spec.finalizer is None and spec.redop in COMBINES and spec.assign != "=" and \
        (not spec.is_scatter or spec.assign == "+=")
    mixed = {p[2] for p in pads if p[3] is None and p[4] == 0}  # read plainly on a padded axis too
    for _, _, split, _, _, _ in pads:  # a padded window's index: read elsewhere only plainly, ':='; if summed,
        # only plainly on other axes (the kernel's per-shard range, ``tullax.jaxop.partition``)
        summed_ok = summable and split not in mixed and split not in spec.free
        if split in read or (split not in lhs_names and not summed_ok) or spec.assign != ":=" or \
                any(h[2] == split for h in halos) or spec.range_of[split].lo != Sym(0):
            whole.add(split)
        of_index(split)
    ranges = spec.range_of
    for index, factor in list(names.items()):  # an axis only the range of an index is read from (a shape input)
        found = ranges.get(index)
        if found is None or found.lo != Sym(0):
            continue
        for array, current in axes.items():
            for position, held in enumerate(current):
                if held is None and found.hi == Sym.extent(array, position):
                    current[position] = factor
    for expr in spec_exprs(spec):
        for node in walk(expr):
            if isinstance(node, IndexVal):
                whole.add(node.name)
            elif isinstance(node, Size) and node.array in axes and node.axis < len(axes[node.array]):
                axes[node.array][node.axis] = axes[node.array][node.axis] or fresh()
                _mark_whole(axes[node.array][node.axis], names, whole)

    result: list[str] = []
    lhs_plain: list[str] = []
    for idx in spec.lhs or ():
        plain = idx.plain if isinstance(idx, Affine) else None
        if plain is not None and plain not in lhs_plain:
            lhs_plain.append(plain)
            result.append(of_index(plain))
        else:
            if isinstance(idx, Indirect):
                pass  # the positions it reads are summed indices (a scatter)
            elif isinstance(idx, (Affine, Wrapped)):
                whole.update(idx.inner.names() if isinstance(idx, Wrapped) else idx.names())
            result.append(fresh())
    if spec.assign != ":=" and spec.inputs:  # input 0 is the given array: the result's own axes
        given = spec.inputs[0].name
        for position, factor in enumerate(result):
            if position < len(axes[given]):
                axes[given][position] = factor
    operands = tuple(_distinct([factor or fresh() for factor in axes[item.name]], fresh, names, whole)
                     for item in spec.inputs)
    index_of = {factor: index for index, factor in names.items()}
    free = tuple(names[i] for i in lhs_plain if i not in whole)
    summed = tuple(names[i] for i in names if i not in lhs_plain and i not in whole and summable and
                   any(names[i] in axes_ for axes_ in operands))
    inputs = [item.name for item in spec.inputs]
    halo = tuple((operands[inputs.index(array)][axis], names[split], window, offset, sign)
                 for kind, found in (("", [(*h, 0) for h in halos]), ("pad", pads))
                 for array, axis, split, window, offset, sign in found
                 if names[split] in free + summed and
                 operands[inputs.index(array)][axis] not in index_of)
    rows = ()
    table = _table(spec)
    if table is not None:
        array, position, ix = table
        factor = result[position] if array is None else operands[inputs.index(array)][position]
        if factor not in index_of:  # an axis of its own, otherwise replicated
            rows = ((factor, ix),)
            free, summed = (free + (factor,), summed) if array is None else (free, summed + (factor,))
    every = {f for axes_ in operands for f in axes_} | set(result)
    replicated = tuple(sorted(every - set(free) - set(summed) - {h[0] for h in halo}))
    return Factors(operands, tuple(result), free, summed, replicated, COMBINES.get(spec.redop, ""),
                   tuple(sorted(index_of.items())), halo, rows)


def _table(spec: Spec) -> tuple[str | None, int, str] | None:
    """``(W, p, ix)`` where axis ``p`` of input ``W`` is read only at a bare ``ix[e]`` (``out[b,d] := W[ix[b],d]``),
    ``ix`` nowhere else, in a ``:=`` sum without a finaliser whose body is linear in that read (a device that
    holds none of the rows reads zero and adds nothing); ``(None, p, ix)`` where a scatter writes the result's
    axis ``p`` at ``ix[e]`` (``ΔW[ix[b],d] += Δout[b,d]``) and its body reads no ``ix``: positions outside a
    device's rows are dropped. None otherwise."""
    if spec.scan is not None or spec.finalizer is not None:
        return None
    reads = list(spec_accesses(spec))
    if spec.is_scatter:
        found = [(p, i) for p, i in enumerate(spec.lhs) if isinstance(i, Indirect)]
        if spec.assign not in ("+=", ":=") or len(found) != 1 or not found[0][1].plain or \
                found[0][1].inner.plain is None or any(isinstance(i, Wrapped) for i in spec.lhs):
            return None
        position, idx = found[0]
        if any(a.array == idx.array or any(isinstance(i, Indirect) and i.array == idx.array for i in a.idx)
               for a in reads):
            return None
        return None, position, idx.array
    if spec.assign != ":=" or spec.redop != "+":
        return None
    for access in reads:
        found = [(p, i) for p, i in enumerate(access.idx) if isinstance(i, Indirect)]
        if len(found) != 1 or not found[0][1].plain or found[0][1].inner.plain is None:
            continue
        position, idx = found[0]
        others = [a for a in reads if a is not access and (a.array in (access.array, idx.array) or any(
            isinstance(i, Indirect) and i.array == idx.array for i in a.idx))]
        if not others and access.array in spec.input_names and _linear(spec.body, access):
            return access.array, position, idx.array
    return None


def _linear(expr: object, access: Access) -> bool:
    """Whether ``expr`` is ``access`` times (or over) terms that do not read it: zero where it reads zero."""
    if expr is access:
        return True
    if isinstance(expr, Unary):
        return _linear(expr.arg, access)
    if isinstance(expr, Binary) and expr.op == "*":
        return (_linear(expr.lhs, access) and not _reads(expr.rhs, access)) or \
            (_linear(expr.rhs, access) and not _reads(expr.lhs, access))
    if isinstance(expr, Binary) and expr.op == "/":
        return _linear(expr.lhs, access) and not _reads(expr.rhs, access)
    return False


def _reads(expr: object, access: Access) -> bool:
    return any(node is access for node in walk(expr))


def _window(spec: Spec, array: str, axis: int, idx: Affine) -> tuple[str, str | None, int] | None:
    """``(i, k, c)`` where ``array``'s ``axis`` is read at ``i+k+c`` (or ``i+c``), c >= 0 a constant, ``k`` a
    window from 0 and ``i`` running to where the window meets the axis's end: then a device's block of ``i``
    reads its block of the axis and the first ``max(k)+c`` elements after it (its halo). None otherwise."""
    if idx.div != 1 or not idx.const.is_const or idx.const.const < 0 or any(c != 1 for _, c in idx.terms) or \
            not 1 <= len(idx.terms) <= 2:
        return None
    ranges, extent, offset = spec.range_of, Sym.extent(array, axis), idx.const.const
    names = idx.names()
    for split in names:
        window = next((n for n in names if n != split), None)
        found, over = ranges.get(split), ranges.get(window) if window else None
        if found is None or found.lo != Sym(0) or (window is not None and (over is None or over.lo != Sym(0))):
            continue
        if found.hi == extent - offset - (over.hi - 1 if over is not None else 0) and (window or offset):
            return split, window, offset
    return None


def _pad_window(spec: Spec, idx: Wrapped, array: str, shapes: dict | None = None) \
        -> tuple[str, str | None, int, int] | None:
    """``(m, k, c, s)`` where an axis is read at ``pad(m+s*k+c)`` (or ``pad(m+c)``, s = 1), ``s`` = ±1, ``c`` a
    constant, ``m`` and ``k`` from 0 (the input gradient of a window, ``Δx[m] := Δy[pad(m-k)]*w[k]``; a "same"
    convolution, ``x[pad(i+k-2)]``; a stencil, ``x[pad(i+1)]``): a device's block of ``m`` reads the axis from
    ``c`` (``c-max(k)``) elements after its start to ``c+max(k)`` (``c``) after its end, zero outside the axis.
    None otherwise."""
    inner = idx.inner
    if idx.kind != "pad" or inner.div != 1 or not inner.const.is_const:
        return None
    up = [n for n, c in inner.terms if c == 1]
    down = [n for n, c in inner.terms if c == -1]
    if not 1 <= len(up) <= 2 or len(up) + len(down) != len(inner.terms) or len(inner.terms) > 2:
        return None
    ranges = spec.range_of
    if any(ranges.get(n) is None or ranges[n].lo != Sym(0) for n in up + down):
        return None
    if len(up) == 2:  # pad(i+k+c): the split index is the longer one (i over the signal, k over the window: a
        # range may read the array's extent either way, Δw[k] := Δy[i]*x[pad(i+k-2)]'s k over x's and Δy's);
        # without shapes, the one whose range the array's extent sets
        up.sort(key=lambda n: array not in ranges[n].hi.arrays())
        extents = [_extent(ranges[n], shapes) for n in up]
        if None not in extents and extents[0] != extents[1]:
            up.sort(key=lambda n: -_extent(ranges[n], shapes))
        return up[0], up[1], inner.const.const, 1
    return up[0], (down or [None])[0], inner.const.const, -1 if down else 1


def _extent(found: object, shapes: dict | None) -> int | None:
    try:
        return int(found.hi.eval(shapes)) if shapes is not None else None
    except (KeyError, IndexError):
        return None


def _padded_axes(spec: Spec, axes: dict, shapes: dict | None = None) -> dict[tuple[str, int], str]:
    """Per input axis read in padded windows (``pad(m±k+c)``), all of one index ``m``: that index. An axis read
    in padded windows of two different indices is left out (its indices stay whole)."""
    reads: dict[tuple[str, int], list] = {}
    for access in spec_accesses(spec):
        for position, idx in enumerate(access.idx):
            if access.array in axes and position < len(axes[access.array]):
                reads.setdefault((access.array, position), []).append(idx)
    found = {}
    for key, idxs in reads.items():
        windows = [_pad_window(spec, idx, key[0], shapes) if isinstance(idx, Wrapped) else None for idx in idxs]
        splits = {window[0] for window in windows if window is not None}
        if len(splits) == 1 and all(window is not None or (isinstance(idx, Affine) and idx.plain in splits)
                                    for idx, window in zip(idxs, windows)):
            found[key] = splits.pop()
    return found


def _claim_window(axes: dict, array: str, position: int, fresh) -> None:
    """A padded window's axis gets a factor of its own, once (several windows of one index on one axis share it)."""
    if axes[array][position] is None:
        axes[array][position] = fresh()


def _recurrence(spec: Spec, axes: dict, of_index, whole: set[str], names: dict[str, str]) -> None:
    """A recurrence splits along its lanes only: each step reads the whole previous state along an axis it mixes
    (``W[n,m]*h[b,t-1,m]``: neither n nor m), a sum inside a step is not one across devices, and ``t`` runs in
    order. The initial state's axes are the result's without ``t`` (after the depth axis, for offsets up to d)."""
    scan = spec.scan
    whole.add(scan.index)
    whole.update(spec.reduced)
    for access in spec_accesses(spec):
        if access.array != spec.out:
            continue
        for position, (idx, own) in enumerate(zip(access.idx, spec.lhs)):
            if position != scan.axis and not (isinstance(idx, Affine) and idx.plain == own.plain):
                whole.update(idx_names(idx) + idx_names(own))
    if scan.init is not None and scan.init in axes:
        lanes = [idx.plain for position, idx in enumerate(spec.lhs) if position != scan.axis]
        skip = len(axes[scan.init]) - len(lanes)  # the depth axis: replicated
        for position, index in enumerate(lanes):
            if index is not None and skip + position < len(axes[scan.init]):
                _claim(axes, scan.init, skip + position, of_index(index), whole, index, names)


def _claim(axes: dict, array: str, position: int, factor: str, whole: set[str], index: str | None,
           names: dict[str, str]) -> None:
    """Give an axis ``factor``; an axis read by two different indices (``A[i,i]``, or ``A[i]`` and ``A[j]``)
    keeps the first, and the indices of both stay whole."""
    current = axes[array][position]
    if current is None:
        axes[array][position] = factor
    elif current != factor:
        if index is not None:
            whole.add(index)
        whole.update(name for name, found in names.items() if found == current)


def _distinct(factors_: list[str], fresh, names: dict[str, str], whole: set[str]) -> tuple[str, ...]:
    """An array's factors, each at most once (Shardy's rule): a second axis of one index (``A[i,i]``) gets a
    factor of its own, and the index stays whole."""
    seen: set[str] = set()
    found = []
    for factor in factors_:
        if factor in seen:
            _mark_whole(factor, names, whole)
            factor = fresh()
        seen.add(factor)
        found.append(factor)
    return tuple(found)


def _mark_whole(factor: str, names: dict[str, str], whole: set[str]) -> None:
    for index, found in names.items():
        if found == factor:
            whole.add(index)


__all__ = ["COMBINES", "Factors", "factors"]
