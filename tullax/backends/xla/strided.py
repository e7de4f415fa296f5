"""The ``strided`` form: a sum over window indices that each read ``pad((m - p)/s)`` of one free index ``m``, with a
window no longer than its stride (``p in 0:k``, ``k <= s``): the input gradient of a strided max or average pool,
or of a patch-embedding convolution's window (``Δx[n,c,m,r] := share[n,c,pad((m-p)/2),pad((r-q)/2)]*(...)``).
At most one term of such a sum divides, ``p = m mod s``; the plain lowering gathers and masks all ``k`` of them, and
the loops test divisibility per term. Here ``m`` is split into ``(m div s, m mod s)`` the way jnp code reshapes it:
every read becomes a slice, pad and reshape of its array on that grid (a ``pad((m-p)/s)`` axis reads ``m div s``,
a plain ``m`` axis is reshaped into both, a plain ``p`` axis reads ``m mod s``), the body is evaluated once per
element (no reduction, no gather), zero where ``m mod s >= k``, and the two axes are merged back.

Where ``p != m mod s`` the plain lowering's division reads 0: the form needs those terms to vanish, so for every
window index some factor of the body's product is such a division read. jax is imported inside functions only.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Callable, Mapping

from tullax.spec.ir import Access, Affine, Binary, Expr, IndexVal, Spec, Wrapped, accesses, map_expr, walk
from tullax.spec.sizes import Sym

Env = Mapping[str, Any]


@dataclass(frozen=True)
class Strided:
    """Per window index ``p``: the free index ``m`` it divides with and the stride ``s`` (``pad((m-p)/s)``)."""

    pairs: Mapping[str, tuple[str, int]]


def _division(idx: Any, free: set[str], reduced: set[str]) -> tuple[str, str, int] | None:
    """``(m, p, s)`` for ``pad((m - p)/s)`` with ``m`` free, ``p`` reduced and ``s > 1``, else None."""
    if not (isinstance(idx, Wrapped) and idx.kind == "pad" and idx.inner.div > 1 and idx.inner.const == Sym(0)):
        return None
    terms = dict(idx.inner.terms)
    outs = [n for n, c in terms.items() if c == 1 and n in free]
    wins = [n for n, c in terms.items() if c == -1 and n in reduced]
    if len(terms) != 2 or len(outs) != 1 or len(wins) != 1:
        return None
    return outs[0], wins[0], idx.inner.div


def strided(spec: Spec) -> Strided | None:
    """The window pairs of a spec in the ``strided`` form's shape, or None (see the module docstring)."""
    if spec.scan is not None or spec.assign != ":=" or spec.is_scatter or spec.finalizer is not None \
            or spec.redop != "+" or not spec.reduced:
        return None
    free, reduced = set(spec.free), set(spec.reduced)
    pairs: dict[str, tuple[str, int]] = {}
    for acc in accesses(spec.body):
        names: list[str] = []
        for idx in acc.idx:
            division = _division(idx, free, reduced)
            if division is not None:
                m, p, s = division
                if pairs.setdefault(p, (m, s)) != (m, s):
                    return None
                names += [m, p]
            elif isinstance(idx, Affine) and idx.plain is not None:
                names.append(idx.plain)
            else:
                return None
        if len(names) != len(set(names)):  # an index on two axes of one read
            return None
    paired = {m for m, _ in pairs.values()}
    if set(pairs) != reduced or len(paired) != len(pairs) \
            or any(isinstance(node, IndexVal) and node.name in reduced | paired for node in walk(spec.body)):
        return None
    # every term with p != m mod s must vanish: a factor of the product reads through p's division
    divisions = [_division(idx, free, reduced) for factor in _factors(spec.body) if isinstance(factor, Access)
                 for idx in factor.idx]
    if {d[1] for d in divisions if d is not None} != reduced:
        return None
    return Strided(MappingProxyType(pairs))


def _factors(expr: Expr) -> list[Expr]:
    """The factors of a product, a quotient's numerator included."""
    if isinstance(expr, Binary) and expr.op == "*":
        return _factors(expr.lhs) + _factors(expr.rhs)
    if isinstance(expr, Binary) and expr.op == "/":
        return _factors(expr.lhs)
    return [expr]


def lower_strided(spec: Spec, found: Strided, plain: Callable[[Env], Any], env: Env) -> Any:
    """``spec`` on the split grid (see the module docstring); the plain lowering where a range does not start
    at 0, a window is longer than its stride, or a value is complex."""
    import jax.numpy as jnp
    from jax import lax

    from tullax.backends.xla import lower as xla

    ctx, dtype = xla._context(spec, env)
    size = dict(zip(ctx.grid.names, ctx.grid.size))
    if ctx.complex_names or ctx.grid.empty or any(lo != 0 for lo in ctx.grid.lo) \
            or any(size[p] > s for p, (_, s) in found.pairs.items()):
        return plain(env)
    split = {m: (p, s) for p, (m, s) in found.pairs.items()}
    window = {p: m for p, (m, _) in found.pairs.items()}
    high = {m: -(-size[m] // s) for m, (_, s) in split.items()}  # m div s runs to ceil(M/s)
    names: list[str] = []
    sizes: list[int] = []
    for name in spec.free:
        parts = [(f"{name}#h", high[name]), (f"{name}#r", split[name][1])] if name in split else [(name, size[name])]
        names += [n for n, _ in parts]
        sizes += [e for _, e in parts]

    def to(value: Any, axis: int, extent: int) -> Any:  # the first ``extent`` along ``axis``, zeros past the end
        have = value.shape[axis]
        if have > extent:
            return lax.slice_in_dim(value, 0, extent, axis=axis)
        if have < extent:
            return jnp.pad(value, [(0, extent - have if a == axis else 0) for a in range(value.ndim)])
        return value

    env2 = dict(env)
    made: dict[Access, Access] = {}
    for k, acc in enumerate(dict.fromkeys(accesses(spec.body))):
        value = ctx.array(acc.array)
        labels: list[str] = []
        for axis in reversed(range(len(acc.idx))):  # last first: a reshape shifts only the axes after it
            idx = acc.idx[axis]
            division = _division(idx, set(spec.free), set(spec.reduced))
            if division is not None:
                value, labels = to(value, axis, high[division[0]]), [f"{division[0]}#h"] + labels
                continue
            name = idx.plain
            if name in split:
                s = split[name][1]
                value = to(to(value, axis, size[name]), axis, high[name] * s)
                value = value.reshape(value.shape[:axis] + (high[name], s) + value.shape[axis + 1:])
                labels = [f"{name}#h", f"{name}#r"] + labels
            elif name in window:
                m = window[name]
                value, labels = to(to(value, axis, size[name]), axis, split[m][1]), [f"{m}#r"] + labels
            else:
                value, labels = to(value, axis, size[name]), [name] + labels
        env2[f"{acc.array}#{k}"] = value
        made[acc] = Access(f"{acc.array}#{k}", tuple(Affine.index(label) for label in labels), acc.span)
    grid = xla._Grid(tuple(names), (0,) * len(names), tuple(sizes))
    body = map_expr(spec.body, lambda node: made.get(node, node) if isinstance(node, Access) else node)
    ctx2 = replace(ctx, env=MappingProxyType(env2), grid=grid)
    value = jnp.broadcast_to(xla._as_array(xla._body(ctx2, body), ctx.body_dtype), tuple(sizes))
    for m, (p, s) in split.items():  # no term where m mod s is past the window
        if size[p] < s:
            axis = names.index(f"{m}#r")
            keep = (jnp.arange(s) < size[p]).reshape([s if a == axis else 1 for a in range(len(names))])
            value = jnp.where(keep, value, jnp.zeros((), value.dtype))
    merged = tuple(high[n] * split[n][1] if n in split else size[n] for n in spec.free)
    value = value.reshape(merged)
    for axis, name in enumerate(spec.free):
        value = to(value, axis, size[name])
    return value.astype(dtype)
