"""What XLA does best, recognised in a spec (from its text alone, no jax): the forms the planner
(``tullax.planner``) can run a kernel in on XLA; ``tullax.backends.xla.forms`` lowers each to a plain jnp/lax
function of the inputs (differentiable, jit-able, vmap-able).

* ``einsum``: a pure contraction (a product of plain accesses summed): ``jnp.einsum``, i.e. ``dot_general``
  (BLAS on the CPU). This is what ``tullax.backends.xla.lower.lower`` already does for such specs.
* ``conv``: a product of two accesses, an "image" whose axes are plain indices or windows ``s*o + d*w``
  (``o`` free, ``w`` reduced; zero padded ``pad(s*o + d*w - p)``; or ``pad((o - d*w + c)/s)``, the full
  correlation of a convolution's input gradient) and
  a "kernel" of plain indices: ``lax.conv_general_dilated``. The image's other plain indices are batch (free,
  not in the kernel) or input features (reduced, in both); the kernel's free indices are output features.
  Several of each are merged into one by a reshape.
* ``slices``: a small reduced index that shifts an access (``x[b,i+k]``) is unrolled: for each of its values
  the body reads shifted slices (no gather), and the results are summed (or maxed...). Up to ``MAX_UNROLL``.
* ``factored``: a sum whose body is a sum of products, each product contracted by ``jnp.einsum`` over its
  factors, each factor evaluated on its own indices only (opt_einsum picks the order). What jnp code does by
  hand for the Gaussian kernel sum's gradients: ``ΔK[i,d]*b[j,d]`` becomes a matmul over ``d`` before the
  ``(i,j)`` factors are multiplied in, where the broadcast lowering materialises every ``(i,j,d,m)``.
* ``rearrange``: every result element is one input element (a patchify ``x[b,c,4h+i,4w+j]``, its gradient
  ``ΔP[b,h,w,c,pad(m-4h),pad(n-4w)]`` summed over ``h``, ``w``): a reshape, a transpose and a broadcast, as jnp
  code writes it (``tullax.backends.xla.rearrange``).
* ``strided``: a sum over window indices each read through ``pad((m-p)/s)``, windows no longer than their
  stride (a strided pool's or patch convolution's input gradient): one term per element, evaluated on ``m``
  split into ``(m div s, m mod s)`` by reshapes (``tullax.backends.xla.strided``).
* ``grid``: tullax's general broadcast-and-reduce lowering (``xla.lower``), which everything can use.
* ``product``: a pure contraction as the broadcast product of its two operands in the order its indices first
  appear, reduced (``xla.lower(einsum=False, grid="appearance")``, jnp's ``(W[:,:,None]*X[:,None,:]).sum(0)``).
  XLA's CPU backend fuses that into one library (YNNPACK) kernel where it runs a ``dot`` of the same layout on
  Eigen (a contraction over both operands' first axis); the planner times it against ``einsum`` on the CPU and
  never runs it where the compiled program would materialise the product (``tullax.planner.tuning.MAX_TEMP_BYTES``).
* ``expanded``: only where the caller opted in (``algebra="expand"``), not among ``forms``: a polynomial body
  multiplied out, each monomial a contraction (``tullax.backends.xla.expand``; Dist as row norms and one GEMM).

"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

from tullax.spec.contraction import factors, is_contraction
from tullax.spec.ir import Access, Affine, Binary, Spec, Wrapped
from tullax.spec.sizes import Extent, Sym

MAX_UNROLL = 64  # the slices form unrolls a window index of at most this many values
CHUNK_POINTS = 1 << 20  # the factored form works in blocks whose largest factor has at most this many points

Env = Mapping[str, Any]


# ---------------------------------------------------------------------------------------------
# Recognising the forms
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Spatial:
    """One image axis read through a window: ``s*out + d*win`` (kind 'valid'; ``pad(s*out + d*win - offset)``
    padded by ``offset`` zeros before the axis, and after it as far as the output reads) or
    ``pad((out - d*win - offset)/s)`` ('full': the correlation with the flipped kernel over the image dilated by
    ``s``, a strided convolution's input gradient; ``stride`` is that ``s``)."""

    axis: int
    out: str
    win: str
    stride: int
    dilation: int
    kind: str
    offset: int = 0


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
        return _window(spec, axis, idx.terms) if len(idx.terms) == 2 else None
    if isinstance(idx, Wrapped) and idx.kind == "pad":
        inner = idx.inner
        if not inner.const.is_const or len(inner.terms) != 2:
            return None
        window = _window(spec, axis, inner.terms) if inner.div == 1 and inner.const.const <= 0 else None
        if window is not None:
            return replace(window, offset=-inner.const.const)
        outs = [n for n, c in inner.terms if n in free and c == 1]
        wins = [(n, -c) for n, c in inner.terms if n in reduced and c <= -1]
        if len(outs) == 1 and len(wins) == 1:
            return Spatial(axis, outs[0], wins[0][0], inner.div, wins[0][1], "full", -inner.const.const)
    return None


def _window(spec: Spec, axis: int, terms: tuple) -> Spatial | None:
    """``s*out + d*win`` (two terms, ``out`` free, ``win`` reduced, both coefficients positive), or None."""
    free, reduced = set(spec.free), set(spec.reduced)
    (a, ca), (b, cb) = terms
    if a in reduced and b in free:
        (a, ca), (b, cb) = (b, cb), (a, ca)
    if a in free and b in reduced and ca >= 1 and cb >= 1:
        return Spatial(axis, a, b, ca, cb, "valid")
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
    if spec.scan is not None:  # a recurrence: lax.scan, and lax.associative_scan where it is linear
        from tullax.backends.xla.associative import is_linear

        return ("grid",) + (("associative",) if is_linear(spec) else ())
    found = []
    contraction = is_contraction(spec) and _einsum_covers(spec)
    if contraction:
        found.append("einsum")
    conv = conv_shape(spec)
    if conv is not None:
        found.append("conv")
        if any(item.kind == "valid" for item in conv.spatial) and not any(item.offset for item in conv.spatial):
            found.append("conv-padded")
    if window_index(spec) is not None and spec.redop in ("+", "max", "min"):
        found.append("slices")
    from tullax.backends.xla.rearrange import rearrangement

    if rearrangement(spec) is not None:
        found.append("rearrange")
    from tullax.backends.xla.strided import strided

    if strided(spec) is not None:
        found.append("strided")
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
            # an extent (not a min or max of several) gives the range: its input
            given = {(t.array, t.axis) for t, c in bound.terms if c == 1 and isinstance(t, Extent)} \
                if len(bound.terms) == 1 else set()
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


def points(ranges: Mapping[str, tuple[int, int]], names: Iterable[str]) -> int:
    """How many points the index space of ``names`` has under ``ranges`` (name -> [lo, hi))."""
    total = 1
    for name in names:
        total *= max(ranges[name][1] - ranges[name][0], 0)
    return total


__all__ = ["ConvShape", "Spatial", "conv_shape", "window_index", "window_indices", "forms", "product_terms",
           "factor_indices", "cuttable", "cut_shapes", "points", "MAX_UNROLL"]
