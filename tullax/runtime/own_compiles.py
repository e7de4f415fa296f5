"""This process's compiles in flight: one registry of the compiles that run beside its work (a steps module's C
compile started with the forward's, a fast tier's optimised build, XLA compiling the candidates of races to come),
which every wait for a compile reads.

* ``compiling(what, holds)``: a block that is such a compile; ``begin``/``end`` where it starts in one thread and
  ends in another. ``holds``: what it finishes (a fast tier's kernels, whose optimised build it is).
* ``running()``: how many are in flight. ``tullax.planner.race`` waits until none is before it times the loops
  (within its compile budget): a race timed beside them times the loops against the compiler for the cores (an
  OpenMP team waits for its slowest thread, and on 2 cores one thread shares its core with the compiler: an
  elementwise kernel timed 4.5-15 ms there and runs in well under 1 ms).
* ``wait(holding)``: until every compile in flight that holds ``holding`` (every compile: None) has ended; the
  planner's race times a fast tier's kernel as its optimised build runs, never the fast tier.

A forked child has none of its parent's compiles (the threads that ran them are not there): it forgets them, so
it never waits for one nor counts it.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from tullax.runtime import forks


@dataclass(eq=False)
class Compile:
    """One compile in flight: what it is, what it finishes, and the event set when it ends."""
    what: str
    holds: tuple[Any, ...] = ()
    done: threading.Event = field(default_factory=threading.Event)


_LOCK = forks.lock()
_IN_FLIGHT: list[Compile] = []


def begin(what: str, holds: Sequence[Any] = ()) -> Compile:
    """Register a compile that starts now; ``end`` it when it has ended (in any thread)."""
    started = Compile(what, tuple(holds))
    with _LOCK:
        _IN_FLIGHT.append(started)
    return started


def end(compile: Compile) -> None:
    """The compile has ended (landed or failed)."""
    with _LOCK:
        if compile in _IN_FLIGHT:
            _IN_FLIGHT.remove(compile)
    compile.done.set()


@contextmanager
def compiling(what: str = "compile", holds: Sequence[Any] = ()) -> Iterator[Compile]:
    """Marks a compile this process runs beside its work, for as long as the block runs."""
    started = begin(what, holds)
    try:
        yield started
    finally:
        end(started)


def in_flight() -> list[Compile]:
    """The compiles in flight now."""
    with _LOCK:
        return list(_IN_FLIGHT)


def running() -> int:
    """How many of this process's own compiles are in flight now."""
    with _LOCK:
        return len(_IN_FLIGHT)


def wait(holding: Any = None) -> None:
    """Until every compile in flight now that holds ``holding`` (with None: every one) has ended."""
    for compile in in_flight():
        if holding is None or any(held is holding for held in compile.holds):
            compile.done.wait()


def _forget() -> None:
    """In a forked child: no thread here ends its parent's compiles."""
    for compile in _IN_FLIGHT:
        compile.done.set()
    _IN_FLIGHT.clear()


forks.on_fork(_forget)

__all__ = ["Compile", "begin", "compiling", "end", "in_flight", "running", "wait"]
