"""A tullax kernel under JAX's SPMD partitioner: ``jax.experimental.custom_partitioning`` with the Shardy rule of
its index notation (``tullax.jaxop.partition_rule``), so sharded inputs are not gathered onto every device.

Used by the kernel's lowering (``tullax.jaxop.primitives``) for a program over several devices, for every kernel a
tullax primitive binds: forward, gradient steps and batched (vmapped) kernels alike, since grad and vmap have
already become tullax kernels by the time their program is lowered.

Shardy propagates shardings through the rule (one factor per index); ``_partition`` then takes the mesh axes
that the operands (or the result) split each index along, keeps those the kernel can run split, and returns the
function each device runs on its blocks: the same kernel (compiled for the per-shard shapes, which are static),
then, where a summed index is split, the reduction's collective (``combine``).

Every backend's kernel is split: the c backend's custom call on CPU devices (path ``ffi-only``: no callback), a
kernel that runs through a Python callback (numba, julia, a c kernel its custom call does not serve, a cuda
kernel on its GPU) through a relay registered with the whole program (``tullax.jaxop.relay``: a callback
registered by the per-shard module alone would never be called), and XLA's forms (XLA's ops, split by this rule
rather than by XLA's partitioner, which gathers a whole operand for some of them).
"""
from __future__ import annotations

from functools import lru_cache, partial
from typing import Any, Callable, Sequence

from tullax.jaxop.halo import Halo, fits, frame, halo_sizes, window
from tullax.jaxop.partition_rule import Factors, factors
from tullax.jaxop.swap_window import swapped

Run = Callable[..., Any]  # run(op, *jax values) -> the kernel's result


def spmd_devices(ctx: Any) -> int:
    """How many devices the SPMD partitioner splits ``ctx``'s program over (1: none, or a shard_map body, whose
    kernels already run on their blocks)."""
    from jax._src import sharding_impls

    context = ctx.module_context.axis_context
    if isinstance(context, sharding_impls.ShardingContext):
        return int(context.num_devices)
    if isinstance(context, sharding_impls.SPMDAxisContext) and \
            set(context.manual_axes) != set(context.mesh.axis_names):
        return int(context.mesh.size)
    return 1


def partitioned(op: Any, run: Run) -> Callable[..., Any]:
    """``run(op, *args)`` as a custom_partitioning function of the args (one per spec input)."""
    return partial(_call, op, run, _partitioned)


def relayed(ctx: Any, op: Any, run: Callable[..., Any]) -> Callable[..., Any]:
    """``run(relay, op, *args)`` as a custom_partitioning function of the args, with a relay registered in the
    program ``ctx`` lowers (``tullax.jaxop.relay``): a kernel that runs through a Python callback."""
    from tullax.jaxop.relay import relay_for

    return partial(_call, op, partial(run, relay_for(ctx)), _partitioned.__wrapped__)  # one per call: not cached


def _call(op: Any, run: Run, make: Callable[..., Any], *args: Any) -> Any:
    """The windowed axes (``x[i+k]``, ``Δy[pad(m-k)]``) the partitioner may split with their index: those whose
    halo is shorter than the axis and whose index no other axis of the input carries (``tullax.jaxop.halo``).
    Several axes of one input (``x[i+k,j+l]``) are exchanged one after the other, so the corners come with the
    second."""
    shapes = {item.name: tuple(a.shape) for item, a in zip(op.spec.inputs, args)}
    spec = swapped(op.spec, shapes)  # a window over a long summed index: over its own short axis instead
    if spec is not op.spec:
        from dataclasses import replace

        op = replace(op, spec=spec)
    rule = factors(op.spec, shapes)
    halos = halo_sizes(op.spec, rule, shapes)
    windows = []
    for k, mapping in enumerate(rule.operands):
        taken = set(mapping)
        for axis, factor in enumerate(mapping):
            halo = halos.get(factor)
            if halo is not None and (halo.pad and halo.hi - halo.lo < halo.extent or 0 < halo.hi < args[k].shape[axis])\
                    and halo.split not in taken:  # a window no longer than its index's extent
                taken.add(halo.split)
                windows.append((k, axis))
    return make(op, run, tuple(windows), tuple(sorted(shapes.items())))(*args)


@lru_cache(maxsize=None)
def _partitioned(op: Any, run: Run, windows: tuple = (), shapes: tuple = ()) -> Callable[..., Any]:
    from jax.experimental.custom_partitioning import SdyShardingRule, custom_partitioning

    rule = _with_windows(factors(op.spec, dict(shapes)), windows)
    order = {f: k for k, f in enumerate(dict.fromkeys(f for axes in (*rule.operands, rule.result) for f in axes))}
    function = custom_partitioning(partial(run, op))
    function.def_partition(  # Shardy wants each kind's factors in the order they first appear in the rule
        partition=partial(_partition, op, rule, run, windows),
        sharding_rule=SdyShardingRule(operand_mappings=rule.operands, result_mappings=(rule.result,),
                                      reduction_factors=tuple(sorted(rule.summed, key=order.get)),
                                      need_replication_factors=tuple(sorted(rule.replicated, key=order.get))),
    )
    return function


def _with_windows(rule: Factors, windows: tuple) -> Factors:
    """The rule Shardy propagates by: a windowed axis ``_call`` kept takes the factor of the index split with
    it (longer or shorter than the index's other axes by its halo: Shardy sizes the factor by the shortest), so
    the input and the result are split alike, each as it stands; a windowed axis not kept stays whole."""
    from dataclasses import replace

    linked = {halo[0]: halo[1] for halo in rule.halo}
    operands = [list(axes) for axes in rule.operands]
    kept = set()
    for k, axis in windows:
        kept.add(operands[k][axis])
        operands[k][axis] = linked[operands[k][axis]]
    uncut = {f for f in linked if f not in kept}
    whole = {linked[f] for f in uncut}  # an index whose window is not exchanged is never split
    return replace(rule, operands=tuple(map(tuple, operands)), free=tuple(f for f in rule.free if f not in whole),
                   summed=tuple(f for f in rule.summed if f not in whole),
                   replicated=tuple(sorted({*rule.replicated, *uncut, *whole})))


def _entries(sharding: Any, rank: int) -> list[tuple[str, ...]]:
    """The mesh axes each axis of an array is split along (a NamedSharding's spec; nothing for another kind)."""
    spec = getattr(sharding, "spec", None)
    if spec is None:
        return [()] * rank
    found = []
    for k in range(rank):
        entry = spec[k] if k < len(spec) else None
        found.append(() if entry is None else (entry,) if isinstance(entry, str) else tuple(entry))
    return found


def _partition(op: Any, rule: Factors, run: Run, windows: tuple, mesh: Any, arg_shapes: Sequence[Any],
               result_shape: Any):
    """``rule``: Shardy's (``_with_windows``): a kept windowed axis carries its index's factor."""
    from jax.sharding import NamedSharding, PartitionSpec

    kinds = [item.kind for item in op.spec.inputs]
    globals_ = {item.name: tuple(s.shape) for item, s in zip(op.spec.inputs, arg_shapes)}
    plain = factors(op.spec, globals_)
    halos = {f: v for f, v in halo_sizes(op.spec, plain, globals_).items()
             if any(plain.operands[k][axis] == f for k, axis in windows)}
    unkept = {halo[1] for halo in plain.halo if halo[0] not in halos}  # an index whose window stays whole
    splittable = set(rule.free) | set(rule.summed)
    assign: dict[str, tuple[str, ...]] = {}
    used: set[str] = set()
    for shape, mapping, kind in [*zip(arg_shapes, rule.operands, kinds), (result_shape, rule.result, "")]:
        if kind == "shape":
            continue
        for factor, axes in zip(mapping, _entries(shape.sharding, len(shape.shape))):
            if factor in splittable and factor not in assign and axes and not used & set(axes):
                assign[factor] = axes
                used |= set(axes)
    while True:  # drop a split the kernel cannot run on blocks of, until every split left can
        shard_spec = _summed_windows(op.spec, plain, halos, assign, globals_)
        bad = next((f for f in unkept if f in assign), None) or \
            (shard_spec if isinstance(shard_spec, str) else None) or \
            _costly_rows(op.spec, plain, assign, globals_, result_shape) or \
            _unfit(shard_spec, plain, mesh, assign, globals_, tuple(result_shape.shape), halos)
        if bad is None:
            break
        del assign[bad]
    rows = tuple(([item.name for item in op.spec.inputs].index(ix), assign[f],
                  _row_extent(f, plain, globals_, op.spec, result_shape) // _parts(mesh, assign[f]))
                 for f, ix in plain.rows if f in assign)
    if rows:
        shard_spec = _padded_rows(shard_spec)
    if shard_spec is not op.spec:
        from dataclasses import replace

        op = replace(op, spec=shard_spec)

    def spec_of(mapping: Sequence[str]) -> Any:
        return PartitionSpec(*[None if f not in assign else assign[f][0] if len(assign[f]) == 1 else assign[f]
                               for f in mapping])

    arg_shardings = tuple(shape.sharding if kind == "shape" and isinstance(shape.sharding, NamedSharding)
                          else NamedSharding(mesh, spec_of(mapping))
                          for shape, mapping, kind in zip(arg_shapes, rule.operands, kinds))
    result_sharding = NamedSharding(mesh, spec_of(rule.result))
    # an index split with padded windows runs over its frame, [lo, B + hi) around its block, in every array it
    # reads (windows exchanged, plain axes padded here with zeros, a shape input's axis grown); then the kernel's
    # result keeps its block (``grown``): the positions around it are another device's
    grow = {f: span for f, span in frame(halos.values()).items() if f in assign and f in plain.free}
    shape_inputs = {k: (_local(globals_[item.name], mapping, assign, mesh, halos, grow), arg_shapes[k].dtype)
                    for k, (item, mapping) in enumerate(zip(op.spec.inputs, plain.operands)) if item.kind == "shape"}
    widened = tuple((k, axis, -grow[f][0], grow[f][1]) for k, (item, mapping) in
                    enumerate(zip(op.spec.inputs, plain.operands)) if item.kind != "shape"
                    for axis, f in enumerate(mapping) if f in grow)
    grown = tuple((axis, -grow[f][0], result_shape.shape[axis] // _parts(mesh, assign[f]))
                  for axis, f in enumerate(rule.result) if f in grow)
    summed_axes = tuple(axis for f in rule.summed if f in assign for axis in assign[f])
    shifted = tuple((k, axis, axes, _parts(mesh, axes), globals_[op.spec.inputs[k].name][axis],
                     halos[plain.operands[k][axis]])
                    for k, axis in windows for axes in [assign.get(rule.operands[k][axis], ())])
    lower = partial(_per_shard, op, run, shape_inputs, summed_axes, rule.combine, shifted, widened, grown, rows)
    return mesh, lower, result_sharding, arg_shardings


def _costly_rows(spec: Any, rule: Factors, assign: dict, shapes: dict, result_shape: Any) -> str | None:
    """A table's rows split where the psum of the result would move more than gathering the table does (more
    lookups than the table holds rows: each device then reads the whole table, as the partitioner gathers it),
    or None."""
    import math

    for factor, _ in rule.rows:
        if factor in assign and factor not in rule.result:
            table = next(item.name for item, mapping in zip(spec.inputs, rule.operands) if factor in mapping)
            if math.prod(result_shape.shape) > math.prod(shapes[table]):
                return factor
    return None


def _row_extent(factor: str, rule: Factors, shapes: dict, spec: Any, result_shape: Any) -> int:
    """The whole extent of a table axis split by rows (``rule.rows``): the result's, or the input's."""
    if factor in rule.result:
        return int(result_shape.shape[rule.result.index(factor)])
    return next(shapes[item.name][mapping.index(factor)] for item, mapping in zip(spec.inputs, rule.operands)
                if factor in mapping)


def _padded_rows(spec: Any) -> Any:
    """``spec`` with its index-array positions padded (``W[pad(ix[b]),d]``): each device's shifted index array
    points outside its block of rows for the rows it does not hold, which then read zero (a scatter drops them)."""
    from dataclasses import replace

    from tullax.spec.ir import Access, Indirect, map_expr

    def padded(idx: Any) -> Any:
        return replace(idx, pad=True) if isinstance(idx, Indirect) else idx

    def visit(node: Any) -> Any:
        return replace(node, idx=tuple(map(padded, node.idx))) if isinstance(node, Access) else node

    lhs = tuple(map(padded, spec.lhs)) if spec.lhs is not None else None
    return replace(spec, body=map_expr(spec.body, visit), lhs=lhs)


def _summed_windows(spec: Any, rule: Factors, halos: dict[str, Halo], assign: dict, shapes: dict) -> Any:
    """The spec each device runs where a summed index is split with padded windows (``Δw[k] := Δy[i]*x[pad(i+k-2)]``
    split along ``i``): its block of ``i``, read plainly (``Δy``'s block) from 0, and the windows it receives,
    which start ``lo`` before the block (``tullax.jaxop.halo``), read ``-lo`` further on (``x[pad(i+k)]``); the
    index's range is its plain axis's extent (a window's array holds more than the block). ``spec`` itself
    where there is none; the factor to drop where its range is not that axis's extent."""
    from dataclasses import replace

    from tullax.spec.ir import Access, Wrapped, map_expr
    from tullax.spec.sizes import Sym

    index_of = rule.index_of
    ranges = dict(spec.ranges)
    shifts = {}
    for factor, (lo, _) in frame(halos.values()).items():
        if factor not in assign or factor not in rule.summed:
            continue
        index = index_of[factor]
        plain = [(item.name, axis) for item, mapping in zip(spec.inputs, rule.operands) if item.kind != "shape"
                 for axis, f in enumerate(mapping) if f == factor]
        if not plain or any(shapes[name][axis] != ranges[index].hi.eval(shapes) for name, axis in plain):
            return factor
        ranges[index] = replace(ranges[index], hi=Sym.extent(*plain[0]))
        shifts[index] = -lo
    if not shifts:
        return spec
    for index, found in list(ranges.items()):  # another index's range over the arrays' extents, which each device
        # holds a part of (Δw[k] := Δy[i]*x[pad(i+k-2)]: k's reads x's and Δy's): the whole call's
        if index not in shifts and found.hi.arrays():
            ranges[index] = replace(found, hi=Sym(found.hi.eval(shapes)))
    out_shape = tuple(Sym(n.eval(shapes)) if spec.assign == ":=" and n.arrays() else n for n in spec.out_shape)

    def shifted(node: Any) -> Any:
        if not isinstance(node, Access):
            return node
        idx = tuple(replace(i, inner=replace(i.inner, const=i.inner.const + shifts[name]))
                    if isinstance(i, Wrapped) and (name := next((n for n in i.inner.names() if n in shifts), None))
                    else i for i in node.idx)
        return replace(node, idx=idx)

    return replace(spec, body=map_expr(spec.body, shifted), ranges=tuple(ranges.items()), out_shape=out_shape)


def _parts(mesh: Any, axes: Sequence[str]) -> int:
    sizes = dict(mesh.shape)
    parts = 1
    for axis in axes:
        parts *= sizes[axis]
    return parts


def _local(shape: Sequence[int], mapping: Sequence[str], assign: dict, mesh: Any,
           halos: dict[str, Halo] | None = None, grow: dict | None = None) -> tuple[int, ...]:
    """Per-shard extents; a windowed axis split with its index: the index's block and the halo; an axis of an
    index split with padded windows (``grow``): its block and the frame around it."""
    local = []
    for extent, factor in zip(shape, mapping):
        if halos and factor in halos and halos[factor].split in assign:
            halo = halos[factor]
            local.append(halo.extent // _parts(mesh, assign[halo.split]) + halo.hi - halo.lo)
        elif grow and factor in grow:
            local.append(extent // _parts(mesh, assign[factor]) + grow[factor][1] - grow[factor][0])
        else:
            local.append(extent // _parts(mesh, assign.get(factor, ())))
    return tuple(local)


def _unfit(spec: Any, rule: Factors, mesh: Any, assign: dict, shapes: dict, result: tuple[int, ...],
           halos: dict[str, Halo]) -> str | None:
    """A split factor the kernel cannot run on blocks of (an extent the split does not divide, an index whose
    range is not its axes' whole extent, a result whose per-shard shape is not its block, a halo one neighbour
    does not hold), or None."""
    index_of = rule.index_of
    for item, mapping in zip(spec.inputs, rule.operands):
        for extent, factor in zip(shapes[item.name], mapping):
            split = halos[factor].split if factor in halos else ""
            if split in assign and not fits(extent, halos[factor], _parts(mesh, assign[split])):
                return split
    grow = {f: span for f, span in frame(halos.values()).items() if f in assign and f in rule.free}
    local = {item.name: _local(shapes[item.name], mapping, assign, mesh, halos, grow)
             for item, mapping in zip(spec.inputs, rule.operands)}
    ran: dict[str, int] = {}  # a grown index: how far the kernel runs it on each device
    sizes = dict(mesh.shape)
    for factor, axes in assign.items():
        parts = 1
        for axis in axes:
            parts *= sizes[axis]
        index = index_of.get(factor)
        extents = [n for item, mapping in zip(spec.inputs, rule.operands) for n, f in zip(shapes[item.name], mapping)
                   if f == factor] + [n for n, f in zip(result, rule.result) if f == factor]
        if any(factor == f for f, _ in rule.rows):  # a table's rows: any block
            if any(n % parts for n in extents):
                return factor
            continue
        found = spec.range_of.get(index)
        if index is None or found is None or any(n % parts for n in extents):
            return factor
        try:
            whole = (found.lo.eval(shapes), found.hi.eval(shapes))
            block = (found.lo.eval(local), found.hi.eval(local))
        except (KeyError, IndexError):
            return factor
        if whole[0] != 0 or block[0] != 0 or any(whole[1] != n for n in extents):
            return factor
        if factor in grow:  # the block and the frame after it at most: the plain axes' length
            lo, hi = grow[factor]
            if whole[1] % parts or not whole[1] // parts - lo <= block[1] <= whole[1] // parts + hi - lo:
                return factor
            ran[factor] = block[1]
        elif block[1] * parts != whole[1]:
            return factor
    try:
        out = tuple(s.eval(local) for s in spec.out_shape) if spec.assign == ":=" else None
    except (KeyError, IndexError):
        return next(iter(assign), None)
    expected = tuple(ran.get(f, n) for n, f in zip(_local(result, rule.result, assign, mesh), rule.result))
    if out is not None and out != expected:
        return next((f for f in rule.result if f in assign), next(iter(assign), None))
    return None


def _per_shard(op: Any, run: Run, shape_inputs: dict, summed_axes: tuple[str, ...], combine: str,
               windows: tuple, widened: tuple, grown: tuple, rows: tuple, *args: Any):
    """What each device runs on its blocks: the kernel (a windowed read on its window, its block and what its
    neighbours send, ``tullax.jaxop.halo``), then the collective over the devices a summed index is split
    across. A '+=' update adds its given array once, after the collective."""
    import jax.numpy as jnp
    from jax import lax

    args = [jnp.zeros(*shape_inputs[k]) if k in shape_inputs else a for k, a in enumerate(args)]
    for k, axis, mesh_axes, parts, extent, halo in windows:
        args[k] = window(args[k], axis, mesh_axes, parts, extent, halo)
    for k, mesh_axes, block in rows:  # this device's rows of a table: positions from its block's start
        start = lax.axis_index(tuple(mesh_axes) if len(mesh_axes) > 1 else mesh_axes[0]) * block
        args[k] = args[k] - start.astype(args[k].dtype)
    for k, axis, front, back in widened:  # read at the frame's positions, whose results are dropped
        widths = [(0, 0)] * args[k].ndim
        widths[axis] = (front, back)
        args[k] = jnp.pad(args[k], widths)
    given = None
    if summed_axes and op.spec.assign == "+=" and not op.zero_start:
        given, args[0] = args[0], jnp.zeros_like(args[0])
    out = run(op, *args)
    for axis, start, length in grown:  # a padded window's index ran from before its block: the block
        out = lax.slice_in_dim(out, start, start + length, axis=axis)
    if not summed_axes:
        return out
    out = _combine(out, summed_axes, combine)
    return out if given is None else (given + out).astype(out.dtype)


def _combine(value: Any, axes: tuple[str, ...], combine: str) -> Any:
    import jax.numpy as jnp
    from jax import lax

    if combine == "psum":
        return lax.psum(value, axes)
    if combine == "pmax":
        return lax.pmax(value, axes)
    if combine == "pmin":
        return lax.pmin(value, axes)
    # logsumexp: shifted by the largest block's value, so no block's exp overflows; an all -inf (or inf) row
    # keeps its value
    top = lax.pmax(value, axes)
    shift = jnp.where(jnp.isfinite(top), top, jnp.zeros_like(top))
    return (shift + jnp.log(lax.psum(jnp.exp(value - shift), axes))).astype(value.dtype)


__all__ = ["partitioned", "spmd_devices"]
