"""Ground truth and generators for tests: a naive evaluator, consistent random inputs, random specs.

``naive_eval`` runs a spec with Python loops over every index value and a tiny interpreter of the body. It
shares nothing with the backends but the analysed Spec (no jax, no lowering), so it is the reference for the
forward semantics of DESIGN section 1. It is slow: use tiny sizes.

This is a public module (``tullax.testing``); it imports neither pytest nor jax.
"""
from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Mapping

import numpy as np

from tullax.errors import ShapeError
from tullax.spec.ir import (
    Access,
    Affine,
    Binary,
    Call,
    Expr,
    Idx,
    IndexVal,
    Indirect,
    Num,
    Param,
    Spec,
    Unary,
    Wrapped,
    accesses,
    walk,
)

Point = dict[str, int]

__all__ = ["naive_eval", "random_inputs", "shapes_for", "random_spec", "random_garbage", "needs_positive"]


# =============================================================================================
# The naive evaluator
# =============================================================================================
def naive_eval(spec: Spec, env: Mapping[str, Any]) -> np.ndarray:
    """The result of ``spec`` on ``env`` (input name -> array or number), computed element by element in
    float64 (complex128 when an input is complex). Out-of-range plain/affine accesses and index arrays holding
    positions outside their axis raise ShapeError, as eager calls do."""
    arrays = {name: np.asarray(env[name]) for name in spec.input_names}
    shapes = {name: a.shape for name, a in arrays.items()}
    ranges = {name: (r.lo.eval(shapes), r.hi.eval(shapes)) for name, r in spec.ranges}
    complex_io = any(np.iscomplexobj(arrays[i.name]) for i in spec.inputs if i.kind in ("array", "scalar"))
    kind = np.complex128 if complex_io else np.float64
    ev = _Evaluator(spec, arrays, shapes, kind)
    with np.errstate(all="ignore"):
        if spec.is_scatter:
            return _naive_scatter(ev, ranges)
        return _naive_reduce(ev, ranges)


def _values(ranges: Mapping[str, tuple[int, int]], names: tuple[str, ...]):
    """Every combination of the index values of ``names`` (nothing when one range is empty)."""
    return itertools.product(*(range(ranges[n][0], ranges[n][1]) for n in names))


def _naive_reduce(ev: "_Evaluator", ranges) -> np.ndarray:
    spec = ev.spec
    if spec.assign == ":=":
        for name in spec.free:
            if ranges[name][1] < ranges[name][0]:
                raise ShapeError(f"index {name} has an empty range {ranges[name]}")
        out = np.zeros(tuple(ranges[n][1] - ranges[n][0] for n in spec.free), ev.kind)
    else:
        out = ev.arrays[spec.out].astype(ev.kind, copy=True)
    for free_values in _values(ranges, spec.free):
        point = dict(zip(spec.free, free_values))
        terms = []
        for reduced_values in _values(ranges, spec.reduced):
            point.update(zip(spec.reduced, reduced_values))
            terms.append(ev.body(point))
        value = _reduce(spec.redop, terms, ev.kind)
        if spec.finalizer:
            value = _call(spec.finalizer, (value,), ev.kind)
        where = tuple(v - ranges[n][0] if spec.assign == ":=" else v for n, v in zip(spec.free, free_values))
        if spec.assign == "+=":
            out[where] += value
        else:
            out[where] = value
    return out


def _naive_scatter(ev: "_Evaluator", ranges) -> np.ndarray:
    spec = ev.spec
    out = ev.arrays[spec.out].astype(ev.kind, copy=True)
    for values in _values(ranges, spec.reduced):
        point = dict(zip(spec.reduced, values))
        where = [ev.position(spec.out, axis, idx, point) for axis, idx in enumerate(spec.lhs)]
        value = ev.body(point)
        if None not in where:  # a pad position outside the output: the value goes nowhere
            out[tuple(where)] += value
    return out


def _reduce(redop: str, terms: list, kind) -> Any:
    if redop == "+":
        return kind(sum(terms, kind(0)))
    if redop == "*":
        return kind(math.prod(terms, start=kind(1)))
    if redop in ("max", "min"):
        if not terms:
            return kind(-np.inf if redop == "max" else np.inf)
        return kind(np.max(terms) if redop == "max" else np.min(terms))
    return _logsumexp(terms, kind)


def _logsumexp(terms: list, kind) -> Any:
    if not terms:
        return kind(-np.inf)
    top = np.max(np.real(terms))
    if not np.isfinite(top):
        return kind(top)  # all -inf gives -inf; any +inf gives +inf
    return kind(top + np.log(sum(np.exp(t - top) for t in terms)))


def _call(fn: str, args: tuple, kind) -> Any:
    if fn == "ifelse":
        cond, then, other = args
        return then if cond != 0 else other
    if fn in ("max", "min"):
        a, b = args
        if np.isnan(a) or np.isnan(b):
            return kind(np.nan)
        return (a if a >= b else b) if fn == "max" else (a if a <= b else b)
    (x,) = args
    return kind(_UNARY[fn](x))


def _sigmoid(x):
    return 1 / (1 + np.exp(-x)) if np.real(x) >= 0 else np.exp(x) / (1 + np.exp(x))


_UNARY: dict[str, Callable] = {
    "exp": np.exp, "log": np.log, "log1p": np.log1p, "expm1": np.expm1, "sqrt": np.sqrt, "abs": np.abs,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "tanh": np.tanh, "sinh": np.sinh, "cosh": np.cosh,
    "sigmoid": _sigmoid, "softplus": lambda x: np.logaddexp(x, 0.0), "relu": lambda x: x if x > 0 else 0 * x,
    "conj": np.conj, "real": np.real, "imag": np.imag,
}


class _Evaluator:
    """Evaluates the body at one point (a value for every index): an interpreter, one node at a time."""

    def __init__(self, spec: Spec, arrays: dict[str, np.ndarray], shapes, kind):
        self.spec, self.arrays, self.shapes, self.kind = spec, arrays, shapes, kind

    def body(self, point: Point) -> Any:
        return self.eval(self.spec.body, point)

    def eval(self, expr: Expr, point: Point) -> Any:
        kind = self.kind
        if isinstance(expr, Num):
            return kind(expr.value)
        if isinstance(expr, Param):
            return kind(self.arrays[expr.name])
        if isinstance(expr, IndexVal):
            return kind(point[expr.name] + expr.offset.eval(self.shapes))
        if isinstance(expr, Access):
            return self.read(expr, point)
        if isinstance(expr, Unary):
            return -self.eval(expr.arg, point)
        if isinstance(expr, Call):
            return _call(expr.fn, tuple(self.eval(a, point) for a in expr.args), kind)
        assert isinstance(expr, Binary), expr
        lhs = self.eval(expr.lhs, point)
        if expr.op == "^" and _int_literal(expr.rhs) is not None:
            return _int_power(lhs, _int_literal(expr.rhs), kind)
        rhs = self.eval(expr.rhs, point)
        return _BINARY[expr.op](lhs, rhs, kind)

    def read(self, acc: Access, point: Point) -> Any:
        where = []
        for axis, idx in enumerate(acc.idx):
            pos = self.position(acc.array, axis, idx, point)
            if pos is None:  # pad outside the axis
                return self.kind(0)
            where.append(pos)
        return self.kind(self.arrays[acc.array][tuple(where)])

    def affine(self, aff: Affine, point: Point) -> int:
        return sum(coef * point[name] for name, coef in aff.terms) + aff.const.eval(self.shapes)

    def position(self, array: str, axis: int, idx: Idx, point: Point) -> int | None:
        """The position ``idx`` reads on ``axis`` of ``array`` at ``point``; None: outside, under pad."""
        extent = self.shapes[array][axis]
        if isinstance(idx, Affine):
            return self.in_bounds(array, axis, self.affine(idx, point))
        if isinstance(idx, Indirect):
            at = self.in_bounds(idx.array, 0, self.affine(idx.inner, point))
            pos = int(self.arrays[idx.array][at])
            if not 0 <= pos < extent:
                raise ShapeError(f"{idx.array}[{at}] = {pos} is outside axis {axis} of {array} (extent {extent})")
            return pos
        raw = self.affine(idx.inner, point)
        if extent == 0 and idx.kind != "pad":
            raise ShapeError(f"{idx.kind}(..) on the empty axis {axis} of {array}")
        if idx.kind == "mod":
            return raw % extent
        if idx.kind == "clamp":
            return min(max(raw, 0), extent - 1)
        assert isinstance(idx, Wrapped) and idx.kind == "pad"
        if raw % idx.inner.div:
            return None
        raw //= idx.inner.div
        return raw if 0 <= raw < extent else None

    def in_bounds(self, array: str, axis: int, pos: int) -> int:
        extent = self.shapes[array][axis]
        if not 0 <= pos < extent:
            raise ShapeError(f"position {pos} is outside axis {axis} of {array} (extent {extent})")
        return pos


def _int_literal(expr: Expr) -> int | None:
    if isinstance(expr, Num) and isinstance(expr.value, int):
        return expr.value
    if isinstance(expr, Unary) and isinstance(expr.arg, Num) and isinstance(expr.arg.value, int):
        return -expr.arg.value
    return None


def _int_power(base, exponent: int, kind):
    """Exact repeated multiplication (negative bases are fine), like jax's integer_pow."""
    result = kind(1)
    for _ in range(abs(exponent)):
        result = result * base
    return kind(1) / result if exponent < 0 else result


_BINARY: dict[str, Callable] = {
    "+": lambda a, b, k: a + b,
    "-": lambda a, b, k: a - b,
    "*": lambda a, b, k: a * b,
    "/": lambda a, b, k: a / b,
    "^": lambda a, b, k: k(np.power(a, b)),
    "<": lambda a, b, k: k(a < b),
    "<=": lambda a, b, k: k(a <= b),
    ">": lambda a, b, k: k(a > b),
    ">=": lambda a, b, k: k(a >= b),
    "==": lambda a, b, k: k(a == b),
    "!=": lambda a, b, k: k(a != b),
}


# =============================================================================================
# Consistent random shapes and inputs
# =============================================================================================
class _Classes:
    """Union-find over array axes that must share one extent."""

    def __init__(self):
        self.parent: dict[tuple[str, int], tuple[str, int]] = {}

    def find(self, item):
        self.parent.setdefault(item, item)
        while self.parent[item] != item:
            self.parent[item] = self.parent[self.parent[item]]
            item = self.parent[item]
        return item

    def union(self, a, b) -> None:
        self.parent[self.find(a)] = self.find(b)


def _occurrences(spec: Spec):
    """(array, axis, idx) of every bracket position, the left-hand side of '=' and '+=' included."""
    found = []
    if spec.assign != ":=" and spec.lhs is not None:
        found += [(spec.out, axis, idx) for axis, idx in enumerate(spec.lhs)]
    for acc in accesses(spec.body):
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
    classes = _Classes()
    for agreement in spec.agreements:
        classes.union(agreement.first, agreement.second)
    axes = [(i.name, ax) for i in spec.inputs if i.kind != "scalar" for ax in range(i.rank)]
    roots = sorted({classes.find(a) for a in axes})
    size = {root: int(rng.integers(low, high + 1)) for root in roots}
    growing = sorted({classes.find((array, axis)) for array, axis, idx in _occurrences(spec)
                      if isinstance(idx, Affine) and not idx.plain})

    def shapes_of(sizes):
        return {i.name: tuple(sizes[classes.find((i.name, ax))] for ax in range(i.rank)) for i in spec.inputs}

    def deficit(sizes) -> int:  # how far the ranges are from all holding at least one value
        return sum(max(0, lo - hi + 1) for lo, hi in eval_shapes(spec, shapes_of(sizes)).values())

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
    raise ShapeError(f"tullax.testing found no small shapes for which every range is non-empty; give "
                     f"shapes explicitly (last tried {shapes})")


def needs_positive(spec: Spec) -> bool:
    """True when the spec takes logs, roots, divisions or non-integer powers of its inputs."""
    for node in walk(spec.body):
        if isinstance(node, Call) and node.fn in ("log", "sqrt", "log1p"):
            return True
        if isinstance(node, Binary) and (node.op == "/" or (node.op == "^" and _int_literal(node.rhs) is None)):
            return True
    return spec.finalizer in ("log", "sqrt", "log1p")


def random_inputs(spec: Spec, shapes: Mapping[str, tuple[int, ...]] | None = None, seed: int = 0,
                  dtype: Any = np.float64) -> dict[str, Any]:
    """Inputs for ``spec``: data in 0.5..1.5 when the spec needs positive values (see ``needs_positive``),
    standard normal otherwise; index arrays hold valid positions of every axis they index; scalars are
    numbers of ``dtype``; 'shape' inputs are zeros of their shape."""
    rng = np.random.default_rng(seed)
    shapes = dict(shapes) if shapes is not None else shapes_for(spec, seed)
    positive = needs_positive(spec)
    dtype = np.dtype(dtype)
    limits = _index_limits(spec, shapes)
    env: dict[str, Any] = {}
    for inp in spec.inputs:
        shape = tuple(shapes[inp.name])
        if inp.kind == "index":
            env[inp.name] = rng.integers(0, max(limits.get(inp.name, 1), 1), size=shape).astype(np.int32)
        elif inp.kind == "shape":
            env[inp.name] = np.zeros(shape, dtype)
        else:
            value = _random_values(rng, shape, positive, dtype)
            env[inp.name] = value if inp.kind == "array" else dtype.type(value)
    return env


def _random_values(rng: np.random.Generator, shape, positive: bool, dtype: np.dtype) -> np.ndarray:
    def draw():
        return rng.uniform(0.5, 1.5, shape) if positive else rng.standard_normal(shape)
    value = draw() + 1j * draw() if dtype.kind == "c" else draw()
    return np.asarray(value).astype(dtype)


def _index_limits(spec: Spec, shapes) -> dict[str, int]:
    """For each index array, the smallest extent among the axes it indexes: its values stay below."""
    limits: dict[str, int] = {}
    for array, axis, idx in _occurrences(spec):
        if isinstance(idx, Indirect):
            extent = shapes[array][axis]
            limits[idx.array] = min(limits.get(idx.array, extent), extent)
    return limits


# =============================================================================================
# Random specs: valid ones from the grammar, and garbage
# =============================================================================================
_INDICES = ("i", "j", "k", "l", "m", "n")
_SCALARS = ("a", "b", "s")


def _as_rng(rng: Any) -> np.random.Generator:
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


class _SpecWriter:
    """Builds one random valid spec. Every index gets a plain occurrence in a 'binder' access, so ranges are
    always inferable; other accesses use shifts, constants, mod/clamp/pad and indirect indices freely."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.ranks: dict[str, int] = {}
        self.index_arrays: list[str] = []
        self.indices: list[str] = []

    def pick(self, items):
        return items[int(self.rng.integers(len(items)))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def new_array(self, rank: int) -> str:
        name = "ABCDEFGHPQRTUVWXYZ"[len(self.ranks)] if len(self.ranks) < 18 else f"Z{len(self.ranks)}"
        self.ranks[name] = rank
        return name

    # -- index expressions ------------------------------------------------------------------------
    def shifted_index(self) -> str:
        i = self.pick(self.indices)
        others = [n for n in self.indices if n != i]
        choices = [f"{i}+1", f"{i}-1", f"2{i}", f"2*{i}+1", f"{i}+2", f"-{i}+3", "0", "1",
                   f"mod({i}+1)", f"mod({i}-2)", f"clamp({i}-1)", f"clamp({i}+1)", f"pad({i}+1)", f"pad({i}-2)",
                   f"pad(2{i})", "indirect", "indirect", "indirect"]
        if others:
            choices += [f"{i}+{others[0]}", f"mod({i}+{others[0]})", f"pad({i}-{others[0]})"]
        choice = self.pick(choices)
        if choice == "indirect":
            name = self.pick(self.index_arrays) if self.index_arrays and self.chance(0.5) else \
                ("ix", "jx", "kx")[min(len(self.index_arrays), 2)]
            if name not in self.index_arrays:
                self.index_arrays.append(name)
            inner = self.pick([i, f"{i}+1", i])
            return f"{name}[{inner}]"
        return choice

    def access(self) -> str:
        """An extra access: a new array or a repeated one, each axis plain or computed."""
        reuse = [a for a in self.ranks if self.chance(0.3)]
        if reuse:
            name = reuse[0]
            rank = self.ranks[name]
        else:
            rank = int(self.rng.integers(1, 3))
            name = self.new_array(rank)
        idx = [self.pick(self.indices) if self.chance(0.4) else self.shifted_index() for _ in range(rank)]
        return f"{name}[{','.join(idx)}]"

    def binders(self, names: list[str]) -> list[str]:
        """Accesses that give each of ``names`` a plain occurrence (groups of up to three indices)."""
        names = list(names)
        self.rng.shuffle(names)
        out = []
        while names:
            size = int(self.rng.integers(1, min(3, len(names)) + 1))
            group, names = names[:size], names[size:]
            if self.chance(0.3) and len(group) < 3:  # a diagonal or a constant position now and then
                group = group + [self.pick(group + ["0"])]
            name = self.new_array(len(group))
            out.append(f"{name}[{','.join(group)}]")
        return out

    # -- body expressions ----------------------------------------------------------------------
    def leaf(self) -> str:
        roll = self.rng.random()
        if roll < 0.55:
            return self.access()
        if roll < 0.7:
            return self.pick(_SCALARS)
        if roll < 0.85:
            return self.pick(["2", "3", "0.5", "1.5", "1"])
        return self.pick(self.indices)

    def combine(self, a: str, b: str) -> str:
        roll = self.rng.random()
        if roll < 0.3:
            return f"{a} + {b}"
        if roll < 0.45:
            return f"{a} - {b}"
        if roll < 0.75:
            return f"{a}*{b}"
        if roll < 0.82:
            return f"{a}/(1 + ({b})^2)"
        if roll < 0.87:
            return f"{self.pick(['max', 'min'])}({a}, {b})"
        if roll < 0.92:
            return f"({a} {self.pick(['<', '<=', '>', '>=', '==', '!='])} {b})"
        return f"ifelse({a} > {b}, {a}, {b})"

    def wrap(self, e: str) -> str:
        """A function or a power of ``e``, with arguments kept in each function's domain."""
        choices = [
            f"exp(tanh({e}))", f"log(1 + ({e})^2)", f"log1p(({e})^2)", f"sqrt(({e})^2 + 1)", f"abs({e})",
            f"sin({e})", f"cos({e})", f"tan(tanh({e}))", f"tanh({e})", f"sinh(tanh({e}))", f"cosh(tanh({e}))",
            f"expm1(tanh({e}))", f"sigmoid({e})", f"softplus({e})", f"relu({e})", f"({e})^2", f"({e})^3",
            f"(1 + ({e})^2)^0.5", f"(1 + ({e})^2)^-1", f"-({e})", f"real({e})", f"conj({e})", f"imag({e}) + {e}",
        ]
        return self.pick(choices)

    def body(self, binders: list[str]) -> str:
        leaves = binders + [self.leaf() for _ in range(int(self.rng.integers(0, 3)))]
        self.rng.shuffle(leaves)
        leaves = [self.wrap(x) if self.chance(0.2) else x for x in leaves]
        while len(leaves) > 1:
            k = int(self.rng.integers(len(leaves) - 1))
            merged = self.combine(leaves[k], leaves[k + 1])
            if self.chance(0.15):
                merged = self.wrap(merged)
            leaves[k:k + 2] = [merged]
        return leaves[0]

    # -- the whole spec ------------------------------------------------------------------------
    def spec(self) -> str:
        n_free = int(self.rng.choice([0, 1, 1, 2, 2, 3]))
        n_reduced = int(self.rng.choice([0, 1, 1, 2]))
        if n_free + n_reduced == 0:
            n_free = 1
        self.indices = list(_INDICES[:n_free + n_reduced])
        free = self.indices[:n_free]
        kind = self.pick(["new"] * 7 + ["update"] * 2 + ["scatter"])
        if kind == "scatter" and not free:
            kind = "new"
        out = "O"
        binders = self.binders(self.indices)
        body = self.body(binders)
        if kind == "scatter":
            lhs = list(free)
            lhs[int(self.rng.integers(len(lhs)))] = self.scatter_position(free)
            return f"{out}[{','.join(lhs)}] += {body}"
        redop = self.pick(["+"] * 6 + ["*", "max", "min", "logsumexp"])
        head = "" if redop == "+" and self.chance(0.8) else f"({redop}) "
        target = f"{out}[{','.join(free)}]" if free or self.chance(0.5) else out
        assign = ":=" if kind == "new" else self.pick(["=", "+="])
        if assign != ":=" and self.chance(0.3):
            body = f"{body} + 0.5*{target}" if free else body
        tail = f" |> {self.pick(['tanh', 'sigmoid', 'softplus', 'relu', 'abs', 'sin', 'cos'])}" \
            if self.chance(0.15) else ""
        return f"{head}{target} {assign} {body}{tail}"

    def scatter_position(self, free: list[str]) -> str:
        i = self.pick(free)
        name = "ix"
        if name not in self.index_arrays:
            self.index_arrays.append(name)
        return self.pick([f"ix[{i}]", f"{i}+1", f"mod({i}+1)", f"clamp({i}-1)", f"pad({i}+1)", f"2{i}",
                          f"pad(2{i}+1)"])


def random_spec(rng: Any) -> str:
    """A random VALID spec covering the grammar of DESIGN section 1 (every range inferable). ``rng``: a NumPy
    Generator or a seed."""
    return _SpecWriter(_as_rng(rng)).spec()


_NOISE = list("[](),:=+-*/^<>|!._ 0123456789ijkxyzAB\t\n") + ["αβ", "∑", "√", "ñ", "€", "𝔸", "\x00", "ü", "ℵ",
                                                                 ":=", "+=", "|>", "[]", "()", "mod(", "pad(",
                                                                 "ix[", "(max)", "exp(", "1e400", "--", ".."]


def random_garbage(rng: Any) -> str:
    """An arbitrary string: usually a valid spec mutated by deletions, insertions (unicode included), swapped
    tokens, duplications and truncations; sometimes pure noise."""
    rng = _as_rng(rng)
    if rng.random() < 0.1:
        return "".join(_NOISE[int(rng.integers(len(_NOISE)))] for _ in range(int(rng.integers(0, 30))))
    text = random_spec(rng)
    for _ in range(int(rng.integers(1, 4))):
        text = _mutate(text, rng)
    return text


def _mutate(text: str, rng: np.random.Generator) -> str:
    if not text:
        return _NOISE[int(rng.integers(len(_NOISE)))]
    at = int(rng.integers(len(text) + 1))
    roll = rng.random()
    if roll < 0.25:
        return text[:at] + text[at + int(rng.integers(1, 4)):]
    if roll < 0.5:
        return text[:at] + _NOISE[int(rng.integers(len(_NOISE)))] + text[at:]
    if roll < 0.7:
        import re
        tokens = re.findall(r"\w+|\S", text)
        if len(tokens) > 1:
            a, b = (int(x) for x in rng.integers(len(tokens), size=2))
            tokens[a], tokens[b] = tokens[b], tokens[a]
        return " ".join(tokens)
    if roll < 0.85:
        return text[:at]
    end = min(len(text), at + int(rng.integers(1, 6)))
    return text[:end] + text[at:end] + text[end:]
