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
* A fused program's row ``Buffer`` is only printed in a block per row (``Buffer.shared``): a slice of the block's
  dynamic shared memory (``extern __shared__ double tx_dynamic[]``, ``shared_buffer_bytes`` long, given at launch).
  A thread-per-row kernel with a buffer is refused: a per-thread device-heap ``malloc`` is slow and fails once the
  8 MB heap is spent by the resident threads, and a global scratch of rows x length would be the program's local
  as a full array, what fusion avoids; such a program runs unfused on a GPU.
* ``atomic_add`` stores print as ``atomicAdd`` (only scatter kernels have them); every other store is plain.
* Cooperative kernels (``LoopKernel.cooperative``): the grid-stride loop runs over BLOCKS, one per point of the
  launch nest; a ``lanes`` loop strides by the block's threads; a ``Combine`` is a call of ``tx_block_combine``
  (a fixed ``__shfl_xor_sync`` tree per warp, the warps' partials through the shared array ``tx_red``, the same
  tree again: every thread gets the total, identical on every run); stores are guarded to thread 0. The block
  is a whole number of warps (the host launches ``BLOCK_THREADS``). Shared arrays are declared through
  ``TX_SHARED(type, name, count)`` so the host header can give each emulated block its own. With
  ``LoopKernel.warp`` the unit is a warp: the grid-stride loop runs over warps, lanes loops stride by 32, a
  ``Combine`` is the shuffle tree alone (``tx_warp_combine``), no shared memory, no barrier.
* Block-tiled kernels (``LoopKernel.tile``, ``tullax.compiler.tiles``): the grid-stride loop runs over blocks,
  one per tile; the host launches exactly ``tile.threads`` threads per block; the IR's ``thread`` is
  ``threadIdx.x``; each ``Shared`` array is declared once at the kernel's top through ``TX_SHARED``; a
  ``Barrier`` is ``__syncthreads()``.
* Identifiers: the IR's generated names (``a0``, ``s0``, ``n0``, ``i0``, ``t0``, ``acc``...), names derived from
  them (``a1_e1``, ``s0_at``) and the printer's own ``tx_`` names. The spec text appears in a comment only.

The module starts with a prelude (typedefs and the ``tx_`` helpers) behind an include guard, so modules can be
concatenated into one translation unit. The same text compiles with NVRTC and, through a small host header that
defines ``__global__``, ``blockIdx``... and ``atomicAdd`` (``tests/cuda_host.h``), with g++ on the CPU.
"""
from __future__ import annotations

from typing import ClassVar, Mapping, Sequence

from tullax._version import __version__
from tullax.compiler.intervals import loaded_index
from tullax.compiler.loops import (
    ALIGNED,
    INDEX,
    THREAD,
    Barrier,
    Buffer,
    Combine,
    Const,
    Expr,
    Let,
    Loop,
    LoopKernel,
    Shared,
    Stmt,
    Store,
    Var,
    VectorLoad,
    VectorStore,
    binop,
    const,
    walk_stmts,
)
from tullax.compiler.vectorize import vector_arrays
from tullax.errors import TullaxError
from tullax.printers.base import LoopPrinter, Place, Precedence, SharedLanes
from tullax.printers.clike import (
    TYPEDEFS,
    CLikePrinter,
    CPlace,
    Parameter,
    extent_name,
    format_float,
    helper_definitions,
    storage_type,
)
from tullax.printers.cuda_complex import CUDA_COMPLEX_PRELUDE, CUDA_COMPLEX_TYPES, ComplexCuda
from tullax.printers.launch import launch_nest

INDEX_BITS = (32, 64)
INDEX_TYPES = {32: "tx_i32", 64: "tx_i64"}
# The most threads per block the host launches with, printed as __launch_bounds__(BLOCK_THREADS, 1): with only
# the first number ptxas aims at several resident blocks and caps registers low enough to SPILL (measured: the
# float64 logsumexp at 48 registers with 44 bytes of spills); one block per SM lets it take what it needs.
BLOCK_THREADS = 256
MIN_BLOCKS_PER_SM = 1

def element_type(dtype: str) -> str:
    """The CUDA type of an element of ``dtype``: the C types, and the prelude's ``tx_c64``/``tx_c128``."""
    return CUDA_COMPLEX_TYPES.get(str(dtype)) or storage_type(dtype)


def parameters(kernel: LoopKernel, index_bits: int) -> tuple[Parameter, ...]:
    """Every parameter of the printed kernel, in order: arrays, scalars, sizes, extents."""
    index = INDEX_TYPES[index_bits]
    params = []
    for arr in kernel.arrays:
        qualifier = "const " if arr.role == "in" else ""
        params.append(Parameter(arr.name, "array", arr.dtype, f"{qualifier}{element_type(arr.dtype)}*", arr.name))
    for sc in kernel.scalars:
        params.append(Parameter(f"{sc.name}_at", "scalar", sc.dtype, f"const {element_type(sc.dtype)}*", sc.name))
    params += [Parameter(size.name, "size", INDEX, index) for size in kernel.sizes]
    for arr in kernel.arrays:
        for axis in range(1, arr.rank):
            params.append(Parameter(extent_name(arr.name, axis), "extent", INDEX, index, arr.name, axis))
    return tuple(params)


# CUDA's vector types by (element type, count): what a VectorLoad reads in one instruction
_VECTORS = {("float32", 4): "float4", ("float32", 2): "float2", ("float64", 2): "double2"}
_THREAD = Var("tx_thread", INDEX)  # the thread's position in its block, declared by cooperative kernels
CudaPlace = CPlace  # the name the CUDA tests and callers know


class CudaPrinter(SharedLanes, ComplexCuda, CLikePrinter):
    """Loop-IR expressions and statements as CUDA C++ with ``index_bits``-bit index arithmetic: the shared C
    printer, with the helpers as templates and ``atomicAdd`` for colliding scatter stores; complex values as the
    prelude's structs (``tullax.printers.cuda_complex``)."""

    backend = "cuda"
    store_forms: ClassVar[Mapping[str, str]] = {"set": "{target} = {value}", "add": "{target} += {value}",
                                                "atomic_add": "atomicAdd(&{target}, {value})"}

    # Combine.op -> the combining operation of tx_block_combine and its identity (what a warp slot past the
    # block's last warp contributes)
    # a fused program's row buffer: only a block per row holds one, a slice of the block's dynamic shared memory
    # (``statement``); a thread per row has none (``kernel_function`` refuses it)
    buffer_form = ""

    combine_forms: ClassVar[Mapping[str, tuple[str, float]]] = {
        "+": ("tx_op_add", 0.0), "max": ("tx_op_max", float("-inf")), "min": ("tx_op_min", float("inf"))}

    def __init__(self, index_bits: int, cooperative: bool = False, warp: bool = False):
        if index_bits not in INDEX_BITS:
            raise TullaxError(f"internal error: index arithmetic is 32 or 64 bits, not {index_bits}")
        super().__init__(INDEX_TYPES[index_bits])
        self.cooperative, self.warp = cooperative, warp
        self._dynamic: Expr = const(0)  # where the next row buffer starts in tx_dynamic (8-byte words)

    def loop_header(self, loop: Loop, place: Place) -> str:
        if not loop.lanes:
            return super().loop_header(loop, place)
        index = self.index_type
        start = self.expr(binop("+", loop.start, _THREAD))
        width = "32" if self.warp else f"{index}(blockDim.x)"
        return f"for ({index} {loop.var} = {start}; {loop.var} < {self.expr(loop.stop)}; {loop.var} += {width}) {{"

    def statement(self, stmt: Stmt, place: Place) -> list[str]:
        pad = self.indent * place.depth
        if isinstance(stmt, Combine) and stmt.op == "logsumexp":
            kind = self.type_name(stmt.dtype)
            if self.warp:
                return [f"{pad}tx_warp_logsumexp({stmt.var}, {stmt.scaled});"]
            return [f"{pad}tx_block_logsumexp({stmt.var}, {stmt.scaled}, ({kind}*)tx_red);"]
        if isinstance(stmt, Combine):
            op, identity = self.combine_forms[stmt.op]
            kind = self.type_name(stmt.dtype)
            if self.warp:
                return [f"{pad}{stmt.var} = tx_warp_combine<{op}>({stmt.var});"]
            return [f"{pad}{stmt.var} = tx_block_combine<{op}>({stmt.var}, "
                    f"{self.expr(Const(identity, stmt.dtype))}, ({kind}*)tx_red);"]
        if isinstance(stmt, Barrier):
            return [f"{pad}__syncthreads();"]
        if isinstance(stmt, Shared):  # declared once at the kernel's top (``kernel_function``)
            return []
        if isinstance(stmt, Buffer):  # the block's slice of dynamic shared memory, laid out as shared_buffer_bytes
            kind = self.type_name(stmt.dtype)
            at, self._dynamic = self._dynamic, binop("+", self._dynamic, stmt.length)
            return [f"{pad}{kind}* {stmt.var} = ({kind}*)(tx_dynamic + {self.expr(at)});"]
        if isinstance(stmt, Store) and self.cooperative and not self.lanes_depth:  # a lanes loop's: each thread its own
            return [f"{pad}if (tx_thread == 0) {self.store(stmt)}{self.statement_end}"]
        return super().statement(stmt, place)

    def let(self, stmt: Let) -> str:
        loaded = loaded_index(stmt.value)
        if loaded is None or self.index_type == INDEX_TYPES[64]:
            return super().let(stmt)
        # a loaded index keeps its array's own type in 32-bit kernels: exact until a guard bounds it, which the
        # host checked (tullax.compiler.intervals: an int64 index past 2^31 must fail the guard, not wrap into it)
        return f"{storage_type(loaded.dtype)} {LoopPrinter.let(self, stmt)}"

    def vector_load(self, stmt: VectorLoad, place: Place) -> list[str]:
        """One 8- or 16-byte read (shared: LDS.64, LDS.128; global: LDG.E.64, LDG.E.128) where CUDA has the vector
        type, unpacked into the locals; scalar reads otherwise."""
        vector = _VECTORS.get((stmt.dtype, len(stmt.vars)))
        if vector is None:
            return super().vector_load(stmt, place)
        pad, kind = self.indent * place.depth, self.type_name(stmt.dtype)
        packed = f"{stmt.vars[0]}_v"
        read = f"tx_load_vec<{vector}, {kind}>({stmt.array}, {self.expr(self.offset(stmt.array, stmt.index))})"
        lines = [f"{pad}const {vector} {packed} = {read};"]
        return lines + [f"{pad}{kind} {var} = {packed}.{part};" for var, part in zip(stmt.vars, "xyzw")]

    def vector_store(self, stmt: VectorStore, place: Place) -> list[str]:
        """One 16-byte write (STG.E.128) where CUDA has the vector type; scalar stores otherwise."""
        vector = _VECTORS.get((stmt.dtype, len(stmt.values)))
        if vector is None:
            return super().vector_store(stmt, place)
        pad, kind = self.indent * place.depth, self.type_name(stmt.dtype)
        values = ", ".join(self.expr(v) for v in stmt.values)
        at = self.expr(self.offset(stmt.array, stmt.index))
        return [f"{pad}tx_store_vec<{vector}, {kind}>({stmt.array}, {at}, {vector}{{{values}}});"]

    def helper_name(self, name: str, dtype: str) -> str:
        """Binary helpers get their template argument (an index operand and a literal would otherwise deduce two
        different template types in 64 bits); unary ones deduce it."""
        if name in ("tx_powi", "tx_iabs"):
            return name
        return f"{name}<{self.type_name(dtype)}>"


# =============================================================================================
# Kernels and modules
# =============================================================================================
def kernel_function(kernel: LoopKernel, index_bits: int) -> str:
    """The ``extern "C" __global__`` function of ``kernel``."""
    buffers = [s for s in walk_stmts(kernel.body) if isinstance(s, Buffer)]
    if any(not s.shared for s in buffers):
        raise TullaxError(f"internal error: {kernel.name} holds a row buffer in a thread per row; on a GPU a row "
                          f"buffer lives in the shared memory of a block per row (tullax.compiler.fuse.block_per_row), "
                          f"else the program runs unfused: a buffer per thread would be device-heap malloc, slow and "
                          f"failing once the heap is spent")
    printer = CudaPrinter(index_bits, kernel.cooperative, kernel.warp)
    index = printer.index_type
    declarations = ",\n    ".join(p.declaration for p in parameters(kernel, index_bits))
    lines = [f"// {kernel.name}: {kernel.spec_text}",
             f'extern "C" __global__ void __launch_bounds__({BLOCK_THREADS}, {MIN_BLOCKS_PER_SM}) {kernel.name}('
             f'\n    {declarations})',
             "{"]
    lines += [f"    const {element_type(s.dtype)} {s.name} = *{s.name}_at;" for s in kernel.scalars]
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
    lines.append(f"    const {index} tx_total = {total};")
    if kernel.cooperative and kernel.warp:  # a warp per element: the grid-stride loop over warps
        lines += [f"    const {index} {_THREAD.name} = {index}(threadIdx.x) & 31;  // the lane",
                  f"    const {index} tx_stride = {index}(gridDim.x) * ({index}(blockDim.x) / 32);",
                  f"    for ({index} tx_flat = ({index}(blockIdx.x) * {index}(blockDim.x) + {index}(threadIdx.x)) "
                  "/ 32; tx_flat < tx_total; tx_flat += tx_stride) {"]
    elif kernel.tile is not None:  # a block per tile: the grid-stride loop over blocks, shared arrays declared once
        lines += [f"    TX_SHARED({element_type(s.dtype)}, {s.var}, {s.length});"
                  for s in walk_stmts(kernel.body) if isinstance(s, Shared)]
        lines += [f"    const {index} {THREAD} = {index}(threadIdx.x);  // the thread's position in its block",
                  f"    for ({index} tx_flat = {index}(blockIdx.x); tx_flat < tx_total; tx_flat += "
                  f"{index}(gridDim.x)) {{"]
    elif kernel.cooperative:  # a block per element: the grid-stride loop over blocks, the same for all its threads
        lines += ["    TX_SHARED(double, tx_red, 64);  // up to two partials per warp (a double holds any float type)",
                  *(f"    TX_SHARED({element_type(s.dtype)}, {s.var}, {s.length});"
                    for s in walk_stmts(kernel.body) if isinstance(s, Shared)),
                  *(["    TX_DYNAMIC_SHARED(tx_dynamic);  // the row buffers: shared_buffer_bytes, set at launch"]
                    if buffers else []),
                  f"    const {index} {_THREAD.name} = {index}(threadIdx.x);",
                  f"    for ({index} tx_flat = {index}(blockIdx.x); tx_flat < tx_total; tx_flat += "
                  f"{index}(gridDim.x)) {{"]
    else:
        lines += [f"    const {index} tx_stride = {index}(gridDim.x) * {index}(blockDim.x);",
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
    if kernel.vector:  # the vector reads and writes only where every array they touch is 16-byte aligned
        tests = " && ".join(f"tx_aligned16({name})" for name in vector_arrays(kernel)) or "true"
        lines.append(f"        const bool {ALIGNED} = {tests};")
    lines += printer.block(body, CudaPlace(2))
    lines += ["    }", "}"]
    return "\n".join(lines) + "\n"


_PRELUDE = """\
#ifndef TULLAX_CUDA_PRELUDE
#define TULLAX_CUDA_PRELUDE
""" + TYPEDEFS + """
// IEEE infinity and quiet NaN from their bit patterns: NVRTC has no <cmath> and no __builtin_nan
__device__ __forceinline__ float tx_inf_f32() { return __int_as_float(0x7f800000); }
__device__ __forceinline__ float tx_nan_f32() { return __int_as_float(0x7fc00000); }
__device__ __forceinline__ double tx_inf_f64() { return __longlong_as_double(0x7ff0000000000000LL); }
__device__ __forceinline__ double tx_nan_f64() { return __longlong_as_double(0x7ff8000000000000LL); }
template <typename T> __device__ __forceinline__ T tx_inf_of();
template <> __device__ __forceinline__ float tx_inf_of<float>() { return tx_inf_f32(); }
template <> __device__ __forceinline__ double tx_inf_of<double>() { return tx_inf_f64(); }

""" + helper_definitions("__device__ __forceinline__") + """
// a warp shuffle of any value: complex values shuffle their two parts (their overloads, cuda_complex)
template <typename T> __device__ __forceinline__ T tx_shfl_xor(unsigned mask, T v, int offset) {
    return __shfl_xor_sync(mask, v, offset);
}
""" + CUDA_COMPLEX_PRELUDE + """
// Block-cooperative reductions: every thread's v combined by op over the block in a fixed order, the total
// returned to every thread. A xor-shuffle tree in each warp; lane 0 of each warp leaves its result in red (32
// shared slots); then every warp runs the same tree over the warps' results (identity past the last warp), so
// all threads agree bit for bit. blockDim.x must be a whole number of warps and every thread must call it.
// A VectorLoad: n consecutive elements p[i..] in one read; the stage makes i a multiple of n and shared arrays
// start 16-byte aligned. T explicit: a traced shared array (the memory-traffic tracer) converts to T*.
template <typename V, typename T, typename I> __device__ __forceinline__ V tx_load_vec(const T* p, I i) {
    return *reinterpret_cast<const V*>(p + i);
}
template <typename V, typename T, typename I> __device__ __forceinline__ void tx_store_vec(T* p, I i, V v) {
    *reinterpret_cast<V*>(p + i) = v;
}
// Whether p is 16-byte aligned (a vector-lane kernel's test of its arrays, tullax.compiler.vectorize)
template <typename T> __device__ __forceinline__ bool tx_aligned16(const T* p) {
    return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0;
}
struct tx_op_add { template <typename T> __device__ static T apply(T a, T b) { return a + b; } };
struct tx_op_max { template <typename T> __device__ static T apply(T a, T b) { return tx_max<T>(a, b); } };
struct tx_op_min { template <typename T> __device__ static T apply(T a, T b) { return tx_min<T>(a, b); } };
template <typename Op, typename T> __device__ __forceinline__ T tx_warp_combine(T v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = Op::apply(v, tx_shfl_xor(0xffffffffu, v, offset));
    return v;
}
template <typename Op, typename T> __device__ __forceinline__ T tx_block_combine(T v, T identity, T* red) {
    v = tx_warp_combine<Op, T>(v);
    if ((threadIdx.x & 31u) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (threadIdx.x & 31u) < (blockDim.x >> 5) ? red[threadIdx.x & 31u] : identity;
    v = tx_warp_combine<Op, T>(v);
    __syncthreads();  // red is free for the next combine only once every warp has read it
    return v;
}
// A running (max m, sum s of exp(x - m') with m' = m, or 0 where m is infinite) of every thread, merged over the
// block like tx_block_combine: each pair's sums rescaled to the larger max (not when a sum is 0 or its max is
// already the larger: 0 times an overflowing factor would be NaN). red holds 64 values.
template <typename T> __device__ __forceinline__ T tx_exp_of(T x);
template <> __device__ __forceinline__ float tx_exp_of<float>(float x) { return expf(x); }
template <> __device__ __forceinline__ double tx_exp_of<double>(double x) { return exp(x); }
template <typename T> __device__ __forceinline__ T tx_lse_safe(T m) { return m - m == (T)0 ? m : (T)0; }
template <typename T> __device__ __forceinline__ T tx_lse_rescale(T s, T m, T to) {
    return s == (T)0 || m == to ? s : s * tx_exp_of<T>(tx_lse_safe<T>(m) - tx_lse_safe<T>(to));
}
template <typename T> __device__ __forceinline__ void tx_lse_merge(T& m, T& s, T other_m, T other_s) {
    T to = tx_max<T>(m, other_m);
    s = tx_lse_rescale<T>(s, m, to) + tx_lse_rescale<T>(other_s, other_m, to);
    m = to;
}
template <typename T> __device__ __forceinline__ void tx_warp_logsumexp(T& m, T& s) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        T other_m = __shfl_xor_sync(0xffffffffu, m, offset), other_s = __shfl_xor_sync(0xffffffffu, s, offset);
        tx_lse_merge<T>(m, s, other_m, other_s);
    }
}
template <typename T> __device__ __forceinline__ void tx_block_logsumexp(T& m, T& s, T* red) {
    tx_warp_logsumexp<T>(m, s);
    if ((threadIdx.x & 31u) == 0) {
        red[threadIdx.x >> 5] = m;
        red[32 + (threadIdx.x >> 5)] = s;
    }
    __syncthreads();
    bool present = (threadIdx.x & 31u) < (blockDim.x >> 5);
    m = present ? red[threadIdx.x & 31u] : -tx_inf_of<T>();
    s = present ? red[32 + (threadIdx.x & 31u)] : (T)0;
    tx_warp_logsumexp<T>(m, s);
    __syncthreads();
}
#ifndef TX_SHARED
#define TX_SHARED(type, name, count) __shared__ __align__(16) type name[count]
#endif
#ifndef TX_DYNAMIC_SHARED
#define TX_DYNAMIC_SHARED(name) extern __shared__ double name[]
#endif
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
           "element_type", "kernel_function", "parameters", "print_module", "storage_type"]
