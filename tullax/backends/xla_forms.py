"""What XLA does best, recognised in a spec: the forms the planner (``tullax.backends.planner``) can run a kernel
in on XLA, each a plain jnp/lax function of the inputs (differentiable, jit-able, vmap-able).

* ``einsum``: a pure contraction (a product of plain accesses summed): ``jnp.einsum``, i.e. ``dot_general``
  (BLAS on the CPU). This is what ``tullax.backends.xla.lower`` already does for such specs.
* ``conv``: a product of two accesses, an "image" whose axes are plain indices or windows ``s*o + d*w``
  (``o`` free, ``w`` reduced; or ``pad(o - w)``, the full correlation of a convolution's input gradient) and
  a "kernel" of plain indices: ``lax.conv_general_dilated``. The image's other plain indices are batch (free,
  not in the kernel) or input features (reduced, in both); the kernel's free indices are output features.
  Several of each are merged into one by a reshape.
* ``slices``: a small reduced index that shifts an access (``x[b,i+k]``) is unrolled: for each of its values
  the body reads shifted slices (no gather), and the results are summed (or maxed...). Up to ``MAX_UNROLL``.
* ``grid``: tullax's general broadcast-and-reduce lowering (``xla.lower``), which everything can use.

jax is imported inside functions only.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from tullax.spec.ir import Access, Affine, Binary, Spec, Wrapped
from tullax.spec.sizes import Sym

MAX_UNROLL = 64  # the slices form unrolls a window index of at most this many values

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
    if spec.is_scatter or spec.assign != ":=":
        return None
    from tullax.spec.ir import accesses

    reduced = set(spec.reduced)
    for acc in accesses(spec.body):
        for idx in acc.idx:
            if isinstance(idx, Affine) and len(idx.terms) >= 2:
                shifting = [n for n, _ in idx.terms if n in reduced]
                if shifting:
                    return shifting[-1]
    return None


def forms(spec: Spec) -> tuple[str, ...]:
    """The XLA forms that apply to ``spec``, best first; 'grid' always applies."""
    from tullax.backends.xla import is_contraction

    found = []
    if is_contraction(spec) and _einsum_covers(spec):
        found.append("einsum")
    if conv_shape(spec) is not None:
        found.append("conv")
    if window_index(spec) is not None and spec.redop in ("+", "max", "min"):
        found.append("slices")
    return tuple(found) + ("grid",)


def _einsum_covers(spec: Spec) -> bool:
    from tullax.spec.ir import accesses

    used = {i.plain for acc in accesses(spec.body) for i in acc.idx}
    return set(spec.free) | set(spec.reduced) <= used


# ---------------------------------------------------------------------------------------------
# The lowerings
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1024)
def lower_form(spec: Spec, form: str) -> Callable[[Env], Any]:
    """``fn(env) -> jax.Array`` computing ``spec`` in ``form`` (one of ``forms(spec)``); 'einsum' and 'grid'
    are tullax's plain lowering. A form whose preconditions fail for the call's shapes (an index range that
    does not start at 0, an empty range) falls back to the plain lowering at trace time."""
    from tullax.backends import xla

    plain = xla.lower(spec)
    if form in ("einsum", "grid", ""):
        return plain
    if form == "conv":
        shape = conv_shape(spec)
        if shape is None:
            raise ValueError(f"{spec.out}: not a convolution")
        return functools.partial(_conv, spec, shape, plain)
    if form == "slices":
        index = window_index(spec)
        if index is None:
            raise ValueError(f"{spec.out}: no window index to unroll")
        return functools.partial(_slices, spec, index, plain)
    raise ValueError(f"unknown XLA form {form!r}")


def _setup(spec: Spec, env: Env) -> tuple[dict, dict, Any]:
    import jax

    from tullax.backends.xla import _dtype_of
    from tullax.spec.shapes import check_shapes, eval_shapes, input_shapes, result_dtype

    shapes = input_shapes(spec, env)
    check_shapes(spec, shapes)
    dtype = jax.dtypes.canonicalize_dtype(result_dtype(spec, {n: _dtype_of(env[n]) for n in spec.input_names}))
    return shapes, eval_shapes(spec, shapes), dtype


def _conv(spec: Spec, shape: ConvShape, plain: Callable, env: Env):
    import jax
    import jax.numpy as jnp
    from jax import lax

    shapes, ranges, dtype = _setup(spec, env)
    if any(lo != 0 or hi <= 0 for lo, hi in ranges.values()):
        return plain(env)
    size = {name: hi for name, (_, hi) in ranges.items()}
    image = jnp.asarray(env[shape.image]).astype(dtype)
    kernel = jnp.asarray(env[shape.kernel]).astype(dtype)
    # the part of each axis the loops read
    window = []
    for item in shape.image_idx:
        if isinstance(item, str):
            window.append(slice(0, size[item]))
        elif item.kind == "valid":
            window.append(slice(0, item.stride * (size[item.out] - 1) + item.dilation * (size[item.win] - 1) + 1))
        else:
            window.append(slice(0, min(image.shape[item.axis], size[item.out])))
    image = image[tuple(window)]
    kernel = kernel[tuple(slice(0, size[n]) for n in shape.kernel_idx)]
    pads = []
    for item in shape.spatial:
        if item.kind == "full":  # out[o] = sum_w img[o - w]: a correlation with the flipped kernel, padded
            kernel = jnp.flip(kernel, shape.kernel_idx.index(item.win))
            pads.append((item.axis, size[item.win] - 1, size[item.out] - image.shape[item.axis]))
    if pads:
        widths = [(0, 0)] * image.ndim
        for axis, lo, hi in pads:
            widths[axis] = (lo, hi)
        image = jnp.pad(image, widths)
    # image -> (batch, infeat, spatial...), kernel -> (outfeat, infeat, spatial...)
    names = [i if isinstance(i, str) else i.out for i in shape.image_idx]
    order = [names.index(n) for n in shape.batch + shape.infeat] + [s.axis for s in shape.spatial]
    image = jnp.transpose(image, order)
    spatial_in = image.shape[len(shape.batch) + len(shape.infeat):]
    batch = _prod(size[n] for n in shape.batch)
    infeat = _prod(size[n] for n in shape.infeat)
    image = image.reshape((batch, infeat, *spatial_in))
    korder = [shape.kernel_idx.index(n) for n in shape.outfeat + shape.infeat + tuple(s.win for s in shape.spatial)]
    kernel = jnp.transpose(kernel, korder)
    spatial_k = kernel.shape[len(korder) - len(shape.spatial):]
    kernel = kernel.reshape((_prod(size[n] for n in shape.outfeat), infeat, *spatial_k))
    strides = tuple(s.stride for s in shape.spatial)
    dilation = tuple(s.dilation for s in shape.spatial)
    out = lax.conv_general_dilated(image, kernel, strides, "VALID", rhs_dilation=dilation,
                                   precision=jax.lax.Precision.HIGHEST)
    out_spatial = tuple(size[s.out] for s in shape.spatial)
    out = out[(slice(None), slice(None), *(slice(0, n) for n in out_spatial))]
    out = out.reshape(tuple(size[n] for n in shape.batch) + tuple(size[n] for n in shape.outfeat) + out_spatial)
    have = shape.batch + shape.outfeat + tuple(s.out for s in shape.spatial)
    return jnp.transpose(out, [have.index(n) for n in spec.free]).astype(dtype)


def _prod(values) -> int:
    total = 1
    for v in values:
        total *= v
    return total


def _slices(spec: Spec, index: str, plain: Callable, env: Env):
    """For each value of ``index``, the plain lowering on a grid where ``index`` has one value (its accesses
    then read shifted slices instead of gathering), combined with the reduction."""
    import jax.numpy as jnp

    from tullax.backends import xla

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


__all__ = ["ConvShape", "Spatial", "conv_shape", "window_index", "forms", "lower_form", "MAX_UNROLL"]
