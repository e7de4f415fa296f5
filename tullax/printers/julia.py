"""Print loop-nest kernels (``tullax.compiler.lower``) as a KernelAbstractions 0.9 Julia module.

The mapping:

* One ``@kernel function <name>!(...)`` per IR kernel, plus a host launcher ``run_<name>!(backend, params...)``
  that launches it over the right ndrange; on ``CPU_FLAVOUR`` it then calls ``KernelAbstractions.synchronize(
  backend)``, on ``GPU_FLAVOUR`` it returns with the work enqueued on CUDA.jl's task-local stream (the caller
  orders it against XLA's stream, or synchronises before it copies back). Parameters keep
  the IR's order (arrays, output first; scalars; sizes). Sizes arrive as ``Int`` and scalars as Python
  floats/ints/bools do through juliacall (``Float64``/``Int``/``Bool``), converted where used (``Float32(s0)``);
  a kernel never assigns to a parameter (KernelAbstractions' CPU work-item loop would carry it over).
* A module is printed for one ``Flavour``, the KernelAbstractions backend it runs on. ``CPU_FLAVOUR``: no
  ``@Const`` (on Julia 1.11/1.12 its alias scope tags every load and store of the kernel, and the tiled
  read-modify-write of the output is the pattern that miscompiles: KernelAbstractions issue 652, julia issue
  60029), and every launch passes ``workgroupsize = cpu_workgroupsize(ndrange)``, a helper printed in the module
  (KernelAbstractions' default on ``CPU()`` makes ONE work-group, so one task on one thread, of an ndrange of up to
  1024 work-items, while a work-item here may be a whole tile or reduction). ``GPU_FLAVOUR``: read-only arrays are
  ``@Const`` (read-only cache loads) and KernelAbstractions picks the work-group size (``kernel(backend)``).
* Layout: a row-major NumPy array of shape (a, b) IS the column-major Julia array of size (b, a), so every index
  list is printed reversed, and 1 is added to every position: IR ``a1[i0, i2]`` prints as ``a1[i2 + 1, i0 + 1]``.
  Loop variables stay 0-based, so all IR integer arithmetic keeps its values; a loop ``[start, stop)`` prints as
  ``for v in start:(stop - 1)``.
* The ndrange: the loops ``tullax.printers.launch.launch_nest`` picks (the parallel nest, plus the colliding
  serial loops of a scatter, whose ``atomic_add`` stores print as ``Atomix.@atomic A[...] += v``), reversed into
  Julia order (the innermost loop is the first, fastest dimension). ``@index(Global, NTuple)`` is destructured at
  the top of the kernel and each IR loop variable is rebuilt from it (``i0 = g0 - 1 + start``). The launcher
  skips the launch when an extent is not positive. An ``atomic_add`` that stays in a serial loop keeps the atomic
  form (correct either way).
* Kernels with no parallel loop (a scalar result, whose reduction loop the lowering marks ``reduce_parallel``)
  run as ONE work-item: ndrange ``(1,)``, work-group size 1, the reduction serial in a register. Simple and exact
  (the same summation order as the serial definition); a per-thread partial scheme would need a second kernel or
  atomics, and these kernels are small in practice (the gradient of a scalar parameter).
* Block-tiled and cooperative kernels (threads that share memory and synchronise) print for ``GPU_FLAVOUR``
  only, through ``tullax.printers.julia_groups``: one work-group per point of the parallel nest, ``@localmem``,
  ``@synchronize()``.
* A ``Scratch`` is ``zeros(T, n)``, a heap array per work-item: the lowering makes one only in a tiled kernel (the
  CPU flavour) and only when its sum is long enough to amortise it.
* ``@inbounds begin ... end`` around the per-item body: the lowering guarantees every access is in range (plain and
  affine ones by the inferred ranges, which the host checks against the shapes before calling; ``mod``/``clamp``
  by construction; ``pad`` and indirect ones under a check).
* Expressions: floor division and modulo print as ``fld``/``mod``; ``Select`` as a ternary ``c ? a : b`` (only the
  chosen branch runs); ``and``/``or``/``not`` as ``&& || !``; typed literals (``1.5f0``, ``-Inf32``, ``NaN``);
  ``Cast`` as a constructor call (``Float32(x)``, ``Int64(ix[...])``); ``x^3`` for an integer constant exponent
  (Julia's exact ``literal_pow``). Julia's real functions with a ``julia_domain`` in the function registry
  (``log``, ``sqrt``, ``sin``...) and ``^`` throw DomainError outside their domain where NumPy/XLA give NaN; they
  print as small ``@inline`` helpers (``log_nan_f32``...) defined at the top of the module that return NaN there
  instead (``pow_nan_*`` returns IEEE ``pow``'s values, which XLA follows, for a negative base, infinities
  included).
* Syntax kept inside what both Julia and tree-sitter-julia 0.23 read the same way (``tests/julia_subset.py``
  executes what tree-sitter parses): ``if`` conditions are parenthesised (tree-sitter reads ``if n + 1 > 0`` as
  ``if n`` followed by ``+1 > 0``); a negated compound operand is wrapped whole, ``-(x - y)`` and ``-(x^2)``
  (Julia reads ``-(x)^2`` as the call ``-(x)`` squared); the base of ``^`` is atomic and a numeric base gets spaces
  (``2.0f0 ^ 3``: ``2.0f0^(...)`` is a juxtaposition); comparisons never chain; negative operands are
  parenthesised.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

from tullax._version import __version__
from tullax.compiler.loops import (
    ALIGNED,
    INDEX,
    LoopKernel,
    Var,
    binop,
    const,
)
from tullax.errors import TullaxError
from tullax.printers import julia_groups
from tullax.printers.base import (
    Place,
    Precedence,
)
from tullax.printers.julia_syntax import (  # noqa: F401 - the printer's public names live on here too
    _CPU_WORKGROUP_SOURCE,
    _SUFFIX,
    CPU_FLAVOUR,
    CPU_GROUP_MAX_ITEMS,
    CPU_GROUPS_PER_THREAD,
    CPU_WORKGROUP_HELPER,
    GPU_FLAVOUR,
    JULIA_TYPES,
    POWER_HELPER,
    Flavour,
    JuliaPrinter,
    _helper_source,
    _helpers,
    _is_int,
    _kernel_params,
    _literal_power,
    _wrapped,
    arrival_dtype,
    format_const,
    format_float,
    helper_name,
    julia_type,
    launcher_name,
)
from tullax.printers.launch import launch_nest, ndrange_extents


# =============================================================================================
# Kernels, launchers, modules
# =============================================================================================
def kernel_function(kernel: LoopKernel, flavour: Flavour) -> str:
    """The ``@kernel`` function."""
    if kernel.tile is not None or kernel.cooperative:  # threads that cooperate: tullax.printers.julia_groups
        _gpu_only(kernel, flavour)
        return julia_groups.kernel_function(kernel)
    printer = JuliaPrinter(kernel)
    loops, body = launch_nest(kernel)
    lines = [f"# {kernel.name}: {kernel.spec_text}",
             f"@kernel function {kernel.name}!({', '.join(_kernel_params(kernel, flavour))})"]
    if loops:
        names = [f"g{k}" for k in range(len(loops))]
        lines.append(f"    ({', '.join(reversed(names))},) = @index(Global, NTuple)"
                     if len(names) == 1 else f"    ({', '.join(reversed(names))}) = @index(Global, NTuple)")
        for name, loop in zip(names, loops):
            position = binop("+", binop("-", Var(name, INDEX), const(1)), loop.start)
            lines.append(f"    {loop.var} = {printer.expr(position)}")
    lines.append("    @inbounds begin")
    if kernel.vector:  # vector lanes (tullax.compiler.vectorize): printed here as scalar reads, so any address will do
        lines.append(f"        {ALIGNED} = true")
    lines += printer.block(body, Place(2))
    lines.append("    end")
    lines.append("end")
    return "\n".join(lines) + "\n"






def launcher_function(kernel: LoopKernel, flavour: Flavour) -> str:
    """``run_<name>!(backend, params...)``: launch over the ndrange (Julia order), then synchronize when the
    flavour says so."""
    if kernel.tile is not None or kernel.cooperative:
        _gpu_only(kernel, flavour)
        return julia_groups.launcher_function(kernel)
    printer = JuliaPrinter(kernel)
    params = ", ".join(kernel.params)
    extents = ndrange_extents(kernel)
    lines = [f"function {launcher_name(kernel)}(backend, {params})"]
    if extents:
        julia_order = [printer.expr(e) for e in reversed(extents)]
        ndrange = f"({julia_order[0]},)" if len(julia_order) == 1 else f"({', '.join(julia_order)})"
        positive = " && ".join(f"{printer.expr(e, Precedence.COMPARE + 1)} > 0" for e in reversed(extents))
        lines.append(f"    if ({positive})")
        if flavour.cpu_workgroups:
            lines += [f"        ndrange = {ndrange}",
                      f"        {kernel.name}!(backend)({params}; ndrange = ndrange, "
                      f"workgroupsize = {CPU_WORKGROUP_HELPER}(ndrange))"]
        else:
            lines.append(f"        {kernel.name}!(backend)({params}; ndrange = {ndrange})")
        lines.append("    end")
    else:  # one work-item does everything
        lines.append(f"    {kernel.name}!(backend, 1)({params}; ndrange = (1,))")
    if flavour.synchronize:
        lines.append("    KernelAbstractions.synchronize(backend)")
    lines += ["    return nothing", "end"]
    return "\n".join(lines) + "\n"


def _gpu_only(kernel: LoopKernel, flavour: Flavour) -> None:
    if flavour != GPU_FLAVOUR:
        raise TullaxError(f"internal error: {kernel.name} is block-tiled or cooperative, a schedule for a GPU; the "
                          "Julia printer prints it for GPU_FLAVOUR only (tullax.printers.julia_groups)")


_HEADER = """\
# Generated by tullax {version} for the Julia backend (KernelAbstractions 0.9). Do not edit: regenerated from the
# spec. Arrays are NumPy's row-major buffers seen as column-major Julia arrays: every index list is reversed and
# 1-based. Launch a kernel through its run_<name>!(backend, arrays..., scalars..., sizes...) function.
"""


def module_body(kernels: Sequence[LoopKernel], flavour: Flavour) -> str:
    """Everything inside ``module ... end``."""
    parts = ["using KernelAbstractions\nusing Atomix\n"]
    helpers = _helpers(kernels)
    merges = julia_groups.helpers(kernels)
    if merges:
        parts.append("# the one-pass logsumexp's merge of two (max, sum) pairs\n" + "\n".join(merges) + "\n")
    if helpers:
        parts.append("# NaN outside the real domain, as NumPy and XLA, where Julia would throw DomainError\n"
                     + "\n".join(helpers) + "\n")
    if flavour.cpu_workgroups and any(ndrange_extents(k) for k in kernels):
        parts.append(_CPU_WORKGROUP_SOURCE)
    for kernel in kernels:
        parts.append(kernel_function(kernel, flavour))
        parts.append(launcher_function(kernel, flavour))
    return "\n".join(parts)


def module_name(body: str) -> str:
    """``TullaxKernels_<hash of the body>``: the same kernels always get the same module name, different ones
    never collide (the name identifies a module inside a precompiled package too)."""
    return "TullaxKernels_" + hashlib.sha256(body.encode("utf-8")).hexdigest()[:16]


def print_module(kernels: Sequence[LoopKernel], *, flavour: Flavour) -> str:
    """The whole Julia module for ``kernels`` on the backend of ``flavour``: header comment, ``module
    TullaxKernels_<hash>``, helpers, one ``@kernel`` and one launcher per kernel, ``end``."""
    names = [k.name for k in kernels]
    if len(set(names)) != len(names):
        raise TullaxError(f"internal error: kernel names repeat in one Julia module: {names}")
    body = module_body(kernels, flavour)
    name = module_name(body)
    return f"{_HEADER.format(version=__version__)}module {name}\n\n{body}\nend # module {name}\n"


def name_of_module(source: str) -> str:
    """The module name of a printed source (the line ``module TullaxKernels_...``)."""
    for line in source.splitlines():
        if line.startswith("module "):
            return line.split()[1]
    raise TullaxError("internal error: printed Julia source has no module line")


__all__ = [
    "JuliaPrinter", "print_module", "kernel_function", "launcher_function", "launcher_name", "module_name",
    "name_of_module", "julia_type", "arrival_dtype", "format_float", "helper_name", "Flavour", "CPU_FLAVOUR",
    "GPU_FLAVOUR", "CPU_WORKGROUP_HELPER", "CPU_GROUPS_PER_THREAD", "CPU_GROUP_MAX_ITEMS",
]
