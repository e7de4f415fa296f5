"""This process's compiles in flight (``tullax.runtime.own_compiles``): one registry that the planner's race reads
before it times (``running``) and that a wait for a fast tier's optimised build reads (``wait(kernel)``); a forked
child has none of its parent's compiles."""
from __future__ import annotations

import multiprocessing
import threading
import warnings

from tullax.runtime import own_compiles


def test_a_compile_is_in_flight_while_its_block_runs_and_a_wait_for_what_it_holds_ends_with_it():
    kernel, other = object(), object()
    before = own_compiles.running()
    building = own_compiles.begin("test build", [kernel])
    assert own_compiles.running() == before + 1 and building in own_compiles.in_flight()
    own_compiles.wait(other)  # holds nothing of this compile: no wait
    ended = threading.Event()

    def waiter() -> None:
        own_compiles.wait(kernel)
        ended.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    assert not ended.wait(0.2), "the wait for the kernel ended before its compile"
    own_compiles.end(building)
    thread.join(10)
    assert ended.is_set() and own_compiles.running() == before
    with own_compiles.compiling("another") as block:
        assert block in own_compiles.in_flight()
    assert block.done.is_set() and block not in own_compiles.in_flight()


def _child(queue) -> None:
    queue.put(own_compiles.running())
    own_compiles.wait()  # no thread here ends the parent's compile: it must not wait for it


def test_a_forked_child_has_none_of_its_parents_compiles():
    """A child forked while a compile runs: before one registry, the counter a race reads kept the parent's
    compile in the child for ever (every race there waited out its whole compile budget)."""
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    with own_compiles.compiling():
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*fork.*")
            child = context.Process(target=_child, args=(queue,))
            child.start()
        child.join(60)
        if child.exitcode is None:
            child.kill()
            raise AssertionError("the child waited for its parent's compile")
    assert queue.get(timeout=10) == 0 and child.exitcode == 0
