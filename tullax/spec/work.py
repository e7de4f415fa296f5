"""A bound on the work of one kernel call (issue 44): a range typo such as ``(k in 0:4611686018427387904)`` passes
every other check and would run for hours, so a call whose estimated work is beyond ``MAX_WORK`` is a ShapeError
that says the estimate and how to raise the bound. It is checked with the shapes (``check_shapes``), at trace time,
for the forward kernel and for each gradient kernel, on every backend.

Decision: the estimate is the number of iterations of the kernel's loop nest (the product of the ranges of all
its indices, or the result's element count where that is larger: an empty sum still writes every element), and
the bound is 2^50 (about 1.1e15): a day or so of a CPU at 1e10 iterations per second, tens of seconds on a GPU,
while a 65536-cube matrix product (2^48) is below it. ``TULLAX_MAX_WORK`` sets another bound (an integer; 0
removes it). Whatever it says, a result of 2^62 elements or more is refused: its positions would not fit the
int64 index arithmetic of the generated code.
"""
from __future__ import annotations

import math
from typing import Mapping

from tullax import settings
from tullax.errors import ShapeError
from tullax.spec.ir import INDEX_LIMIT, Spec
from tullax.spec.sizes import Shapes

MAX_WORK_ENV = "TULLAX_MAX_WORK"
MAX_WORK = settings.SETTINGS[MAX_WORK_ENV].default


def max_work() -> int | None:
    """The bound on one call's iterations: ``MAX_WORK``, or ``TULLAX_MAX_WORK`` (None where it is 0: no bound).
    An invalid value is the settings registry's TullaxError."""
    return settings.value(MAX_WORK_ENV) or None


def check_work(spec: Spec, shapes: Shapes, ranges: Mapping[str, tuple[int, int]]) -> None:
    """Raise ShapeError when a call of ``spec`` on these shapes would run more than ``max_work()`` iterations, or
    write a result of 2^62 elements or more."""
    extents = {name: max(hi - lo, 0) for name, (lo, hi) in ranges.items()}
    elements = math.prod(max(s.eval(shapes), 0) for s in spec.out_shape)
    if elements > INDEX_LIMIT:
        raise ShapeError(f"the result would have {elements} elements ({_power(elements)}), beyond the 2^62 that "
                         f"tullax's int64 index arithmetic allows: {_spans(extents)}; a range is wrong")
    work = max(math.prod(extents.values()), elements)
    bound = max_work()
    if bound is None or work <= bound:
        return
    from tullax.spec.text import format_spec

    raise ShapeError(
        f"{format_spec(spec)} would run about {work:.3g} iterations ({_power(work)}: {_spans(extents)}), beyond "
        f"tullax's bound of {bound:.3g} per call ({_power(bound)}), which stops a wrong range from running for "
        f"hours: check the ranges; if this much work is meant, set {MAX_WORK_ENV} to a larger number of iterations "
        f"(0 for no bound)")


def _power(n: int) -> str:
    return f"2^{math.log2(n):.1f}" if n > 0 else "0"


def _spans(extents: Mapping[str, int]) -> str:
    return ", ".join(f"{name} over {n}" for name, n in extents.items()) or "no index"


__all__ = ["MAX_WORK", "MAX_WORK_ENV", "max_work", "check_work"]
