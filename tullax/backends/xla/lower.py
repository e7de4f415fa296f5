"""The XLA reference backend: a Spec lowered to plain jax.numpy (docs/design.md, section 4).

``lower(spec)`` is the PLAIN lowering, without custom_vjp: ``jnp.einsum`` for pure contractions, otherwise an
index grid (one broadcast axis per index), the body evaluated elementwise with slices and gathers, a reduction,
the finaliser, and the placement into the result. ``jax.grad`` of it is the gradient oracle of the tests, and it
is the "XLA" column of the benchmarks, so it stays plain jnp that XLA can optimise as it likes.

jax is imported inside functions only: importing this module must stay cheap and jax-free.
"""
from __future__ import annotations

import functools
import importlib
import string
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

import numpy as np

from tullax.backends.xla.reads import all_masks, position, read
from tullax.spec import functions
from tullax.spec.contraction import factors, is_contraction
from tullax.spec.dtypes import HALF
from tullax.spec.ir import (
    Access,
    Binary,
    Call,
    Expr,
    Hole,
    IndexVal,
    Num,
    Param,
    Size,
    Spec,
    Unary,
    idx_names,
    reduction_identity,
    walk,
)
from tullax.spec.shapes import (
    check_dtypes,
    check_shapes,
    eval_shapes,
    input_shapes,
    result_dtype,
)
from tullax.spec.valuetype import complex_inputs, has_complex_literal, is_complex

__all__ = ["lower", "result_dtype", "eval_shapes", "check_shapes", "is_contraction"]

Env = Mapping[str, Any]

def _identity(redop: str, dtype: Any) -> Any:
    """The reduction's initial value in ``dtype`` (``reduction_identity``, as the loop lowering has it)."""
    return reduction_identity(redop, np.dtype(dtype).name)


# ---------------------------------------------------------------------------------------------
# dtypes
# ---------------------------------------------------------------------------------------------
def _dtype_of(value: Any) -> Any:
    """What ``jnp.result_type`` should see for one input: its dtype, or the Python type of a weak scalar."""
    return value.dtype if hasattr(value, "dtype") else type(value)


# ---------------------------------------------------------------------------------------------
# The plain lowering
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1024)  # one function object per spec: jax.jit of it reuses its compile cache
def lower(spec: Spec, *, einsum: bool = True, grid: str = "free-first") -> Callable[[Env], Any]:
    """The plain jnp lowering of ``spec``: ``fn(env) -> jax.Array``, ``env`` mapping every input name (see
    ``spec.inputs``; 'shape' inputs are only read for their ``.shape``) to an array or a number. Differentiable
    and jit-able: shapes are read from ``.shape`` (static under jit) and checked at trace time.
    ``einsum=False`` forces broadcast-and-reduce even for pure contractions (to compare the two).
    ``grid="appearance"`` orders the broadcast axes as the indices first appear in the body, the way the
    expression is usually written by hand in jnp (``((W[:,:,None]-X[:,None,:])**2).sum(0)`` for Dist): the
    benchmarks' "xla-naive" comparator. The default puts the free indices first, which XLA fuses better."""
    if grid not in ("free-first", "appearance"):
        raise ValueError(f"grid must be 'free-first' or 'appearance', got {grid!r}")
    if spec.scan is not None:  # a recurrence: one lax.scan (tullax.backends.xla.scan)
        from tullax.backends.xla.scan import lower_scan

        return lower_scan(spec, lower, _dtype_of)

    def run(env: Env):
        return _evaluate(spec, env, einsum, grid)
    run.__name__ = "tullax_xla_" + spec.out
    run.__doc__ = f"jnp lowering of a tullax spec with inputs {', '.join(spec.input_names)}"
    return run


def _evaluate(spec: Spec, env: Env, einsum: bool = True, grid: str = "free-first"):
    ctx, dtype = _context(spec, env, grid)
    if spec.is_scatter:
        return _scatter(ctx).astype(dtype)
    value = _contract(ctx) if einsum and is_contraction(spec) and _einsum_fits(ctx) else _reduce(ctx)
    if spec.finalizer is not None:
        value = _finalize(ctx, value)
    return _place(ctx, _as_array(value, ctx.dtype)).astype(dtype)


def _context(spec: Spec, env: Env, grid: str = "free-first") -> tuple["_Context", Any]:
    """The one evaluation context of every entry point (``_evaluate``, ``evaluate_fixed``, ``finalize_value``),
    and the result's dtype: shapes and dtypes checked, complex inputs named, half precision computed in float32
    (loaded, computed and accumulated in float32 and rounded once at the end, by the caller)."""
    import jax

    shapes = input_shapes(spec, env)
    check_shapes(spec, shapes)
    check_dtypes(spec, {name: _np_dtype(env[name]) for name in spec.input_names})
    dtypes = {n: _dtype_of(env[n]) for n in spec.input_names}
    dtype = np.dtype(jax.dtypes.canonicalize_dtype(result_dtype(spec, dtypes)))
    compute = np.dtype(np.float32) if dtype.name in HALF else dtype
    ctx = _Context(spec, env, shapes, compute, _Grid.build(spec, shapes, _grid_order(spec, grid)),
                   complex_inputs(spec, dtypes))
    return ctx, dtype


def _finalize(ctx: "_Context", value):
    """The finaliser on the reduced ``value`` (free indices in lhs order), its reads on a grid of the free
    indices alone."""
    import jax.numpy as jnp

    free = ctx.spec.free
    axes = [ctx.grid.axis(n) for n in free]
    grid = _Grid(free, tuple(ctx.grid.lo[a] for a in axes), tuple(ctx.grid.size[a] for a in axes))
    out = _body(replace(ctx, grid=grid, hole=value), ctx.spec.finalizer)
    return jnp.broadcast_to(_as_array(out, ctx.dtype), grid.shape)


def evaluate_fixed(spec: Spec, env: Env, fixed: Mapping[str, int]):
    """The reduction of ``spec`` (a ':=' spec; no finaliser applied) with the indices of ``fixed`` held at one
    value each: the reduced value over every other index, in the compute dtype of ``_context`` (float32 for
    half precision; the caller rounds once). Accesses that an index of ``fixed`` shifts read slices (see
    ``reads.live_terms``). The slices form of ``tullax.backends.xla.forms`` sums these."""
    ctx, _ = _context(spec, env)
    grid = ctx.grid
    lo = tuple(fixed.get(n, lo) for n, lo in zip(grid.names, grid.lo))
    size = tuple(1 if n in fixed else sz for n, sz in zip(grid.names, grid.size))
    return _reduce(replace(ctx, grid=_Grid(grid.names, lo, size)))


def finalize_value(spec: Spec, env: Env, value):
    """``spec``'s finaliser applied to its reduced ``value`` (free indices in lhs order), as ``_evaluate`` applies
    it (in the same context, so in float32 for half precision): for a form that computes the reduction its own
    way (``tullax.backends.xla.forms``)."""
    return _finalize(_context(spec, env)[0], value)


def _grid_order(spec: Spec, grid: str) -> tuple[str, ...]:
    """The broadcast axes: free indices first, or every index in the order it first appears in the body."""
    names = spec.free + spec.reduced
    if grid == "free-first":
        return names
    seen: list[str] = []
    for node in walk(spec.body):
        found = [node.name] if isinstance(node, IndexVal) else []
        if isinstance(node, Access):
            found = [n for idx in node.idx for n in idx_names(idx)]
        for name in found:
            if name in names and name not in seen:
                seen.append(name)
    return tuple(seen) + tuple(n for n in names if n not in seen)


def _np_dtype(value: Any) -> np.dtype:
    return np.dtype(value.dtype) if hasattr(value, "dtype") else np.dtype(type(value))


@dataclass(frozen=True)
class _Grid:
    """One broadcast axis per index: free indices first (lhs order), then the reduced ones."""

    names: tuple[str, ...]
    lo: tuple[int, ...]
    size: tuple[int, ...]

    @staticmethod
    def build(spec: Spec, shapes, names: tuple[str, ...] | None = None) -> "_Grid":
        ranges = eval_shapes(spec, shapes)
        names = names or spec.free + spec.reduced
        lo = tuple(ranges[n][0] for n in names)
        size = tuple(max(ranges[n][1] - ranges[n][0], 0) for n in names)
        return _Grid(names, lo, size)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.size

    @property
    def empty(self) -> bool:
        return 0 in self.size

    def axis(self, name: str) -> int:
        return self.names.index(name)

    def values(self, name: str):
        """The values of index ``name``, shaped to broadcast along its own grid axis."""
        import jax.numpy as jnp

        axis = self.axis(name)
        shape = [1] * len(self.names)
        shape[axis] = self.size[axis]
        return jnp.arange(self.lo[axis], self.lo[axis] + self.size[axis]).reshape(shape)


@dataclass(frozen=True)
class _Context:
    """``dtype`` is the result's. Values are typed as ``spec.valuetype`` infers: real ones in ``real`` (the
    result's precision), complex ones (inputs in ``complex_names``, and what they reach) in ``compute``; without
    complex values both are ``dtype``."""

    spec: Spec
    env: Env
    shapes: Mapping[str, tuple[int, ...]]
    dtype: Any
    grid: _Grid
    complex_names: frozenset[str] = frozenset()
    hole: Any = None  # the reduced values, while the finaliser is evaluated

    @property
    def compute(self) -> Any:
        if self.complex_names or has_complex_literal(self.spec.body):
            return np.result_type(self.dtype, np.complex64)
        return self.dtype

    @property
    def real(self) -> Any:
        return np.dtype(np.finfo(self.dtype).dtype) if self.dtype.kind == "c" else self.dtype

    def leaf(self, name: str) -> Any:
        """The dtype an input's values are read in."""
        return self.compute if name in self.complex_names else self.real

    @property
    def body_dtype(self) -> Any:
        return self.compute if is_complex(self.spec.body, self.complex_names) else self.real

    def array(self, name: str):
        import jax.numpy as jnp

        return jnp.asarray(self.env[name])


# ---------------------------------------------------------------------------------------------
# Pure contractions -> einsum
# ---------------------------------------------------------------------------------------------
def _einsum_fits(ctx: _Context) -> bool:
    used = {i.plain for f in factors(ctx.spec.body) for i in f.idx}
    return set(ctx.grid.names) <= used and len(ctx.grid.names) <= len(string.ascii_letters)


def _contract(ctx: _Context):
    import jax
    import jax.numpy as jnp

    letter = dict(zip(ctx.grid.names, string.ascii_letters))
    operands, terms = [], []
    for factor in factors(ctx.spec.body):
        names = [i.plain for i in factor.idx]
        window = tuple(slice(ctx.grid.lo[ctx.grid.axis(n)], ctx.grid.lo[ctx.grid.axis(n)] + ctx.grid.size[
            ctx.grid.axis(n)]) for n in names)
        operands.append(ctx.array(factor.array)[window].astype(ctx.leaf(factor.array)))
        terms.append("".join(letter[n] for n in names))
    out = "".join(letter[n] for n in ctx.spec.free)
    return jnp.einsum(f"{','.join(terms)}->{out}", *operands, precision=jax.lax.Precision.HIGHEST)


# ---------------------------------------------------------------------------------------------
# Broadcast and reduce
# ---------------------------------------------------------------------------------------------
def _reduce(ctx: _Context):
    import jax.numpy as jnp

    free = ctx.spec.free
    free_shape = tuple(ctx.grid.size[ctx.grid.axis(n)] for n in free)
    if ctx.grid.empty:  # nothing to read: every element is the reduction's identity
        return jnp.full(free_shape, _identity(ctx.spec.redop, ctx.body_dtype), ctx.body_dtype)
    value = jnp.broadcast_to(_as_array(_body(ctx, ctx.spec.body), ctx.body_dtype), ctx.grid.shape)
    axes = tuple(k for k, n in enumerate(ctx.grid.names) if n not in free)
    if axes:
        value = _reduce_axes(ctx.spec.redop, value, axes)
    remaining = [n for n in ctx.grid.names if n in free]  # the grid may not put the free indices first
    order = [remaining.index(n) for n in free]
    return value if order == sorted(order) else jnp.transpose(value, order)


def _reduce_axes(redop: str, value, axes: tuple[int, ...]):
    import jax
    import jax.numpy as jnp

    if redop == "+":
        return jnp.sum(value, axis=axes)
    if redop == "*":
        return jnp.prod(value, axis=axes)
    if redop in ("max", "min"):
        if jnp.issubdtype(value.dtype, jnp.floating):
            # XLA's CPU reduction loses a NaN in an array of 4096 elements or more (jaxlib 0.10.2: 3x1366,
            # 1x4096 and 64x64 did, 3x1365 and 1x2048 did not; it returns the max of the rest, or -inf where the
            # NaN was last), while NumPy and every loop backend propagate it: the NaN is said explicitly
            # (tests/test_nan_propagation.py, the long rows)
            return _nan_propagating(redop)(value, axes)
        found = (jnp.max if redop == "max" else jnp.min)(value, axis=axes)
        if jnp.issubdtype(value.dtype, jnp.complexfloating):
            return jnp.where(jnp.isnan(value).any(axis=axes), jnp.array(jnp.nan, found.dtype), found)
        return found
    return jax.nn.logsumexp(value, axis=axes)


@functools.cache
def _nan_propagating(redop: str) -> Callable:
    """``redop`` ("max"/"min") of a real float array over ``axes``, NaN wherever a NaN was reduced: one variadic
    reduction of the values and of their NaN flags, which XLA reads in one pass. It replaced a max checked by a
    sum (NaN where a NaN is), which read the values twice (benchmarks/xla_nan_max.py times the two against
    `jnp.max`, which drops the NaN). Its derivative is `jnp.max`'s: the tangent averaged over the positions equal
    to the result (none where it is NaN: a NaN tangent)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    pick = lax.max if redop == "max" else lax.min

    def combine(a, b):
        (a_value, a_nan), (b_value, b_nan) = a, b
        return pick(a_value, b_value), a_nan | b_nan

    @functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
    def reduce(value, axes):
        start = jnp.array(_identity(redop, value.dtype), value.dtype)
        found, nan = lax.reduce((value, jnp.isnan(value)), (start, jnp.array(False)), combine, axes)
        return jnp.where(nan, jnp.array(jnp.nan, value.dtype), found)

    @reduce.defjvp
    def _(axes, primals, tangents):
        (value,), (tangent,) = primals, tangents
        found = reduce(value, axes)
        at = value == jnp.expand_dims(found, axes)
        picked = jnp.sum(jnp.where(at, tangent, jnp.zeros_like(tangent)), axis=axes)
        return found, picked / jnp.sum(at, axis=axes, dtype=value.dtype)

    return reduce


def _as_array(value, dtype):
    import jax.numpy as jnp

    return jnp.asarray(value, dtype=dtype) if not hasattr(value, "dtype") else value.astype(dtype)


def _body(ctx: _Context, expr: Expr):
    import jax.numpy as jnp

    if isinstance(expr, Num):
        return _as_array(expr.value, ctx.compute if isinstance(expr.value, complex) else ctx.real)
    if isinstance(expr, Param):
        return _as_array(ctx.env[expr.name], ctx.leaf(expr.name))
    if isinstance(expr, IndexVal):
        return (ctx.grid.values(expr.name) + expr.offset.eval(ctx.shapes)).astype(ctx.real)
    if isinstance(expr, Size):
        return _as_array(ctx.shapes[expr.array][expr.axis], ctx.real)
    if isinstance(expr, Hole):
        return ctx.hole
    if isinstance(expr, Access):
        return read(ctx, expr)
    if isinstance(expr, Unary):
        return -_body(ctx, expr.arg)
    if isinstance(expr, Call):
        return _apply(expr.fn, tuple(_body(ctx, a) for a in expr.args))
    assert isinstance(expr, Binary), expr
    lhs = _body(ctx, expr.lhs)
    if expr.op == "^":
        exponent = _integer_literal(expr.rhs)
        if exponent is not None:
            return jnp.power(lhs, exponent)  # integer_pow: exact, fine for negative bases
        return jnp.power(lhs, _body(ctx, expr.rhs))
    rhs = _body(ctx, expr.rhs)
    return _binary(expr.op, lhs, rhs, ctx.real)


def _integer_literal(expr: Expr) -> int | None:
    if isinstance(expr, Num) and isinstance(expr.value, int):
        return expr.value
    if isinstance(expr, Unary) and isinstance(expr.arg, Num) and isinstance(expr.arg.value, int):
        return -expr.arg.value
    return None


def _binary(op: str, lhs, rhs, dtype):
    import jax.numpy as jnp

    if op == "+":
        return lhs + rhs
    if op == "-":
        return lhs - rhs
    if op == "*":
        return lhs * rhs
    if op == "/":
        return lhs / rhs
    compare = {"<": jnp.less, "<=": jnp.less_equal, ">": jnp.greater, ">=": jnp.greater_equal,
               "==": jnp.equal, "!=": jnp.not_equal}[op]
    # a select of 1/0, not a conversion of the bool: XLA rewrites x * convert(x > 2) into select(x > 2, x, 0),
    # which gives 0 where x is NaN; tullax follows IEEE (NaN * 0 is NaN) on every backend, as NumPy does
    return jnp.where(compare(lhs, rhs), jnp.ones((), dtype), jnp.zeros((), dtype))


def _apply(fn: str, args: tuple):
    """A function of the registry (``tullax.spec.functions``) through its jax implementation, with jax's own
    derivative conventions (relu'(0) = 0, max/min split ties equally)."""
    impl = _jax_function(fn)
    if fn == "ifelse":  # the condition is a number of the result dtype: nonzero is true
        cond, then, other = args
        return impl(cond != 0, then, other)
    return impl(*args)


@functools.lru_cache(maxsize=None)
def _jax_function(fn: str) -> Callable:
    """The jax implementation named by the registry's dotted path (imported on first use: jax stays lazy)."""
    module, _, name = functions.get(fn).jnp.rpartition(".")
    return getattr(importlib.import_module(module), name)


# ---------------------------------------------------------------------------------------------
# Placing the result
# ---------------------------------------------------------------------------------------------
def _place(ctx: _Context, value):
    spec = ctx.spec
    if spec.assign == ":=":
        return value
    base = _as_array(ctx.array(spec.out), ctx.dtype)
    if spec.lhs is None:
        return value if spec.assign == "=" else base * value if spec.assign == "*=" else base + value
    window = []
    for idx in spec.lhs:
        axis = ctx.grid.axis(idx.plain)
        window.append(slice(ctx.grid.lo[axis], ctx.grid.lo[axis] + ctx.grid.size[axis]))
    target = base.at[tuple(window)]
    if spec.assign == "*=":
        return target.multiply(value)
    return target.set(value) if spec.assign == "=" else target.add(value)


def _scatter(ctx: _Context):
    """``out[computed positions] += body`` over every index; positions outside the output are dropped."""
    import jax.numpy as jnp

    from tullax.backends.xla import rows as xla_rows

    base = _as_array(ctx.array(ctx.spec.out), ctx.dtype)
    if ctx.grid.empty:
        return base
    value = jnp.broadcast_to(_as_array(_body(ctx, ctx.spec.body), ctx.dtype), ctx.grid.shape)
    windows = xla_rows.scatter_windows(ctx)
    places = {}
    for axis, idx in enumerate(ctx.spec.lhs):
        if axis in windows:
            continue
        extent = base.shape[axis]
        pos = position(ctx, idx, extent)
        keep = all_masks([pos.inside, pos.defined])
        places[axis] = jnp.asarray(pos.pos) if keep is None else jnp.where(keep, pos.pos, extent)
    if windows:
        return xla_rows.scatter_rows(ctx, base, value, windows, places)
    where = tuple(jnp.broadcast_to(places[axis], ctx.grid.shape) for axis in range(len(ctx.spec.lhs)))
    return base.at[where].add(value, mode="drop")

