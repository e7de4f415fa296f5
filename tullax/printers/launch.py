"""The launch geometry of a GPU-style printer: which loops of a kernel become the ndrange (the grid).

Target-neutral: the Julia printer maps these loops to KernelAbstractions' ndrange; a CUDA printer would
collapse them into a grid-stride loop. Both print the remaining statements as the per-work-item body.

* The parallel nest at the top of the body (``parallel_nest``) always goes into the ndrange.
* Scatter kernels: the loops the lowering left serial because they may hit the same element twice are ALSO
  moved into the ndrange when they form a chain under the parallel nest (only ``Let``s and guard ``If``s between
  them, bounds that are sizes); their ``atomic_add`` stores must then print atomically. So a histogram
  ``h[ix[b]] += v[b]`` runs one work-item per ``b`` instead of one thread in total.
* A kernel with no parallel loop (a scalar result) has an empty ndrange: the printer runs it as one work-item.
"""
from __future__ import annotations

from dataclasses import replace

from tullax.compiler.loops import Expr, If, Let, Loop, LoopKernel, Stmt, binop, expr_vars, parallel_nest
from tullax.errors import TullaxError


def launch_nest(kernel: LoopKernel) -> tuple[tuple[Loop, ...], tuple[Stmt, ...]]:
    """(the loops that become the ndrange, outermost first; the per-work-item statements).

    The parallel nest, plus for a scatter kernel the colliding serial loops that chain below it, placed
    outermost so the parallel loops keep the fastest, usually unit-stride, dimensions. Bounds of every ndrange
    loop depend on sizes only."""
    parallel, body = parallel_nest(kernel)
    promoted: list[Loop] = []
    sizes = {s.name for s in kernel.sizes}
    while kernel.is_scatter:
        found = _promote(body, sizes)
        if found is None:
            break
        loop, body = found
        promoted.append(loop)
    loops = tuple(promoted) + parallel  # the parallel loops stay innermost: the fastest ndrange dimensions
    for loop in loops:
        if not (expr_vars(loop.start) | expr_vars(loop.stop)) <= sizes:
            raise TullaxError(f"internal error: ndrange loop {loop.var} of {kernel.name} has bounds that are "
                              "not sizes")
    return loops, tuple(body)


def _promote(block: tuple[Stmt, ...], sizes: set[str]) -> tuple[Loop, tuple[Stmt, ...]] | None:
    """The serial loop ending the chain ``Let...; (Loop | If(then=chain))`` and the block without it (its body in
    its place), or None. Lets and guards before it are pure, so running them once per work-item is the same."""
    if not block or not all(isinstance(s, Let) for s in block[:-1]):
        return None
    last = block[-1]
    if isinstance(last, Loop) and not last.parallel and (expr_vars(last.start) | expr_vars(last.stop)) <= sizes:
        return last, block[:-1] + last.body
    if isinstance(last, If) and not last.orelse:
        inner = _promote(last.then, sizes)
        if inner is not None:
            loop, then = inner
            return loop, block[:-1] + (replace(last, then=then),)
    return None


def ndrange_extents(kernel: LoopKernel) -> tuple[Expr, ...]:
    """The extent of each ndrange loop in IR order (outermost first), or () for a single-work-item kernel.
    Integer expressions over the size parameters."""
    loops, _ = launch_nest(kernel)
    return tuple(binop("-", loop.stop, loop.start) for loop in loops)


__all__ = ["launch_nest", "ndrange_extents"]
