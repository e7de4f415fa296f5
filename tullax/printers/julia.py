"""Print loop-nest kernels (``tullax.lower``) as a KernelAbstractions 0.9 Julia module.

Pure functions over the IR, no state. The mapping:

* One ``@kernel function <name>!(...)`` per IR kernel, plus a host launcher ``run_<name>!(backend, params...)``
  that launches it over the right ndrange, lets KernelAbstractions pick the work-group size (``kernel(backend)``,
  dynamic) and calls ``KernelAbstractions.synchronize(backend)``. Parameters keep the IR's order (arrays, output
  first; scalars; sizes). Read-only arrays are ``@Const``; sizes arrive as ``Int`` and scalars as Python
  floats/ints/bools do through juliacall (``Float64``/``Int``/``Bool``), converted where used (``Float32(s0)``);
  a kernel never assigns to a parameter (KernelAbstractions' CPU work-item loop would carry it over).
* Layout: a row-major NumPy array of shape (a, b) IS the column-major Julia array of size (b, a), so every index
  list is printed reversed, and 1 is added to every position: IR ``a1[i0, i2]`` prints as ``a1[i2 + 1, i0 + 1]``.
  Loop variables stay 0-based, so all IR integer arithmetic keeps its values; a loop ``[start, stop)`` prints as
  ``for v in start:(stop - 1)``.
* The ndrange: the perfect nest of parallel loops at the top of the body (``parallel_nest``), reversed into Julia
  order (the innermost loop is the first, fastest dimension). ``@index(Global, NTuple)`` is destructured at the
  top of the kernel and each IR loop variable is rebuilt from it (``i0 = g0 - 1 + start``). The launcher skips
  the launch when an extent is not positive.
* Scatter kernels: the loops the lowering left serial because they may hit the same element twice are ALSO moved
  into the ndrange when they form a chain under the parallel nest (only ``Let``s and guard ``If``s between them,
  bounds that are sizes), and their ``atomic_add`` stores print as ``Atomix.@atomic A[...] += v``. So a histogram
  ``h[ix[b]] += v[b]`` runs one work-item per ``b`` on a GPU instead of one thread in total. An ``atomic_add``
  that stays in a serial loop keeps the atomic form (correct either way).
* Kernels with no parallel loop (a scalar result, whose reduction loop the lowering marks ``reduce_parallel``)
  run as ONE work-item: ndrange ``(1,)``, work-group size 1, the reduction serial in a register. Simple and exact
  (the same summation order as the serial definition); a per-thread partial scheme would need a second kernel or
  atomics, and these kernels are small in practice (the gradient of a scalar parameter).
* ``@inbounds begin ... end`` around the per-item body: the lowering guarantees every access is in range (plain and
  affine ones by the inferred ranges, which the host checks against the shapes before calling; ``mod``/``clamp``
  by construction; ``pad`` and indirect ones under a check).
* Expressions: floor division and modulo print as ``fld``/``mod``; ``Select`` as a ternary ``c ? a : b`` (only the
  chosen branch runs); ``and``/``or``/``not`` as ``&& || !``; typed literals (``1.5f0``, ``-Inf32``, ``NaN``);
  ``Cast`` as a constructor call (``Float32(x)``, ``Int64(ix[...])``); ``x^3`` for an integer constant exponent
  (Julia's exact ``literal_pow``). Julia's real ``log``, ``log1p``, ``sqrt``, ``sin``, ``cos``, ``tan`` and ``^``
  throw DomainError outside their domain where NumPy/XLA give NaN; they print as small ``@inline`` helpers
  (``log_nan_f32``...) defined at the top of the module that return NaN there instead.
* Syntax kept inside what both Julia and tree-sitter-julia 0.23 read the same way (``tests/julia_subset.py``
  executes what tree-sitter parses): ``if`` conditions are parenthesised (tree-sitter reads ``if n + 1 > 0`` as
  ``if n`` followed by ``+1 > 0``); a negated compound operand is wrapped whole, ``-(x - y)`` and ``-(x^2)``
  (Julia reads ``-(x)^2`` as the call ``-(x)`` squared); the base of ``^`` is atomic and a numeric base gets spaces
  (``2.0f0 ^ 3``: ``2.0f0^(...)`` is a juxtaposition); comparisons never chain; negative operands are
  parenthesised.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np

from tullax._version import __version__
from tullax.compiler.loops import (
    COMPARE,
    INDEX,
    Accum,
    BinOp,
    Call,
    Cast,
    Const,
    Expr,
    If,
    Let,
    Load,
    Loop,
    LoopKernel,
    Select,
    Stmt,
    Store,
    UnOp,
    Var,
    binop,
    const,
    expr_vars,
    parallel_nest,
    walk_expr,
    walk_stmts,
)
from tullax.errors import TullaxError

# =============================================================================================
# Types and literals
# =============================================================================================
JULIA_TYPES = {
    "float32": "Float32", "float64": "Float64", "float16": "Float16",
    "int64": "Int64", "int32": "Int32", "int16": "Int16", "int8": "Int8",
    "uint64": "UInt64", "uint32": "UInt32", "uint16": "UInt16", "uint8": "UInt8",
    "bool": "Bool",
}


def julia_type(dtype: str) -> str:
    """The Julia type of a NumPy dtype name (the element type of a zero-copy array view)."""
    try:
        return JULIA_TYPES[str(dtype)]
    except KeyError:
        raise TullaxError(f"the Julia backend has no element type for dtype {dtype}; use float32/float64 "
                          "data and integer index arrays") from None


def arrival_dtype(dtype: str) -> str:
    """The dtype a scalar parameter has when it reaches Julia: juliacall turns a Python float into Float64, an
    int into Int64, a bool into Bool (the host passes plain Python numbers)."""
    if dtype == "bool":
        return "bool"
    return "float64" if dtype.startswith("float") else "int64"


def format_float(value: float, dtype: str) -> str:
    """A Julia literal of the float dtype: ``1.5f0`` / ``1.0f-5`` for Float32, ``1.5`` / ``1.0e-5`` for Float64.
    Float32 values print with NumPy's shortest round-trip digits, so Julia parses back the same Float32."""
    single = dtype == "float32"
    if math.isnan(value):
        return "NaN32" if single else "NaN"
    if math.isinf(value):
        text = "Inf32" if single else "Inf"
        return text if value > 0 else "-" + text
    text = str(np.float32(value)) if single else repr(float(value))
    mantissa, _, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    power = int(exponent) if exponent else 0
    if single:
        return f"{mantissa}f{power}"
    return f"{mantissa}e{power}" if exponent else mantissa


def format_const(node: Const) -> str:
    value = node.value
    if isinstance(value, (bool, np.bool_)):
        text = "true" if value else "false"
        return text if node.dtype == "bool" else f"{julia_type(node.dtype)}({text})"
    if node.dtype in ("float32", "float64"):
        return format_float(float(value), node.dtype)
    if node.dtype == INDEX:
        return str(int(value))
    return f"{julia_type(node.dtype)}({int(value) if float(value).is_integer() else float(value)})"


# =============================================================================================
# Expressions
# =============================================================================================
# Precedence, higher binds tighter (Julia: ?: < || < && < comparisons < + - < * / < unary < ^).
_TERNARY, _OR, _AND, _CMP, _SUM, _PRODUCT, _UNARY, _POWER, _ATOM = 0, 1, 2, 3, 4, 5, 6, 7, 9
_BINARY = {"+": ("+", _SUM), "-": ("-", _SUM), "*": ("*", _PRODUCT), "/": ("/", _PRODUCT),
           "and": ("&&", _AND), "or": ("||", _OR), "<": ("<", _CMP), "<=": ("<=", _CMP), ">": (">", _CMP),
           ">=": (">=", _CMP), "==": ("==", _CMP), "!=": ("!=", _CMP)}
_CALLED = {"//": "fld", "mod": "mod", "max": "max", "min": "min"}  # binary IR ops printed as calls
# Real functions that throw DomainError in Julia where NumPy/XLA give NaN, and the condition on x for NaN.
_DOMAIN = {"log": "x < {zero}", "log1p": "x < -{one}", "sqrt": "x < {zero}",
           "sin": "isinf(x)", "cos": "isinf(x)", "tan": "isinf(x)"}
_SUFFIX = {"float32": "f32", "float64": "f64"}


@dataclass(frozen=True)
class _Context:
    """What printing an expression needs beyond the node: the dtype each scalar parameter arrives as."""

    arrivals: Mapping[str, str]


def _context(kernel: LoopKernel) -> _Context:
    return _Context({s.name: arrival_dtype(s.dtype) for s in kernel.scalars})


def helper_name(fn: str, dtype: str) -> str:
    """The NaN-returning helper for ``fn`` in ``dtype``: ``log_nan_f32``, ``pow_nan_f64``..."""
    return f"{fn}_nan_{_SUFFIX[dtype]}"


def expr_text(expr: Expr, ctx: _Context, parent: int = 0) -> str:
    """Julia source of ``expr``, parenthesised when it binds looser than its ``parent`` position requires."""
    text, prec = _expr(expr, ctx)
    return f"({text})" if prec < parent else text


def _operand(expr: Expr, ctx: _Context, parent: int) -> str:
    """An operand of a binary operator; a negative literal or negation is always parenthesised there."""
    text = expr_text(expr, ctx, parent)
    return f"({text})" if text.startswith("-") else text


def index_text(index: Sequence[Expr], ctx: _Context) -> str:
    """A 0-based row-major IR index list as a 1-based column-major Julia one: reversed, plus one."""
    return ", ".join(expr_text(binop("+", i, const(1)), ctx) for i in reversed(tuple(index)))


def _expr(expr: Expr, ctx: _Context) -> tuple[str, int]:
    if isinstance(expr, Const):
        text = format_const(expr)
        return text, (_UNARY if text.startswith("-") else _ATOM)
    if isinstance(expr, Var):
        arrives = ctx.arrivals.get(expr.name)
        if arrives is not None and arrives != expr.dtype:
            return f"{julia_type(expr.dtype)}({expr.name})", _ATOM
        return expr.name, _ATOM
    if isinstance(expr, Load):
        return f"{expr.array}[{index_text(expr.index, ctx)}]", _ATOM
    if isinstance(expr, Cast):
        return f"{julia_type(expr.dtype)}({expr_text(expr.arg, ctx)})", _ATOM
    if isinstance(expr, Call):
        return _call(expr, ctx), _ATOM
    if isinstance(expr, Select):
        text = (f"{expr_text(expr.cond, ctx, _OR)} ? {expr_text(expr.then, ctx, _OR)} : "
                f"{expr_text(expr.orelse, ctx, _OR)}")
        return text, _TERNARY
    if isinstance(expr, UnOp):  # `-(x)^2` would parse as `(-(x))^2`: a compound operand is wrapped whole
        symbol = "-" if expr.op == "neg" else "!"
        text, prec = _expr(expr.arg, ctx)
        atomic = prec == _ATOM and not text.startswith(("-", "("))
        return f"{symbol}{text}" if atomic else f"{symbol}({text})", _UNARY
    assert isinstance(expr, BinOp), expr
    return _binary(expr, ctx)


def _binary(expr: BinOp, ctx: _Context) -> tuple[str, int]:
    if expr.op in _CALLED:
        return f"{_CALLED[expr.op]}({expr_text(expr.lhs, ctx)}, {expr_text(expr.rhs, ctx)})", _ATOM
    if expr.op == "^":
        return _power(expr, ctx)
    symbol, prec = _BINARY[expr.op]
    if expr.op in COMPARE:  # comparisons never chain: both sides bind tighter
        return f"{_operand(expr.lhs, ctx, prec + 1)} {symbol} {_operand(expr.rhs, ctx, prec + 1)}", prec
    return f"{_operand(expr.lhs, ctx, prec)} {symbol} {_operand(expr.rhs, ctx, prec + 1)}", prec


def _power(expr: BinOp, ctx: _Context) -> tuple[str, int]:
    exponent = expr.rhs
    if isinstance(exponent, Const) and exponent.dtype == INDEX:  # literal_pow: exact, any base sign
        base = expr_text(expr.lhs, ctx, _ATOM)
        power = str(int(exponent.value)) if exponent.value >= 0 else f"({int(exponent.value)})"
        spaced = isinstance(expr.lhs, Const)  # `2.0f0^(...)` would parse as a juxtaposition
        return (f"{base} ^ {power}" if spaced else f"{base}^{power}"), _POWER
    fn = helper_name("pow", expr.dtype)
    return f"{fn}({expr_text(expr.lhs, ctx)}, {expr_text(exponent, ctx)})", _ATOM


def _call(expr: Call, ctx: _Context) -> str:
    args = ", ".join(expr_text(a, ctx) for a in expr.args)
    if expr.fn in _DOMAIN and expr.dtype in _SUFFIX:
        return f"{helper_name(expr.fn, expr.dtype)}({args})"
    return f"{expr.fn}({args})"


# =============================================================================================
# Statements
# =============================================================================================
_INDENT = "    "


def stmt_lines(stmts: Sequence[Stmt], ctx: _Context, depth: int) -> list[str]:
    pad = _INDENT * depth
    lines: list[str] = []
    for stmt in stmts:
        if isinstance(stmt, Loop):
            last = expr_text(binop("-", stmt.stop, const(1)), ctx, _ATOM)
            lines.append(f"{pad}for {stmt.var} in {expr_text(stmt.start, ctx, _ATOM)}:{last}")
            lines += stmt_lines(stmt.body, ctx, depth + 1)
            lines.append(f"{pad}end")
        elif isinstance(stmt, If):  # parenthesised: tree-sitter-julia misreads `if n + 1 > 0`
            lines.append(f"{pad}if ({expr_text(stmt.cond, ctx)})")
            lines += stmt_lines(stmt.then, ctx, depth + 1)
            if stmt.orelse:
                lines.append(f"{pad}else")
                lines += stmt_lines(stmt.orelse, ctx, depth + 1)
            lines.append(f"{pad}end")
        elif isinstance(stmt, Let):
            lines.append(f"{pad}{stmt.var} = {expr_text(stmt.value, ctx)}")
        elif isinstance(stmt, Accum):
            value = expr_text(stmt.value, ctx)
            if stmt.op in ("max", "min"):
                lines.append(f"{pad}{stmt.var} = {stmt.op}({stmt.var}, {value})")
            else:
                lines.append(f"{pad}{stmt.var} {stmt.op}= {value}")
        else:
            assert isinstance(stmt, Store), stmt
            lines.append(pad + _store(stmt, ctx))
    return lines


def _store(stmt: Store, ctx: _Context) -> str:
    target = f"{stmt.array}[{index_text(stmt.index, ctx)}]"
    value = expr_text(stmt.value, ctx)
    if stmt.mode == "set":
        return f"{target} = {value}"
    if stmt.mode == "add":
        return f"{target} += {value}"
    return f"Atomix.@atomic {target} += {value}"


# =============================================================================================
# The launch geometry
# =============================================================================================
def launch_nest(kernel: LoopKernel) -> tuple[tuple[Loop, ...], tuple[Stmt, ...]]:
    """(the loops that become the ndrange, outermost first; the per-work-item statements).

    The parallel nest, plus for a scatter kernel the colliding serial loops that chain below it (their
    ``atomic_add`` stores print atomically), placed outermost so the parallel loops keep the fastest, usually
    unit-stride, dimensions. Bounds of every ndrange loop depend on sizes only."""
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
    """The extent of each ndrange loop in IR order (outermost first; Julia's ndrange is the reverse), or () for a
    single-work-item kernel. Integer expressions over the size parameters."""
    loops, _ = launch_nest(kernel)
    return tuple(binop("-", loop.stop, loop.start) for loop in loops)


# =============================================================================================
# Kernels, launchers, modules
# =============================================================================================
def kernel_function(kernel: LoopKernel) -> str:
    """The ``@kernel`` function."""
    ctx = _context(kernel)
    loops, body = launch_nest(kernel)
    lines = [f"# {kernel.name}: {kernel.spec_text}",
             f"@kernel function {kernel.name}!({', '.join(_kernel_params(kernel))})"]
    if loops:
        names = [f"g{k}" for k in range(len(loops))]
        lines.append(f"    ({', '.join(reversed(names))},) = @index(Global, NTuple)"
                     if len(names) == 1 else f"    ({', '.join(reversed(names))}) = @index(Global, NTuple)")
        for name, loop in zip(names, loops):
            position = binop("+", binop("-", Var(name, INDEX), const(1)), loop.start)
            lines.append(f"    {loop.var} = {expr_text(position, ctx)}")
    lines.append("    @inbounds begin")
    lines += stmt_lines(body, ctx, 2)
    lines.append("    end")
    lines.append("end")
    return "\n".join(lines) + "\n"


def _kernel_params(kernel: LoopKernel) -> list[str]:
    params = [a.name if a.role != "in" else f"@Const({a.name})" for a in kernel.arrays]
    params += [f"{s.name}::{julia_type(arrival_dtype(s.dtype))}" for s in kernel.scalars]
    params += [f"{s.name}::Int" for s in kernel.sizes]
    return params


def launcher_name(kernel: LoopKernel) -> str:
    return f"run_{kernel.name}!"


def launcher_function(kernel: LoopKernel) -> str:
    """``run_<name>!(backend, params...)``: launch over the ndrange (Julia order) and synchronize."""
    ctx = _context(kernel)
    params = ", ".join(kernel.params)
    extents = ndrange_extents(kernel)
    lines = [f"function {launcher_name(kernel)}(backend, {params})"]
    if extents:
        julia_order = [expr_text(e, ctx) for e in reversed(extents)]
        ndrange = f"({julia_order[0]},)" if len(julia_order) == 1 else f"({', '.join(julia_order)})"
        positive = " && ".join(f"{expr_text(e, ctx, _CMP + 1)} > 0" for e in reversed(extents))
        lines += [f"    if ({positive})",
                  f"        {kernel.name}!(backend)({params}; ndrange = {ndrange})",
                  "    end"]
    else:  # one work-item does everything
        lines.append(f"    {kernel.name}!(backend, 1)({params}; ndrange = (1,))")
    lines += ["    KernelAbstractions.synchronize(backend)", "    return nothing", "end"]
    return "\n".join(lines) + "\n"


def _helpers(kernels: Sequence[LoopKernel]) -> list[str]:
    """Definitions of the NaN-returning helpers the kernels call, in a fixed order."""
    needed: set[tuple[str, str]] = set()
    for kernel in kernels:
        for stmt in walk_stmts(kernel.body):
            for expr in _stmt_exprs(stmt):
                for node in walk_expr(expr):
                    if isinstance(node, Call) and node.fn in _DOMAIN and node.dtype in _SUFFIX:
                        needed.add((node.fn, node.dtype))
                    elif isinstance(node, BinOp) and node.op == "^" and not (
                            isinstance(node.rhs, Const) and node.rhs.dtype == INDEX):
                        needed.add(("pow", node.dtype))
    return [_helper_source(fn, dtype) for fn, dtype in sorted(needed)]


def _stmt_exprs(stmt: Stmt) -> tuple[Expr, ...]:
    if isinstance(stmt, Loop):
        return (stmt.start, stmt.stop)
    if isinstance(stmt, If):
        return (stmt.cond,)
    if isinstance(stmt, (Let, Accum)):
        return (stmt.value,)
    assert isinstance(stmt, Store)
    return stmt.index + (stmt.value,)


def _helper_source(fn: str, dtype: str) -> str:
    jt = julia_type(dtype)
    zero, one, nan = (format_float(v, dtype) for v in (0.0, 1.0, math.nan))
    name = helper_name(fn, dtype)
    if fn == "pow":  # Julia throws for a negative base and a non-integer exponent; IEEE pow gives NaN there
        return (f"@inline {name}(x::{jt}, y::{jt}) = x >= {zero} || isnan(x) ? x^y : "
                f"(isinf(y) ? abs(x)^y : (rem(y, {one}) == {zero} ? x^y : {nan}))")
    condition = _DOMAIN[fn].format(zero=zero, one=one)
    return f"@inline {name}(x::{jt}) = {condition} ? {nan} : {fn}(x)"


_HEADER = """\
# Generated by tullax {version} for the Julia backend (KernelAbstractions 0.9). Do not edit: regenerated from the
# spec. Arrays are NumPy's row-major buffers seen as column-major Julia arrays: every index list is reversed and
# 1-based. Launch a kernel through its run_<name>!(backend, arrays..., scalars..., sizes...) function.
"""


def module_body(kernels: Sequence[LoopKernel]) -> str:
    """Everything inside ``module ... end``."""
    parts = ["using KernelAbstractions\nusing Atomix\n"]
    helpers = _helpers(kernels)
    if helpers:
        parts.append("# NaN outside the real domain, as NumPy and XLA, where Julia would throw DomainError\n"
                     + "\n".join(helpers) + "\n")
    for kernel in kernels:
        parts.append(kernel_function(kernel))
        parts.append(launcher_function(kernel))
    return "\n".join(parts)


def module_name(body: str) -> str:
    """``TullaxKernels_<hash of the body>``: the same kernels always get the same module name, different ones
    never collide (the name identifies a module inside a precompiled package too)."""
    return "TullaxKernels_" + hashlib.sha256(body.encode("utf-8")).hexdigest()[:16]


def print_module(kernels: Sequence[LoopKernel]) -> str:
    """The whole Julia module for ``kernels``: header comment, ``module TullaxKernels_<hash>``, helpers, one
    ``@kernel`` and one launcher per kernel, ``end``."""
    names = [k.name for k in kernels]
    if len(set(names)) != len(names):
        raise TullaxError(f"internal error: kernel names repeat in one Julia module: {names}")
    body = module_body(kernels)
    name = module_name(body)
    return f"{_HEADER.format(version=__version__)}module {name}\n\n{body}\nend # module {name}\n"


def name_of_module(source: str) -> str:
    """The module name of a printed source (the line ``module TullaxKernels_...``)."""
    for line in source.splitlines():
        if line.startswith("module "):
            return line.split()[1]
    raise TullaxError("internal error: printed Julia source has no module line")


__all__ = [
    "print_module", "kernel_function", "launcher_function", "launcher_name", "launch_nest", "ndrange_extents",
    "module_name", "name_of_module", "julia_type", "arrival_dtype", "format_float", "expr_text",
]
