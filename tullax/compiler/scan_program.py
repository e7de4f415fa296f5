"""A scan program (``tullax.spec.scan_program``) as ONE loop kernel: every statement of the step inside the one
sequential ``t`` loop.

Given the trajectory, the step's statements (the locals, then the scan statement unrolled) are a row-wise program
over the scan statement's indices, so the per-row fusion (``tullax.compiler.fuse``) stitches them: a local indexed
by the rows is a register, one with an index more a row buffer, each statement lowered as on its own. The fused
nest is then rearranged as ``tullax.compiler.scan`` rearranges one scan: the lanes (the other row indices) stay
parallel, outermost; ``t`` runs sequentially inside them (reverse: downwards), so every local of step t is
recomputed there, from the results of the steps before, which the output array holds (the initial state before
the start: ``tullax.compiler.scan``'s read swap).
"""
from __future__ import annotations

from dataclasses import replace

from tullax.compiler.fuse import Fused, NotFusable, _fuse
from tullax.compiler.hoist import hoist_invariants
from tullax.compiler.loops import INDEX, Buffer, Const, Let, Loop, Var, binop, parallel_nest
from tullax.compiler.scan import _swap_reads
from tullax.spec.program import Program, Statement
from tullax.spec.scan import TRAJECTORY
from tullax.spec.scan_program import step_specs


def fuse_scan_program(program: Program, dtype: str, name: str = "program", hoist: bool = True) -> Fused:
    """The one loop kernel of the scan program for data of ``dtype``, or ``NotFusable`` with the reason.
    ``hoist``: terms that are the same at every step computed once per lane, before ``t``, into row buffers
    (``tullax.compiler.hoist``; the CPU form: a GPU thread per lane holds no buffer)."""
    step = program.step
    scan = step.scan
    specs = step_specs(program)
    flat = replace(program, step=None, statements=tuple(
        Statement(st.text, st.canonical, spec, st.local, st.number) for st, spec in zip(program.statements, specs)))
    scan_spec = specs[step.number - 1]
    rows = scan_spec.free
    fused = _fuse(flat, dtype, name, True, rows)
    kernel = fused.kernel
    loops, inner = parallel_nest(kernel)
    if len(loops) < len(rows):
        raise NotFusable("the step's row loops are not a plain nest")
    loops, inner = loops[:len(rows)], _inside(loops[len(rows):], inner)
    t_loop = loops[scan.axis]
    lanes = [loop for k, loop in enumerate(loops) if k != scan.axis]
    trajectory = next((a for a in kernel.arrays if a.source == TRAJECTORY), None)
    arrays = tuple(a for a in kernel.arrays if a.source != TRAJECTORY)
    out = kernel.arrays[0]
    init = None
    if scan.init is not None:
        init = next((a for a in arrays if a.source == scan.init), None)
        if init is None:
            rank = len(rows) - (1 if scan.depth == 1 else 0)
            init = replace(out, name=f"a{len(kernel.arrays)}", source=scan.init, rank=rank, role="in")
            arrays += (init,)
    body = inner if trajectory is None else _swap_reads(inner, trajectory.name, out, init, scan, t_loop.var,
                                                        t_loop.stop)
    # the row buffers live for the lane's whole sequence (declared once, before t: no allocation per step)
    before: tuple = tuple(st for st in body if isinstance(st, Buffer))
    body = tuple(st for st in body if not isinstance(st, Buffer))
    if hoist:  # the terms every step recomputes (softplus of a weight), once per lane before t
        fixed = frozenset(a.name for a in kernel.sizes) | frozenset(a.name for a in kernel.scalars)
        pre, body = hoist_invariants(body, fixed, frozenset(a.name for a in arrays if a.role == "in"))
        before += pre
    if scan.reverse:  # t = start + stop - 1 - u, for u running upwards
        u = t_loop.var + "r"
        top = binop("-", binop("+", t_loop.start, t_loop.stop), Const(1, INDEX))
        nest = before + (Loop(u, t_loop.start, t_loop.stop, False,
                              (Let(t_loop.var, binop("-", top, Var(u, INDEX))),) + body),)
    else:
        nest = before + (replace(t_loop, parallel=False, body=body),)
    for loop in reversed(lanes):
        nest = (replace(loop, body=nest),)
    text = "; ".join(("local " if st.local else "") + st.canonical for st in program.statements)
    return replace(fused, kernel=replace(kernel, spec_text=text, arrays=arrays, body=nest), program=program)


def _inside(loops, inner):
    """The parallel loops below the rows (none in a fused kernel: its other indices run serially) around ``inner``."""
    for loop in reversed(loops):
        inner = (replace(loop, body=inner),)
    return inner


__all__ = ["fuse_scan_program"]
