"""Benchmark machinery shared by ``tullax bench`` (a user's own kernel) and ``benchmarks/run.py`` (the suite).

Every backend runs in its own child process (``python -m tullax.benchmarking.worker``): Numba and Julia each
load an LLVM and must never meet in one process, and a child's peak RSS is that backend's memory alone.
The parent (``runner``) spawns the children, enforces timeouts and shows progress; ``report`` turns the
results into JSON, Markdown and a PNG chart. Nothing here is imported by ``import tullax``.
"""
