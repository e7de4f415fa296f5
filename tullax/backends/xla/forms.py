"""The XLA forms of a spec (``tullax.backends.xla.recognise`` says which apply and what each is) as plain jnp/lax
functions of the inputs: differentiable, jit-able, vmap-able. jax is imported inside functions only."""
from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

from tullax.backends.xla.recognise import (
    MAX_UNROLL,
    ConvShape,
    conv_shape,
    cut_shapes,
    cuttable,
    factor_indices,
    forms,
    points,
    product_terms,
    window_index,
)
from tullax.spec.ir import Spec

CHUNK_POINTS = 1 << 20  # the factored form works in blocks whose largest factor has at most this many points

Env = Mapping[str, Any]


# ---------------------------------------------------------------------------------------------
# The lowerings
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1024)
def lower_form(spec: Spec, form: str) -> Callable[[Env], Any]:
    """``fn(env) -> jax.Array`` computing ``spec`` in ``form`` (one of ``forms(spec)``); 'einsum' and 'grid'
    are tullax's plain lowering. A form whose preconditions fail for the call's shapes (an index range that
    does not start at 0, an empty range) falls back to the plain lowering at trace time."""
    from tullax.backends.xla import lower as xla

    plain = xla.lower(spec)
    if form in ("einsum", "grid", ""):
        return plain
    if form == "product":
        return xla.lower(spec, einsum=False, grid="appearance")
    if form in ("conv", "conv-padded"):
        shape = conv_shape(spec)
        if shape is None:
            raise ValueError(f"{spec.out}: not a convolution")
        return functools.partial(_conv, spec, shape, plain, padded=form == "conv-padded")
    if form == "slices":
        index = window_index(spec)
        if index is None:
            raise ValueError(f"{spec.out}: no window index to unroll")
        return functools.partial(_slices, spec, index, plain)
    if form == "rearrange":
        from tullax.backends.xla.rearrange import lower_rearrange, rearrangement

        read = rearrangement(spec)
        if read is None:
            raise ValueError(f"{spec.out}: not a rearrangement")
        return functools.partial(lower_rearrange, spec, read, plain, setup=_setup)
    if form == "strided":
        from tullax.backends.xla.strided import lower_strided, strided

        found = strided(spec)
        if found is None:
            raise ValueError(f"{spec.out}: no strided windows")
        return functools.partial(lower_strided, spec, found, plain)
    if form == "associative":
        from tullax.backends.xla.associative import lower_associative

        return lower_associative(spec, xla.lower, xla._dtype_of)
    if form == "factored":
        if product_terms(spec) is None:
            raise ValueError(f"{spec.out}: not a sum of products")
        return functools.partial(_factored, spec, plain)
    if form == "expanded":  # the opt-in algebra="expand" (tullax.backends.xla.expand)
        from tullax.backends.xla.expand import expansion

        found = expansion(spec)
        if found is None:
            raise ValueError(f"{spec.out}: no polynomial body to expand")
        return functools.partial(_expanded, spec, found, plain)
    raise ValueError(f"unknown XLA form {form!r}")


def _setup(spec: Spec, env: Env) -> tuple[dict, dict, Any]:
    import jax

    from tullax.backends.xla.lower import _dtype_of
    from tullax.spec.shapes import check_shapes, eval_shapes, input_shapes, result_dtype

    shapes = input_shapes(spec, env)
    check_shapes(spec, shapes)
    dtype = jax.dtypes.canonicalize_dtype(result_dtype(spec, {n: _dtype_of(env[n]) for n in spec.input_names}))
    return shapes, eval_shapes(spec, shapes), dtype


def _conv(spec: Spec, shape: ConvShape, plain: Callable, env: Env, padded: bool = False):
    """``lax.conv_general_dilated`` on the image and kernel laid out channels last (NHWC, HWIO: XLA's CPU
    convolution reads no other layout, and would copy them so itself), and the result laid out as ``spec``'s
    output. Each layout change is one ``_relayout`` (the part of each axis the loops read, the flipped kernel of
    a 'full' axis, the transpose). ``padded`` ('conv-padded'): the first 'valid' axis padded by one element at
    its end, and the output it adds cut off again: on XLA's CPU a convolution without any padding takes
    another, at some shapes several times slower, path (``benchmarks/conv_padding.py``)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    shapes, ranges, dtype = _setup(spec, env)
    if any(lo != 0 or hi <= 0 for lo, hi in ranges.values()):
        return plain(env)
    size = {name: hi for name, (_, hi) in ranges.items()}
    image = jnp.asarray(env[shape.image]).astype(dtype)
    kernel = jnp.asarray(env[shape.kernel]).astype(dtype)
    # the part of each image axis the loops read
    image_extent = []
    for item in shape.image_idx:
        if isinstance(item, str):
            image_extent.append(size[item])
        elif item.kind == "valid":  # the reads from -offset on, in the axis
            reach = item.stride * (size[item.out] - 1) + item.dilation * (size[item.win] - 1) + 1 - item.offset
            image_extent.append(min(image.shape[item.axis], reach))
        else:  # 'full': the dilated image's positions up to the last one read
            image_extent.append(min(image.shape[item.axis], (size[item.out] - 1 - item.offset) // item.stride + 1))
    # out[o] = sum_w img[o - w] ('full'): a correlation with the flipped kernel over the image padded by the
    # conv itself (as jax's own transpose of a conv: a jnp.pad before it made the input gradient of conv2d 3x
    # slower, 60 against 17 ms: XLA no longer fused the padding into the convolution)
    flipped = [shape.kernel_idx.index(item.win) for item in shape.spatial if item.kind == "full"]
    padding = [(item.dilation * (size[item.win] - 1) + item.offset,
                size[item.out] - 1 - item.offset - item.stride * (image_extent[item.axis] - 1)) if item.kind == "full"
               else (item.offset, item.stride * (size[item.out] - 1) + item.dilation * (size[item.win] - 1) + 1
                     - item.offset - image_extent[item.axis])
               for item in shape.spatial]
    if any(n <= 0 for n in image_extent) or any(lo < 0 for lo, _ in padding):
        return plain(env)  # a window that reads nothing but padding, or starts inside the image
    if padded:
        first = next(k for k, item in enumerate(shape.spatial) if item.kind == "valid")
        padding[first] = (0, 1)
    # image -> (batch, spatial..., infeat), kernel -> (spatial..., infeat, outfeat)
    names = [i if isinstance(i, str) else i.out for i in shape.image_idx]
    order = ([names.index(n) for n in shape.batch] + [s.axis for s in shape.spatial]
             + [names.index(n) for n in shape.infeat])
    image = _relayout(image, order, image_extent)
    batch = _prod(size[n] for n in shape.batch)
    infeat = _prod(size[n] for n in shape.infeat)
    outfeat = _prod(size[n] for n in shape.outfeat)
    spatial_in = tuple(image_extent[s.axis] for s in shape.spatial)
    image = image.reshape((batch, *spatial_in, infeat))
    korder = [shape.kernel_idx.index(n) for n in tuple(s.win for s in shape.spatial) + shape.infeat + shape.outfeat]
    kernel = _relayout(kernel, korder, [size[n] for n in shape.kernel_idx], flipped)
    spatial_k = tuple(size[s.win] for s in shape.spatial)
    kernel = kernel.reshape((*spatial_k, infeat, outfeat))
    rank = len(shape.spatial) + 2
    numbers = lax.ConvDimensionNumbers(lhs_spec=(0, rank - 1, *range(1, rank - 1)),
                                       rhs_spec=(rank - 1, rank - 2, *range(rank - 2)),
                                       out_spec=(0, rank - 1, *range(1, rank - 1)))
    strides = tuple(1 if s.kind == "full" else s.stride for s in shape.spatial)
    lhs_dilation = tuple(s.stride if s.kind == "full" else 1 for s in shape.spatial)
    out = lax.conv_general_dilated(image, kernel, strides, padding, lhs_dilation=lhs_dilation,
                                   rhs_dilation=tuple(s.dilation for s in shape.spatial),
                                   dimension_numbers=numbers, precision=jax.lax.Precision.HIGHEST)
    # (batch..., spatial..., outfeat...) -> the spec's own order, each spatial axis cut to the output's extent
    out = out.reshape(tuple(size[n] for n in shape.batch) + out.shape[1:-1] + tuple(size[n] for n in shape.outfeat))
    have = shape.batch + tuple(s.out for s in shape.spatial) + shape.outfeat
    return _relayout(out, [have.index(n) for n in spec.free], [size[n] for n in have]).astype(dtype)


def _relayout(value: Any, axes: Sequence[int], extents: Sequence[int], reversed_axes: Sequence[int] = ()) -> Any:
    """``jnp.transpose(jnp.flip(value[:extents], reversed_axes), axes)``. On the CPU, where the c backend's XLA
    FFI handler builds, one custom call of its layout change (``ffi.permute``): XLA compiles each transpose,
    slice or flip of its own into a loop, tens of milliseconds for every program in every new process (three
    per convolution: the image, the kernel, the result), and a custom call into nothing. Elsewhere (a GPU),
    XLA's own ops."""
    import jax.numpy as jnp
    from jax import lax

    axes, extents, reversed_axes = tuple(axes), tuple(extents), tuple(reversed_axes)
    if axes == tuple(range(value.ndim)) and extents == tuple(value.shape) and not reversed_axes:
        return value

    def in_xla(v):
        v = v[tuple(slice(0, n) for n in extents)]
        return jnp.transpose(jnp.flip(v, reversed_axes) if reversed_axes else v, axes)

    from tullax.backends import ffi
    from tullax.backends.gpu_select import on_gpu

    if on_gpu() or not ffi.permute_available():
        return in_xla(value)
    return lax.platform_dependent(value, cpu=lambda v: ffi.permute(v, axes, extents, reversed_axes),
                                  default=in_xla)


def _prod(values) -> int:
    total = 1
    for v in values:
        total *= v
    return total


def _slices(spec: Spec, index: str, plain: Callable, env: Env):
    """For each value of ``index``, the plain lowering on a grid where ``index`` has one value (its accesses
    then read shifted slices instead of gathering), combined with the reduction."""
    import jax.numpy as jnp

    from tullax.backends.xla import lower as xla

    shapes, ranges, dtype = _setup(spec, env)
    lo, hi = ranges[index]
    if not 0 < hi - lo <= MAX_UNROLL:
        return plain(env)
    total = None
    for value in range(lo, hi):  # summed in evaluate_fixed's compute dtype (float32 for half precision)
        part = xla.evaluate_fixed(spec, env, {index: value})
        if total is None:
            total = part
        elif spec.redop == "+":
            total = total + part
        else:
            total = (jnp.maximum if spec.redop == "max" else jnp.minimum)(total, part)
    if spec.finalizer is not None:
        total = xla.finalize_value(spec, env, total)
    return total.astype(dtype)


def _factored(spec: Spec, plain: Callable, env: Env):
    """``_factored_block`` over the whole call, or block after block of a free index (``lax.map``) when a
    factor would exceed ``CHUNK_POINTS``: XLA materialises each factor, and one of the Gaussian gradient's
    (i,j) factors in full is 64 MB, out of the cache, where a block of rows stays in it (measured on a
    222-row slice: 4x faster per row than in full)."""
    import jax.numpy as jnp
    from jax import lax

    shapes, ranges, _ = _setup(spec, env)
    largest = max((points(ranges, factor_indices(f)) for _, fs in product_terms(spec) for f in fs), default=0)
    cuts = cuttable(spec)
    if largest <= CHUNK_POINTS or not cuts:
        return _factored_block(spec, plain, env)
    name = max(cuts, key=lambda n: ranges[n][1])
    hi = ranges[name][1]
    size = max(1, hi * CHUNK_POINTS // largest)
    if size >= hi or cut_shapes(spec, shapes, name, size) is None:
        return _factored_block(spec, plain, env)
    count = hi // size
    axes = sorted(cuts[name])

    def block(start, length):
        sub = dict(env)
        for array, axis in axes:
            sub[array] = lax.dynamic_slice_in_dim(jnp.asarray(env[array]), start, length, axis)
        return _factored_block(spec, plain, sub)

    where = spec.free.index(name)
    parts = lax.map(lambda start: block(start, size), jnp.arange(count) * size)  # (count, ..., size, ...)
    parts = jnp.moveaxis(parts, 0, where)
    parts = parts.reshape(parts.shape[:where] + (count * size,) + parts.shape[where + 2:])
    if count * size < hi:
        parts = jnp.concatenate([parts, block(count * size, hi - count * size)], axis=where)
    return parts


def _factored_block(spec: Spec, plain: Callable, env: Env):
    """Each signed product of ``product_terms`` as one ``jnp.einsum`` of its factors, each factor evaluated by
    the plain lowering's own evaluator on the grid (size 1 along the indices it does not use), summed."""
    import jax.numpy as jnp
    import numpy as np

    from tullax.backends.xla import lower as xla

    shapes, ranges, result = _setup(spec, env)
    grid = xla._Grid.build(spec, shapes)
    if grid.empty:
        return plain(env)
    dtype = np.dtype(np.float32) if np.dtype(result).itemsize < 4 and np.dtype(result).kind == "f" else result
    # the one evaluation context (complex inputs named, half precision in float32), on this grid's order
    ctx = replace(xla._context(spec, env)[0], grid=grid)
    if ctx.compute != ctx.dtype:  # complex values in a real result: the plain lowering's typing
        return plain(env)
    labels = {name: chr(ord("a") + k) for k, name in enumerate(grid.names)}
    out = [n for n, size in zip(grid.names, grid.size) if n in spec.free and size > 1]
    total = None
    for sign, term in product_terms(spec):
        operands, subscripts, scale = [], [], float(sign)
        for factor in term:
            value = jnp.asarray(xla._body(ctx, factor)).astype(dtype)
            value = value.reshape((1,) * (len(grid.names) - value.ndim) + value.shape)
            kept = [k for k, n in enumerate(value.shape) if n > 1]
            operands.append(value.reshape(tuple(value.shape[k] for k in kept)))
            subscripts.append("".join(labels[grid.names[k]] for k in kept))
        used = set("".join(subscripts))
        here = [n for n in out if labels[n] in used]
        for name, size in zip(grid.names, grid.size):  # a reduced index no factor uses: the sum is a multiple
            if name not in spec.free and labels[name] not in used:
                scale *= size
        part = _contract(list(zip(subscripts, operands)), "".join(labels[n] for n in here))
        part = part * jnp.asarray(scale, dtype) if scale != 1.0 else part
        # back to every free index (those of extent 1, or that this product does not use: broadcast)
        full = [grid.size[grid.axis(n)] for n in spec.free]
        part = part.reshape(tuple(full[spec.free.index(n)] if n in here else 1 for n in spec.free))
        part = jnp.broadcast_to(part, tuple(full))
        total = part if total is None else total + part
    if spec.finalizer is not None:
        total = xla.finalize_value(spec, env, total)
    return total.astype(result)


def _expanded(spec: Spec, found: Any, plain: Callable, env: Env):
    """The expanded body (``expand.Expansion``) contracted term by term (``_factored``); a square clamped at 0
    before the finaliser; float32 inputs in float64 where jax has float64 enabled, the result rounded once."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from tullax.backends.xla import lower as xla

    _, _, dtype = _setup(spec, env)
    if np.dtype(dtype).kind != "f":  # complex or integer results: the plain lowering, as written
        return plain(env)
    wide = np.dtype(dtype) == np.float32 and bool(jax.config.jax_enable_x64)
    data = {item.name for item in spec.inputs if item.kind in ("array", "scalar")}
    inner = {name: (jnp.asarray(v).astype(jnp.float64) if wide and name in data else v) for name, v in env.items()}
    total = _monomials(spec, found, inner, dtype if not wide else np.dtype(np.float64))
    if total is None:
        total = _factored(found.body, xla.lower(found.body), inner)
    if found.nonnegative:
        total = jnp.maximum(total, jnp.zeros((), total.dtype))
    if spec.finalizer is not None:
        total = xla.finalize_value(spec, inner, total)
    return total.astype(dtype)


def _monomials(spec: Spec, found: Any, env: Env, dtype: Any):
    """Each monomial of the expansion contracted on the arrays as they are laid out (``_contract``: row norms
    and one GEMM for Dist, as jnp code writes them), its coefficient applied to the contracted result; None
    unless every factor is a plain read of a whole array axis by axis (or a scalar input) and every range
    starts at 0: ``_factored`` on the grid then does it, transposing each factor into the grid's order."""
    import jax.numpy as jnp

    from tullax.spec.ir import Access, Affine, Param

    shapes, ranges, _ = _setup(spec, env)
    if any(lo != 0 or hi <= 0 for lo, hi in ranges.values()):
        return None
    labels = {name: chr(ord("a") + k) for k, name in enumerate(spec.indices)}
    full = tuple(ranges[n][1] for n in spec.free)
    total = None
    for coef, atoms in found.monomials:
        operands, scale = [], float(coef)
        for atom in atoms:
            if isinstance(atom, Param):
                operands.append(("", jnp.asarray(env[atom.name]).astype(dtype)))
                continue
            if not isinstance(atom, Access):
                return None
            names = [i.plain if isinstance(i, Affine) else None for i in atom.idx]
            value = jnp.asarray(env[atom.array]).astype(dtype)
            if None in names or len(set(names)) != len(names) or any(
                    ranges[n] != (0, value.shape[axis]) for axis, n in enumerate(names)):
                return None
            operands.append(("".join(labels[n] for n in names), value))
        used = set("".join(sub for sub, _ in operands))
        for name in spec.reduced:  # a summed index no factor reads: the sum is a multiple
            if labels[name] not in used:
                scale *= ranges[name][1]
        here = [n for n in spec.free if labels[n] in used]
        part = _contract(operands, "".join(labels[n] for n in here)) if operands else jnp.ones((), dtype)
        part = part * jnp.asarray(scale, dtype)
        part = part.reshape(tuple(full[k] if n in here else 1 for k, n in enumerate(spec.free)))
        part = jnp.broadcast_to(part, full)
        total = part if total is None else total + part
    return total


def _contract(operands: list[tuple[str, Any]], out: str):
    """The einsum ``operands -> out`` in an order XLA runs well on the CPU: a factor whose indices are a subset
    of another's is multiplied into it elementwise (no dot_general with batch dimensions: XLA's CPU runs those
    as many small dots); an index only one operand still has, and the output lacks, is summed out at once;
    otherwise the pair of operands with the smallest result is contracted by einsum (a GEMM for ``id,jd->ij``)."""
    import jax
    import jax.numpy as jnp

    ops = list(operands)
    while True:
        merged = False
        for a in range(len(ops)):  # subset: multiply in
            for b in range(len(ops)):
                if a != b and set(ops[a][0]) <= set(ops[b][0]):
                    sub, val = ops[a]
                    big, other = ops[b]
                    shaped = jnp.einsum(f"{sub}->{''.join(c for c in big if c in sub)}", val)
                    expand = tuple(slice(None) if c in sub else None for c in big)
                    ops[b] = (big, other * shaped[expand])
                    del ops[a]
                    merged = True
                    break
            if merged:
                break
        if merged:
            continue
        for k, (sub, val) in enumerate(ops):  # indices nobody else needs: sum them out
            others = set(out).union(*(set(o[0]) for j, o in enumerate(ops) if j != k))
            alone = [c for c in sub if c not in others]
            if alone:
                keep = "".join(c for c in sub if c in others)
                ops[k] = (keep, jnp.sum(val, axis=tuple(sub.index(c) for c in alone)))
                merged = True
        if merged:
            continue
        if len(ops) == 1:
            sub, val = ops[0]
            return jnp.einsum(f"{sub}->{out}", val) if sub != out else val
        best = None
        for a in range(len(ops)):
            for b in range(a + 1, len(ops)):
                others = set(out).union(*(set(o[0]) for j, o in enumerate(ops) if j not in (a, b)))
                result = "".join(dict.fromkeys(c for c in ops[a][0] + ops[b][0] if c in others))
                size = 1
                for c in result:
                    size *= (ops[a][1].shape[ops[a][0].index(c)] if c in ops[a][0]
                             else ops[b][1].shape[ops[b][0].index(c)])
                if best is None or size < best[0]:
                    best = (size, a, b, result)
        _, a, b, result = best
        value = jnp.einsum(f"{ops[a][0]},{ops[b][0]}->{result}", ops[a][1], ops[b][1],
                           precision=jax.lax.Precision.HIGHEST)
        ops = [o for j, o in enumerate(ops) if j not in (a, b)] + [(result, value)]


__all__ = ["lower_form", "forms", "CHUNK_POINTS"]
