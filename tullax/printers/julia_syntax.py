"""The Julia printer's syntax: types and literals, the KernelAbstractions flavours, the NaN-returning helpers and
``JuliaPrinter`` (expressions and statements), shared by ``tullax.printers.julia`` (modules, kernels, launchers)
and ``tullax.printers.julia_groups`` (kernels whose threads cooperate); the mapping is described in
``tullax.printers.julia``."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Mapping, Sequence

import numpy as np

from tullax.compiler.loops import (
    INDEX,
    BinOp,
    Call,
    Cast,
    Const,
    Loop,
    LoopKernel,
    Var,
    binop,
    const,
    expressions,
    walk_expr,
)
from tullax.errors import SpecError, TullaxError
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
from tullax.spec import functions
from tullax.spec.functions import Function

# =============================================================================================
# Types and literals
# =============================================================================================
JULIA_TYPES = {
    "float32": "Float32", "float64": "Float64", "float16": "Float16",
    "complex64": "ComplexF32", "complex128": "ComplexF64",
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
    if dtype.startswith("complex"):  # a Python complex arrives as ComplexF64
        return "complex128"
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


def _is_int(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


def format_const(node: Const) -> str:
    value = node.value
    if isinstance(value, (bool, np.bool_)):
        text = "true" if value else "false"
        return text if node.dtype == "bool" else f"{julia_type(node.dtype)}({text})"
    if node.dtype in ("float32", "float64"):
        return format_float(float(value), node.dtype)
    if node.dtype in ("complex64", "complex128"):  # ComplexF32(re, im), both parts literals of the real type
        part = "float32" if node.dtype == "complex64" else "float64"
        value = complex(value)
        return f"{julia_type(node.dtype)}({format_float(value.real, part)}, {format_float(value.imag, part)})"
    if node.dtype == INDEX:  # -2^63 (an integer max's start) as a literal would parse as an Int128
        return "typemin(Int64)" if int(value) == -2**63 else str(int(value))
    return f"{julia_type(node.dtype)}({int(value) if float(value).is_integer() else float(value)})"


# =============================================================================================
# What the KernelAbstractions backend changes in a module
# =============================================================================================
@dataclass(frozen=True)
class Flavour:
    """What a module printed for one KernelAbstractions backend differs in (see the module docstring)."""

    const_inputs: bool  # read-only array parameters are @Const
    cpu_workgroups: bool  # launches pass workgroupsize = cpu_workgroupsize(ndrange)
    # the launcher waits for its kernel; a GPU launcher returns at once, so XLA's stream never waits on the host
    synchronize: bool


CPU_FLAVOUR = Flavour(const_inputs=False, cpu_workgroups=True, synchronize=True)
GPU_FLAVOUR = Flavour(const_inputs=True, cpu_workgroups=False, synchronize=False)

CPU_WORKGROUP_HELPER = "cpu_workgroupsize"
CPU_GROUPS_PER_THREAD = 4  # groups per Julia thread: KernelAbstractions splits the groups evenly over the threads
CPU_GROUP_MAX_ITEMS = 1024  # KernelAbstractions' own CPU_GRAINSIZE, the most work-items its default puts in a group

_CPU_WORKGROUP_SOURCE = """\
# CPU(): every work-group runs as one task, and KernelAbstractions' default makes ONE group of an ndrange of up to
# {most} work-items, while a work-item here may be a whole tile or reduction. Ask for about {groups} groups per
# Julia thread instead (at most {most} work-items each), filling the fastest dimension first.
@inline function {name}(ndrange)
    items = clamp(cld(prod(ndrange), {groups} * Threads.nthreads()), 1, {most})
    fastest = min(ndrange[1], items)
    return length(ndrange) == 1 ? (fastest,) : (fastest, min(fld(items, fastest), ndrange[2]))
end
""".format(name=CPU_WORKGROUP_HELPER, groups=CPU_GROUPS_PER_THREAD, most=CPU_GROUP_MAX_ITEMS)


# =============================================================================================
# NaN-returning helpers for functions Julia only defines on part of the reals
# =============================================================================================
_SUFFIX = {"float32": "f32", "float64": "f64"}
POWER_HELPER = "pow"  # the helper of `^` with a non-constant exponent (not a registry function)


def helper_name(fn: str, dtype: str) -> str:
    """The NaN-returning helper for the Julia function ``fn`` in ``dtype``: ``log_nan_f32``, ``pow_nan_f64``..."""
    return f"{fn}_nan_{_SUFFIX[dtype]}"


def _wrapped(fn: Function, dtype: str) -> bool:
    """Calls of ``fn`` print as its NaN helper: Julia throws DomainError where the other targets give NaN."""
    return fn.julia_domain is not None and dtype in _SUFFIX


def _literal_power(expr: BinOp) -> bool:
    """``x^k`` for an integer constant ``k``: Julia's exact literal_pow, fine for any base sign."""
    return isinstance(expr.rhs, Const) and expr.rhs.dtype == INDEX


def _helpers(kernels: Sequence[LoopKernel]) -> list[str]:
    """Definitions of the NaN-returning helpers the kernels call, in a fixed order."""
    needed: set[tuple[str, str]] = set()
    for kernel in kernels:
        for expr in expressions(kernel.body):
            for node in walk_expr(expr):
                if isinstance(node, Call) and _wrapped(functions.get(node.fn), node.dtype):
                    needed.add((node.fn, node.dtype))
                elif isinstance(node, BinOp) and node.op == "^" and not _literal_power(node) \
                        and node.dtype in _SUFFIX:
                    needed.add((POWER_HELPER, node.dtype))
    return [_helper_source(fn, dtype) for fn, dtype in sorted(needed)]


def _helper_source(fn: str, dtype: str) -> str:
    jt = julia_type(dtype)
    zero, one, nan = (format_float(v, dtype) for v in (0.0, 1.0, math.nan))
    if fn == POWER_HELPER:
        # Julia's x^y throws for a negative base and a non-integer exponent. IEEE pow (XLA) gives NaN there for a
        # finite base and exponent; with an infinite one it is |x|^y: pow(-Inf, y) is Inf for y > 0 and 0 for
        # y < 0 unless y is an odd integer, pow(x, +-Inf) depends on |x| only. Integer exponents (odd ones
        # included, and -Inf with them) are exact in Julia; rem(+-Inf, 1) is NaN, so infinite ones fall through.
        return (f"@inline {helper_name(fn, dtype)}(x::{jt}, y::{jt}) = x >= {zero} || isnan(x) ? x^y : "
                f"(rem(y, {one}) == {zero} ? x^y : (isinf(x) || isinf(y) ? abs(x)^y : {nan}))")
    entry = functions.get(fn)
    condition = entry.julia_domain.format(zero=zero, one=one)
    return f"@inline {helper_name(entry.julia, dtype)}(x::{jt}) = {condition} ? {nan} : {entry.julia}(x)"


# =============================================================================================
# The printer
# =============================================================================================
class JuliaPrinter(LoopPrinter):
    """Loop-IR expressions and statements as Julia, for one kernel (its scalars' arrival types)."""

    infix: ClassVar[Mapping[str, Infix]] = {
        **arithmetic_operators(non_chaining),  # `a < b < c` chains in Julia
        "and": left_associative("&&", Precedence.AND), "or": left_associative("||", Precedence.OR),
    }
    # the operand of - and ! is atomic: a compound one is wrapped whole (`-(x)^2` is the call -(x) squared)
    prefix: ClassVar[Mapping[str, Prefix]] = {"neg": Prefix("-", Precedence.UNARY, Precedence.ATOM),
                                              "not": Prefix("!", Precedence.UNARY, Precedence.ATOM)}
    called: ClassVar[Mapping[str, str]] = {"//": "fld", "mod": "mod", "max": "max", "min": "min"}
    one_based = True
    reversed_index = True
    wrap_negative_operands = True
    if_head = "if ({cond})"  # parenthesised: tree-sitter-julia misreads `if n + 1 > 0`
    else_line = "else"
    block_end = "end"
    store_forms: ClassVar[Mapping[str, str]] = {"set": "{target} = {value}", "add": "{target} += {value}",
                                                "atomic_add": "Atomix.@atomic {target} += {value}"}
    scratch_form = "{var} = zeros({type}, {length})"
    buffer_form = scratch_form  # a heap array per work-item (zeros: the subset evaluator's private array)

    def __init__(self, kernel: LoopKernel):
        self.arrivals = {s.name: arrival_dtype(s.dtype) for s in kernel.scalars}

    def constant(self, node: Const) -> str:
        return format_const(node)

    def type_name(self, dtype: str) -> str:
        return julia_type(dtype)

    def cast(self, expr: Cast) -> str:
        """``Int32(x)`` throws InexactError outside Int32: an integer narrowed to a narrow result type (a value
        as jnp's wrapping arithmetic holds it) is ``x % Int32``, which wraps."""
        if _is_int(expr.dtype) and _is_int(expr.arg.dtype) and expr.dtype != INDEX:
            return f"({self.expr(expr.arg, Precedence.ATOM)} % {julia_type(expr.dtype)})"
        return super().cast(expr)

    def call_name(self, fn: Function, dtype: str) -> str:
        if fn.julia is None:  # erf: Julia's lives in SpecialFunctions.jl, which the bridge does not load
            raise SpecError(f"{fn.name} is not supported on the Julia backends (Base Julia has no {fn.name}; it is in "
                            f"SpecialFunctions.jl, which tullax does not load): use backend='numba' or 'xla'")
        return helper_name(fn.julia, dtype) if _wrapped(fn, dtype) else fn.julia

    def variable(self, var: Var) -> str:
        arrives = self.arrivals.get(var.name)
        if arrives is not None and arrives != var.dtype:
            return f"{julia_type(var.dtype)}({var.name})"
        return var.name

    def loop_header(self, loop: Loop, place: Place) -> str:
        last = self.expr(binop("-", loop.stop, const(1)), Precedence.ATOM)
        return f"for {loop.var} in {self.expr(loop.start, Precedence.ATOM)}:{last}"

    def binary(self, expr: BinOp) -> tuple[str, int]:
        return self._power(expr) if expr.op == "^" else super().binary(expr)

    def _power(self, expr: BinOp) -> tuple[str, int]:
        if expr.dtype.startswith("complex") and not _literal_power(expr):  # Julia's complex ^ never throws
            lhs, rhs = self.expr(expr.lhs, Precedence.ATOM), self.expr(expr.rhs, Precedence.ATOM)
            return f"({lhs} ^ {rhs})", Precedence.ATOM
        if _literal_power(expr):
            base = self.expr(expr.lhs, Precedence.ATOM)
            k = int(expr.rhs.value)
            power = str(k) if k >= 0 else f"({k})"
            spaced = isinstance(expr.lhs, Const)  # `2.0f0^(...)` would parse as a juxtaposition
            return (f"{base} ^ {power}" if spaced else f"{base}^{power}"), Precedence.POWER
        return self.call(helper_name(POWER_HELPER, expr.dtype), (expr.lhs, expr.rhs)), Precedence.ATOM

def _kernel_params(kernel: LoopKernel, flavour: Flavour) -> list[str]:
    params = [f"@Const({a.name})" if a.role == "in" and flavour.const_inputs else a.name for a in kernel.arrays]
    params += [f"{s.name}::{julia_type(arrival_dtype(s.dtype))}" for s in kernel.scalars]
    params += [f"{s.name}::Int" for s in kernel.sizes]
    return params


def launcher_name(kernel: LoopKernel) -> str:
    return f"run_{kernel.name}!"
