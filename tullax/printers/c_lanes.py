"""The GCC/Clang vector lanes of the host C printer's max/min and sum reduction loops (``CPrinter.lanes``,
``CPrinter.sum_lanes``): how many lanes a reduction over each dtype keeps, and the prelude's vector types, lane
steps and folds (``LANE_PRELUDE``, not in a plain module). Float and integer types only: complex loops are never
printed as lanes (``tullax.printers.c_complex``)."""
from __future__ import annotations

from tullax.compiler.loops import FLOATS
from tullax.printers.clike import TYPE_SUFFIX, storage_type

HELPER_TYPES = ("float32", "float64", "int32", "int64")  # the types the prelude instantiates its helpers for
# A max/min reduction loop keeps this many bytes of accumulators: two independent compare-select chains, each a
# GCC/Clang vector of VECTOR_BYTES (one AVX2 register): more lanes spill, fewer leave the chains' latency exposed,
# and one 64-byte vector is compared lane by lane, with branches, by GCC without AVX-512 (benchmarks/row_streams.py,
# benchmarks/results/row_streams.json)
LANE_BYTES = 64
VECTOR_BYTES = 32

ELEMENT_BYTES = {"float32": 4, "float64": 8, "int32": 4, "int64": 8, "int16": 2, "int8": 1, "uint8": 1,
                  "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1}
_MASK = {"float32": "tx_i32", "float64": "tx_i64", "int32": "tx_i32", "int64": "tx_i64"}


def lane_count(dtype: str) -> int:
    """The lanes of a max/min reduction loop over ``dtype``: LANE_BYTES of its elements."""
    return LANE_BYTES // ELEMENT_BYTES[dtype]


def vector_lanes(dtype: str) -> int:
    """The lanes of one vector of a max/min reduction loop over ``dtype``: VECTOR_BYTES of its elements."""
    return VECTOR_BYTES // ELEMENT_BYTES[dtype]


# x86's maxps/minps compute exactly the lane step's select (``v > l ? v : l``, ``v < l ? v : l``) in one instruction;
# GCC spells the select as a compare and a blend, whose latency the loop's accumulator chains wait on
# (benchmarks/row_streams.py)
_X86_SELECT = {("max", "float32"): "__builtin_ia32_maxps256", ("min", "float32"): "__builtin_ia32_minps256",
               ("max", "float64"): "__builtin_ia32_maxpd256", ("min", "float64"): "__builtin_ia32_minpd256"}


def _lane_helpers(dtype: str) -> str:
    """The vector and mask types of ``vector_lanes(dtype)`` elements of ``dtype``, its lane max/min steps and the
    folds of a vector of lanes into the accumulator (``tx_vfoldmax_f32``): halves compared with halves, in
    vectors; the lanes and the NaN mask read one by one, a compare and a branch each, cost more than the loop over
    a row of 256 (``benchmarks/row_streams.py``). The result is NaN when a lane saw one, or holds one (it started
    from a NaN accumulator); else the accumulator's max/min with the lanes'."""
    lanes, suffix = vector_lanes(dtype), TYPE_SUFFIX[dtype]
    vector, mask, size = f"tx_v{lanes}_{suffix}", f"tx_m{lanes}_{suffix}", VECTOR_BYTES
    lines = [f"typedef {storage_type(dtype)} {vector} __attribute__((vector_size({size})));",
             f"typedef {_MASK[dtype]} {mask} __attribute__((vector_size({size})));"]
    halves = []
    width = lanes // 2
    while width:  # lane k against lane k ^ width: after the last, lane 0 holds the fold
        halves.append(", ".join(str(k ^ width) for k in range(lanes)))
        width //= 2
    for op, cmp in (("max", ">"), ("min", "<")):
        lines += [f"static inline {vector} tx_v{op}_{suffix}({vector} v, {vector} l, {mask}* nan) {{",
                  "    *nan |= v != v;"]
        builtin = _X86_SELECT.get((op, dtype)) if VECTOR_BYTES == 32 else None
        if builtin:
            lines += ["#ifdef __AVX__", f"    return {builtin}(v, l);", "#else"]
        lines += [f"    {mask} m = v {cmp} l;", f"    return ({vector})((({mask})v & m) | (({mask})l & ~m));"]
        lines += ["#endif", "}"] if builtin else ["}"]
        lines += [f"static inline {storage_type(dtype)} tx_vfold{op}_{suffix}({vector} l, {mask} nan, "
                  f"{storage_type(dtype)} acc) {{",
                  "    nan |= l != l;"]
        for half in halves:
            lines += [f"    l = tx_v{op}_{suffix}(TX_SHUFFLE(l, {mask}, {half}), l, &nan);",
                      f"    nan |= TX_SHUFFLE(nan, {mask}, {half});"]
        nan = f"nan[0] ? tx_nan_{suffix}() : " if dtype in FLOATS else ""
        lines += [f"    return {nan}tx_{op}_{suffix}(acc, l[0]);", "}"]
    for op, sign in (("add", "+"), ("mul", "*")):  # halves with halves, a fixed order: then the accumulator
        lines.append(f"static inline {storage_type(dtype)} tx_vfold{op}_{suffix}({vector} l, "
                     f"{storage_type(dtype)} acc) {{")
        lines += [f"    l = l {sign} TX_SHUFFLE(l, {mask}, {half});" for half in halves]
        lines += [f"    return acc {sign} l[0];", "}"]
    if lanes == 8:  # eight sums' lanes folded at once: each lane's additions exactly tx_vfoldadd's, in vectors
        vs = ", ".join(f"{vector} l{t}" for t in range(8))
        lo, hi = "0, 1, 2, 3, 8, 9, 10, 11", "4, 5, 6, 7, 12, 13, 14, 15"
        lines += [f"static inline {vector} tx_vfold8add_{suffix}({vs}, {vector} acc) {{",
                  *(f"    const {vector} a{t} = TX_SHUFFLE2(l{t}, l{t + 1}, {mask}, {lo}) + "
                    f"TX_SHUFFLE2(l{t}, l{t + 1}, {mask}, {hi});" for t in range(0, 8, 2)),
                  *(f"    const {vector} b{t} = TX_SHUFFLE2(a{t}, a{t + 2}, {mask}, 0, 1, 8, 9, 4, 5, 12, 13) + "
                    f"TX_SHUFFLE2(a{t}, a{t + 2}, {mask}, 2, 3, 10, 11, 6, 7, 14, 15);" for t in (0, 4)),
                  f"    const {vector} c = TX_SHUFFLE2(b0, b4, {mask}, 0, 2, 4, 6, 8, 10, 12, 14) + "
                  f"TX_SHUFFLE2(b0, b4, {mask}, 1, 3, 5, 7, 9, 11, 13, 15);",
                  f"    return acc + TX_SHUFFLE(c, {mask}, 0, 2, 1, 3, 4, 6, 5, 7);", "}"]
    # an unaligned vector read (``c_vector``): a local of an inline function, so it never stays on the stack
    lines += [f"static inline {vector} tx_vload_{suffix}(const {storage_type(dtype)}* p) {{",
              f"    {vector} v;", "    memcpy(&v, p, sizeof(v));", "    return v;", "}"]
    return "\n".join(lines) + "\n"


LANE_PRELUDE = """
// max/min reduction lanes (CPrinter.lanes): GCC/Clang vectors of 32 bytes, a compare-select that skips NaN
// and a mask of the lanes that saw one; the fold of the lanes into the accumulator
#if defined(__clang__) || __GNUC__ >= 12
#define TX_SHUFFLE(v, mask, ...) __builtin_shufflevector(v, v, __VA_ARGS__)
#define TX_SHUFFLE2(a, b, mask, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define TX_SHUFFLE(v, mask, ...) __builtin_shuffle(v, (mask){__VA_ARGS__})
#define TX_SHUFFLE2(a, b, mask, ...) __builtin_shuffle(a, b, (mask){__VA_ARGS__})
#endif
""" + "".join(_lane_helpers(dtype) for dtype in HELPER_TYPES)

__all__ = ["ELEMENT_BYTES", "HELPER_TYPES", "LANE_BYTES", "LANE_PRELUDE", "VECTOR_BYTES", "lane_count", "vector_lanes"]
