"""vmap of a kernel as a spec transform: one batched kernel instead of a loop over the batch.

``batch_spec(spec, batched_axes)`` gives every batched input a new index at its batch axis and the output a
new FIRST free index over the batch:

    D[i,j] := (W[k,i] - X[k,j])^2      batched_axes=(0, None)  ->  D[b,i,j] := (W[b,k,i] - X[k,j])^2
    y[i] := a*x[i]                     batched_axes=(0, 0)     ->  y[b,i] := a[b]*x[b,i]     (scalar -> rank 1)
    ΔW[ix[j],d] += Δo[j,d]             batched_axes=(0, 0, 0)  ->  ΔW[b,ix[j+n*b],d] += Δo[b,j,d]

The batch index runs over the batch axis of a batched input (plain occurrences of it in several inputs add
agreements, so mismatched batch sizes are a ShapeError like any other). For '=' and '+=' the given array
(input 0, which becomes the result) must be batched at axis 0: ``batch_arguments`` arranges that.

Index arrays have rank 1 in the grammar, so a batched index array of shape (B, n) is passed flattened to
(B*n,) and read at ``n*b + e``; its per-example extent ``n`` becomes a constant of the batched spec. With
n == 1 (one lookup per example) this is exactly the gather ``out[b,d] := W[ix[b],d]``.

``batch_arguments`` is the data side of the same rule: it moves, flattens or broadcasts the few arguments
that need it (never the data arrays, whose batch axis may be anywhere) and returns the batch axes to use.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

from tullax.errors import ShapeError
from tullax.spec.ir import (
    Access,
    Affine,
    Agreement,
    Expr,
    Idx,
    IndexVal,
    Indirect,
    Input,
    Num,
    Param,
    Range,
    Size,
    Spec,
    Wrapped,
    idx_names,
    map_expr,
    spec_accesses,
)
from tullax.spec.sizes import (
    Extent,
    Extremum,
    FloorDiv,
    Sym,
    extremum,
    floordiv,
)


def batch_spec(spec: Spec, batched_axes: Sequence[int | None],
               index_extents: Mapping[str, int] | None = None) -> Spec:
    """The spec computing ``spec`` for every element of a batch at once (see the module docstring).

    ``batched_axes`` has one entry per input: None (shared by the whole batch) or the batch axis of that
    input's batched value (0 for a scalar parameter, whose batched value is a vector; 0 for a flattened index
    array). ``index_extents`` gives the per-example extent of every batched index array."""
    plan = _Plan.make(spec, tuple(batched_axes), dict(index_extents or {}))
    body = map_expr(spec.body, plan.expr)
    finalizer = None if spec.finalizer is None else map_expr(spec.finalizer, plan.expr)
    # the batch is the first output axis (for '='/'+=' the given array is batched at axis 0 to match)
    lhs = (Affine.index(plan.b),) + tuple(plan.idx(i) for i in spec.lhs or ())
    free, reduced = ((), (plan.b,) + spec.reduced) if spec.is_scatter else ((plan.b,) + spec.free, spec.reduced)
    ranges = ((plan.b, Range(Sym(0), plan.extent)),) + tuple(
        (name, Range(plan.sym(r.lo), plan.sym(r.hi))) for name, r in spec.ranges)
    if spec.assign == ":=":
        out_shape = (plan.extent,) + tuple(plan.sym(s) for s in spec.out_shape)
    else:
        out_shape = tuple(Sym.extent(spec.out, d) for d in range(len(spec.lhs or ()) + 1))
    scan = spec.scan if spec.scan is None else replace(spec.scan, axis=spec.scan.axis + 1)
    return replace(spec, body=body, finalizer=finalizer, lhs=lhs, inputs=plan.inputs(), free=free,
                   reduced=reduced, ranges=ranges, agreements=plan.agreements(), out_shape=out_shape, scan=scan)


class _Plan:
    """What happens to each input, and the rewriting of sizes, indices and body nodes that follows."""

    def __init__(self, spec: Spec, b: str, shifted: dict[str, int], flat: dict[str, int], params: set[str]):
        self.spec, self.b = spec, b
        self.shifted = shifted  # array or shape input -> batch axis (an index is inserted there)
        self.flat = flat        # index array -> per-example extent n (read at n*b + e)
        self.params = params    # scalar parameters that become vectors over the batch
        self.extent = self._batch_extent()

    @staticmethod
    def make(spec: Spec, axes: tuple, index_extents: dict[str, int]) -> "_Plan":
        if len(axes) != len(spec.inputs):
            raise ShapeError(f"batch_spec needs one batch axis (or None) per input: {len(spec.inputs)} inputs "
                             f"({', '.join(spec.input_names)}), got {len(axes)}")
        if all(a is None for a in axes):
            raise ShapeError("batch_spec needs at least one batched input")
        shifted, flat, params = {}, {}, set()
        for item, axis in zip(spec.inputs, axes):
            if axis is None:
                continue
            if item.kind == "scalar" or item.kind == "index":
                if axis != 0:
                    raise ShapeError(f"the batched value of {item.name} ({item.kind}) must carry its batch "
                                     f"at axis 0, got {axis}")
                if item.kind == "scalar":
                    params.add(item.name)
                elif item.name not in index_extents:
                    raise ShapeError(f"batching index array {item.name} needs its per-example extent")
                else:
                    flat[item.name] = int(index_extents[item.name])
            elif not 0 <= axis <= item.rank:
                raise ShapeError(f"batch axis {axis} of {item.name} is outside 0..{item.rank}")
            else:
                shifted[item.name] = axis
        if spec.assign != ":=" and shifted.get(spec.out) != 0:
            raise ShapeError(f"for '{spec.assign}' the given array {spec.out} must be batched at axis 0")
        return _Plan(spec, fresh_index(spec), shifted, flat, params)

    # -- the batch index's range -------------------------------------------------------------------
    def _batch_extent(self) -> Sym:
        for item in self.spec.inputs:  # plain axes first, in input order
            if item.name in self.shifted:
                return Sym.extent(item.name, self.shifted[item.name])
            if item.name in self.params:
                return Sym.extent(item.name, 0)
        for name, n in self.flat.items():
            if n > 0:
                return floordiv(Sym.extent(name, 0), n)
        raise ShapeError("cannot batch: every batched input is an empty index array, the batch size is unknown")

    def agreements(self) -> tuple[Agreement, ...]:
        kept = tuple(Agreement(a.index, self.axis(a.first), self.axis(a.second)) for a in self.spec.agreements
                     if a.first[0] not in self.flat and a.second[0] not in self.flat)
        batch_axes = [(name, axis) for name, axis in self.shifted.items()] + [(p, 0) for p in sorted(self.params)]
        return kept + tuple(Agreement(self.b, batch_axes[0], other) for other in batch_axes[1:])

    def axis(self, where: tuple[str, int]) -> tuple[str, int]:
        name, ax = where
        return (name, ax + 1) if name in self.shifted and ax >= self.shifted[name] else where

    def inputs(self) -> tuple[Input, ...]:
        out = []
        for item in self.spec.inputs:
            if item.name in self.params:
                item = Input(item.name, "array", 1)
            elif item.name in self.shifted:
                item = Input(item.name, item.kind, item.rank + 1)
            out.append(item)
        return tuple(out)

    # -- rewriting -----------------------------------------------------------------------------
    def sym(self, size: Sym) -> Sym:
        out = Sym(size.const)
        for atom, coef in size.terms:
            out = out + self._atom(atom) * coef
        return out

    def _atom(self, atom) -> Sym:
        if isinstance(atom, Extent):
            if atom.array in self.flat:
                return Sym(self.flat[atom.array])
            return Sym.extent(*self.axis((atom.array, atom.axis)))
        if isinstance(atom, FloorDiv):
            return floordiv(self.sym(atom.num), atom.den)
        assert isinstance(atom, Extremum)
        return extremum(atom.kind, [self.sym(a) for a in atom.args])

    def affine(self, aff: Affine) -> Affine:
        return replace(aff, const=self.sym(aff.const))

    def idx(self, idx: Idx) -> Idx:
        if isinstance(idx, Affine):
            return self.affine(idx)
        if isinstance(idx, Wrapped):
            return replace(idx, inner=self.affine(idx.inner))
        inner = self.affine(idx.inner)
        n = self.flat.get(idx.array)
        if n:  # row b of the flattened (B*n,) index array
            inner = replace(inner, terms=inner.terms + ((self.b, n),))
        return replace(idx, inner=inner, offset=self.affine(idx.offset))

    def expr(self, node: Expr) -> Expr:
        if isinstance(node, Access):
            idx = tuple(self.idx(i) for i in node.idx)
            if node.array in self.shifted:
                at = self.shifted[node.array]
                idx = idx[:at] + (Affine.index(self.b),) + idx[at:]
            elif self.spec.scan is not None and node.array == self.spec.out:  # a recurrence's self-read
                idx = (Affine.index(self.b),) + idx
            return replace(node, idx=idx)
        if isinstance(node, Param) and node.name in self.params:
            return Access(node.name, (Affine.index(self.b),))
        if isinstance(node, Size):  # the per-example extent: the axis moved by the batch axis
            if node.array in self.flat:
                return Num(self.flat[node.array])
            return replace(node, axis=self.axis((node.array, node.axis))[1])
        if isinstance(node, IndexVal) and node.offset != Sym(0):
            return replace(node, offset=self.sym(node.offset))
        return node


def fresh_index(spec: Spec, base: str = "b") -> str:
    """An index name that no index, input or output of ``spec`` uses (``b``, ``b1``, ``b2`` ...)."""
    taken = set(spec.indices) | set(spec.input_names) | {spec.out}
    for acc in list(spec_accesses(spec)) + [Access(spec.out, spec.lhs or ())]:
        for idx in acc.idx:
            taken |= set(idx_names(idx))
            if isinstance(idx, Indirect):
                taken.add(idx.array)
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}{n}"
    return name


# ---------------------------------------------------------------------------------------------
# The data side of the batching rule (jax arrays or tracers; jax imported lazily)
# ---------------------------------------------------------------------------------------------
def batch_arguments(spec: Spec, args: Sequence[Any], dims: Sequence[int | None],
                    size: int) -> tuple[list[Any], tuple[int | None, ...], dict[str, int]]:
    """(arguments for the batched kernel, their batch axes, per-example extents of batched index arrays).

    Data arrays keep their batch axis wherever vmap put it: the batched spec indexes them there, nothing
    moves. Only index arrays (flattened), the given array of '='/'+=' (batch axis moved to 0, or broadcast
    when unbatched: it becomes the per-example result) and scalar parameters (already vectors) are touched."""
    import jax.numpy as jnp

    new_args, axes, extents = [], [], {}
    for pos, (item, arg, dim) in enumerate(zip(spec.inputs, args, dims)):
        given = pos == 0 and spec.assign != ":="
        if spec.scan is not None and item.name == spec.scan.init:  # laid out as the result: batch axis first
            given, lead = True, 0 if spec.scan.depth == 1 else 1  # (after a depth axis)
            arg = jnp.broadcast_to(arg, (size,) + tuple(arg.shape)) if dim is None else jnp.moveaxis(arg, dim, 0)
            new_args.append(jnp.moveaxis(arg, 0, lead))
            axes.append(lead)
            continue
        if dim is None and given:
            arg, dim = jnp.broadcast_to(arg, (size,) + tuple(arg.shape)), 0
        elif dim is not None and (given or item.kind == "index"):
            arg = jnp.moveaxis(arg, dim, 0)
            dim = 0
            if item.kind == "index":
                extents[item.name] = int(arg.shape[1]) if arg.ndim > 1 else 1
                arg = arg.reshape(-1)
        new_args.append(arg)
        axes.append(dim)
    return new_args, tuple(axes), extents


__all__ = ["batch_spec", "batch_arguments", "fresh_index"]
