"""A linear first-order recurrence ``h[t] = a[t]*h[t-1] + b[t]`` (issue 48) split into its slope ``a`` and its
offset ``b``, each an elementwise spec over the result's indices: what ``lax.associative_scan`` combines (the XLA
form 'associative', ``tullax.backends.xla.associative``) and what the GPU's chunked scan composes per chunk
(``tullax.compiler.scan_chunks``).
"""
from __future__ import annotations

import functools
from dataclasses import replace

from tullax.grad.derivative import wirtinger
from tullax.spec.ir import Access, Affine, Num, Spec, accesses, map_expr, walk
from tullax.spec.scan import TRAJECTORY, unrolled


@functools.lru_cache(maxsize=1024)
def linear_parts(spec: Spec) -> tuple[Spec, Spec] | None:
    """(a, b): elementwise specs over the result's indices with ``spec``'s body ``a*h[t∓1] + b``; None where
    ``spec`` is not such a recurrence."""
    scan = spec.scan
    if scan is None or scan.depth != 1 or spec.reduced or spec.finalizer is not None or spec.assign != ":=":
        return None
    reads = {acc for acc in accesses(spec.body) if acc.array == spec.out}
    if len(reads) != 1:
        return None
    (read,) = reads
    if any(not (isinstance(ix, Affine) and ix.plain == own.plain) for axis, (ix, own) in
           enumerate(zip(read.idx, spec.lhs)) if axis != scan.axis):
        return None  # the lanes mix
    every = frozenset(spec.input_names) | {spec.out}  # as if every value were complex: conj(h) is not linear
    slope, other = wirtinger(spec.body, lambda e: e == read, every)
    if slope is None or other is not None or any(
            isinstance(n, Access) and n.array == spec.out for n in walk(slope)):
        return None
    offset = map_expr(spec.body, lambda n: Num(0) if n == read else n)
    flat = unrolled(spec)
    inputs = tuple(i for i in flat.inputs if i.name != TRAJECTORY)
    return tuple(replace(flat, body=body, inputs=inputs) for body in (slope, offset))


__all__ = ["linear_parts"]
