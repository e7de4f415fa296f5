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


def fuse_scan_program(program: Program, dtype: str, name: str = "program", hoist: bool = True,
                      gpu: bool = False) -> Fused:
    """The one loop kernel of the scan program for data of ``dtype``, or ``NotFusable`` with the reason.
    ``hoist``: terms that are the same at every step computed once per lane, before ``t``, into row buffers
    (``tullax.compiler.hoist``; the CPU form). ``gpu``: the form of a GPU thread per lane, which holds no buffer:
    nothing hoisted, float32 sums in one register, and a row buffer read once per element by one later loop
    (issue 7024's hidden layer, summed by the output) computed inside that loop instead (``inline_buffers``), or
    ``NotFusable``."""
    step = program.step
    scan = step.scan
    specs = step_specs(program)
    flat = replace(program, step=None, statements=tuple(
        Statement(st.text, st.canonical, spec, st.local, st.number) for st, spec in zip(program.statements, specs)))
    scan_spec = specs[step.number - 1]
    rows = scan_spec.free
    fused = _fuse(flat, dtype, name, not gpu, rows=rows)
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
    agree = fused.agree
    if gpu:
        body, same = inline_buffers(body)
        agree += same
        if any(_reads(st, buffer.var) for buffer in before for st in body):
            raise NotFusable("a row buffer of the step is read by more than one loop, or not once per element: a "
                             "GPU thread per lane holds no buffer")
        before = ()
    elif hoist:  # the terms every step recomputes (softplus of a weight), once per lane before t
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
    return replace(fused, kernel=replace(kernel, spec_text=text, arrays=arrays, body=nest), program=program,
                   agree=agree)


def inline_buffers(body: tuple) -> tuple[tuple, tuple]:
    """``body`` (a step) with each row buffer that one later loop reads once per element (at its own variable,
    not inside a loop of its own) computed in that loop instead: the producing loop's work for that element, then
    the reads as its value. The buffers left (the others) stay in ``body``'s Buffer statements, which the caller
    holds; returns (the new body, the bounds that must agree: producer's and consumer's loops)."""
    body = list(body)
    agree: list = []
    changed = True
    while changed:
        changed = False
        for k, producer in enumerate(body):
            found = _buffer_store(producer)
            if found is None:
                continue
            buffer, value = found
            readers = [j for j in range(len(body)) if j != k and _reads(body[j], buffer)]
            if len(readers) != 1 or readers[0] < k or not isinstance(body[readers[0]], Loop):
                continue
            consumer = body[readers[0]]
            inlined = _inline(consumer, producer, buffer, value)
            if inlined is None:
                continue
            agree += [(x, y) for x, y in ((producer.start, consumer.start), (producer.stop, consumer.stop)) if x != y]
            body[readers[0]] = inlined
            del body[k]
            changed = True
            break
    return tuple(body), tuple(agree)


def _buffer_store(stmt):
    """(buffer, value) where ``stmt`` is a serial loop whose last statement stores into a row buffer at the loop's
    own variable and whose other statements store nothing."""
    from tullax.compiler.loops import Store, walk_stmts

    if not isinstance(stmt, Loop) or stmt.parallel or not stmt.body:
        return None
    last = stmt.body[-1]
    if not isinstance(last, Store) or last.mode != "set" or last.index != (Var(stmt.var, INDEX),) \
            or not last.array.startswith("b_"):
        return None
    if any(isinstance(s, Store) for s in walk_stmts(stmt.body[:-1])):
        return None
    return last.array, last.value


def _reads(stmt, buffer: str) -> bool:
    from tullax.compiler.loops import Load, expressions, walk_expr

    return any(isinstance(e, Load) and e.array == buffer for x in expressions((stmt,)) for e in walk_expr(x))


def _inline(consumer: Loop, producer: Loop, buffer: str, value):
    """The consumer loop computing the producer's element itself, or None where a read is not at the consumer's
    variable or sits in a nested loop (it would recompute the element there)."""
    from tullax.compiler.loops import Load, statement_expressions, walk_expr
    from tullax.compiler.scan import map_statement_expressions, rebuild_expression

    here = Var(consumer.var, INDEX)
    element = f"v_{buffer}"
    for stmt in consumer.body:
        nested = isinstance(stmt, Loop) or type(stmt).__name__ == "If"
        for e in (walk_expr(x) for x in statement_expressions(stmt)):
            for node in e:
                if isinstance(node, Load) and node.array == buffer and (nested or node.index != (here,)):
                    return None
        if nested and _reads(stmt, buffer):
            return None

    def swap(expr):
        if isinstance(expr, Load) and expr.array == buffer:
            return Var(element, expr.dtype)
        return rebuild_expression(expr, swap)

    work = (Let(producer.var, here),) + tuple(producer.body[:-1]) + (Let(element, value),)
    return replace(consumer, body=work + tuple(map_statement_expressions(s, swap) for s in consumer.body))


def _inside(loops, inner):
    """The parallel loops below the rows (none in a fused kernel: its other indices run serially) around ``inner``."""
    for loop in reversed(loops):
        inner = (replace(loop, body=inner),)
    return inner


__all__ = ["fuse_scan_program"]
