"""The OpenMP clauses that size the team of a host C kernel's parallel loop (``tullax.printers.c``)."""
from __future__ import annotations

from typing import Sequence

from tullax.compiler.loops import Loop
from tullax.printers.base import LoopPrinter

THREADS = "tx_threads"  # the last parameter of every function: the OpenMP team size (1: serial)


def team(trips: str | None = None) -> str:
    """``tx_threads`` threads, none at all (serial) when it is 1 or when the parallel loop has ``trips`` (a C
    expression) of one iteration: a team woken for one iteration leaves the other threads spinning at the
    barrier (a 64-lane reduction over a recurrence's batch and time, one tile, took 2.7x its serial CPU time
    on two threads: benchmarks/results/scan-threads.json)."""
    if trips is None:
        return f"num_threads({THREADS}) if({THREADS} > 1)"
    return f"num_threads({THREADS}) if({THREADS} > 1 && {trips} > 1)"


def trip_count(printer: LoopPrinter, loops: Sequence[Loop]) -> str:
    """The iterations of the (collapsed) parallel ``loops`` as a C expression (their bounds use no variable of
    theirs: ``tullax.printers.c.collapsible``)."""
    parts = []
    for loop in loops:
        start = printer.expr(loop.start)
        parts.append(f"({printer.expr(loop.stop)})" if start == "0" else f"({printer.expr(loop.stop)} - ({start}))")
    return " * ".join(parts)


__all__ = ["THREADS", "team", "trip_count"]
