"""Kernels whose threads cooperate, as KernelAbstractions kernels for a GPU (``GPU_FLAVOUR``): block-tiled
kernels (``LoopKernel.tile``, ``tullax.compiler.tiles``) and block- or warp-cooperative reductions
(``LoopKernel.cooperative``, ``tullax.compiler.cooperate``), the same schedules the CUDA printer prints.

The mapping (``tullax.printers.julia`` for everything else):

* ONE work-group per point of the parallel nest: the launcher runs an ndrange of ``group * points`` work-items
  in groups of ``group`` (``name!(backend, group)(...; ndrange = (group * points,))``): ``tile.threads`` for a
  block tile, ``BLOCK_THREADS`` for a block per element, 32 for a warp per element. ``@index(Group, Linear)``
  gives the point (the nest's loop variables rebuilt from it, innermost fastest), ``@index(Local, Linear) - 1``
  the IR's ``thread``.
* ``Shared`` arrays are ``@localmem T (n,)`` at the kernel's top, once; a ``Barrier`` is ``@synchronize()``.
* A ``lanes`` loop strides by the group: ``for j in (start + thread):group:(stop - 1)``. A ``Combine`` is a fixed
  tree in local memory (``tx_red_f32``, one per float type; a logsumexp's sums in ``tx_sum_f32``): every
  work-item writes its partial, then halving steps ``red[t] = op(red[t], red[t + half])`` for ``t < half``, each
  followed by ``@synchronize()``; everyone reads ``red[1]`` and synchronises once more before the array is
  reused. KernelAbstractions has no portable warp shuffle, so a warp per element merges the same way in a
  group of 32. The order is fixed: results are identical run to run (their last bits may differ from the CUDA
  printer's xor-shuffle tree). A cooperative kernel's stores run on work-item 0 only.
* ``CPU_FLAVOUR`` never gets such a kernel (only the cuda backend's launch planner makes them, and
  KernelAbstractions' CPU backend runs a group's work-items one after another between synchronisations, which
  would need every value that crosses a ``@synchronize`` in ``@private`` memory): printing one for it is an
  internal error.
"""
from __future__ import annotations

from typing import Sequence

from tullax.compiler.loops import (
    FLOATS,
    INDEX,
    THREAD,
    Buffer,
    Combine,
    Loop,
    LoopKernel,
    Shared,
    Stmt,
    Store,
    Var,
    binop,
    const,
    walk_stmts,
)
from tullax.errors import TullaxError
from tullax.printers.base import Place, Precedence, SharedLanes
from tullax.printers.julia_syntax import GPU_FLAVOUR, JuliaPrinter, _kernel_params, julia_type, launcher_name
from tullax.printers.launch import launch_nest, ndrange_extents

WARP = 32
BLOCK_THREADS = 256  # the cuda printer's block of a cooperative reduction (tullax.printers.cuda.BLOCK_THREADS)
_SUFFIX = {"float32": "f32", "float64": "f64"}


def group_size(kernel: LoopKernel) -> int:
    """The work-items of each group of ``kernel`` (a block tile's threads, a block or a warp)."""
    if kernel.tile is not None:
        return kernel.tile.threads
    return WARP if kernel.warp else BLOCK_THREADS


def cooperates(kernel: LoopKernel) -> bool:
    return kernel.tile is not None or kernel.cooperative


class GroupPrinter(SharedLanes, JuliaPrinter):
    """The Julia printer plus the statements of cooperating work-items."""

    def __init__(self, kernel: LoopKernel):
        super().__init__(kernel)
        self.kernel, self.group = kernel, group_size(kernel)

    def loop_header(self, loop: Loop, place: Place) -> str:
        if not loop.lanes:
            return super().loop_header(loop, place)
        first = self.expr(binop("+", loop.start, Var(THREAD, INDEX)), Precedence.ATOM)
        last = self.expr(binop("-", loop.stop, const(1)), Precedence.ATOM)
        return f"for {loop.var} in {first}:{self.group}:{last}"

    def shared(self, stmt: Shared, place: Place) -> list[str]:
        return []  # declared at the kernel's top (``kernel_function``)

    def barrier(self) -> str:
        return "@synchronize()"

    def statement(self, stmt: Stmt, place: Place) -> list[str]:
        pad = self.indent * place.depth
        if isinstance(stmt, Combine):
            return [pad + line for line in self.combine(stmt)]
        if isinstance(stmt, Buffer) and stmt.shared:  # the group's, declared at the kernel's top
            return []
        if isinstance(stmt, Store) and self.kernel.cooperative and not self.lanes_depth:
            return [f"{pad}if (thread == 0)", f"{pad}{self.indent}{self.store(stmt)}", f"{pad}end"]
        return super().statement(stmt, place)

    def combine(self, stmt: Combine) -> list[str]:
        suffix = _SUFFIX[stmt.dtype]
        red, sums = f"tx_red_{suffix}", f"tx_sum_{suffix}"
        lines = [f"{red}[thread + 1] = {stmt.var}"]
        if stmt.op == "logsumexp":
            lines.append(f"{sums}[thread + 1] = {stmt.scaled}")
        lines.append("@synchronize()")
        half = self.group // 2
        while half:
            mine, other = f"{red}[thread + 1]", f"{red}[thread + {half + 1}]"
            lines.append(f"if (thread < {half})")
            if stmt.op == "logsumexp":
                lines += [f"    (tx_m, tx_s) = tx_lse_merge_{suffix}({mine}, {sums}[thread + 1], {other}, "
                          f"{sums}[thread + {half + 1}])",
                          f"    {mine} = tx_m", f"    {sums}[thread + 1] = tx_s"]
            elif stmt.op == "+":
                lines.append(f"    {mine} = {mine} + {other}")
            else:
                lines.append(f"    {mine} = {stmt.op}({mine}, {other})")
            lines += ["end", "@synchronize()"]
            half //= 2
        lines.append(f"{stmt.var} = {red}[1]")
        if stmt.op == "logsumexp":
            lines.append(f"{stmt.scaled} = {sums}[1]")
        lines.append("@synchronize()")  # nobody overwrites the array before everyone has read the total
        return lines


def kernel_function(kernel: LoopKernel) -> str:
    """The ``@kernel`` function of a cooperating kernel (GPU flavour: read-only arrays are ``@Const``)."""
    printer = GroupPrinter(kernel)
    group = printer.group
    loops, body = launch_nest(kernel)
    if not loops:
        raise TullaxError(f"internal error: the cooperating kernel {kernel.name} has no parallel loop")
    lines = [f"# {kernel.name}: {kernel.spec_text}",
             f"@kernel function {kernel.name}!({', '.join(_kernel_params(kernel, GPU_FLAVOUR))})",
             "    tx_local = @index(Local, Linear)",
             "    tx_group = @index(Group, Linear)"]
    lines += [f"    {s.var} = @localmem {julia_type(s.dtype)} ({s.length},)"
              for s in walk_stmts(kernel.body) if isinstance(s, Shared)]
    # a block per row's row buffers: local memory sized by the call's sizes (KernelAbstractions' @localmem wants
    # a size known when the kernel compiles: a GPU run specialises on it)
    lines += [f"    {s.var} = @localmem {julia_type(s.dtype)} ({printer.expr(s.length)},)"
              for s in walk_stmts(kernel.body) if isinstance(s, Buffer) and s.shared]
    combined = sorted({(s.dtype, s.op == "logsumexp") for s in walk_stmts(kernel.body) if isinstance(s, Combine)})
    for dtype in sorted({d for d, _ in combined}):
        lines.append(f"    tx_red_{_SUFFIX[dtype]} = @localmem {julia_type(dtype)} ({group},)")
        if (dtype, True) in combined:
            lines.append(f"    tx_sum_{_SUFFIX[dtype]} = @localmem {julia_type(dtype)} ({group},)")
    lines.append(f"    {THREAD} = tx_local - 1")
    rest = "tx_group - 1"
    for k in reversed(range(len(loops))):  # the innermost loop fastest, as the CUDA printer's grid-stride loop
        loop = loops[k]
        extent = printer.expr(binop("max", binop("-", loop.stop, loop.start), const(0)))
        lines.append(f"    tx_ext{k} = {extent}")
        position = f"mod({rest}, tx_ext{k})" if k else rest
        start = printer.expr(loop.start, Precedence.SUM + 1)
        lines.append(f"    {loop.var} = {position}" + ("" if start == "0" else f" + {start}"))
        if k:
            lines.append(f"    tx_rest{k} = fld({rest}, tx_ext{k})")
            rest = f"tx_rest{k}"
    lines.append("    @inbounds begin")
    lines += printer.block(body, Place(2))
    lines += ["    end", "end"]
    return "\n".join(lines) + "\n"


def launcher_function(kernel: LoopKernel) -> str:
    """``run_<name>!(backend, params...)``: one work-group per point of the parallel nest, returning at once."""
    printer = GroupPrinter(kernel)
    params = ", ".join(kernel.params)
    extents = ndrange_extents(kernel)
    points = " * ".join(printer.expr(e, Precedence.PRODUCT + 1) for e in extents)
    positive = " && ".join(f"{printer.expr(e, Precedence.COMPARE + 1)} > 0" for e in extents)
    return "\n".join([f"function {launcher_name(kernel)}(backend, {params})",
                      f"    if ({positive})",
                      f"        {kernel.name}!(backend, {printer.group})({params}; ndrange = ({printer.group} * "
                      f"{points},))",
                      "    end",
                      "    return nothing",
                      "end"]) + "\n"


def helpers(kernels: Sequence[LoopKernel]) -> list[str]:
    """The one-pass logsumexp's merge of two (max, sum) pairs, per float type a kernel merges them in (the CUDA
    prelude's ``tx_lse_merge``: each sum rescaled to the larger max, not when it is 0 or already there)."""
    dtypes = sorted({s.dtype for k in kernels if cooperates(k) for s in walk_stmts(k.body)
                     if isinstance(s, Combine) and s.op == "logsumexp"})
    out = []
    for dtype in dtypes:
        if dtype not in FLOATS:
            raise TullaxError(f"internal error: a logsumexp merge of {dtype}")
        t, sfx = julia_type(dtype), _SUFFIX[dtype]
        zero = "0.0f0" if dtype == "float32" else "0.0"
        out += [f"@inline tx_lse_safe_{sfx}(m::{t}) = (m - m == {zero}) ? m : {zero}",
                f"@inline tx_lse_rescale_{sfx}(s::{t}, m::{t}, to::{t}) = (s == {zero} || m == to) ? s : "
                f"s * exp(tx_lse_safe_{sfx}(m) - tx_lse_safe_{sfx}(to))",
                f"@inline function tx_lse_merge_{sfx}(m::{t}, s::{t}, om::{t}, os::{t})",
                "    to = max(m, om)",
                f"    return (to, tx_lse_rescale_{sfx}(s, m, to) + tx_lse_rescale_{sfx}(os, om, to))",
                "end"]
    return out


__all__ = ["GroupPrinter", "cooperates", "group_size", "helpers", "kernel_function", "launcher_function"]
