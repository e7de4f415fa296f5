"""Small example shapes and inputs that fit a spec.

Product code needs them where the user gave no arrays: ``generate_source`` for the XLA backend traces at some
shapes, the Julia precompile workload calls each launcher once, ``warm`` runs every kernel once. Tests use the
same functions for their random inputs.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from tullax.errors import ShapeError
from tullax.spec.dtypes import as_dtype
from tullax.spec.functions import FUNCTIONS
from tullax.spec.ir import Affine, Binary, Call, Idx, Indirect, Spec, integer_literal, spec_accesses, spec_exprs, walk

Axis = tuple[str, int]  # (array name, axis)

# Functions whose argument must be positive (NaN below zero in NumPy and XLA; a DomainError in Julia): those whose
# registry entry says Julia throws below a bound (log, sqrt, log1p, log2, log10).
_POSITIVE_DOMAIN = tuple(f.name for f in FUNCTIONS.values() if f.julia_domain and f.julia_domain.startswith("x <"))


class _AxisClasses:
    """Union-find over array axes that must share one extent."""

    def __init__(self):
        self.parent: dict[Axis, Axis] = {}

    def find(self, item: Axis) -> Axis:
        self.parent.setdefault(item, item)
        while self.parent[item] != item:
            self.parent[item] = self.parent[self.parent[item]]
            item = self.parent[item]
        return item

    def union(self, a: Axis, b: Axis) -> None:
        self.parent[self.find(a)] = self.find(b)


def _occurrences(spec: Spec) -> list[tuple[str, int, Idx]]:
    """(array, axis, idx) of every bracket position, the left-hand side of '=' and '+=' included."""
    found = []
    if spec.assign != ":=" and spec.lhs is not None:
        found += [(spec.out, axis, idx) for axis, idx in enumerate(spec.lhs)]
    for acc in spec_accesses(spec):
        found += [(acc.array, axis, idx) for axis, idx in enumerate(acc.idx)]
    for array, axis, idx in list(found):
        if isinstance(idx, Indirect):
            found.append((idx.array, 0, idx.inner))
    return found


def shapes_for(spec: Spec, seed: int = 0, low: int = 2, high: int = 5) -> dict[str, tuple[int, ...]]:
    """Small shapes that fit ``spec``: agreeing axes share one extent in ``low..high``; axes read with shifts or
    constant positions grow until every range is non-empty and every access is in bounds."""
    from tullax.spec.shapes import check_shapes, eval_shapes

    rng = np.random.default_rng(seed)
    classes = _AxisClasses()
    for agreement in spec.agreements:
        classes.union(agreement.first, agreement.second)
    axes = [(i.name, ax) for i in spec.inputs if i.kind != "scalar" for ax in range(i.rank)]
    roots = sorted({classes.find(a) for a in axes})
    size = {root: int(rng.integers(low, high + 1)) for root in roots}
    growing = sorted({classes.find((array, axis)) for array, axis, idx in _occurrences(spec)
                      if isinstance(idx, (Affine, Indirect)) and not idx.plain})

    def shapes_of(sizes):
        return {i.name: tuple(sizes[classes.find((i.name, ax))] for ax in range(i.rank)) for i in spec.inputs}

    def deficit(sizes) -> int:  # how far the ranges (and index arrays' values) are from holding one value each
        shapes = shapes_of(sizes)
        short = sum(max(0, lo - hi + 1) for lo, hi in eval_shapes(spec, shapes).values())
        if short:
            return short
        return sum(max(0, lo - hi + 1) for lo, hi in index_intervals(spec, shapes).values())

    for _ in range(64):
        shapes = shapes_of(size)
        if deficit(size) == 0:
            try:
                check_shapes(spec, shapes)
                return shapes
            except ShapeError:
                pass
        if not growing:
            break
        # greedy: grow the shifted axis that helps most (growing all together keeps their differences)
        trials = [(deficit({**size, root: size[root] + 1}), float(rng.random()), root) for root in growing]
        size[min(trials)[2]] += 1
    raise ShapeError(f"found no small shapes for which every range is non-empty; give shapes explicitly "
                     f"(last tried {shapes})")


def needs_positive(spec: Spec) -> bool:
    """True when the spec takes logs, roots, divisions or non-integer powers of its inputs."""
    for node in (node for expr in spec_exprs(spec) for node in walk(expr)):
        if isinstance(node, Call) and node.fn in _POSITIVE_DOMAIN:
            return True
        if isinstance(node, Binary) and (node.op == "/" or (node.op == "^" and integer_literal(node.rhs) is None)):
            return True
    return False


def special_values(dtype: Any = np.float64, subnormals: bool = True, extremes: bool = True) -> np.ndarray:
    """The IEEE values a kernel must get right, in ``dtype`` (real floats): NaN, +-inf, +-0; with ``extremes``
    the largest and smallest normal magnitudes and, with ``subnormals`` too, subnormals (XLA on the CPU flushes
    them to zero), and a few ordinary values around the kinks of abs, relu, sign and round. Without
    ``extremes``, whatever a kernel makes of them does not depend on the order it sums or multiplies in (a huge
    value times a huge one and then zero is NaN, the other way round 0)."""
    values = [np.nan, np.inf, -np.inf, 0.0, -0.0]
    if extremes:
        info = np.finfo(dtype)
        values += [float(info.max), -float(info.max), float(info.tiny), -float(info.tiny), 1.0, -1.0, 0.5, -2.5,
                   3.0]
        if subnormals:
            values += [float(info.smallest_subnormal), -float(info.smallest_subnormal) * 3]
    return np.array(values, dtype)


def random_inputs(spec: Spec, shapes: Mapping[str, tuple[int, ...]] | None = None, seed: int = 0,
                  dtype: Any = np.float64, special: float = 0.0, pool: np.ndarray | None = None) -> dict[str, Any]:
    """Inputs for ``spec``: data in 0.5..1.5 when the spec needs positive values (see ``needs_positive``),
    standard normal otherwise; index arrays hold valid positions of every axis they index; scalars are
    numbers of ``dtype``; 'shape' inputs are zeros of their shape. ``special``: the fraction of real data
    elements replaced by values drawn from ``pool`` (default ``special_values(dtype)``), chosen at random."""
    rng = np.random.default_rng(seed)
    shapes = dict(shapes) if shapes is not None else shapes_for(spec, seed)
    positive = needs_positive(spec)
    dtype = as_dtype(dtype)  # "bfloat16" too
    intervals = index_intervals(spec, shapes)
    env: dict[str, Any] = {}
    for inp in spec.inputs:
        shape = tuple(shapes[inp.name])
        if inp.kind == "index":
            lo, hi = intervals.get(inp.name, (0, 1))
            env[inp.name] = rng.integers(lo, max(hi, lo + 1), size=shape).astype(np.int32)
        elif inp.kind == "shape":
            env[inp.name] = np.zeros(shape, dtype)
        else:
            value = _random_values(rng, shape, positive, dtype)
            if special and inp.kind == "array" and dtype.kind == "f":
                value = _with_special_values(rng, value, special, special_values(dtype) if pool is None else pool)
            env[inp.name] = value if inp.kind == "array" else dtype.type(value)
    return env


def _with_special_values(rng: np.random.Generator, value: np.ndarray, fraction: float,
                         pool: np.ndarray) -> np.ndarray:
    """``value`` with about ``fraction`` of its elements replaced by values drawn from ``pool``."""
    chosen = rng.random(value.shape) < fraction
    out = value.copy()
    out[chosen] = rng.choice(np.asarray(pool, value.dtype), size=int(chosen.sum()))
    return out


def _random_values(rng: np.random.Generator, shape, positive: bool, dtype: np.dtype) -> np.ndarray:
    def draw():
        return rng.uniform(0.5, 1.5, shape) if positive else rng.standard_normal(shape)
    value = draw() + 1j * draw() if dtype.kind == "c" else draw()
    return np.asarray(value).astype(dtype)


def index_intervals(spec: Spec, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, int]]:
    """For each index array, the half-open interval ``[lo, hi)`` of values it may hold: every position it gives
    is inside its axis at every point of the index ranges. A bare ``ix[e]`` allows ``0..extent-1``; inside affine
    arithmetic (``A[ix[i]+j]``, ``A[2K[j]+i]``) the offset's extremes over the ranges narrow that to what keeps
    ``scale*value + offset`` in bounds. Under ``pad(...)`` every value is legal: an array read only there gets
    its in-bounds interval widened by one on each side, so some positions fall outside and read the pad value.
    ``lo >= hi``: no value fits these shapes."""
    from tullax.spec.shapes import eval_shapes

    ranges = eval_shapes(spec, shapes)
    strict: dict[str, tuple[int, int]] = {}
    padded: dict[str, tuple[int, int]] = {}
    for array, axis, idx in _occurrences(spec):
        if not isinstance(idx, Indirect):
            continue
        lo, hi = _fitting_values(idx, int(shapes[array][axis]), ranges, shapes)
        into = padded if idx.pad else strict
        old = into.get(idx.array, (lo, hi))
        into[idx.array] = (max(old[0], lo), min(old[1], hi))
    out = dict(strict)
    for name, (lo, hi) in padded.items():
        if name not in out:
            out[name] = (lo - 1, hi + 1) if lo < hi else (-1, 1)
    return out


def _fitting_values(idx: Indirect, extent: int, ranges: Mapping[str, tuple[int, int]], shapes) -> tuple[int, int]:
    """The values v with ``scale*v + offset`` in ``0..extent-1`` for every offset the ranges give."""
    low = high = idx.offset.const.eval(shapes)
    for name, coef in idx.offset.terms:
        first, last = ranges[name][0], ranges[name][1] - 1
        if last < first:  # an empty range: this position is never read
            return (-(2 ** 30), 2 ** 30)
        low += min(coef * first, coef * last)
        high += max(coef * first, coef * last)
    s = idx.scale
    # s*v >= -low and s*v <= extent-1-high
    if s > 0:
        return (-(low // s), (extent - 1 - high) // s + 1)
    return (-((extent - 1 - high) // -s), low // -s + 1)


def make_inputs(spec: Spec, shapes: Mapping[str, tuple[int, ...]], dtype: str, seed: int = 0) -> list[Any]:
    """NumPy inputs in ``spec.inputs`` order: data standard normal in ``dtype``, index arrays uniform over
    the values that keep their positions in range, shape-only inputs zero."""
    rng = np.random.default_rng(seed)
    bounds = index_intervals(spec, shapes)
    values = []
    for item in spec.inputs:
        shape = tuple(shapes.get(item.name, ()))
        if item.kind == "index":
            lo, hi = bounds.get(item.name, (0, 1))
            values.append(rng.integers(lo, max(hi, lo + 1), size=shape, dtype=np.int64))
        elif item.kind == "shape":
            values.append(np.zeros(shape, dtype))
        elif item.kind == "scalar":
            values.append(np.asarray(rng.standard_normal(), dtype=dtype))
        else:
            values.append(rng.standard_normal(shape).astype(dtype))
    return values


__all__ = ["shapes_for", "random_inputs", "needs_positive", "index_intervals", "make_inputs",
           "special_values"]
