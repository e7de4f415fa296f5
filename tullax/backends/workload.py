"""How much work one call of a spec is, from its static shapes: the product of its index extents (the loop
nest's iteration count) times the cost of one body evaluation. Used to run tiny kernels serially (no thread
pool wake-up) and by the planner to decide whether timing both implementations on first use is cheap."""
from __future__ import annotations

from typing import Mapping

from tullax.spec.ir import Access, Binary, Call, Spec, walk

# Below this much work (estimated operations, ``work``) a loop kernel runs its serial variant: waking the
# thread pool costs more than the parallel part saves. Measured on the 2-core development machine with
# benchmarks/tiny_kernels.py (matmuls of growing size, serial vs parallel variant under jit, NUMBA_NUM_THREADS=2):
# the serial variant wins up to about 2^18 operations; 2^17 keeps a margin for machines with more cores.
SERIAL_WORK = 1 << 17

# Relative cost of one evaluation of a body node: a transcendental call costs several arithmetic operations.
_CALL_COST = 8


def body_cost(spec: Spec) -> int:
    """Estimated operations per iteration of the loop nest: one per arithmetic node and per array read,
    ``_CALL_COST`` per function call."""
    cost = 0
    for node in walk(spec.body):
        if isinstance(node, Call):
            cost += _CALL_COST
        elif isinstance(node, Binary | Access):
            cost += 1
    return max(cost, 1)


def iterations(spec: Spec, shapes: Mapping[str, tuple[int, ...]]) -> int:
    """The number of points of the index space (free and reduced indices) for these input shapes."""
    from tullax.spec.shapes import eval_shapes

    total = 1
    for lo, hi in eval_shapes(spec, shapes).values():
        total *= max(hi - lo, 0)
    return total


def work(spec: Spec, shapes: Mapping[str, tuple[int, ...]]) -> int:
    """Estimated operations of one call: ``iterations * body_cost`` (at least 1)."""
    return max(iterations(spec, shapes) * body_cost(spec), 1)


def runs_serially(spec: Spec, shapes: Mapping[str, tuple[int, ...]]) -> bool:
    """Whether a loop kernel of ``spec`` should skip the parallel launch for a call with these shapes."""
    return work(spec, shapes) < SERIAL_WORK
