"""Concrete shapes against an analysed Spec: evaluate the symbolic ranges and check that arrays fit.

Every backend needs the same checks before it runs a kernel (ranks, agreeing extents, non-empty output
ranges, explicit ranges that push an access out of bounds, index arrays holding valid positions), so they live
here, with plain tuples for shapes and NumPy arrays for index values (jax only for ``result_dtype``'s promotion
rules, imported when it is called).
"""
from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence

from tullax.errors import ShapeError
from tullax.spec.ir import (
    INDEX_LIMIT,
    Affine,
    Idx,
    IndexVal,
    Indirect,
    Size,
    Spec,
    Wrapped,
    idx_names,
    spec_accesses,
    spec_exprs,
    walk,
)
from tullax.spec.sizes import Shapes, Sym
from tullax.spec.work import check_work

Ranges = dict[str, tuple[int, int]]


def shape_of(value: Any) -> tuple[int, ...]:
    """The shape of an input: arrays (NumPy, JAX, tracers) by ``.shape``, Python scalars are rank 0."""
    shape = getattr(value, "shape", None)
    if shape is not None:
        return tuple(int(n) for n in shape)
    if isinstance(value, (bool, int, float, complex)):
        return ()
    raise ShapeError(f"expected an array or a number, got {type(value).__name__}")


def input_shapes(spec: Spec, env: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Shapes of every input of ``spec`` found in ``env``; a missing input is a ShapeError."""
    missing = [name for name in spec.input_names if name not in env]
    if missing:
        raise ShapeError(f"missing input{'s' * (len(missing) > 1)} {', '.join(missing)}: the spec reads "
                         f"{', '.join(spec.input_names)}")
    return {name: shape_of(env[name]) for name in spec.input_names}


def eval_shapes(spec: Spec, shapes: Shapes) -> Ranges:
    """Every index's half-open range ``(lo, hi)`` for these concrete shapes (``hi < lo`` is possible: an empty
    range; ``check_shapes`` decides whether that is an error)."""
    return {name: (rng.lo.eval(shapes), rng.hi.eval(shapes)) for name, rng in spec.ranges}


def check_shapes(spec: Spec, shapes: Shapes) -> None:
    """Raise ShapeError unless arrays of these ``shapes`` fit ``spec`` (see the module docstring)."""
    if spec.scan is not None:  # a recurrence: checked in its unrolled form (tullax.spec.scan)
        from tullax.spec.scan import check_scan_shapes

        return check_scan_shapes(spec, shapes, check_shapes)
    _check_ranks(spec, shapes)
    _check_agreements(spec, shapes)
    ranges = eval_shapes(spec, shapes)
    _check_free_ranges(spec, shapes, ranges)
    _check_index_arithmetic(spec, shapes, ranges)
    check_work(spec, shapes, ranges)  # a range typo would run for hours: refused beyond a bound
    _check_bounds(spec, shapes, ranges)


# ---------------------------------------------------------------------------------------------
def _describe(name: str, shape: tuple[int, ...]) -> str:
    return f"{name} (shape {shape})"


def _check_ranks(spec: Spec, shapes: Shapes) -> None:
    for inp in spec.inputs:
        if inp.name not in shapes:
            raise ShapeError(f"missing input {inp.name}: the spec reads {', '.join(spec.input_names)}")
        shape = tuple(shapes[inp.name])
        if inp.kind == "scalar" and shape != ():
            raise ShapeError(f"{inp.name} is a scalar parameter of the spec, but got an array of shape {shape}; "
                             f"index it in the spec (e.g. {inp.name}[i]) or pass a number")
        if inp.kind in ("array", "index") and len(shape) != inp.rank:
            raise ShapeError(f"{inp.name} has rank {len(shape)} (shape {shape}) but the spec indexes it with "
                             f"{inp.rank} ind{'ex' if inp.rank == 1 else 'ices'}")
    for _, rng in spec.ranges:  # 'shape' inputs: only the axes the ranges read must exist
        for sym in (rng.lo, rng.hi):
            _check_axes_exist(sym, shapes)
    for node in (node for expr in spec_exprs(spec) for node in walk(expr)):
        if isinstance(node, Size):  # size(A, d) in an expression
            _check_axes_exist(Sym.extent(node.array, node.axis), shapes)


def _check_axes_exist(sym: Sym, shapes: Shapes) -> None:
    for name in sym.arrays():
        if name not in shapes:
            raise ShapeError(f"missing input {name}: a range of the spec reads its shape")
    try:
        sym.eval(shapes)
    except IndexError:
        names = ", ".join(_describe(n, tuple(shapes[n])) for n in sorted(sym.arrays()))
        raise ShapeError(f"the range {sym} reads an axis that {names} does not have") from None


def _check_agreements(spec: Spec, shapes: Shapes) -> None:
    for agr in spec.agreements:
        (a, ax), (b, bx) = agr.first, agr.second
        na, nb = shapes[a][ax], shapes[b][bx]
        if na != nb:
            raise ShapeError(
                f"index {agr.index} runs along axis {ax} of {a} (extent {na}) and axis {bx} of {b} "
                f"(extent {nb}): these extents must be equal (shapes: {_describe(a, tuple(shapes[a]))}, "
                f"{_describe(b, tuple(shapes[b]))})")


def _check_free_ranges(spec: Spec, shapes: Shapes, ranges: Ranges) -> None:
    """A free index must have a range of at least one value, unless an input really is empty (then a
    zero-size result is the honest answer)."""
    some_input_empty = any(0 in tuple(shapes[i.name]) for i in spec.inputs if i.kind != "scalar")
    for name in spec.free:
        lo, hi = ranges[name]
        if hi < lo or (hi == lo and not some_input_empty):
            rng = spec.range_of[name]
            given = ", ".join(_describe(n, tuple(shapes[n])) for n in spec.input_names if shapes[n] != ())
            raise ShapeError(
                f"index {name} has an empty range: {rng.lo} <= {name} < {rng.hi} is {lo} <= {name} < {hi} "
                f"for the inputs {given}; the arrays read with shifts are too short for the others "
                f"(or an explicit range is wrong)")


# ---------------------------------------------------------------------------------------------
# Bounds of plain and affine accesses (explicit ranges can push them outside)
# ---------------------------------------------------------------------------------------------
def _positioned(spec: Spec) -> Iterator[tuple[str, int, Idx, tuple[str, ...]]]:
    """(array, axis, index expression, indices that must all be non-empty for the access to happen).

    A read happens whenever the loops over ITS OWN indices run: the lowering hoists a load out of every loop
    it does not depend on, so an empty range of an unrelated index does not keep it from being executed."""
    every = spec.indices
    if spec.assign != ":=" and spec.lhs is not None:
        when = every if spec.is_scatter else spec.free
        for axis, idx in enumerate(spec.lhs):
            yield spec.out, axis, idx, when
    for acc in spec_accesses(spec):
        own = tuple(dict.fromkeys(name for idx in acc.idx for name in _idx_names(idx)))
        for axis, idx in enumerate(acc.idx):
            yield acc.array, axis, idx, own


def _idx_names(idx: Idx) -> tuple[str, ...]:
    if isinstance(idx, Affine):
        return idx.names()
    return idx_names(idx)  # Wrapped and Indirect wrap an affine position (an indirect one may add an offset)


def _affine_extremes(aff: Affine, shapes: Shapes, ranges: Ranges) -> tuple[int, int]:
    const = aff.const.eval(shapes)
    low = high = const
    for name, coef in aff.terms:
        lo, hi = ranges[name]
        first, last = coef * lo, coef * (hi - 1)
        low, high = low + min(first, last), high + max(first, last)
    return low, high


def _check_bounds(spec: Spec, shapes: Shapes, ranges: Ranges) -> None:
    for array, axis, idx, when in _positioned(spec):
        if any(ranges[n][1] <= ranges[n][0] for n in when):
            continue  # this access never happens
        extent = shapes[array][axis]
        if isinstance(idx, Affine):
            _check_affine(array, axis, idx, extent, shapes, ranges)
        elif isinstance(idx, Indirect):
            _check_affine(idx.array, 0, idx.inner, shapes[idx.array][0], shapes, ranges)
        elif isinstance(idx, Wrapped) and idx.kind != "pad" and extent == 0:
            raise ShapeError(f"{idx.kind}(..) on axis {axis} of {array}, which is empty "
                             f"(shape {tuple(shapes[array])}): there is no element to wrap or clamp to")


def _check_affine(array: str, axis: int, aff: Affine, extent: int, shapes: Shapes, ranges: Ranges) -> None:
    low, high = _affine_extremes(aff, shapes, ranges)
    if 0 <= low and high < extent:
        return
    from tullax.spec.text import format_affine
    bad = low if low < 0 else high
    spans = ", ".join(f"{n} in [{ranges[n][0]}, {ranges[n][1]})" for n in aff.names())
    raise ShapeError(
        f"axis {axis} of {array} is indexed by {format_affine(aff)}, which reaches {bad} but the axis has "
        f"extent {extent} (shape {tuple(shapes[array])}; {spans or 'a constant position'}): "
        f"shrink the explicit ranges or pass a larger array")


# ---------------------------------------------------------------------------------------------
# Index arithmetic must fit in int64
# ---------------------------------------------------------------------------------------------
def _magnitude(aff: Affine, shapes: Shapes, ranges: Ranges) -> int:
    """The largest absolute value any partial sum of ``aff`` can take over the ranges (Python integers)."""
    total = abs(aff.const.eval(shapes))
    for name, coef in aff.terms:
        lo, hi = ranges[name]
        total += abs(coef) * max(abs(lo), abs(hi))
    return total


def _check_index_arithmetic(spec: Spec, shapes: Shapes, ranges: Ranges) -> None:
    for name, (lo, hi) in ranges.items():
        if max(abs(lo), abs(hi)) > INDEX_LIMIT:
            raise ShapeError(f"index {name} runs over [{lo}, {hi}), beyond the 2^62 that tullax's int64 index "
                             f"arithmetic allows; shrink the range or the constants of the spec")
    for array, axis, idx, _ in list(_positioned(spec)) + list(_indirect_offsets(spec)):
        aff = idx if isinstance(idx, Affine) else idx.inner
        where = array if not isinstance(idx, Indirect) else idx.array
        if _magnitude(aff, shapes, ranges) > INDEX_LIMIT:
            from tullax.spec.text import format_affine
            spans = ", ".join(f"{n} in [{ranges[n][0]}, {ranges[n][1]})" for n in aff.names())
            raise ShapeError(
                f"a position on axis {axis} of {where}, {format_affine(aff)}, can reach magnitude "
                f"{_magnitude(aff, shapes, ranges)} ({spans or 'a constant'}), beyond the 2^62 that tullax's int64 "
                f"index arithmetic allows: it would overflow; use smaller coefficients or constants")
    for node in (node for expr in spec_exprs(spec) for node in walk(expr)):
        if isinstance(node, IndexVal):
            lo, hi = ranges[node.name]
            offset = node.offset.eval(shapes)
            if max(abs(lo), abs(hi)) + abs(offset) > INDEX_LIMIT:
                raise ShapeError(f"the value of index {node.name} (plus {offset}) can exceed the 2^62 that "
                                 f"tullax's int64 index arithmetic allows")


# ---------------------------------------------------------------------------------------------
# Values of index arrays (eager calls only: under jit these are not known)
# ---------------------------------------------------------------------------------------------
def check_index_values(spec: Spec, env: Mapping[str, Any]) -> None:
    """Raise ShapeError when an index array holds a position outside the axis it indexes (eager calls).

    ``env`` maps input names to concrete arrays (anything ``numpy.asarray`` accepts)."""
    import numpy as np

    shapes = input_shapes(spec, env)
    ranges = eval_shapes(spec, shapes)
    for array, axis, idx, when in _positioned(spec):
        if not isinstance(idx, Indirect) or any(ranges[n][1] <= ranges[n][0] for n in when):
            continue
        low, high = _affine_extremes(idx.inner, shapes, ranges)
        values = np.asarray(env[idx.array])[low:high + 1]
        if not np.issubdtype(values.dtype, np.integer):
            raise ShapeError(f"{idx.array} is used as an index ({idx.array}[..] inside {array}[..]) and must "
                             f"hold integers, got dtype {values.dtype}")
        if idx.pad:  # pad(ix[e]) reads 0 outside the axis: any position is valid
            continue
        extent = shapes[array][axis]
        if not idx.plain:
            _check_indirect_sums(array, axis, idx, values, low, extent, shapes, ranges)
            continue
        bad = np.flatnonzero((values < 0) | (values >= extent))
        if bad.size:
            pos = int(bad[0]) + low
            raise ShapeError(
                f"{idx.array}[{pos}] = {int(values[bad[0]])} is outside axis {axis} of {array} "
                f"(extent {extent}, shape {tuple(shapes[array])}): index arrays must hold positions "
                f"0..{extent - 1}")


def _indirect_offsets(spec: Spec):
    """The offsets of the indirect positions (``ix[i]+j``) as affine positions, for the int64 check."""
    for array, axis, idx, when in _positioned(spec):
        if isinstance(idx, Indirect) and not idx.plain:
            yield array, axis, idx.offset, when


def _check_indirect_sums(array: str, axis: int, idx: Indirect, values, low: int, extent: int, shapes: Shapes,
                         ranges: Ranges) -> None:
    """``scale*ix[e] + offset`` stays inside the axis: for every value read, with the offset's extremes (exact
    when the offset shares no index with e; otherwise each position is checked over the indices it shares)."""
    import numpy as np

    shared = [n for n in idx.offset.names() if n in idx.inner.names()]
    if not shared:
        off_lo, off_hi = _affine_extremes(idx.offset, shapes, ranges)
        lows = idx.scale * values.astype(object) + off_lo
        highs = idx.scale * values.astype(object) + off_hi
        lows, highs = np.minimum(lows, highs), np.maximum(lows, highs)
        bad = np.flatnonzero((lows < 0) | (highs >= extent))
        where = [int(b) + low for b in bad[:1]]
    else:  # enumerate the indices of e and of the offset together
        names = tuple(dict.fromkeys(idx.inner.names() + idx.offset.names()))
        grid = np.meshgrid(*(np.arange(*ranges[n], dtype=object) for n in names), indexing="ij")
        point = dict(zip(names, grid))
        at = sum((c * point[n] for n, c in idx.inner.terms), idx.inner.const.eval(shapes))
        pos = idx.scale * np.asarray(values, dtype=object)[np.asarray(at - low, dtype=np.int64)] + sum(
            (c * point[n] for n, c in idx.offset.terms), idx.offset.const.eval(shapes))
        bad_mask = (pos < 0) | (pos >= extent)
        where = [int(np.asarray(at)[bad_mask].flat[0])] if np.any(bad_mask) else []
    if where:
        raise ShapeError(
            f"{idx.array}[{where[0]}] = {int(values[where[0] - low])} puts the position of axis {axis} of {array} "
            f"outside it (extent {extent}, shape {tuple(shapes[array])}) for some value of "
            f"{', '.join(idx.offset.names()) or 'the offset'}: index arrays must keep every position inside")


def check_dtypes(spec: Spec, dtypes: Mapping[str, Any]) -> None:
    """Index arrays must be integers; data inputs must be numbers (bool, integer, float or complex)."""
    import numpy as np

    from tullax.spec.dtypes import is_numeric

    for inp in spec.inputs:
        if inp.name not in dtypes or inp.kind == "shape":
            continue
        dtype = np.dtype(dtypes[inp.name])
        if inp.kind == "index" and not np.issubdtype(dtype, np.integer):
            raise ShapeError(f"{inp.name} is used as an index array ({inp.name}[..] inside brackets) and must "
                             f"hold integers, got dtype {dtype}")
        if inp.kind != "index" and not is_numeric(dtype):
            raise ShapeError(f"{inp.name} must hold numbers, got dtype {dtype}")


def result_dtype(spec: Spec, dtypes: Mapping[str, Any] | Sequence[Any]):
    """The result dtype (a NumPy dtype): ``jnp.result_type`` of the data inputs ('array' and 'scalar' kinds;
    index arrays and shape-only inputs do not take part). Integer inputs keep an integer result only where the
    body is integer-valued (``tullax.spec.dtypes``); otherwise, and for bool-only data, the result is the default
    float (docs/design.md, section 1); the real dtype of that precision where complex inputs make a real-valued body.

    ``dtypes`` maps input names (or lists, in ``spec.inputs`` order) to dtypes, Python types (``float`` is a weak
    scalar, as in jax), values, or None (unknown: left out). The promotion is computed as with x64 enabled, so
    float64 NumPy inputs give float64 even when jax itself is in 32-bit mode; callers that run under jax
    canonicalise (``jax.dtypes.canonicalize_dtype``)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    if not isinstance(dtypes, Mapping):
        dtypes = dict(zip(spec.input_names, dtypes))
    data = [dtypes[i.name] for i in spec.inputs
            if i.kind in ("array", "scalar") and dtypes.get(i.name) is not None]
    if data:
        with jax.enable_x64(True):
            found = np.dtype(jnp.result_type(*data))
        weak_float64 = found == np.float64 and not any(_strong_float64(d) for d in data)
        if jnp.issubdtype(found, jnp.inexact) and not weak_float64:
            return _real_where_real(spec, dtypes, found)
        if _keeps_integers(spec, dtypes, found):
            return found
    return np.dtype(jax.dtypes.canonicalize_dtype(np.float64))


def _strong_float64(dtype: Any) -> bool:
    """A float64 input (not a Python float: integers times a weak float give the default float, as in jnp)."""
    import numpy as np

    return not isinstance(dtype, type) and np.dtype(getattr(dtype, "dtype", dtype)) == np.float64


def _keeps_integers(spec: Spec, dtypes: Mapping[str, Any], found: Any) -> bool:
    """An integer result type whose body keeps integers integer (``tullax.spec.dtypes.integer_valued``)."""
    from tullax.spec.dtypes import integer_valued, is_integer

    return found.kind in "iu" and integer_valued(spec, lambda name: is_integer(dtypes.get(name)))


def _real_where_real(spec: Spec, dtypes: Mapping[str, Any], found: Any) -> Any:
    """A complex promotion gives a real result where the body is real-valued (``real``/``imag``/``abs`` of
    complex values: ``tullax.spec.valuetype``), as jnp does; constructs with no meaning on complex values are a
    SpecError here."""
    import numpy as np

    from tullax.spec.valuetype import check_complex, complex_inputs, has_complex_literal, result_is_complex

    if found.kind != "c" and not has_complex_literal(spec.body):  # the common case: nothing complex
        return found
    names = complex_inputs(spec, dtypes)
    check_complex(spec, names)
    if result_is_complex(spec, names):  # a derived gradient spec's literal (0.5im) makes a real one complex
        return np.result_type(found, np.complex64)
    return np.dtype(np.finfo(found).dtype)


__all__ = ["shape_of", "input_shapes", "eval_shapes", "check_shapes", "check_index_values", "check_dtypes",
           "result_dtype"]
