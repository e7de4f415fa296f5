"""The ``rearrange`` form: a spec whose every result element is one input element (or zero), written as index
arithmetic, as the reshape, transpose and broadcast a jnp user writes by hand. jax is imported inside functions.

Two shapes of index, one per input axis, recognised from the text alone (``rearrangement``):

* a split: ``x[b,c,4h+i,4w+j]`` with ``i in 0:4``: an axis read at a mixed-radix number of free indices (the
  smallest coefficient 1, each next one the previous times its index's extent) is that axis reshaped into one
  axis per index (a patchify);
* a merge: ``ΔP[b,h,w,c,pad(m-4h),pad(n-4w)]`` summed over ``h``, ``w``: the inverse, a free ``m`` minus
  reduced indices that each also read an axis of their own; with ``pad(m-4h)``'s axis at most 4 long, exactly one
  ``h`` reads each ``m`` (or none: zero), so the sum is the axes ``h`` and the padded axis merged into one (a
  patchify's gradient).

Any other axis is a plain index. Free indices the input does not read are broadcast. Whether the radix holds is
a matter of the call's extents: where it does not, the form falls back to the plain lowering at trace time.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

from tullax.spec.ir import Access, Affine, Spec, Wrapped
from tullax.spec.sizes import Sym

Env = Mapping[str, Any]


def rearrangement(spec: Spec) -> Access | None:
    """The one read a rearranging spec copies, or None (see the module docstring)."""
    body = spec.body
    if spec.scan is not None or spec.assign != ":=" or spec.is_scatter or spec.finalizer is not None \
            or not isinstance(body, Access) or (spec.reduced and spec.redop != "+"):
        return None
    free, reduced = set(spec.free), set(spec.reduced)
    seen: Counter[str] = Counter()
    merged: set[str] = set()
    plain: set[str] = set()
    for idx in body.idx:
        if isinstance(idx, Affine):
            if idx.div != 1 or idx.const != Sym(0) or not idx.terms or min(c for _, c in idx.terms) != 1 \
                    or any(c < 1 for _, c in idx.terms):
                return None
            plain.add(idx.plain or "")
            if len(idx.terms) > 1 and any(n not in free for n in idx.names()):
                return None  # a split reads free indices only
            if idx.plain is None and idx.terms[0][0] in reduced:
                return None
        elif isinstance(idx, Wrapped) and idx.kind == "pad":
            inner = idx.inner
            outs = [n for n, c in inner.terms if n in free and c == 1]
            wins = [n for n, c in inner.terms if n in reduced and c < 0]
            if inner.div != 1 or inner.const != Sym(0) or len(outs) != 1 or len(outs) + len(wins) != len(inner.terms) \
                    or not wins:
                return None
            merged.update(wins)
        else:
            return None
        seen.update(idx.inner.names() if isinstance(idx, Wrapped) else idx.names())
    # each free index read once; each reduced index once plainly and once in a merge: a sum of one term
    if any(seen[n] > 1 for n in free) or merged != reduced or any(seen[n] != 2 for n in reduced) \
            or not reduced <= plain:
        return None
    return body


@dataclass(frozen=True)
class Layout:
    """How one call's input becomes its result: per input axis, the extent kept and the zeros padded after it;
    the axes after the reshape (``digits``, by index name; ``#a`` the in-window part of input axis ``a``) and
    their ``extents`` (each digit's slot, of which it reads the first ``size`` values); per merged free index,
    its digits, most significant first."""

    cut: tuple[tuple[int, int], ...]
    digits: tuple[str, ...]
    extents: tuple[int, ...]
    groups: Mapping[str, tuple[str, ...]]


def layout(read: Access, ranges: Mapping[str, tuple[int, int]], shape: tuple[int, ...]) -> Layout | None:
    """The layout for these index ranges and the input's ``shape``, or None where the extents break the radix
    (``x[2h+i]`` with ``i in 0:3``: overlapping windows, a real sum) or a range does not start at 0."""
    if any(lo != 0 or hi <= 0 for lo, hi in ranges.values()):
        return None
    size = {name: hi for name, (_, hi) in ranges.items()}
    cut, digits, extents, groups = [], [], [], {}
    for axis, idx in enumerate(read.idx):
        have = shape[axis]
        if isinstance(idx, Affine):
            # each digit's slot: the next coefficient over its own (x[4h+i] with i in 0:3 reads 3 of each 4)
            terms = sorted(idx.terms, key=lambda t: t[1])
            slots = [c // terms[k][1] for k, (_, c) in enumerate(terms[1:])] + [size[terms[-1][0]]]
            if terms[0][1] != 1 or any(c % terms[k][1] for k, (_, c) in enumerate(terms[1:])) \
                    or any(slot < size[n] for slot, (n, _) in zip(slots, terms)):
                return None
            span = terms[-1][1] * size[terms[-1][0]]  # a reduced index's own axis: only its range is summed
            if span > have:
                return None
            cut.append((span, 0))
            digits += [n for n, _ in reversed(terms)]
            extents += slots[::-1]
        else:
            assert isinstance(idx, Wrapped)
            out = next(n for n, c in idx.inner.terms if c > 0)
            wins = sorted(((n, -c) for n, c in idx.inner.terms if c < 0), key=lambda t: t[1])
            if wins[0][1] < have or any(k != wins[t][1] * size[wins[t][0]] for t, (_, k) in enumerate(wins[1:])):
                return None
            cut.append((have, wins[0][1] - have))
            digits.append(f"#{axis}")
            extents.append(wins[0][1])
            groups[out] = tuple(n for n, _ in reversed(wins)) + (f"#{axis}",)
    return Layout(tuple(cut), tuple(digits), tuple(extents), MappingProxyType(groups))


def lower_rearrange(spec: Spec, read: Access, plain: Callable[[Env], Any], env: Env,
                    setup: Callable[[Spec, Env], tuple[dict, dict, Any]]) -> Any:
    """``spec`` computed as slices, pads, one reshape into digits, one transpose and one reshape merging them,
    and a broadcast; the plain lowering where the call's extents break the radix."""
    import jax.numpy as jnp

    _, ranges, dtype = setup(spec, env)
    value = jnp.asarray(env[read.array])
    found = layout(read, ranges, tuple(value.shape))
    if found is None:
        return plain(env)
    size = {name: hi for name, (_, hi) in ranges.items()}
    digits, extents, groups = found.digits, found.extents, found.groups
    for axis, (keep, pad) in enumerate(found.cut):
        if keep < value.shape[axis]:
            value = value[(slice(None),) * axis + (slice(0, keep),)]
        if pad:
            value = jnp.pad(value, [(0, pad if a == axis else 0) for a in range(value.ndim)])
    value = value.reshape(extents)
    value = value[tuple(slice(0, size[d]) if not d.startswith("#") else slice(None) for d in digits)]
    extents = tuple(value.shape)
    order = [name for name in spec.free if name in digits or name in groups]
    value = jnp.transpose(value, [digits.index(d) for name in order for d in groups.get(name, (name,))])
    shape = [_prod(extents[digits.index(d)] for d in groups.get(name, (name,))) for name in order]
    value = value.reshape(tuple(shape))
    for k, name in enumerate(order):  # a merged axis to the result's extent: cut, or zeros where no window reads
        if shape[k] > size[name]:
            value = value[(slice(None),) * k + (slice(0, size[name]),)]
        elif shape[k] < size[name]:
            value = jnp.pad(value, [(0, size[name] - shape[k] if a == k else 0) for a in range(value.ndim)])
    full = tuple(size[name] for name in spec.free)
    value = jnp.expand_dims(value, tuple(k for k, name in enumerate(spec.free) if name not in order))
    return jnp.broadcast_to(value, full).astype(dtype)


def _prod(values) -> int:
    total = 1
    for v in values:
        total *= v
    return total
