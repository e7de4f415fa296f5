"""What XLA does best, recognised in a spec: the forms the planner (``tullax.planner.decide``) can run a kernel
in on XLA, each a plain jnp/lax function of the inputs (differentiable, jit-able, vmap-able).

* ``einsum``: a pure contraction (a product of plain accesses summed): ``jnp.einsum``, i.e. ``dot_general``
  (BLAS on the CPU). This is what ``tullax.backends.xla.lower.lower`` already does for such specs.
* ``conv``: a product of two accesses, an "image" whose axes are plain indices or windows ``s*o + d*w``
  (``o`` free, ``w`` reduced; or ``pad(o - w)``, the full correlation of a convolution's input gradient) and
  a "kernel" of plain indices: ``lax.conv_general_dilated``. The image's other plain indices are batch (free,
  not in the kernel) or input features (reduced, in both); the kernel's free indices are output features.
  Several of each are merged into one by a reshape.
* ``slices``: a small reduced index that shifts an access (``x[b,i+k]``) is unrolled: for each of its values
  the body reads shifted slices (no gather), and the results are summed (or maxed...). Up to ``MAX_UNROLL``.
* ``factored``: a sum whose body is a sum of products, each product contracted by ``jnp.einsum`` over its
  factors, each factor evaluated on its own indices only (opt_einsum picks the order). What jnp code does by
  hand for the Gaussian kernel sum's gradients: ``ΔK[i,d]*b[j,d]`` becomes a matmul over ``d`` before the
  ``(i,j)`` factors are multiplied in, where the broadcast lowering materialises every ``(i,j,d,m)``.
* ``grid``: tullax's general broadcast-and-reduce lowering (``xla.lower``), which everything can use.
* ``product``: a pure contraction as the broadcast product of its two operands in the order its indices first
  appear, reduced (``xla.lower(einsum=False, grid="appearance")``, jnp's ``(W[:,:,None]*X[:,None,:]).sum(0)``).
  XLA's CPU backend fuses that into one library (YNNPACK) kernel where it runs a ``dot`` of the same layout on
  Eigen (a contraction over both operands' first axis); the planner times it against ``einsum`` on the CPU and
  never runs it where the compiled program would materialise the product (``planner.MAX_TEMP_BYTES``).

jax is imported inside functions only.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from tullax.spec.contraction import factors, is_contraction
from tullax.spec.ir import Access, Affine, Binary, Spec, Wrapped
from tullax.spec.sizes import Sym

MAX_UNROLL = 64  # the slices form unrolls a window index of at most this many values
CHUNK_POINTS = 1 << 20  # the factored form works in blocks whose largest factor has at most this many points

Env = Mapping[str, Any]


# ---------------------------------------------------------------------------------------------
# Recognising the forms
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Spatial:
    """One image axis read through a window: ``s*out + d*win`` (kind 'valid') or ``pad(out - win)`` ('full')."""

    axis: int
    out: str
    win: str
    stride: int
    dilation: int
    kind: str


@dataclass(frozen=True)
class ConvShape:
    image: str
    kernel: str
    image_idx: tuple[str | Spatial, ...]  # per image axis: a plain index name, or a Spatial
    kernel_idx: tuple[str, ...]
    batch: tuple[str, ...]
    infeat: tuple[str, ...]
    outfeat: tuple[str, ...]
    spatial: tuple[Spatial, ...]


def _plain_product(spec: Spec) -> tuple[Access, Access] | None:
    if spec.redop != "+" or spec.assign != ":=" or spec.finalizer is not None or spec.is_scatter:
        return None
    body = spec.body
    if not (isinstance(body, Binary) and body.op == "*" and isinstance(body.lhs, Access)
            and isinstance(body.rhs, Access)):
        return None
    return body.lhs, body.rhs


def _spatial(spec: Spec, axis: int, idx: Any) -> Spatial | str | None:
    """The image axis as a plain index name, a Spatial, or None (neither)."""
    free, reduced = set(spec.free), set(spec.reduced)
    if isinstance(idx, Affine):
        if idx.div != 1 or idx.const != Sym(0):
            return None
        if idx.plain is not None:
            return idx.plain
        if len(idx.terms) != 2:
            return None
        (a, ca), (b, cb) = idx.terms
        if a in reduced and b in free:
            (a, ca), (b, cb) = (b, cb), (a, ca)
        if a in free and b in reduced and ca >= 1 and cb >= 1:
            return Spatial(axis, a, b, ca, cb, "valid")
        return None
    if isinstance(idx, Wrapped) and idx.kind == "pad":
        inner = idx.inner
        if inner.div != 1 or inner.const != Sym(0) or len(inner.terms) != 2:
            return None
        coefs = dict(inner.terms)
        outs = [n for n, c in inner.terms if n in free and c == 1]
        wins = [n for n, c in inner.terms if n in reduced and c == -1]
        if len(outs) == 1 and len(wins) == 1 and len(coefs) == 2:
            return Spatial(axis, outs[0], wins[0], 1, 1, "full")
    return None


def conv_shape(spec: Spec) -> ConvShape | None:
    """The convolution a spec is, or None (see the module docstring)."""
    pair = _plain_product(spec)
    if pair is None:
        return None
    for image, kernel in (pair, pair[::-1]):
        found = _conv_roles(spec, image, kernel)
        if found is not None:
            return found
    return None


def _conv_roles(spec: Spec, image: Access, kernel: Access) -> ConvShape | None:
    if not all(isinstance(i, Affine) and i.plain is not None for i in kernel.idx):
        return None
    kernel_idx = tuple(i.plain for i in kernel.idx)
    image_idx = tuple(_spatial(spec, axis, idx) for axis, idx in enumerate(image.idx))
    if None in image_idx or len(set(kernel_idx)) != len(kernel_idx):
        return None
    spatial = tuple(i for i in image_idx if isinstance(i, Spatial))
    plain = [i for i in image_idx if isinstance(i, str)]
    if not spatial:
        return None
    image_names = plain + [n for s in spatial for n in (s.out, s.win)]
    if len(set(image_names)) != len(image_names):
        return None
    free, reduced, in_kernel = set(spec.free), set(spec.reduced), set(kernel_idx)
    batch = tuple(n for n in plain if n in free and n not in in_kernel)
    infeat = tuple(n for n in plain if n in reduced and n in in_kernel)
    if len(batch) + len(infeat) != len(plain):
        return None
    wins = {s.win for s in spatial}
    if any(s.out in in_kernel or s.win not in in_kernel for s in spatial):
        return None
    outfeat = tuple(n for n in kernel_idx if n not in wins and n not in infeat)
    if any(n not in free or n in image_names for n in outfeat):
        return None
    if set(spec.free) | set(spec.reduced) != set(image_names) | in_kernel:
        return None
    return ConvShape(image.array, kernel.array, image_idx, kernel_idx, batch, infeat, outfeat, spatial)


def window_index(spec: Spec) -> str | None:
    """A reduced index that shifts an access (appears in an affine position with another index): the index
    the slices form unrolls. None when there is none, or the spec scatters."""
    found = window_indices(spec)
    return found[0] if found else None


def window_indices(spec: Spec) -> tuple[str, ...]:
    """Every reduced index that shifts an access, in order of appearance (the last one of each position
    first); () for a scatter."""
    if spec.is_scatter or spec.assign != ":=":
        return ()
    from tullax.spec.ir import accesses

    reduced, found = set(spec.reduced), []
    for acc in accesses(spec.body):
        for idx in acc.idx:
            if isinstance(idx, Affine) and len(idx.terms) >= 2:
                shifting = [n for n, _ in idx.terms if n in reduced]
                if shifting and shifting[-1] not in found:
                    found.append(shifting[-1])
    return tuple(found)


@functools.lru_cache(maxsize=1024)  # every plan of a kernel asks, and its rule, and the race ahead of it
def forms(spec: Spec) -> tuple[str, ...]:
    """The XLA forms that apply to ``spec``, best first; 'grid' always applies (then 'factored', if it does)."""
    if spec.scan is not None:  # a recurrence has one form: lax.scan
        return ("grid",)
    found = []
    contraction = is_contraction(spec) and _einsum_covers(spec)
    if contraction:
        found.append("einsum")
    conv = conv_shape(spec)
    if conv is not None:
        found.append("conv")
        if any(item.kind == "valid" for item in conv.spatial):
            found.append("conv-padded")
    if window_index(spec) is not None and spec.redop in ("+", "max", "min"):
        found.append("slices")
    # 'factored' after 'grid': a default (a tiny call, no loop backend) stays on the plain lowering; only the
    # planner's timing picks it
    return tuple(found) + ("grid",) + (("product",) if contraction and len(spec.inputs) == 2 else ()) + (
        ("factored",) if not contraction and _factors_apart(spec) else ())


def product_terms(spec: Spec) -> tuple[tuple[int, tuple[Any, ...]], ...] | None:
    """The body as signed products, ``((sign, factors), ...)``, for a plain sum (``+``, ``:=``, no scatter);
    None for any other spec. Factors are the operands of ``*`` chains; anything else is one factor."""
    from tullax.spec.ir import Unary

    if spec.redop != "+" or spec.assign != ":=" or spec.is_scatter:
        return None
    terms: list[tuple[int, tuple[Any, ...]]] = []

    def split(expr: Any, sign: int) -> None:
        if isinstance(expr, Binary) and expr.op in ("+", "-"):
            split(expr.lhs, sign)
            split(expr.rhs, sign if expr.op == "+" else -sign)
        elif isinstance(expr, Unary):
            split(expr.arg, -sign)
        else:
            terms.append((sign, tuple(factors(expr))))

    split(spec.body, 1)
    return tuple(terms)


def factor_indices(expr: Any) -> frozenset[str]:
    """The indices a factor depends on (its accesses' positions, index values)."""
    from tullax.spec.ir import IndexVal, idx_names, walk

    names: set[str] = set()
    for node in walk(expr):
        if isinstance(node, IndexVal):
            names.add(node.name)
        elif isinstance(node, Access):
            for idx in node.idx:
                names.update(idx_names(idx))
    return frozenset(names)


def _factors_apart(spec: Spec) -> bool:
    """Whether some product has factors on different indices (else einsum only re-reads the broadcast), and an
    index is summed: without one the "contraction" is an elementwise product that einsum turns into a batched
    dot_general, which XLA does not fuse with its neighbours (the row norm's gradient step, ``Δx[i,j] :=
    Δn[i]*(0.5/n[i])*(2*x[i,j])``, made the planned VJP 1.4x slower than in the broadcast form)."""
    from tullax.spec.ir import Indirect, accesses

    if not spec.reduced:
        return False
    terms = product_terms(spec)
    if terms is None or any(isinstance(i, Indirect) for a in accesses(spec.body) for i in a.idx):
        return False
    return any(len({factor_indices(f) for f in factors} - {frozenset()}) >= 2 for _, factors in terms)


def _einsum_covers(spec: Spec) -> bool:
    from tullax.spec.ir import accesses

    used = {i.plain for acc in accesses(spec.body) for i in acc.idx}
    return set(spec.free) | set(spec.reduced) <= used


def cuttable(spec: Spec) -> dict[str, frozenset[tuple[str, int]]]:
    """The free indices a call can be cut along into smaller calls of the same spec (a slice of the output),
    each with the input axes to cut: indices that appear in accesses only as a plain index, never as a value,
    plus the input that gives the range (a gradient step's shape-only input). {} for a scatter or ``+=``."""
    from tullax.spec.ir import IndexVal, accesses, idx_names, walk

    if spec.is_scatter or spec.assign != ":=":
        return {}
    axes: dict[str, set[tuple[str, int]]] = {name: set() for name in spec.free}
    exprs = (spec.body,) + ((spec.finalizer,) if spec.finalizer is not None else ())
    for expr in exprs:
        for node in walk(expr):
            if isinstance(node, IndexVal):
                axes.pop(node.name, None)  # its value is read: a cut would shift it
    for acc in accesses(spec.body):
        for axis, idx in enumerate(acc.idx):
            if isinstance(idx, Affine) and idx.plain is not None:
                if idx.plain in axes:
                    axes[idx.plain].add((acc.array, axis))
                continue
            for name in idx_names(idx):
                axes.pop(name, None)  # inside arithmetic, a window or an index array
    ranges = dict(spec.ranges)
    found = {}
    for name, used in axes.items():
        bound = ranges[name].hi
        if used and ranges[name].lo == Sym(0):
            given = {(t.array, t.axis) for t, c in bound.terms if c == 1} if len(bound.terms) == 1 else set()
            found[name] = frozenset(used | given)
    return found


def cut_shapes(spec: Spec, shapes: Mapping[str, tuple[int, ...]], name: str, extent: int) -> dict | None:
    """The input shapes of the call cut to ``name`` in [0, extent) (``cuttable``), or None when the cut
    does not give exactly that (every other range unchanged, the shapes consistent)."""
    from tullax.errors import TullaxError
    from tullax.spec.shapes import check_shapes, eval_shapes

    axes = cuttable(spec).get(name)
    ranges = eval_shapes(spec, shapes)
    if not axes or ranges[name][0] != 0 or not 0 < extent < ranges[name][1]:
        return None
    cut = {n: list(s) for n, s in shapes.items()}
    for array, axis in axes:
        if array not in cut or cut[array][axis] != ranges[name][1]:
            return None
        cut[array][axis] = extent
    sliced = {n: tuple(s) for n, s in cut.items()}
    got = eval_shapes(spec, sliced)
    if got[name] != (0, extent) or any(got[n] != ranges[n] for n in ranges if n != name):
        return None
    try:
        check_shapes(spec, sliced)
    except TullaxError:
        return None
    return sliced


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
    if form == "factored":
        if product_terms(spec) is None:
            raise ValueError(f"{spec.out}: not a sum of products")
        return functools.partial(_factored, spec, plain)
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
        elif item.kind == "valid":
            image_extent.append(item.stride * (size[item.out] - 1) + item.dilation * (size[item.win] - 1) + 1)
        else:
            image_extent.append(min(image.shape[item.axis], size[item.out]))
    # out[o] = sum_w img[o - w] ('full'): a correlation with the flipped kernel over the image padded by the
    # conv itself (as jax's own transpose of a conv: a jnp.pad before it made the input gradient of conv2d 3x
    # slower, 60 against 17 ms: XLA no longer fused the padding into the convolution)
    flipped = [shape.kernel_idx.index(item.win) for item in shape.spatial if item.kind == "full"]
    padding = [(size[item.win] - 1, size[item.out] - image_extent[item.axis]) if item.kind == "full" else (0, 0)
               for item in shape.spatial]
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
    out = lax.conv_general_dilated(image, kernel, tuple(s.stride for s in shape.spatial), padding,
                                   rhs_dilation=tuple(s.dilation for s in shape.spatial),
                                   dimension_numbers=numbers, precision=jax.lax.Precision.HIGHEST)
    # (batch..., spatial..., outfeat...) -> the spec's own order, each spatial axis cut to the output's extent
    out = out.reshape(tuple(size[n] for n in shape.batch) + out.shape[1:-1] + tuple(size[n] for n in shape.outfeat))
    have = shape.batch + tuple(s.out for s in shape.spatial) + shape.outfeat
    return _relayout(out, [have.index(n) for n in spec.free], [size[n] for n in have]).astype(dtype)


def _relayout(value: Any, axes: Sequence[int], extents: Sequence[int], reversed_axes: Sequence[int] = ()) -> Any:
    """``jnp.transpose(jnp.flip(value[:extents], reversed_axes), axes)``. On the CPU, where the c backend's XLA
    FFI handler builds, one custom call of its layout change (``c_ffi.permute``): XLA compiles each transpose,
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

    from tullax.backends.c import ffi as c_ffi
    from tullax.backends.gpu_select import on_gpu

    if on_gpu() or not c_ffi.permute_available():
        return in_xla(value)
    return lax.platform_dependent(value, cpu=lambda v: c_ffi.permute(v, axes, extents, reversed_axes),
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


def points(ranges: Mapping[str, tuple[int, int]], names: Iterable[str]) -> int:
    """How many points the index space of ``names`` has under ``ranges`` (name -> [lo, hi))."""
    total = 1
    for name in names:
        total *= max(ranges[name][1] - ranges[name][0], 0)
    return total


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


__all__ = ["ConvShape", "Spatial", "conv_shape", "window_index", "window_indices", "forms", "product_terms",
           "factor_indices", "cuttable", "cut_shapes", "lower_form", "points", "MAX_UNROLL"]
