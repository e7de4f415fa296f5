"""The CUDA C printer: the loop IR as ``extern "C" __global__`` kernels (one module per kernel set).

The mapping:

* One thread per point of the kernel's launch nest (``tullax.printers.launch.launch_nest``: the parallel nest,
  plus the colliding loops of a scatter): the nest is collapsed into ONE grid-stride loop over the product of
  its extents (each clamped at 0), and each IR loop variable is rebuilt from the flat position by division, the
  innermost loop fastest (consecutive threads touch consecutive elements of the unit-stride axis). The rest of
  the body is the per-thread work: reductions accumulate in registers (the IR's ``Let``/``Accum``), guards and
  bounds print exactly as lowered. A kernel with no parallel loop runs as ONE thread (the reduction serial in a
  register, the same summation order as the serial definition).
* Parameters, in order (``parameters``): the arrays (output first) as ``__restrict__`` pointers of their
  storage type; each scalar as a pointer to its one element (under ``jax`` it is a device buffer the host cannot
  read without a copy), dereferenced once at the top; the IR's size parameters; then, for every array of rank
  >= 2, the extents of its axes 1.. (``a1_e1``), which the row-major flat offset of an element needs.
* Index arithmetic is in ``tx_i32`` or ``tx_i64``, one per kernel (``index_bits``): the host picks 32 bits when
  every integer the kernel computes fits (``tullax.compiler.intervals``), since 64-bit division and
  multiplication cost several instructions each on a GPU.
* Expressions: ``//`` and ``mod`` are FLOOR division and modulo (``tx_floordiv``/``tx_floormod``: C's ``/`` and
  ``%`` truncate); ``max``/``min`` propagate NaN like ``jnp.maximum`` (``tx_max``/``tx_min``; ``fmaxf`` drops
  it); ``x^k`` for an integer constant ``k`` is exact repeated multiplication (``tx_powi``), other powers are
  ``powf``/``pow``; functions are spelled as the registry's ``c`` field says; ``Select`` is a C ternary (only the
  chosen branch runs); infinities and NaN are built from their bit patterns (NVRTC has no ``<cmath>``).
* ``atomic_add`` stores print as ``atomicAdd`` (only scatter kernels have them); every other store is plain.
* Identifiers: the IR's generated names (``a0``, ``s0``, ``n0``, ``i0``, ``t0``, ``acc``...), names derived from
  them (``a1_e1``, ``s0_at``) and the printer's own ``tx_`` names. The spec text appears in a comment only.

The module starts with a prelude (typedefs and the ``tx_`` helpers) behind an include guard, so modules can be
concatenated into one translation unit. The same text compiles with NVRTC and, through a small host header that
defines ``__global__``, ``blockIdx``... and ``atomicAdd`` (``tests/cuda_host.h``), with g++ on the CPU.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar, Mapping, Sequence

import numpy as np

from tullax._version import __version__
from tullax.compiler.loops import (
    FLOATS,
    INDEX,
    Accum,
    BinOp,
    Const,
    Expr,
    Let,
    Loop,
    LoopKernel,
    Stmt,
    Var,
    binop,
    const,
)
from tullax.errors import TullaxError
from tullax.printers.base import (
    Infix,
    LoopPrinter,
    Place,
    Precedence,
    Prefix,
    arithmetic_operators,
    left_associative,
    non_chaining,
)
from tullax.printers.launch import launch_nest
from tullax.spec.functions import Function

INDEX_BITS = (32, 64)
INDEX_TYPES = {32: "tx_i32", 64: "tx_i64"}
# The most threads per block the host launches with, printed as __launch_bounds__(BLOCK_THREADS, 1): with only
# the first number ptxas aims at several resident blocks and caps registers low enough to SPILL (measured: the
# float64 logsumexp at 48 registers with 44 bytes of spills); one block per SM lets it take what it needs.
BLOCK_THREADS = 256
MIN_BLOCKS_PER_SM = 1

C_TYPES = {
    "float32": "float", "float64": "double", "bool": "bool",
    "int8": "tx_i8", "int16": "tx_i16", "int32": "tx_i32", "int64": "tx_i64",
    "uint8": "tx_u8", "uint16": "tx_u16", "uint32": "tx_u32", "uint64": "tx_u64",
}
_FLOAT_SUFFIX = {"float32": "f32", "float64": "f64"}
_POWER = {"float32": "powf", "float64": "pow"}  # `^` with a non-constant exponent (an operator, not a function)


def storage_type(dtype: str) -> str:
    """The C type of an element of an array of ``dtype``."""
    try:
        return C_TYPES[str(dtype)]
    except KeyError:
        raise TullaxError(f"the cuda backend has no element type for dtype {dtype}; use float32/float64 data "
                          "and integer index arrays") from None


@dataclass(frozen=True)
class Parameter:
    """One kernel parameter: ``kind`` is ``array`` (a pointer to the elements of array parameter ``array``),
    ``scalar`` (a pointer to the one element of scalar ``array``), ``size`` (the IR size parameter ``name``) or
    ``extent`` (extent ``axis`` of the array parameter ``array``). ``ctype``: the C type it is passed as."""

    name: str
    kind: str
    dtype: str
    ctype: str
    array: str = ""
    axis: int = 0

    @property
    def pointer(self) -> bool:
        return self.kind in ("array", "scalar")

    @property
    def declaration(self) -> str:
        return f"{self.ctype} __restrict__ {self.name}" if self.pointer else f"const {self.ctype} {self.name}"


def parameters(kernel: LoopKernel, index_bits: int) -> tuple[Parameter, ...]:
    """Every parameter of the printed kernel, in order: arrays, scalars, sizes, extents."""
    index = INDEX_TYPES[index_bits]
    params = []
    for arr in kernel.arrays:
        qualifier = "const " if arr.role == "in" else ""
        params.append(Parameter(arr.name, "array", arr.dtype, f"{qualifier}{storage_type(arr.dtype)}*", arr.name))
    for sc in kernel.scalars:
        params.append(Parameter(f"{sc.name}_at", "scalar", sc.dtype, f"const {storage_type(sc.dtype)}*", sc.name))
    params += [Parameter(size.name, "size", INDEX, index) for size in kernel.sizes]
    for arr in kernel.arrays:
        for axis in range(1, arr.rank):
            params.append(Parameter(extent_name(arr.name, axis), "extent", INDEX, index, arr.name, axis))
    return tuple(params)


def extent_name(array: str, axis: int) -> str:
    return f"{array}_e{axis}"


def format_float(value: float, dtype: str) -> str:
    """A C literal of the float dtype (``1.5f``, ``1e-05f``; ``1.5``), or the prelude's infinity/NaN. Float32
    values print with NumPy's shortest round-trip digits, so the compiler reads back the same float."""
    suffix = _FLOAT_SUFFIX[dtype]
    if math.isnan(value):
        return f"tx_nan_{suffix}()"
    if math.isinf(value):
        return f"tx_inf_{suffix}()" if value > 0 else f"-tx_inf_{suffix}()"
    text = str(np.float32(value)) if dtype == "float32" else repr(float(value))
    if "." not in text and "e" not in text:
        text += ".0"
    return text + "f" if dtype == "float32" else text


@dataclass(frozen=True)
class CudaPlace(Place):
    """``declared``: the locals (name, dtype) already declared in this C scope or an enclosing one. The loop IR
    may bind a name again in the same block (a hoisted value placed before each pass of a logsumexp, as
    Python and Julia rebind it); C declares once and then assigns."""

    declared: frozenset[tuple[str, str]] = frozenset()


class CudaPrinter(LoopPrinter):
    """Loop-IR expressions and statements as CUDA C++ with ``index_bits``-bit index arithmetic."""

    infix: ClassVar[Mapping[str, Infix]] = {
        # C would parse `a < b < c`, as (a < b) < c: never print it
        **arithmetic_operators(non_chaining),
        "and": left_associative("&&", Precedence.AND), "or": left_associative("||", Precedence.OR),
    }
    prefix: ClassVar[Mapping[str, Prefix]] = {"neg": Prefix("-", Precedence.UNARY, Precedence.UNARY),
                                              "not": Prefix("!", Precedence.UNARY, Precedence.UNARY)}
    called: ClassVar[Mapping[str, str]] = {"//": "tx_floordiv", "mod": "tx_floormod", "max": "tx_max",
                                           "min": "tx_min"}
    wrap_negative_operands = True  # `- -x` would print as the decrement `--x`
    if_head = "if ({cond}) {{"
    else_line = "} else {"
    block_end = "}"
    statement_end = ";"
    store_forms: ClassVar[Mapping[str, str]] = {"set": "{target} = {value}", "add": "{target} += {value}",
                                                "atomic_add": "atomicAdd(&{target}, {value})"}

    def __init__(self, index_bits: int):
        if index_bits not in INDEX_BITS:
            raise TullaxError(f"internal error: index arithmetic is 32 or 64 bits, not {index_bits}")
        self.index_type = INDEX_TYPES[index_bits]

    def constant(self, node: Const) -> str:
        value = node.value
        if isinstance(value, (bool, np.bool_)):
            text = "true" if value else "false"
            return text if node.dtype == "bool" else f"{self.type_name(node.dtype)}({text})"
        if node.dtype in FLOATS:
            return format_float(float(value), node.dtype)
        if int(value) == -2**63:  # an integer max's start: the literal 9223372036854775808 has no signed type
            return "(-9223372036854775807LL - 1)"
        return str(int(value))

    def type_name(self, dtype: str) -> str:
        return self.index_type if dtype == INDEX else storage_type(dtype)

    def call_name(self, fn: Function, dtype: str) -> str:
        if dtype not in FLOATS:  # abs of an index value: integer arithmetic
            return "tx_iabs"
        if fn.c is None:
            raise TullaxError(f"internal error: the function registry has no C spelling of {fn.name}")
        return fn.c[FLOATS.index(dtype)]

    def loop_header(self, loop: Loop, place: Place) -> str:
        v = loop.var
        return f"for ({self.index_type} {v} = {self.expr(loop.start)}; {v} < {self.expr(loop.stop)}; ++{v}) {{"

    def block(self, stmts: Sequence[Stmt], place: Place) -> list[str]:
        assert isinstance(place, CudaPlace)
        lines = []
        for stmt in stmts:
            lines += self.statement(stmt, place)
            if isinstance(stmt, Let):
                place = replace(place, declared=place.declared | {(stmt.var, stmt.value.dtype)})
        return lines

    def statement(self, stmt: Stmt, place: Place) -> list[str]:
        assert isinstance(place, CudaPlace)
        if isinstance(stmt, Let) and any(name == stmt.var for name, _ in place.declared):
            if (stmt.var, stmt.value.dtype) not in place.declared:
                raise TullaxError(f"internal error: the loop IR binds {stmt.var} again with another type")
            return [self.indent * place.depth + super().let(stmt) + self.statement_end]
        return super().statement(stmt, place)

    def let(self, stmt: Let) -> str:
        return f"{self.type_name(stmt.value.dtype)} {super().let(stmt)}"

    def helper(self, op: str, dtype: str) -> str:
        """A prelude helper of a binary IR op, instantiated for ``dtype`` (an index operand and a literal
        would otherwise deduce two different template types in 64 bits)."""
        return f"{self.called[op]}<{self.type_name(dtype)}>"

    def accumulate(self, stmt: Accum) -> str:
        if stmt.op in self.called:  # max/min
            return f"{stmt.var} = {self.helper(stmt.op, stmt.value.dtype)}({stmt.var}, {self.expr(stmt.value)})"
        return super().accumulate(stmt)

    def binary(self, expr: BinOp) -> tuple[str, int]:
        if expr.op in self.called:
            return self.call(self.helper(expr.op, expr.lhs.dtype), (expr.lhs, expr.rhs)), Precedence.ATOM
        if expr.op != "^":
            return super().binary(expr)
        if isinstance(expr.rhs, Const) and expr.rhs.dtype == INDEX:  # exact, any sign of the base
            return f"tx_powi({self.expr(expr.lhs)}, {int(expr.rhs.value)})", Precedence.ATOM
        return self.call(_POWER[expr.dtype], (expr.lhs, expr.rhs)), Precedence.ATOM

    def element(self, array: str, index: Sequence[Expr]) -> str:
        """``a[offset]`` with the row-major offset ``(i0 * a_e1 + i1) * a_e2 + i2``."""
        offset: Expr = const(0)
        for axis, position in enumerate(index):
            scaled = binop("*", offset, Var(extent_name(array, axis), INDEX)) if axis else offset
            offset = binop("+", scaled, position)
        return f"{array}[{self.expr(offset)}]"


# =============================================================================================
# Kernels and modules
# =============================================================================================
def kernel_function(kernel: LoopKernel, index_bits: int) -> str:
    """The ``extern "C" __global__`` function of ``kernel``."""
    dtypes = {kernel.compute_dtype, *(a.dtype for a in kernel.arrays), *(s.dtype for s in kernel.scalars)}
    if any(d.startswith("complex") for d in dtypes):
        raise TullaxError("the cuda backend has no complex numbers (its C printer has no complex type): run "
                          "complex64/complex128 specs on backend='xla' (on the GPU too) or 'numba'")
    printer = CudaPrinter(index_bits)
    index = printer.index_type
    declarations = ",\n    ".join(p.declaration for p in parameters(kernel, index_bits))
    lines = [f"// {kernel.name}: {kernel.spec_text}",
             f'extern "C" __global__ void __launch_bounds__({BLOCK_THREADS}, {MIN_BLOCKS_PER_SM}) {kernel.name}('
             f'\n    {declarations})',
             "{"]
    lines += [f"    const {storage_type(s.dtype)} {s.name} = *{s.name}_at;" for s in kernel.scalars]
    loops, body = launch_nest(kernel)
    if not loops:  # a scalar result: one thread does everything
        lines.append("    if (blockIdx.x == 0 && threadIdx.x == 0) {")
        lines += printer.block(body, CudaPlace(2))
        lines += ["    }", "}"]
        return "\n".join(lines) + "\n"
    for k, loop in enumerate(loops):
        extent = binop("max", binop("-", loop.stop, loop.start), const(0))
        lines.append(f"    const {index} tx_ext{k} = {printer.expr(extent)};")
    total = " * ".join(f"tx_ext{k}" for k in range(len(loops)))
    lines += [f"    const {index} tx_total = {total};",
              f"    const {index} tx_stride = {index}(gridDim.x) * {index}(blockDim.x);",
              f"    for ({index} tx_flat = {index}(blockIdx.x) * {index}(blockDim.x) + {index}(threadIdx.x); "
              "tx_flat < tx_total; tx_flat += tx_stride) {"]
    if len(loops) > 1:
        lines.append(f"        {index} tx_rest = tx_flat;")
    rest = "tx_rest" if len(loops) > 1 else "tx_flat"
    for k in reversed(range(len(loops))):  # innermost (fastest) first; tx_flat >= 0 and extents > 0 here
        position = f"{rest} % tx_ext{k}" if k else rest
        start = loops[k].start
        if start != const(0):
            position += f" + {printer.expr(start, Precedence.SUM + 1)}"
        lines.append(f"        const {index} {loops[k].var} = {position};")
        if k:
            lines.append(f"        {rest} /= tx_ext{k};")
    lines += printer.block(body, CudaPlace(2))
    lines += ["    }", "}"]
    return "\n".join(lines) + "\n"


_PRELUDE = """\
#ifndef TULLAX_CUDA_PRELUDE
#define TULLAX_CUDA_PRELUDE
typedef signed char tx_i8;
typedef short tx_i16;
typedef int tx_i32;
typedef long long tx_i64;
typedef unsigned char tx_u8;
typedef unsigned short tx_u16;
typedef unsigned int tx_u32;
typedef unsigned long long tx_u64;

// IEEE infinity and quiet NaN from their bit patterns: NVRTC has no <cmath> and no __builtin_nan
__device__ __forceinline__ float tx_inf_f32() { return __int_as_float(0x7f800000); }
__device__ __forceinline__ float tx_nan_f32() { return __int_as_float(0x7fc00000); }
__device__ __forceinline__ double tx_inf_f64() { return __longlong_as_double(0x7ff0000000000000LL); }
__device__ __forceinline__ double tx_nan_f64() { return __longlong_as_double(0x7ff8000000000000LL); }

// max/min that propagate NaN, as jnp.maximum/minimum (fmaxf/fminf return the other operand)
template <typename T> __device__ __forceinline__ T tx_max(T a, T b) { return (a > b || a != a) ? a : b; }
template <typename T> __device__ __forceinline__ T tx_min(T a, T b) { return (a < b || a != a) ? a : b; }

// floor division and floor modulo (the sign of the divisor), as the loop IR defines them; C's / and % truncate
template <typename T> __device__ __forceinline__ T tx_floordiv(T a, T b) {
    T q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
template <typename T> __device__ __forceinline__ T tx_floormod(T a, T b) {
    T r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
template <typename T> __device__ __forceinline__ T tx_iabs(T a) { return a < 0 ? -a : a; }

// x^n for an integer constant n by repeated squaring (exact signs for negative x, like lax.integer_pow)
template <typename T> __device__ __forceinline__ T tx_powi(T x, int n) {
    T result = T(1);
    T base = x;
    for (unsigned m = n < 0 ? 0u - unsigned(n) : unsigned(n); m != 0; m >>= 1) {
        if (m & 1u) result *= base;
        base *= base;
    }
    return n < 0 ? T(1) / result : result;
}
#endif
"""

_HEADER = "// Generated by tullax {version} for the cuda backend. Do not edit: regenerated from the spec.\n"


def print_module(kernels: Sequence[tuple[LoopKernel, int]]) -> str:
    """One CUDA C++ source for ``kernels``, each with its index width: header, prelude, the kernels."""
    names = [k.name for k, _ in kernels]
    if len(set(names)) != len(names):
        raise TullaxError(f"internal error: kernel names repeat in one CUDA module: {names}")
    parts = [_HEADER.format(version=__version__) + _PRELUDE]
    parts += [kernel_function(kernel, bits) for kernel, bits in kernels]
    return "\n".join(parts)


__all__ = ["BLOCK_THREADS", "INDEX_BITS", "CudaPlace", "CudaPrinter", "Parameter", "extent_name", "format_float",
           "kernel_function", "parameters", "print_module", "storage_type"]
