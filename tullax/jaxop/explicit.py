"""A kernel's result type under JAX's explicit sharding (``AxisType.Explicit``: shardings are part of the types,
``jax.typeof(x)`` is ``f32[8@x,16]``).

The result is sharded by the kernel's partitioning rule (``tullax.jaxop.partition_rule``), as the partitioner
then runs it (``tullax.jaxop.partition``): a result axis of a free index takes the mesh axes its inputs split
that index along; a summed index split across devices is combined by its collective, so the result is whole
along it. What the rule cannot run split (an axis read shifted, through an index array, as a value, ...; one
index split along two different mesh axes; one mesh axis splitting two result axes; an index split in blocks
its extent does not divide) is a TullaxError at trace time saying what to reshard: explicit mode moves no data
the program did not ask for.
"""
from __future__ import annotations

from typing import Any, Sequence

from tullax.errors import TullaxError
from tullax.spec.ir import Spec


def explicit_sharding(spec: Spec, avals: Sequence[Any], shape: Sequence[int]) -> Any | None:
    """The result's NamedSharding (on the inputs' abstract mesh) for a result of ``shape``, when an input is
    split along an explicit mesh axis; None otherwise (Auto mode, or nothing split). A result axis its mesh axes
    do not divide is a TullaxError (the partitioner would run that split on the whole axis, gathered)."""
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    from tullax.jaxop.partition_rule import factors
    from tullax.spec.text import format_spec

    rule = factors(spec)
    linked = {halo[0]: halo[1] for halo in rule.halo}
    mesh = None
    split: dict[str, tuple[tuple[str, ...], str]] = {}  # factor -> (mesh axes, which input axis)
    for item, mapping, aval in zip(spec.inputs, rule.operands, avals):
        sharding = getattr(aval, "sharding", None)
        pspec, on = getattr(sharding, "spec", None), getattr(sharding, "mesh", None)
        if item.kind == "shape" or pspec is None or on is None:
            continue
        explicit = {name for name, kind in zip(on.axis_names, on.axis_types) if kind == AxisType.Explicit}
        for axis, factor in enumerate(mapping):
            entry = pspec[axis] if axis < len(pspec) else None
            axes = tuple(a for a in ((entry,) if isinstance(entry, str) else entry or ()) if a in explicit)
            if not axes:
                continue
            mesh, where = on, f"{item.name}'s axis {axis}"
            factor = linked.get(factor, factor)
            if factor not in rule.free and factor not in rule.summed:
                raise TullaxError(
                    f"{format_spec(spec)}: {where} is split along mesh axis {_names(axes)} (explicit sharding), but "
                    "the kernel needs that axis whole on every device (it is read shifted, strided, through an "
                    "index array, or its index's value or extent is read), and explicit mode gathers nothing by "
                    f"itself. Reshard it first, e.g. jax.sharding.reshard({item.name}, P(...)) with None at axis "
                    f"{axis}, or use a mesh of AxisType.Auto, where the partitioner gathers it for you.")
            if factor in split and split[factor][0] != axes:
                raise TullaxError(
                    f"{format_spec(spec)}: index {rule.index_of.get(factor, factor)} is split along mesh axis "
                    f"{_names(split[factor][0])} in {split[factor][1]} but along {_names(axes)} in {where}: reshard "
                    "one of them (jax.sharding.reshard) so that both split it alike, or neither.")
            split[factor] = (axes, where)
    if mesh is None:
        return None
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    _divided(spec, rule, avals, shape, split, sizes)
    entries: list[Any] = []
    used: dict[str, str] = {}
    for factor in rule.result:
        axes = split[factor][0] if factor in split and factor in rule.free else ()
        for axis in axes:
            if axis in used:
                raise TullaxError(
                    f"{format_spec(spec)}: mesh axis {axis!r} splits both index {used[axis]} and index "
                    f"{rule.index_of.get(factor, factor)} of the result, which no array can be: reshard one input "
                    "(jax.sharding.reshard) so that at most one of them is split along it.")
            used[axis] = rule.index_of.get(factor, factor)
        entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return NamedSharding(mesh, PartitionSpec(*entries))


def _divided(spec: Spec, rule: Any, avals: Sequence[Any], shape: Sequence[int], split: dict,
             sizes: dict[str, int]) -> None:
    """A TullaxError unless the mesh axes splitting each index divide its extent in every array it is plain in
    and in the result: the partitioner runs an uneven split on the whole axis, a gather explicit mode does not
    make by itself."""
    from tullax.spec.text import format_spec

    arrays = [(item.name, mapping, tuple(aval.shape)) for item, mapping, aval in zip(spec.inputs, rule.operands, avals)
              if item.kind != "shape"] + [(f"the result {spec.out}", rule.result, tuple(shape))]
    for factor, (axes, where) in split.items():
        parts = 1
        for axis in axes:
            parts *= sizes[axis]
        for name, mapping, extents in arrays:
            for position, (found, extent) in enumerate(zip(mapping, extents)):
                if found == factor and extent % parts:
                    index = rule.index_of.get(factor, factor)
                    raise TullaxError(
                        f"{format_spec(spec)}: index {index} is split along mesh axis {_names(axes)} ({parts} "
                        f"devices, in {where}), which does not divide {name}'s axis {position} ({extent} elements), "
                        "and explicit mode gathers nothing by itself. Reshard the input(s) split along it "
                        f"(jax.sharding.reshard) so that index {index} is whole, or give it an extent {parts} "
                        "divides (pad the arrays).")


def untyped(ctx: Any) -> tuple[Any, Any]:
    """``ctx`` (a lowering rule's context) with its values' sharding types dropped, and the context manager to
    lower in: a kernel's lowering slices, reshapes and runs XLA's forms on whole arrays, split afterwards by the
    partitioner (``tullax.jaxop.partition``), which explicit mode's type checks of those ops would refuse."""
    import contextlib

    from jax._src import core
    from jax._src import mesh as mesh_lib
    from jax.sharding import AxisType

    def explicit(aval: Any) -> bool:
        on = getattr(getattr(aval, "sharding", None), "mesh", None)
        return on is not None and AxisType.Explicit in tuple(getattr(on, "axis_types", ()))

    if not any(explicit(a) for a in (*ctx.avals_in, *ctx.avals_out)):
        return ctx, contextlib.nullcontext()

    def plain(aval: Any) -> Any:
        return core.ShapedArray(aval.shape, aval.dtype, weak_type=aval.weak_type) if explicit(aval) else aval

    with mesh_lib.use_abstract_mesh(mesh_lib.empty_abstract_mesh):
        stripped = ctx.replace(avals_in=[plain(a) for a in ctx.avals_in], avals_out=[plain(a) for a in ctx.avals_out])
    return stripped, mesh_lib.use_abstract_mesh(mesh_lib.empty_abstract_mesh)


def _names(axes: tuple[str, ...]) -> str:
    return repr(axes[0]) if len(axes) == 1 else repr(axes)


__all__ = ["explicit_sharding"]
