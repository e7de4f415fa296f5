"""An evaluator for exactly the Julia subset tullax's kernel printer emits (issue 5, layer 2).

No Julia can be installed on the project's machines, so generated KernelAbstractions kernels
are executed here, in Python, with Julia's semantics, and compared with the Numba backend.
The source is parsed with tree-sitter-julia; every node is compiled into a Python closure
BEFORE anything runs, and any construct outside the subset raises :class:`UnsupportedJulia`
naming the node type and line, so the printer cannot drift outside the verified subset
unnoticed (an untaken branch is checked as strictly as a taken one).

API::

    parse_errors(src) -> list[str]              # layer 1: tree-sitter ERROR/MISSING nodes, "line:col: ..."
    mod = load_module(src, seed=0, nthreads=1)  # JuliaSyntaxError / UnsupportedJulia / UndefinedName
    mod.launch("kern!", out, a, 3, ndrange=(4, 2), workgroupsize=None)   # == kern!(CPU())(...; ndrange)
    mod.call("run!", CPU_BACKEND, out, a, 3)    # a plain (host) function of the module
    mod.kernel_names, mod.function_names, mod.launches, mod.geometry

Arrays: pass C-contiguous row-major NumPy arrays. Julia sees each with REVERSED axes, as the
bridge's zero-copy ``unsafe_wrap`` does: for a NumPy ``a`` of shape (I, J), Julia's ``A`` has
size (J, I) and ``A[j, i] == a[i-1, j-1]``; linear indexing follows the C order of ``a``. Writes go
to the caller's buffer in place. ndrange and workgroupsize are given in Julia order.
Python ints become Int64, floats Float64; NumPy scalars keep their type.

Semantics checked (each violation raises :class:`JuliaRuntimeError`): 1-based bounds checks on
every access (``@inbounds`` does not switch them off: an out-of-bounds access there is undefined
behaviour), integer-only indices, conversion on store (InexactError), Bool-only conditions,
Julia's numeric promotion (Float32 op Int -> Float32, Int / Int -> Float64), DomainError,
DivideError, UndefVarError (hard local scope, fresh loop-body locals per iteration), read-only
``@Const`` arguments that must not alias another argument, and data races between work-items
(an element written by one work-item and read or written by another without ``Atomix.@atomic``).
Work-items run one at a time, once per point of the ndrange, in a shuffled order.

Launch geometry on ``CPU()`` (KernelAbstractions 0.9.38-0.9.41, ``src/cpu.jl``): each launch records in
``mod.geometry`` a :class:`Launch` with its work-group size (the one given, static or at launch, else KA's
``default_cpu_workgroupsize``: the whole ndrange as ONE group up to 1024 work-items, else groups of 1024 filled
fastest dimension first), the number of groups (``fld1`` per dimension, a shorter work-group size padded with
ones) and the number of tasks KA's ``__run`` spawns for them on ``nthreads`` Julia threads
(``Threads.nthreads()`` in the module returns ``nthreads``).

The subset (anything else raises UnsupportedJulia / UndefinedName at load time):

- top level: one ``module Name ... end`` (or bare definitions, as the bridge's container accepts), ``using``/
  ``import`` of KernelAbstractions and Atomix only, ``export``, docstrings, ``const NAME = expr``,
  ``function f(args) ... end``, ``f(args) = expr``, ``@inline`` on either, ``@kernel [inbounds=true|false]
  function k!(args) ... end``. One method per name; builtin names cannot be redefined.
- parameters: ``x``, ``x::T`` (T in Int Int32 Int64 Float32 Float64 Bool Integer AbstractFloat Real Number
  AbstractArray AbstractVector AbstractMatrix AbstractArray{T} AbstractArray{T,N}), ``@Const(x)`` in kernels.
- statements: assignment (also chained and ``(a, b) = tuple``), ``+= -= *= /=`` on locals and elements,
  ``local x``, ``local x::T = v``, ``x::T = v``, ``for v in a:b`` / ``a:s:b`` (several bindings allowed),
  ``while``, ``if/elseif/else``, ``break``/``continue`` inside loops, ``return`` (not in kernels),
  ``begin ... end``, ``@inbounds`` on an expression/statement/block, ``Atomix.@atomic A[i...] += v`` / ``-= v``.
- expressions: Int literals (decimal, ``_`` allowed), Float64 (``1.0 1e-3``) and Float32 (``1f0 0.5f0 1.5f-3``)
  literals, ``true false nothing Inf Inf32 Inf64 NaN NaN32 NaN64``, ``+ - * / ^ ÷ %`` (``x % T``, T an integer
  type: x converted modulo 2^bits), unary ``- + !``,
  ``== != ≠ < <= ≤ > >= ≥`` (no chains), ``&& ||``, ``c ? a : b``, ``A[i, j]`` / ``A[k]`` / ``A[I]`` / ``A[]``,
  tuple ``t[k]`` and ``I[k]``, ``(a, b)`` and ``(n,)`` tuples, calls of module functions, of the builtins in
  SUPPORTED_FUNCTIONS (``zeros(T, n)`` makes an array private to its work-item), of the types ``Float32(x)
  Int(x) ...`` and ``KernelAbstractions.{synchronize,CPU,get_backend}``; ``kern(backend)(args...; ndrange=...,
  workgroupsize=...)``, ``kern(backend, wgsize)(...)``, ``kern(backend, wgsize, ndrange)(...)``; in kernels
  ``@ndrange()``; ``Threads.nthreads()``, ``prod`` of a tuple.
- tree-sitter-julia 0.23 quirks the printer must avoid (both are rejected, never mis-evaluated): ``a^b^c``
  (grouped to the left; write ``a^(b^c)``) and a number literal directly before ``^(`` (``2^(x+1)`` parses
  as a juxtaposition; write ``2 ^ (x + 1)`` or ``2.0f0^k``).

Work-groups that cooperate (a kernel that uses ``@localmem`` or ``@synchronize()``) run as on a GPU: every
work-item of a group at once, one Python thread each, ``@synchronize()`` a barrier of the group, ``x = @localmem T
(n,)`` one zero-filled array per group (not race-tracked: its accesses are ordered by the barriers), and
``@index(Local, Linear)`` / ``@index(Group, Linear)`` the work-item's position in its group and the group's
number; the groups run one after another in a shuffled order, and the ndrange must be a whole number of groups.
A missing barrier then shows as a wrong result.

KernelAbstractions 0.9 rules enforced at load time: ``@index(Global|Local|Group, Linear|Cartesian|NTuple)``
only as the right-hand side of a top-level assignment of the kernel body (the CPU backend hoists
exactly those statements), no ``return`` in a ``@kernel`` (KA rejects it), no assignment to a kernel parameter (the CPU
backend's work-item loop would carry it over to the next work-item), only the ``inbounds=`` option, KA
names only after ``using KernelAbstractions``, ``Atomix.@atomic`` only after ``using Atomix``/``import Atomix``.
"""
from __future__ import annotations

import functools
import inspect
import itertools
import math
import random
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tree_sitter
import tree_sitter_julia

__all__ = [
    "CPU_BACKEND",
    "JuliaModule",
    "JuliaRuntimeError",
    "JuliaSyntaxError",
    "KA_CPU_GRAINSIZE",
    "Launch",
    "UndefinedName",
    "UnsupportedJulia",
    "cpu_launch",
    "default_cpu_workgroupsize",
    "load_module",
    "parse_errors",
    "SUPPORTED_FUNCTIONS",
]

# ---------------------------------------------------------------------------------------------
# Errors


class UnsupportedJulia(Exception):
    """A construct outside the verified subset (raised while loading, or for a runtime shape)."""

    def __init__(self, node_type: str, line: int | None, detail: str = ""):
        self.node_type = node_type
        self.line = line
        where = f" at line {line}" if line is not None else ""
        super().__init__(f"unsupported Julia construct {node_type!r}{where}" + (f": {detail}" if detail else ""))


class UndefinedName(UnsupportedJulia):
    """A name that is neither a local, a module-level definition nor a supported builtin."""

    def __init__(self, name: str, line: int | None, detail: str = ""):
        self.name = name
        super().__init__("identifier", line, f"undefined name `{name}`" + (f" ({detail})" if detail else ""))


class JuliaSyntaxError(Exception):
    """tree-sitter-julia found ERROR or MISSING nodes; ``errors`` lists them as "line:col: ..."."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("Julia source does not parse:\n" + "\n".join(errors))


class JuliaRuntimeError(Exception):
    """What Julia would throw at run time (BoundsError, InexactError, ...) or a data race."""

    def __init__(self, message: str, line: int | None = None):
        self.message = message
        self.line = line
        super().__init__(message)

    def __str__(self) -> str:
        return self.message if self.line is None else f"line {self.line}: {self.message}"


# ---------------------------------------------------------------------------------------------
# Parsing (layer 1)

_LANGUAGE = tree_sitter.Language(tree_sitter_julia.language())
_COMMENTS = frozenset({"line_comment", "block_comment"})


def _parse(src: str) -> tree_sitter.Tree:
    return tree_sitter.Parser(_LANGUAGE).parse(src.encode("utf-8"))


def parse_errors(src: str) -> list[str]:
    """Every ERROR and MISSING node of tree-sitter-julia's parse, as "line:col: what" (1-based)."""
    found: list[str] = []

    def visit(node: tree_sitter.Node) -> None:
        row, col = node.start_point
        if node.is_missing:
            found.append(f"{row + 1}:{col + 1}: MISSING {node.type}")
        elif node.is_error:
            snippet = node.text.decode("utf-8", "replace").splitlines()[0][:40] if node.text else ""
            found.append(f"{row + 1}:{col + 1}: ERROR at {snippet!r}")
        if node.has_error or node.is_missing:
            for child in node.children:
                visit(child)

    visit(_parse(src).root_node)
    return found


def _line(node: tree_sitter.Node) -> int:
    return node.start_point[0] + 1


def _text(node: tree_sitter.Node) -> str:
    return node.text.decode("utf-8")


def _named(node: tree_sitter.Node) -> list[tree_sitter.Node]:
    return [c for c in node.named_children if c.type not in _COMMENTS]


def _reject(node: tree_sitter.Node, detail: str = "") -> UnsupportedJulia:
    return UnsupportedJulia(node.type, _line(node), detail)


# ---------------------------------------------------------------------------------------------
# Julia values: types, arrays, indices, backends


@dataclass(frozen=True)
class JuliaType:
    """A Julia number type (concrete, with a NumPy dtype) or an abstract one for annotations."""

    name: str
    kind: str  # "float" | "int" | "bool" | "complex" | "abstract"
    dtype: np.dtype | None = None
    covers: frozenset[str] = frozenset()  # for abstract types: the kinds they contain

    def __repr__(self) -> str:
        return self.name

    def cast(self, x: Any) -> Any:
        """Plain numeric cast (promotion), no exactness check."""
        if self.kind == "bool":
            return bool(x)
        return self.dtype.type(x)


FLOAT32 = JuliaType("Float32", "float", np.dtype(np.float32))
FLOAT64 = JuliaType("Float64", "float", np.dtype(np.float64))
INT32 = JuliaType("Int32", "int", np.dtype(np.int32))
INT64 = JuliaType("Int64", "int", np.dtype(np.int64))
BOOL = JuliaType("Bool", "bool", np.dtype(np.bool_))
COMPLEXF32 = JuliaType("ComplexF32", "complex", np.dtype(np.complex64))
COMPLEXF64 = JuliaType("ComplexF64", "complex", np.dtype(np.complex128))
_ABSTRACT = {
    "Integer": JuliaType("Integer", "abstract", covers=frozenset({"int", "bool"})),
    "AbstractFloat": JuliaType("AbstractFloat", "abstract", covers=frozenset({"float"})),
    "Real": JuliaType("Real", "abstract", covers=frozenset({"int", "bool", "float"})),
    "Number": JuliaType("Number", "abstract", covers=frozenset({"int", "bool", "float", "complex"})),
}
CONCRETE_TYPES = {"Float32": FLOAT32, "Float64": FLOAT64, "Int32": INT32, "Int64": INT64, "Int": INT64,
                  "Bool": BOOL, "ComplexF32": COMPLEXF32, "ComplexF64": COMPLEXF64}
_BY_DTYPE = {t.dtype: t for t in (FLOAT32, FLOAT64, INT32, INT64, BOOL, COMPLEXF32, COMPLEXF64)}
_ARRAY_ANNOTATIONS = {"AbstractArray": None, "AbstractVector": 1, "AbstractMatrix": 2}


@dataclass(frozen=True)
class ArrayAnnotation:
    """``::AbstractArray``, ``::AbstractVector{Float32}``, ``::AbstractArray{Float32,2}``."""

    eltype: JuliaType | None
    ndims: int | None


@dataclass(frozen=True)
class CartesianIndex:
    """``@index(Global, Cartesian)``: indexes arrays and is indexed by dimension."""

    I: tuple[np.int64, ...]  # noqa: E741 (Julia's field name)


@dataclass(frozen=True)
class Backend:
    """KernelAbstractions' ``CPU()``."""

    name: str = "CPU"


CPU_BACKEND = Backend()


class JuliaArray:
    """A C-contiguous NumPy array seen from Julia: reversed axes, 1-based, column-major linear."""

    __slots__ = ("data", "flat", "size", "strides", "jtype", "const", "ptr", "private")

    def __init__(self, data: np.ndarray, const: bool = False, private: bool = False):
        if data.dtype not in _BY_DTYPE:
            raise TypeError(f"unsupported array dtype {data.dtype}; use float32/float64/int32/int64/bool")
        if not data.flags.c_contiguous:
            raise ValueError("arrays must be C-contiguous (the Julia bridge wraps them without copying)")
        self.data = data
        self.flat = data.reshape(-1)
        self.size = tuple(int(n) for n in reversed(data.shape))
        self.strides = tuple(int(np.prod(self.size[:d])) for d in range(len(self.size)))
        self.jtype = _BY_DTYPE[data.dtype]
        self.const = const
        self.ptr = data.__array_interface__["data"][0]
        self.private = private  # made by ``zeros`` in a work-item: no other work-item can reach it

    def as_const(self) -> JuliaArray:
        return JuliaArray(self.data, const=True)

    def describe(self) -> str:
        dims = "×".join(map(str, self.size)) or "0-dimensional"
        return f"{dims} Array{{{self.jtype.name}, {len(self.size)}}}"

    def linear(self, idx: Sequence[Any]) -> int:
        """0-based column-major position of a Julia index tuple (checks bounds)."""
        ints = _index_ints(idx)
        n, ndims = len(ints), len(self.size)
        length = len(self.flat)
        if n == 1 and ndims != 1:
            if not 1 <= ints[0] <= length:
                raise self._bounds_error(ints)
            return ints[0] - 1
        if n == 0:
            if length != 1:
                raise JuliaRuntimeError(f"BoundsError: attempt to access {self.describe()} at index []")
            return 0
        if n > ndims:
            if any(i != 1 for i in ints[ndims:]):
                raise self._bounds_error(ints)
            ints = ints[:ndims]
        elif n < ndims:
            raise JuliaRuntimeError(f"partial linear indexing of a {ndims}-d array with {n} indices "
                                    "is outside the supported subset")
        offset = 0
        for i, extent, stride in zip(ints, self.size, self.strides):
            if not 1 <= i <= extent:
                raise self._bounds_error(ints)
            offset += (i - 1) * stride
        return offset

    def _bounds_error(self, ints: Sequence[int]) -> JuliaRuntimeError:
        return JuliaRuntimeError(f"BoundsError: attempt to access {self.describe()} at index "
                                 f"[{', '.join(map(str, ints))}]")

    def load(self, idx: Sequence[Any], tracker: _RaceTracker | None) -> Any:
        pos = self.linear(idx)
        if tracker is not None and not self.const and not self.private:
            tracker.read(self, pos)
        return _normalize(self.flat[pos])

    def store(self, idx: Sequence[Any], value: Any, tracker: _RaceTracker | None, atomic: bool = False) -> None:
        if self.const:
            raise JuliaRuntimeError("cannot write to a @Const argument (setindex! is not defined for "
                                    "Base.Experimental.Const)")
        pos = self.linear(idx)
        converted = _convert(self.jtype, value)
        if tracker is not None and not self.private:
            tracker.write(self, pos, atomic)
        if not self.data.flags.writeable:
            raise JuliaRuntimeError("the array passed for this argument is read-only")
        self.flat[pos] = converted


def _index_ints(idx: Sequence[Any]) -> list[int]:
    ints: list[int] = []
    for i in idx:
        if isinstance(i, CartesianIndex):
            ints.extend(int(k) for k in i.I)
        elif isinstance(i, (bool, np.bool_)):
            raise JuliaRuntimeError("logical (Bool) indexing is outside the supported subset")
        elif isinstance(i, (np.integer, int)):
            ints.append(int(i))
        else:
            raise JuliaRuntimeError(f"ArgumentError: invalid index: {i!r} of type {_type_name(i)}")
    return ints


# ---------------------------------------------------------------------------------------------
# Numbers: Julia's types, promotion, conversion


def _normalize(x: Any) -> Any:
    """One representation per Julia type: Python bool for Bool, NumPy scalars for numbers."""
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, int):
        return np.int64(x)
    if isinstance(x, float):
        return np.float64(x)
    if isinstance(x, complex):  # juliacall's ComplexF64
        return np.complex128(x)
    return x


def _numtype(x: Any) -> JuliaType | None:
    if isinstance(x, bool):
        return BOOL
    if isinstance(x, np.generic):
        return _BY_DTYPE.get(x.dtype)
    return None


def _type_name(x: Any) -> str:
    t = _numtype(x)
    if t is not None:
        return t.name
    if isinstance(x, JuliaArray):
        return f"Array{{{x.jtype.name}, {len(x.size)}}}"
    if x is None:
        return "Nothing"
    if isinstance(x, tuple):
        return "Tuple"
    return type(x).__name__


def _number(x: Any, what: str) -> JuliaType:
    t = _numtype(x)
    if t is None:
        raise JuliaRuntimeError(f"MethodError: no method matching {what}(::{_type_name(x)})")
    return t


def _promote_type(a: JuliaType, b: JuliaType) -> JuliaType:
    """Julia's promote_type for the supported numbers (Bool is the narrowest Integer)."""
    if a is b:
        return a
    if a is BOOL:
        return b
    if b is BOOL:
        return a
    if a.kind == b.kind:
        return a if a.dtype.itemsize >= b.dtype.itemsize else b
    if "complex" in (a.kind, b.kind):  # Complex{promote_type(real parts)}
        c, other = (a, b) if a.kind == "complex" else (b, a)
        return COMPLEXF64 if other is FLOAT64 else c
    return a if a.kind == "float" else b


def _convert(t: JuliaType, x: Any) -> Any:
    """Julia's ``convert(T, x)``: exact for integers (InexactError), rounding for floats."""
    src = _number(x, f"convert({t.name}, x) with x")
    if t.kind == "complex":
        return t.dtype.type(x)
    if src.kind == "complex":  # Julia converts a complex number to a real type only when it is real
        if x.imag != 0:
            raise JuliaRuntimeError(f"InexactError: {t.name}({x})")
        x = x.real
    if t.kind == "float":
        return t.dtype.type(x)
    if t.kind == "bool":
        if src is BOOL:
            return x
        if x == 0 or x == 1:
            return bool(x == 1)
        raise JuliaRuntimeError(f"InexactError: Bool({x})")
    if src.kind == "float" and not (np.isfinite(x) and float(x).is_integer()):
        raise JuliaRuntimeError(f"InexactError: {t.name}({x})")
    value = int(x)
    info = np.iinfo(t.dtype)
    if not info.min <= value <= info.max:
        raise JuliaRuntimeError(f"InexactError: {t.name}({value})")
    return t.dtype.type(value)


def _to_float(x: Any, what: str) -> Any:
    """Integer arguments of float functions become Float64, as in Julia (``exp(1) isa Float64``)."""
    t = _number(x, what)
    return x if t.kind in ("float", "complex") else np.float64(x)


def _wrap_int(value: int, t: JuliaType) -> Any:
    """Two's-complement wrap-around, as Julia's integer arithmetic does."""
    bits = t.dtype.itemsize * 8
    value = (value + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))
    return t.dtype.type(value)


def _arith(op: str, x: Any, y: Any) -> Any:
    tx, ty = _number(x, op), _number(y, op)
    if op == "*" and (tx is BOOL) != (ty is BOOL) and "float" in (tx.kind, ty.kind):
        flag, other = (x, y) if tx is BOOL else (y, x)
        return other if flag else np.copysign(_promote_type(tx, ty).cast(0), other)  # Bool is a strong zero
    t = _promote_type(tx, ty)
    if op == "/":
        t = t if t.kind in ("float", "complex") else FLOAT64
        return t.cast(x) / t.cast(y)
    if t is BOOL:
        if op == "*":
            return bool(x and y)
        t = INT64
    a, b = t.cast(x), t.cast(y)
    if t.kind == "int":
        ia, ib = int(a), int(b)
        return _wrap_int(ia + ib if op == "+" else ia - ib if op == "-" else ia * ib, t)
    return a + b if op == "+" else a - b if op == "-" else a * b


def _power(x: Any, y: Any) -> Any:
    tx, ty = _number(x, "^"), _number(y, "^")
    if "complex" in (tx.kind, ty.kind):  # complex powers never throw (principal branch, as NumPy)
        t = tx if ty.kind == "int" else _promote_type(tx, ty)
        return t.cast(np.power(t.cast(x), y if ty.kind == "int" else t.cast(y)))
    if tx.kind != "float" and ty.kind != "float":
        base, exponent = int(x), int(y)
        if exponent >= 0:
            value = pow(base, exponent)
        elif base in (1, -1):
            value = 1 if base == 1 or exponent % 2 == 0 else -1
        else:
            raise JuliaRuntimeError(f"DomainError with {exponent}: cannot raise an integer to a negative power")
        return bool(value) if tx is BOOL else _wrap_int(value, tx)  # the result has the base's type
    if tx.kind == "float" and ty.kind != "float":
        return tx.cast(np.power(np.float64(x), np.float64(y)))  # Julia powers Float32 by squaring in Float64
    t = _promote_type(tx, ty)
    return t.cast(_float_power(float(t.cast(x)), float(t.cast(y))))


# Julia replaces an exponent of this size or more (the infinities too) with it: a huge even integer.
_HUGE_EVEN_EXPONENT = float.fromhex("0x1.8p62")


def _float_power(base: float, exponent: float) -> float:
    """Julia's ``^(::Float64, ::Float64)`` special cases (base/math.jl), in its order; the Float32 method has the
    same ones. Only the finite, positive, non-integer case is left to C's pow."""
    if base == 1.0:
        return 1.0
    if math.isnan(exponent):
        return exponent
    if not abs(exponent) < _HUGE_EVEN_EXPONENT:
        exponent = math.copysign(_HUGE_EVEN_EXPONENT, exponent)
    if exponent.is_integer():
        return float(np.power(np.float64(base), np.float64(exponent)))
    if base == 0.0:
        return 0.0 if exponent > 0 else math.inf
    if base < 0:
        raise JuliaRuntimeError(f"DomainError with {base}: exponentiation yielding a complex result")
    if math.isinf(base) or math.isnan(base):
        return base if exponent > 0 or math.isnan(base) else 0.0
    return float(np.power(np.float64(base), np.float64(exponent)))


def _integer_division(kind: str, x: Any, y: Any) -> Any:
    """div/÷ (truncate), rem/% (sign of x), fld (floor), mod (sign of y), cld (ceiling)."""
    t = _promote_type(_number(x, kind), _number(y, kind))
    if t.kind == "float":
        return _float_division(kind, t.cast(x), t.cast(y))
    a, b = int(x), int(y)
    if b == 0:
        raise JuliaRuntimeError(f"DivideError: integer division error ({kind}({a}, 0))")
    trunc = abs(a) // abs(b) * (1 if (a >= 0) == (b > 0) else -1)
    value = {"div": trunc, "rem": a - b * trunc, "fld": a // b, "mod": a % b, "cld": -((-a) // b)}[kind]
    return bool(value) if t is BOOL else _wrap_int(value, t)


def _float_division(kind: str, a: Any, b: Any) -> Any:
    remainder = np.fmod(a, b)
    if kind == "rem":
        return remainder
    if kind == "mod":
        if remainder == 0:
            return np.copysign(remainder, b)
        return remainder + b if (remainder > 0) != (b > 0) else remainder
    if kind == "div":
        return np.trunc((a - remainder) / b)
    floor = np.floor_divide(a, b)
    return floor if kind == "fld" else -np.floor_divide(-a, b)


_COMPARISONS = {"==": "==", "!=": "!=", "≠": "!=", "<": "<", "<=": "<=", "≤": "<=", ">": ">", ">=": ">=",
                "≥": ">="}


def _compare(op: str, x: Any, y: Any) -> bool:
    if _numtype(x) is None or _numtype(y) is None:
        if op in ("==", "!=") and isinstance(x, (tuple, type(None))) and isinstance(y, (tuple, type(None))):
            return (x == y) == (op == "==")
        raise JuliaRuntimeError(f"MethodError: no method matching {op}(::{_type_name(x)}, ::{_type_name(y)})")
    if op not in ("==", "!=") and "complex" in (_numtype(x).kind, _numtype(y).kind):  # no isless for Complex
        raise JuliaRuntimeError(f"MethodError: no method matching isless(::{_type_name(x)}, ::{_type_name(y)})")
    if op == "==":
        return bool(x == y)
    if op == "!=":
        return bool(x != y)
    if op == "<":
        return bool(x < y)
    if op == "<=":
        return bool(x <= y)
    if op == ">":
        return bool(x > y)
    return bool(x >= y)


def _require_bool(x: Any, context: str) -> bool:
    if not isinstance(x, bool):
        raise JuliaRuntimeError(f"TypeError: non-boolean ({_type_name(x)}) used in boolean context ({context})")
    return x


def _identity_plus(x: Any) -> Any:
    t = _number(x, "+")
    return np.int64(x) if t is BOOL else x


def _negate(x: Any) -> Any:
    t = _number(x, "-")
    if t.kind in ("float", "complex"):
        return -x
    return _wrap_int(-int(x), INT64 if t is BOOL else t)


def _float_function(name: str, fn: Callable[[Any], Any], domain: Callable[[Any], bool] | None = None):
    def apply(x: Any) -> Any:
        value = _to_float(x, name)
        if domain is not None and _numtype(value).kind != "complex" and domain(value):  # complex: no throw
            raise JuliaRuntimeError(f"DomainError with {value}: {name} is not defined there")
        return fn(value)

    return apply


def _float_pair(name: str, fn: Callable[[Any, Any], Any]):
    """A two-argument float function (``atan(y, x)``, ``hypot``): both promoted to one float type first."""
    def apply(x: Any, y: Any) -> Any:
        t = _promote_type(_number(_to_float(x, name), name), _number(_to_float(y, name), name))
        return fn(t.cast(_to_float(x, name)), t.cast(_to_float(y, name)))

    return apply


def _atan(*args: Any) -> Any:
    """Base's atan(x) and atan(y, x) (the four-quadrant arctangent)."""
    if len(args) == 1:
        return _float_function("atan", np.arctan)(*args)
    return _float_pair("atan", np.arctan2)(*args)


def _abs(x: Any) -> Any:
    t = _number(x, "abs")
    if t.kind in ("float", "complex"):  # abs of a complex number is real of its precision
        return np.abs(x)
    return x if t is BOOL else _wrap_int(abs(int(x)), t)


def _extremum(name: str, x: Any, y: Any) -> Any:
    """Julia's max/min: NaN wins, and -0.0 < 0.0 (same formula as Base for IEEE floats)."""
    t = _promote_type(_number(x, name), _number(y, name))
    a, b = t.cast(x), t.cast(y)
    if t.kind != "float":
        return (a if a >= b else b) if name == "max" else (a if a <= b else b)
    if name == "max":
        take_b = bool(b > a) or bool(np.signbit(b) < np.signbit(a))
    else:
        take_b = bool(b < a) or bool(np.signbit(b) > np.signbit(a))
    if take_b:
        return a if np.isnan(a) else b
    return b if np.isnan(b) else a


def _fold_extremum(name: str) -> Callable[..., Any]:
    def apply(*args: Any) -> Any:
        if len(args) < 2:
            raise JuliaRuntimeError(f"MethodError: {name} needs at least two arguments")
        result = args[0]
        for arg in args[1:]:
            result = _extremum(name, result, arg)
        return result

    return apply


def _clamp(x: Any, lo: Any, hi: Any) -> Any:
    t = _promote_type(_promote_type(_number(x, "clamp"), _number(lo, "clamp")), _number(hi, "clamp"))
    if _compare(">", x, hi):
        return _convert(t, hi)
    return _convert(t, lo) if _compare("<", x, lo) else _convert(t, x)


def _ifelse(condition: Any, a: Any, b: Any) -> Any:
    return a if _require_bool(condition, "ifelse") else b


def _type_of(x: Any, name: str) -> JuliaType:
    if isinstance(x, JuliaType):
        if x.kind == "abstract":
            raise JuliaRuntimeError(f"MethodError: no method matching {name}(::Type{{{x.name}}})")
        return x
    return _number(x, name)


def _typemin(x: Any) -> Any:
    t = _type_of(x, "typemin")
    if t.kind == "float":
        return t.cast(-np.inf)
    return False if t is BOOL else t.cast(np.iinfo(t.dtype).min)


def _typemax(x: Any) -> Any:
    t = _type_of(x, "typemax")
    if t.kind == "float":
        return t.cast(np.inf)
    return True if t is BOOL else t.cast(np.iinfo(t.dtype).max)


def _float(x: Any) -> Any:
    t = _number(x, "float")
    return x if t.kind == "float" else np.float64(x)


def _convert_builtin(t: Any, x: Any) -> Any:
    if not isinstance(t, JuliaType) or t.kind == "abstract":
        raise JuliaRuntimeError(f"MethodError: convert needs a concrete number type, got {t!r}")
    return _convert(t, x)


def _array(x: Any, name: str) -> JuliaArray:
    if not isinstance(x, JuliaArray):
        raise JuliaRuntimeError(f"MethodError: no method matching {name}(::{_type_name(x)})")
    return x


def _size(x: Any, *dim: Any) -> Any:
    array = _array(x, "size")
    if not dim:
        return tuple(np.int64(n) for n in array.size)
    if len(dim) > 1:
        raise JuliaRuntimeError("size with more than one dimension argument is outside the supported subset")
    d = _index_ints(dim)[0]
    if d < 1:
        raise JuliaRuntimeError(f"ArgumentError: dimension out of range (got {d})")
    return np.int64(array.size[d - 1] if d <= len(array.size) else 1)


def _length(x: Any) -> Any:
    if isinstance(x, tuple):
        return np.int64(len(x))
    return np.int64(len(_array(x, "length").flat))


def _predicate(name: str, fn: Callable[[Any], Any], for_integers: bool) -> Callable[[Any], bool]:
    def apply(x: Any) -> bool:
        t = _number(x, name)
        return bool(fn(x)) if t.kind == "float" else for_integers

    return apply


def _prod(x: Any) -> Any:
    """``prod`` of a tuple of numbers (Julia's ``prod(())`` is the Int 1)."""
    if not isinstance(x, tuple):
        raise JuliaRuntimeError(f"prod of a {_type_name(x)} is outside the supported subset (tuples only)")
    return functools.reduce(lambda a, b: _arith("*", a, b), x, np.int64(1))


def _zeros(t: Any, *dims: Any) -> JuliaArray:
    """``zeros(T, dims...)``: a new array of zeros, private to the work-item that makes it."""
    if not isinstance(t, JuliaType) or t.kind == "abstract" or not dims:
        raise JuliaRuntimeError("zeros needs a concrete number type and at least one dimension in the subset")
    sizes = _index_ints(dims)
    if any(n < 0 for n in sizes):
        raise JuliaRuntimeError(f"ArgumentError: invalid Array dimensions {tuple(sizes)}")
    return JuliaArray(np.zeros(tuple(reversed(sizes)), dtype=t.dtype), private=True)


def _muladd(a: Any, b: Any, c: Any) -> Any:
    return _arith("+", _arith("*", a, b), c)


def _synchronize(backend: Any) -> None:
    if not isinstance(backend, Backend):
        raise JuliaRuntimeError(f"MethodError: no method matching synchronize(::{_type_name(backend)})")
    return None


def _get_backend(x: Any) -> Backend:
    _array(x, "get_backend")
    return CPU_BACKEND


def _cpu(*, static: bool = False) -> Backend:
    return CPU_BACKEND


@dataclass(frozen=True)
class _Builtin:
    """A supported Base/KernelAbstractions function; ``package`` names the `using` it needs."""

    name: str
    fn: Callable[..., Any]
    package: str | None = None
    keywords: bool = False


def _builtins() -> dict[str, Any]:
    functions = [
        _Builtin("exp", _float_function("exp", np.exp)),
        _Builtin("log", _float_function("log", np.log, lambda v: v < 0)),
        _Builtin("log1p", _float_function("log1p", np.log1p, lambda v: v < -1)),
        _Builtin("expm1", _float_function("expm1", np.expm1)),
        _Builtin("sqrt", _float_function("sqrt", np.sqrt, lambda v: v < 0)),
        _Builtin("sin", _float_function("sin", np.sin, np.isinf)),
        _Builtin("cos", _float_function("cos", np.cos, np.isinf)),
        _Builtin("tan", _float_function("tan", np.tan, np.isinf)),
        _Builtin("tanh", _float_function("tanh", np.tanh)),
        _Builtin("sinh", _float_function("sinh", np.sinh)),
        _Builtin("cosh", _float_function("cosh", np.cosh)),
        _Builtin("cbrt", _float_function("cbrt", np.cbrt)),
        _Builtin("exp2", _float_function("exp2", np.exp2)),
        _Builtin("log2", _float_function("log2", np.log2, lambda v: v < 0)),
        _Builtin("log10", _float_function("log10", np.log10, lambda v: v < 0)),
        _Builtin("atan", _atan),
        _Builtin("hypot", _float_pair("hypot", np.hypot)),
        _Builtin("floor", _float_function("floor", np.floor)),
        _Builtin("ceil", _float_function("ceil", np.ceil)),
        _Builtin("trunc", _float_function("trunc", np.trunc)),
        _Builtin("round", _float_function("round", np.rint)),  # RoundNearest: ties go to the even neighbour
        _Builtin("sign", _float_function("sign", np.sign)),
        _Builtin("abs", _abs),
        _Builtin("abs2", lambda x: _arith("*", x, x)),
        _Builtin("conj", lambda x: np.conj(x) if _number(x, "conj").kind == "complex" else x),
        _Builtin("real", lambda x: x.real if _number(x, "real").kind == "complex" else x),
        _Builtin("imag", lambda x: x.imag if _number(x, "imag").kind == "complex" else _type_of(x, "imag").cast(0)),
        _Builtin("max", _fold_extremum("max")),
        _Builtin("min", _fold_extremum("min")),
        _Builtin("clamp", _clamp),
        _Builtin("ifelse", _ifelse),
        _Builtin("muladd", _muladd),
        _Builtin("zeros", _zeros),
        _Builtin("div", lambda x, y: _integer_division("div", x, y)),
        _Builtin("rem", lambda x, y: _integer_division("rem", x, y)),
        _Builtin("fld", lambda x, y: _integer_division("fld", x, y)),
        _Builtin("mod", lambda x, y: _integer_division("mod", x, y)),
        _Builtin("cld", lambda x, y: _integer_division("cld", x, y)),
        _Builtin("zero", lambda x: _type_of(x, "zero").cast(0)),
        _Builtin("one", lambda x: _type_of(x, "one").cast(1)),
        _Builtin("oneunit", lambda x: _type_of(x, "oneunit").cast(1)),
        _Builtin("typemin", _typemin),
        _Builtin("typemax", _typemax),
        _Builtin("float", _float),
        _Builtin("convert", _convert_builtin),
        _Builtin("isnan", _predicate("isnan", np.isnan, False)),
        _Builtin("isinf", _predicate("isinf", np.isinf, False)),
        _Builtin("isfinite", _predicate("isfinite", np.isfinite, True)),
        _Builtin("size", _size),
        _Builtin("length", _length),
        _Builtin("prod", _prod),
        _Builtin("eltype", lambda x: _array(x, "eltype").jtype),
        _Builtin("ndims", lambda x: np.int64(len(_array(x, "ndims").size))),
        _Builtin("CPU", _cpu, package="KernelAbstractions", keywords=True),
        _Builtin("synchronize", _synchronize, package="KernelAbstractions"),
        _Builtin("get_backend", _get_backend, package="KernelAbstractions"),
    ]
    table: dict[str, Any] = {f.name: f for f in functions}
    table.update(CONCRETE_TYPES)
    table.update({"Inf": np.float64(np.inf), "Inf64": np.float64(np.inf), "Inf32": np.float32(np.inf),
                  "NaN": np.float64(np.nan), "NaN64": np.float64(np.nan), "NaN32": np.float32(np.nan)})
    return table


BUILTINS: dict[str, Any] = _builtins()
SUPPORTED_FUNCTIONS: tuple[str, ...] = tuple(sorted(k for k, v in BUILTINS.items() if isinstance(v, _Builtin)))
_QUALIFIED = {("KernelAbstractions", "synchronize"), ("KernelAbstractions", "CPU"),
              ("KernelAbstractions", "get_backend")}
_PACKAGES = ("KernelAbstractions", "Atomix")
_NTHREADS = ("Threads", "nthreads")


# ---------------------------------------------------------------------------------------------
# Runtime state

Closure = Callable[["_Frame"], Any]
_MISSING = object()
_MAX_WHILE_ITERATIONS = 1_000_000


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


class _Return(Exception):
    def __init__(self, value: Any):
        self.value = value


class _Frame:
    """One activation: local scopes (index = static scope depth), and the work-item if in a kernel."""

    __slots__ = ("scopes", "module", "tracker", "item", "ndrange", "group")

    def __init__(self, module: JuliaModule, scope: dict[str, Any], tracker: _RaceTracker | None = None,
                 item: tuple[int, ...] | None = None, ndrange: tuple[int, ...] | None = None,
                 group: _Group | None = None):
        self.scopes = [scope]
        self.module = module
        self.tracker = tracker
        self.item = item
        self.ndrange = ndrange
        self.group = group


class _Group:
    """One work-group of a cooperating kernel: its number, size, barrier and local memory (per @localmem site)."""

    def __init__(self, number: int, size: int):
        self.number, self.size = number, size
        self.barrier = threading.Barrier(size)
        self.local: dict[int, JuliaArray] = {}
        self.lock = threading.Lock()

    def localmem(self, site: int, make: Callable[[], JuliaArray]) -> JuliaArray:
        with self.lock:
            if site not in self.local:
                self.local[site] = make()
            return self.local[site]


class _ThreadItem(threading.local):
    item: tuple[int, ...] = ()


class _RaceTracker:
    """Who touched which element during one launch; conflicting work-items are a data race."""

    MANY = ("several work-items",)

    def __init__(self, names: dict[int, str]):
        self.names = names
        self._now = _ThreadItem()  # the work-item now running on this thread (cooperating groups run at once)
        self.writer: dict[tuple[int, int], tuple] = {}
        self.reader: dict[tuple[int, int], tuple] = {}
        self.atomic: dict[tuple[int, int], tuple] = {}

    @property
    def item(self) -> tuple[int, ...]:
        return self._now.item

    @item.setter
    def item(self, value: tuple[int, ...]) -> None:
        self._now.item = value

    def _other(self, table: dict, key: tuple[int, int]) -> tuple | None:
        who = table.get(key)
        return who if who is not None and who != self.item else None

    def _race(self, array: JuliaArray, pos: int, other: tuple, what: str) -> JuliaRuntimeError:
        name = self.names.get(array.ptr, "an array argument")
        return JuliaRuntimeError(
            f"data race: element {pos + 1} (linear) of `{name}` is {what} by work-item {other} and accessed "
            f"by work-item {self.item}; each element may be touched by one work-item only, unless every "
            "update is an Atomix.@atomic")

    def read(self, array: JuliaArray, pos: int) -> None:
        key = (array.ptr, pos)
        for table, what in ((self.writer, "written"), (self.atomic, "atomically updated")):
            other = self._other(table, key)
            if other is not None:
                raise self._race(array, pos, other, what)
        self.reader[key] = self.item if self.reader.get(key, self.item) == self.item else self.MANY

    def write(self, array: JuliaArray, pos: int, atomic: bool) -> None:
        key = (array.ptr, pos)
        checks = [(self.writer, "written"), (self.reader, "read")]
        if not atomic:
            checks.append((self.atomic, "atomically updated"))
        for table, what in checks:
            other = self._other(table, key)
            if other is not None:
                raise self._race(array, pos, other, what)
        if atomic:
            self.atomic[key] = self.item if self.atomic.get(key, self.item) == self.item else self.MANY
        else:
            self.writer[key] = self.item


@dataclass(frozen=True)
class _Param:
    name: str
    const: bool
    annotation: JuliaType | ArrayAnnotation | None


def _isa(value: Any, annotation: JuliaType | ArrayAnnotation | None) -> bool:
    if annotation is None:
        return True
    if isinstance(annotation, ArrayAnnotation):
        return (isinstance(value, JuliaArray)
                and (annotation.eltype is None or value.jtype is annotation.eltype)
                and (annotation.ndims is None or len(value.size) == annotation.ndims))
    t = _numtype(value)
    if annotation.kind == "abstract":
        return t is not None and t.kind in annotation.covers
    return t is annotation


def _check_arguments(name: str, params: Sequence[_Param], args: Sequence[Any]) -> None:
    signature = f"{name}({', '.join('::' + _type_name(a) for a in args)})"
    if len(args) != len(params):
        raise JuliaRuntimeError(f"MethodError: no method matching {signature}: expected {len(params)} arguments")
    for param, arg in zip(params, args):
        if not _isa(arg, param.annotation):
            raise JuliaRuntimeError(f"MethodError: no method matching {signature}: `{param.name}` must be "
                                    f"::{param.annotation}")


@dataclass
class _FunctionDef:
    name: str
    params: list[_Param]
    body: Closure
    module: JuliaModule

    def call(self, args: Sequence[Any], kwargs: dict[str, Any], tracker: _RaceTracker | None) -> Any:
        if kwargs:
            raise JuliaRuntimeError(f"MethodError: {self.name} has no keyword arguments (got {sorted(kwargs)})")
        _check_arguments(self.name, self.params, args)
        frame = _Frame(self.module, {p.name: a for p, a in zip(self.params, args)}, tracker)
        try:
            return self.body(frame)
        except _Return as ret:
            return ret.value


@dataclass
class _KernelDef:
    name: str
    params: list[_Param]
    index_statements: list[Closure]
    body: Closure
    module: JuliaModule
    cooperates: bool = False

    def instantiate(self, args: Sequence[Any], kwargs: dict[str, Any]) -> _KernelInstance:
        if kwargs or not 1 <= len(args) <= 3 or not isinstance(args[0], Backend):
            raise JuliaRuntimeError(f"MethodError: a kernel is instantiated as {self.name}(backend), "
                                    f"{self.name}(backend, workgroupsize) or {self.name}(backend, "
                                    "workgroupsize, ndrange)")
        workgroupsize = _dims(args[1], "workgroupsize", positive=True) if len(args) > 1 else None
        ndrange = _dims(args[2], "ndrange") if len(args) > 2 else None
        return _KernelInstance(self, args[0], workgroupsize, ndrange)

    def run_work_item(self, frame: _Frame) -> None:
        for statement in self.index_statements:
            statement(frame)
        self.body(frame)


@dataclass
class _KernelInstance:
    kernel: _KernelDef
    backend: Backend
    workgroupsize: tuple[int, ...] | None
    static_ndrange: tuple[int, ...] | None

    def launch(self, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        unknown = set(kwargs) - {"ndrange", "workgroupsize"}
        if unknown:
            raise JuliaRuntimeError(f"MethodError: unsupported kernel keyword(s) {sorted(unknown)}")
        ndrange = kwargs.get("ndrange")
        if ndrange is None:
            if self.static_ndrange is None:
                raise JuliaRuntimeError(f"{self.kernel.name}: a dynamic kernel needs ndrange=...")
            dims = self.static_ndrange
        else:
            dims = _dims(ndrange, "ndrange")
            if self.static_ndrange is not None and dims != self.static_ndrange:
                raise JuliaRuntimeError(f"{self.kernel.name}: ndrange {dims} differs from the static "
                                        f"ndrange {self.static_ndrange}")
        workgroupsize = self.workgroupsize
        if kwargs.get("workgroupsize") is not None:
            given = _dims(kwargs["workgroupsize"], "workgroupsize", positive=True)
            if workgroupsize is not None and given != workgroupsize:
                raise JuliaRuntimeError(f"{self.kernel.name}: Static WorkgroupSize {workgroupsize} and launch "
                                        f"WorkgroupSize {given} differ")
            workgroupsize = given
        if workgroupsize is not None and len(workgroupsize) > len(dims):
            raise JuliaRuntimeError(f"{self.kernel.name}: AssertionError: the work-group size {workgroupsize} has "
                                    f"more dimensions than the ndrange {dims}")
        module = self.kernel.module
        geometry = cpu_launch(self.kernel.name, dims, workgroupsize, module.nthreads)
        if self.kernel.cooperates:
            _launch_groups(self.kernel, list(args), dims, workgroupsize)
        else:
            _launch(self.kernel, list(args), dims)
        if geometry.groups:  # KernelAbstractions returns before running anything when there are no groups
            module.geometry.append(geometry)


KA_CPU_GRAINSIZE = 1024  # KernelAbstractions' CPU_GRAINSIZE


@dataclass(frozen=True)
class Launch:
    """One kernel launch on ``CPU()``: how KernelAbstractions splits it into work-groups and tasks."""

    kernel: str
    ndrange: tuple[int, ...]
    workgroupsize: tuple[int, ...]  # as KA uses it: padded with ones to the ndrange's rank
    groups: int  # work-groups: each one runs on one task, its work-items one after another
    tasks: int  # the Julia tasks (so at most the threads) that run the groups


def default_cpu_workgroupsize(ndrange: tuple[int, ...]) -> tuple[int, ...]:
    """KernelAbstractions' ``default_cpu_workgroupsize``: the work-group size of a dynamic kernel launched without
    one. Up to KA_CPU_GRAINSIZE work-items are ONE group; beyond, groups of that many, fastest dimension first."""
    n = int(np.prod(ndrange))
    if n == 0:
        return tuple(1 for _ in ndrange)
    if n <= KA_CPU_GRAINSIZE:
        return ndrange
    available, sizes = KA_CPU_GRAINSIZE, []
    for dim in ndrange:
        if available == 0:
            sizes.append(1)
        elif available <= dim:
            sizes.append(available)
            available = 0
        else:
            available //= dim
            sizes.append(dim)
    return tuple(sizes)


def cpu_launch(kernel: str, ndrange: tuple[int, ...], workgroupsize: tuple[int, ...] | None,
               nthreads: int) -> Launch:
    """KernelAbstractions' ``launch_config``, ``partition`` and ``__run`` on ``CPU()`` for one launch: the default
    work-group size when none is given, padded with ones, ``fld1`` groups per dimension, and one task per thread
    with work, the groups split evenly over them."""
    sizes = default_cpu_workgroupsize(ndrange) if workgroupsize is None else workgroupsize
    sizes = tuple(sizes) + (1,) * (len(ndrange) - len(sizes))
    groups = int(np.prod([-(-n // w) for n, w in zip(ndrange, sizes)]))
    return Launch(kernel, tuple(ndrange), sizes, groups, min(nthreads, groups))


def _dims(value: Any, what: str, positive: bool = False) -> tuple[int, ...]:
    items = value if isinstance(value, tuple) else (value,)
    if not items:
        raise JuliaRuntimeError(f"{what} must not be empty")
    dims = tuple(_index_ints(items))
    if any(d < (1 if positive else 0) for d in dims):
        raise JuliaRuntimeError(f"invalid {what} {dims}")
    return dims


def _launch(kernel: _KernelDef, args: list[Any], ndrange: tuple[int, ...]) -> None:
    """Run the kernel body once per point of the ndrange, in a shuffled order, tracking races."""
    _check_arguments(kernel.name, kernel.params, args)
    bound = [a.as_const() if p.const and isinstance(a, JuliaArray) else a for p, a in zip(kernel.params, args)]
    _check_const_aliasing(kernel, bound)
    names = {a.ptr: p.name for p, a in zip(kernel.params, bound) if isinstance(a, JuliaArray)}
    tracker = _RaceTracker(names)
    module = kernel.module
    items = list(itertools.product(*(range(1, n + 1) for n in ndrange)))
    module.rng.shuffle(items)
    for item in items:
        tracker.item = item
        scope = {p.name: a for p, a in zip(kernel.params, bound)}
        kernel.run_work_item(_Frame(module, scope, tracker, item, ndrange))
    module.launches.append((kernel.name, ndrange))


def _launch_groups(kernel: _KernelDef, args: list[Any], ndrange: tuple[int, ...],
                   workgroupsize: tuple[int, ...] | None) -> None:
    """A cooperating kernel: each work-group's work-items at once, one thread each (a GPU's semantics)."""
    _check_arguments(kernel.name, kernel.params, args)
    if len(ndrange) != 1 or workgroupsize is None or len(workgroupsize) != 1 or ndrange[0] % workgroupsize[0]:
        raise JuliaRuntimeError(f"{kernel.name}: a kernel with @localmem/@synchronize needs a 1-D ndrange that is a "
                                f"whole number of work-groups of a given size (ndrange {ndrange}, workgroupsize "
                                f"{workgroupsize})")
    bound = [a.as_const() if p.const and isinstance(a, JuliaArray) else a for p, a in zip(kernel.params, args)]
    _check_const_aliasing(kernel, bound)
    tracker = _RaceTracker({a.ptr: p.name for p, a in zip(kernel.params, bound) if isinstance(a, JuliaArray)})
    module = kernel.module
    size = workgroupsize[0]
    numbers = list(range(1, ndrange[0] // size + 1))
    module.rng.shuffle(numbers)
    for number in numbers:
        group = _Group(number, size)
        failures: list[BaseException] = []

        def work(item: int) -> None:
            tracker.item = (item,)
            frame = _Frame(module, {p.name: a for p, a in zip(kernel.params, bound)}, tracker, (item,), ndrange,
                           group)
            try:
                kernel.run_work_item(frame)
            except BaseException as err:  # noqa: BLE001 - re-raised below, after every thread stopped
                failures.append(err)
                group.barrier.abort()

        threads = [threading.Thread(target=work, args=((number - 1) * size + k,)) for k in range(1, size + 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        first = next((f for f in failures if not isinstance(f, JuliaRuntimeError) or "another work-item" not in
                      str(f)), failures[0] if failures else None)
        if first is not None:
            raise first
    module.launches.append((kernel.name, ndrange))


def _check_const_aliasing(kernel: _KernelDef, bound: list[Any]) -> None:
    arrays = [(p, a) for p, a in zip(kernel.params, bound) if isinstance(a, JuliaArray)]
    for (p, a), (q, b) in itertools.combinations(arrays, 2):
        if (p.const or q.const) and np.shares_memory(a.data, b.data):
            raise JuliaRuntimeError(f"{kernel.name}: @Const argument `{p.name if p.const else q.name}` aliases "
                                    f"`{q.name if p.const else p.name}` (KernelAbstractions forbids that)")


@functools.lru_cache(maxsize=None)
def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(fn)


def _invoke(fn: Any, args: list[Any], kwargs: dict[str, Any], frame: _Frame | None) -> Any:
    if isinstance(fn, _Builtin):
        if kwargs and not fn.keywords:
            raise JuliaRuntimeError(f"MethodError: {fn.name} takes no keyword arguments")
        try:
            _signature(fn.fn).bind(*args, **kwargs)
        except TypeError as err:
            raise JuliaRuntimeError(f"MethodError: no method matching {fn.name} with {len(args)} "
                                    f"argument(s) ({err})") from None
        return fn.fn(*args, **kwargs)
    if isinstance(fn, JuliaType) and fn.kind == "complex" and len(args) == 2 and not kwargs:
        real = FLOAT32 if fn is COMPLEXF32 else FLOAT64  # ComplexF32(re, im)
        return fn.dtype.type(complex(_convert(real, args[0]), _convert(real, args[1])))
    if isinstance(fn, JuliaType):
        if kwargs or len(args) != 1 or fn.kind == "abstract":
            raise JuliaRuntimeError(f"MethodError: no method matching {fn.name}(...) with {len(args)} arguments")
        return _convert(fn, args[0])
    tracker = frame.tracker if frame is not None else None
    if isinstance(fn, _FunctionDef):
        return fn.call(args, kwargs, tracker)
    if isinstance(fn, _KernelDef):
        return fn.instantiate(args, kwargs)
    if isinstance(fn, _KernelInstance):
        if tracker is not None:
            raise JuliaRuntimeError("a kernel cannot launch another kernel")
        return fn.launch(args, kwargs)
    raise JuliaRuntimeError(f"MethodError: objects of type {_type_name(fn)} are not callable")


def _to_julia(x: Any) -> Any:
    if x is None or isinstance(x, (JuliaArray, Backend, CartesianIndex, JuliaType)):
        return x
    if isinstance(x, np.ndarray):
        return JuliaArray(x)
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, int):
        if not -(2**63) <= x < 2**63:
            raise TypeError(f"{x} does not fit Int64")
        return np.int64(x)
    if isinstance(x, float):
        return np.float64(x)
    if isinstance(x, complex):  # juliacall's ComplexF64
        return np.complex128(x)
    if isinstance(x, np.generic) and x.dtype in _BY_DTYPE:
        return x
    if isinstance(x, tuple):
        return tuple(_to_julia(v) for v in x)
    raise TypeError(f"cannot pass {type(x).__name__} to the Julia evaluator")


def _from_julia(x: Any) -> Any:
    if isinstance(x, JuliaArray):
        return x.data
    if isinstance(x, tuple):
        return tuple(_from_julia(v) for v in x)
    return x


# ---------------------------------------------------------------------------------------------
# The module object (public API)


class JuliaModule:
    """A loaded module: its kernels and functions, run with Julia semantics on NumPy arrays."""

    def __init__(self, name: str, seed: int, nthreads: int):
        self.name = name
        self.defs: dict[str, Any] = {}
        self.imports: set[str] = set()
        self.launches: list[tuple[str, tuple[int, ...]]] = []
        self.geometry: list[Launch] = []
        self.nthreads = nthreads
        self.rng = random.Random(seed)

    @property
    def kernel_names(self) -> list[str]:
        return sorted(k for k, v in self.defs.items() if isinstance(v, _KernelDef))

    @property
    def function_names(self) -> list[str]:
        return sorted(k for k, v in self.defs.items() if isinstance(v, _FunctionDef))

    def lookup(self, name: str) -> Any:
        value = self.defs.get(name, _MISSING)
        return BUILTINS[name] if value is _MISSING else value

    def call(self, fname: str, *args: Any, **kwargs: Any) -> Any:
        """Call a plain function of the module; array results come back as the NumPy arrays passed in."""
        fn = self.defs.get(fname)
        if not isinstance(fn, _FunctionDef):
            raise KeyError(f"{self.name} has no function {fname!r} (functions: {self.function_names})")
        with np.errstate(all="ignore"):
            result = fn.call([_to_julia(a) for a in args], {k: _to_julia(v) for k, v in kwargs.items()}, None)
        return _from_julia(result)

    def launch(self, kernel_name: str, *args: Any, ndrange: Any, workgroupsize: Any = None) -> None:
        """``kernel_name(CPU())(args...; ndrange)`` (or ``kernel_name(CPU(), workgroupsize)``)."""
        kernel = self.defs.get(kernel_name)
        if not isinstance(kernel, _KernelDef):
            raise KeyError(f"{self.name} has no kernel {kernel_name!r} (kernels: {self.kernel_names})")
        instance = kernel.instantiate([CPU_BACKEND] + ([_to_julia(workgroupsize)] if workgroupsize else []), {})
        with np.errstate(all="ignore"):
            instance.launch([_to_julia(a) for a in args], {"ndrange": _to_julia(ndrange)})


def load_module(src: str, *, seed: int = 0, nthreads: int = 1) -> JuliaModule:
    """Parse, check and compile ``src`` for a Julia with ``nthreads`` threads; raises JuliaSyntaxError,
    UnsupportedJulia or UndefinedName."""
    errors = parse_errors(src)
    if errors:
        raise JuliaSyntaxError(errors)
    return _ModuleCompiler(_parse(src).root_node, seed, nthreads).module


# ---------------------------------------------------------------------------------------------
# Compilation: tree-sitter nodes -> closures


@dataclass
class _Scope:
    """Static scope: its local names and their declared types (``local s::Float32``)."""

    names: set[str]
    types: dict[str, JuliaType] = field(default_factory=dict)


def _concrete_type(node: tree_sitter.Node) -> JuliaType:
    name = _text(node)
    if node.type != "identifier" or name not in CONCRETE_TYPES:
        raise _reject(node, f"type `{name}` (supported: {', '.join(CONCRETE_TYPES)})")
    return CONCRETE_TYPES[name]


def _annotation(node: tree_sitter.Node) -> JuliaType | ArrayAnnotation:
    if node.type == "identifier":
        name = _text(node)
        if name in _ARRAY_ANNOTATIONS:
            return ArrayAnnotation(None, _ARRAY_ANNOTATIONS[name])
        if name in _ABSTRACT:
            return _ABSTRACT[name]
        return _concrete_type(node)
    if node.type == "parametrized_type_expression":
        base, curly = _named(node)
        params = _named(curly)
        if _text(base) not in _ARRAY_ANNOTATIONS or not 1 <= len(params) <= 2:
            raise _reject(node, "only AbstractArray{T}, AbstractArray{T,N}, AbstractVector{T}, AbstractMatrix{T}")
        ndims = _ARRAY_ANNOTATIONS[_text(base)]
        if len(params) == 2:
            if params[1].type != "integer_literal" or ndims is not None:
                raise _reject(params[1], "the rank must be an integer literal of AbstractArray{T,N}")
            ndims = int(_text(params[1]))
        return ArrayAnnotation(_concrete_type(params[0]), ndims)
    raise _reject(node, "type annotation")


def _scan_scope(nodes: Iterable[tree_sitter.Node]) -> tuple[list[str], set[str], dict[str, JuliaType]]:
    """Names assigned in a scope body (not in nested loop scopes), forced locals, declared types."""
    assigned: list[str] = []
    forced: set[str] = set()
    types: dict[str, JuliaType] = {}

    def target(lhs: tree_sitter.Node, force: bool) -> None:
        if lhs.type == "identifier":
            names = [_text(lhs)]
        elif lhs.type == "typed_expression":
            name_node, type_node = _named(lhs)
            names = [_text(name_node)]
            types[names[0]] = _concrete_type(type_node)
        elif lhs.type in ("tuple_expression", "open_tuple"):
            names = [_text(c) for c in _named(lhs) if c.type == "identifier"]
        else:
            return
        assigned.extend(names)
        if force:
            forced.update(names)

    def visit(node: tree_sitter.Node) -> None:
        if node.type in ("for_statement", "while_statement", "function_definition"):
            return
        if node.type == "local_statement":
            for child in _named(node):
                if child.type == "assignment":
                    target(_named(child)[0], True)
                    visit(_named(child)[-1])
                else:
                    target(child, True)
            return
        if node.type in ("assignment", "compound_assignment_expression"):
            target(_named(node)[0], False)
            for child in _named(node)[1:]:
                visit(child)
            return
        for child in _named(node):
            visit(child)

    for node in nodes:
        visit(node)
    return assigned, forced, types


def _macro_parts(node: tree_sitter.Node) -> tuple[str | None, str, list[tree_sitter.Node], bool]:
    """(qualifier, macro name, arguments, parenthesized) of a macrocall_expression."""
    qualifier = None
    name = None
    args: list[tree_sitter.Node] = []
    parenthesized = False
    for child in _named(node):
        if child.type == "identifier" and name is None:
            qualifier = _text(child)
        elif child.type == "macro_identifier":
            name = _text(_named(child)[0])
        elif child.type in ("macro_argument_list", "argument_list"):
            parenthesized = child.type == "argument_list"
            args = _named(child)
        else:
            raise _reject(child, "inside a macro call")
    if name is None:
        raise _reject(node)
    return qualifier, name, args, parenthesized


def _is_index_macro(node: tree_sitter.Node) -> bool:
    return node.type == "macrocall_expression" and _macro_parts(node)[:2] == (None, "index")


def _block(statements: list[Closure]) -> Closure:
    if len(statements) == 1:
        return statements[0]

    def run(frame: _Frame) -> Any:
        result = None
        for statement in statements:
            result = statement(frame)
        return result

    return run


def _with_line(fn: Closure, line: int) -> Closure:
    def run(frame: _Frame) -> Any:
        try:
            return fn(frame)
        except JuliaRuntimeError as err:
            if err.line is None:
                err.line = line
            raise

    return run


def _constant(value: Any) -> Closure:
    return lambda frame: value


def _integer_literal(node: tree_sitter.Node) -> Any:
    text = _text(node).replace("_", "")
    if not text.isdigit():
        raise _reject(node, f"integer literal {text} (hex/binary/octal literals are unsigned types)")
    value = int(text)
    if value >= 2**63:
        raise _reject(node, f"integer literal {text} does not fit Int64")
    return np.int64(value)


def _float_literal(node: tree_sitter.Node) -> Any:
    text = _text(node).replace("_", "")
    if text.lower().startswith("0x"):
        raise _reject(node, "hexadecimal float literal")
    if "f" in text:
        return np.float32(text.replace("f", "e"))
    return np.float64(text)


_ARITHMETIC = {"+", "-", "*", "/", "^", "÷", "%"}
_COMPOUND = {"+=": "+", "-=": "-", "*=": "*", "/=": "/"}


def _binary(op: str, x: Any, y: Any) -> Any:
    if op == "%" and isinstance(y, JuliaType):  # x % T: an integer converted to T modulo 2^bits
        if y.kind != "int" or _number(x, op).kind != "int":
            raise JuliaRuntimeError(f"MethodError: no method matching rem({_type_name(x)}, Type{{{y}}})")
        return _wrap_int(int(x), y)
    if op in ("+", "-", "*", "/"):
        return _arith(op, x, y)
    if op == "^":
        return _power(x, y)
    return _integer_division("div" if op == "÷" else "rem", x, y)


class _BodyCompiler:
    """Compiles one function, kernel or constant: statements and expressions into closures."""

    def __init__(self, module: _ModuleCompiler, kind: str):
        self.mc = module
        self.kind = kind  # "kernel" | "function" | "const"
        self.scopes: list[_Scope] = []
        self.loop_depth = 0
        self.parameters: set[str] = set()
        self.cooperates = False  # a kernel with @localmem or @synchronize(): its work-groups run at once

    # -- scopes ---------------------------------------------------------------------------------

    def push_scope(self, body: Iterable[tree_sitter.Node], own: Iterable[str] = ()) -> None:
        assigned, forced, types = _scan_scope(body)
        names = set(own) | forced
        names.update(n for n in assigned if n not in names and self.depth_of(n) is None)
        self.scopes.append(_Scope(names, types))

    def depth_of(self, name: str) -> int | None:
        for depth in range(len(self.scopes) - 1, -1, -1):
            if name in self.scopes[depth].names:
                return depth
        return None

    # -- statements -----------------------------------------------------------------------------

    def statements(self, nodes: Iterable[tree_sitter.Node]) -> Closure:
        return _block([self.statement(n) for n in nodes])

    def statement(self, node: tree_sitter.Node) -> Closure:
        handler = {
            "for_statement": self.for_statement,
            "while_statement": self.while_statement,
            "if_statement": self.if_statement,
            "local_statement": self.local_statement,
            "return_statement": self.return_statement,
            "break_statement": self.loop_jump,
            "continue_statement": self.loop_jump,
        }.get(node.type, self.expression)
        return _with_line(handler(node), _line(node))

    def for_statement(self, node: tree_sitter.Node) -> Closure:
        bindings = [c for c in _named(node) if c.type == "for_binding"]
        body_nodes = [c for c in _named(node) if c.type != "for_binding"]
        variables: list[str] = []
        ranges: list[Closure] = []
        for k, binding in enumerate(bindings):
            parts = _named(binding)
            if len(parts) != 3 or parts[0].type != "identifier" or _text(parts[1]) not in ("in", "=", "∈"):
                raise _reject(binding, "only `for v in a:b` / `for v in a:s:b` loops")
            variables.append(_text(parts[0]))
            if k == 0:
                ranges.append(self.range_expression(parts[2]))
        self.push_scope(body_nodes, variables)
        ranges += [self.range_expression(_named(b)[2]) for b in bindings[1:]]
        self.loop_depth += 1
        body = self.statements(body_nodes)
        self.loop_depth -= 1
        self.scopes.pop()

        def combinations(frame: _Frame, level: int, bound: dict[str, Any]):
            if level == len(ranges):
                yield bound
                return
            if level == 0:
                values = ranges[0](frame)
            else:
                frame.scopes.append(dict(bound))
                try:
                    values = ranges[level](frame)
                finally:
                    frame.scopes.pop()
            for value in values:
                yield from combinations(frame, level + 1, {**bound, variables[level]: value})

        def run(frame: _Frame) -> None:
            try:
                for bound in combinations(frame, 0, {}):
                    frame.scopes.append(dict(bound))
                    try:
                        body(frame)
                    except _Continue:
                        pass
                    finally:
                        frame.scopes.pop()
            except _Break:
                pass

        return run

    def range_expression(self, node: tree_sitter.Node) -> Closure:
        if node.type != "range_expression":
            raise _reject(node, "loops iterate over integer ranges a:b or a:s:b only")
        first, stop = _named(node)
        if first.type == "range_expression":
            start, step = (self.expression(n) for n in _named(first))
        else:
            start, step = self.expression(first), _constant(np.int64(1))
        stop_fn = self.expression(stop)

        def run(frame: _Frame) -> list[Any]:
            a, s, b = start(frame), step(frame), stop_fn(frame)
            kinds = [_numtype(v) for v in (a, s, b)]
            if any(t is None or t.kind != "int" for t in kinds):
                raise JuliaRuntimeError(f"ranges must have integer bounds and step, got {a}:{s}:{b}")
            t = _promote_type(_promote_type(kinds[0], kinds[1]), kinds[2])
            if int(s) == 0:
                raise JuliaRuntimeError("ArgumentError: step cannot be zero")
            end = int(b) + (1 if int(s) > 0 else -1)
            return [t.cast(v) for v in range(int(a), end, int(s))]

        return run

    def while_statement(self, node: tree_sitter.Node) -> Closure:
        condition_node = node.child_by_field_name("condition")
        condition = self.expression(condition_node)
        body_nodes = [c for c in _named(node) if c.id != condition_node.id]
        self.push_scope(body_nodes)
        self.loop_depth += 1
        body = self.statements(body_nodes)
        self.loop_depth -= 1
        self.scopes.pop()

        def run(frame: _Frame) -> None:
            iterations = 0
            try:
                while _require_bool(condition(frame), "while"):
                    iterations += 1
                    if iterations > _MAX_WHILE_ITERATIONS:
                        raise JuliaRuntimeError("while loop did not terminate (iteration limit reached)")
                    frame.scopes.append({})
                    try:
                        body(frame)
                    except _Continue:
                        pass
                    finally:
                        frame.scopes.pop()
            except _Break:
                pass

        return run

    def if_statement(self, node: tree_sitter.Node) -> Closure:
        branches: list[tuple[Closure, Closure]] = []
        otherwise: Closure = _constant(None)
        for clause in [node] + [c for c in _named(node) if c.type in ("elseif_clause", "else_clause")]:
            condition_node = clause.child_by_field_name("condition")
            body_nodes = [c for c in _named(clause) if c.type not in ("elseif_clause", "else_clause")
                          and (condition_node is None or c.id != condition_node.id)]
            body = self.statements(body_nodes) if body_nodes else _constant(None)
            if condition_node is None:
                otherwise = body
            else:
                branches.append((self.expression(condition_node), body))

        def run(frame: _Frame) -> Any:
            for condition, body in branches:
                if _require_bool(condition(frame), "if"):
                    return body(frame)
            return otherwise(frame)

        return run

    def local_statement(self, node: tree_sitter.Node) -> Closure:
        parts: list[Closure] = []
        for child in _named(node):
            if child.type == "assignment":
                parts.append(self.assignment(child))
            elif child.type not in ("identifier", "typed_expression"):
                raise _reject(child, "in a local declaration")
        return _block(parts) if parts else _constant(None)

    def return_statement(self, node: tree_sitter.Node) -> Closure:
        if self.kind == "kernel":
            raise _reject(node, "return is not permitted in a @kernel function (KernelAbstractions rejects "
                                "it); guard the body with `if` instead")
        if self.kind != "function":
            raise _reject(node)
        values = _named(node)
        if len(values) > 1:
            raise _reject(node, "return of several values")
        value = self.expression(values[0]) if values else _constant(None)

        def run(frame: _Frame) -> None:
            raise _Return(value(frame))

        return run

    def loop_jump(self, node: tree_sitter.Node) -> Closure:
        if self.loop_depth == 0:
            raise _reject(node, "break/continue outside a loop")
        signal = _Break if node.type == "break_statement" else _Continue

        def run(frame: _Frame) -> None:
            raise signal()

        return run

    # -- expressions ----------------------------------------------------------------------------

    def expression(self, node: tree_sitter.Node) -> Closure:
        handler = getattr(self, "expr_" + node.type, None)
        if handler is None:
            raise _reject(node)
        return handler(node)

    def expr_identifier(self, node: tree_sitter.Node) -> Closure:
        name = _text(node)
        if name == "nothing":
            return _constant(None)
        depth = self.depth_of(name)
        if depth is not None:
            def read_local(frame: _Frame) -> Any:
                try:
                    return frame.scopes[depth][name]
                except KeyError:
                    raise JuliaRuntimeError(f"UndefVarError: `{name}` not defined in local scope") from None

            return read_local
        self.mc.require(name, node)
        lookup = self.mc.module.lookup
        return lambda frame: lookup(name)

    def expr_integer_literal(self, node: tree_sitter.Node) -> Closure:
        return _constant(_integer_literal(node))

    def expr_float_literal(self, node: tree_sitter.Node) -> Closure:
        return _constant(_float_literal(node))

    def expr_boolean_literal(self, node: tree_sitter.Node) -> Closure:
        return _constant(_text(node) == "true")

    def expr_parenthesized_expression(self, node: tree_sitter.Node) -> Closure:
        inner = _named(node)
        if len(inner) != 1:
            raise _reject(node, "a parenthesized sequence of expressions")
        return self.expression(inner[0])

    def expr_tuple_expression(self, node: tree_sitter.Node) -> Closure:
        elements = _named(node)
        if any(e.type in ("assignment", "named_argument") for e in elements):
            raise _reject(node, "named tuple")
        parts = [self.expression(e) for e in elements]
        return lambda frame: tuple(p(frame) for p in parts)

    def expr_compound_statement(self, node: tree_sitter.Node) -> Closure:
        return self.statements(_named(node))

    def expr_binary_expression(self, node: tree_sitter.Node) -> Closure:
        left_node, op_node, right_node = _named(node)
        op = _text(op_node)
        left, right = self.expression(left_node), self.expression(right_node)
        if op in ("&&", "||"):
            is_and = op == "&&"

            def logical(frame: _Frame) -> bool:
                if _require_bool(left(frame), op) != is_and:
                    return not is_and
                return _require_bool(right(frame), op)

            return logical
        if op in _COMPARISONS:
            if left_node.type == "binary_expression" and _text(_named(left_node)[1]) in _COMPARISONS:
                raise _reject(node, "chained comparison; write `a < b && b < c`")
            canonical = _COMPARISONS[op]
            return lambda frame: _compare(canonical, left(frame), right(frame))
        if op == "^" and left_node.type == "binary_expression" and _text(_named(left_node)[1]) == "^":
            # Julia's ^ is right-associative, tree-sitter-julia 0.23 groups a^b^c to the left.
            raise _reject(node, "chained ^; parenthesize it: a^(b^c)")
        if op in _ARITHMETIC:
            return lambda frame: _binary(op, left(frame), right(frame))
        raise _reject(node, f"operator {op}")

    def expr_unary_expression(self, node: tree_sitter.Node) -> Closure:
        op_node, operand_node = _named(node)
        return self.unary(_text(op_node), self.expression(operand_node), node)

    def unary(self, op: str, operand: Closure, node: tree_sitter.Node) -> Closure:
        if op == "-":
            return lambda frame: _negate(operand(frame))
        if op == "+":
            return lambda frame: _identity_plus(operand(frame))
        if op == "!":
            return lambda frame: not _require_bool(operand(frame), "!")
        raise _reject(node, f"unary operator {op}")

    def expr_ternary_expression(self, node: tree_sitter.Node) -> Closure:
        condition, yes, no = (self.expression(n) for n in _named(node))
        return lambda frame: yes(frame) if _require_bool(condition(frame), "?:") else no(frame)

    def expr_call_expression(self, node: tree_sitter.Node) -> Closure:
        parts = _named(node)
        if len(parts) != 2 or parts[1].type != "argument_list":
            raise _reject(node, "call form (do-blocks, broadcasting calls)")
        callee_node, arguments = parts
        positional, keywords = self.arguments(arguments)
        if callee_node.type == "operator":
            if len(positional) != 1 or keywords:
                raise _reject(node, "operator called as a function")
            return self.unary(_text(callee_node), positional[0], node)
        callee = self.expression(callee_node)

        def call(frame: _Frame) -> Any:
            fn = callee(frame)
            args = [p(frame) for p in positional]
            kwargs = {name: value(frame) for name, value in keywords}
            return _invoke(fn, args, kwargs, frame)

        return call

    def arguments(self, node: tree_sitter.Node) -> tuple[list[Closure], list[tuple[str, Closure]]]:
        positional: list[Closure] = []
        keywords: list[tuple[str, Closure]] = []
        after_semicolon = False
        for child in node.children:
            if child.type == ";":
                after_semicolon = True
            elif not child.is_named or child.type in _COMMENTS:
                continue
            elif child.type == "named_argument":
                name_node, value_node = _named(child)[0], _named(child)[-1]
                keywords.append((_text(name_node), self.expression(value_node)))
            elif after_semicolon and child.type == "identifier":
                keywords.append((_text(child), self.expression(child)))
            elif after_semicolon:
                raise _reject(child, "keyword argument form")
            else:
                positional.append(self.expression(child))
        return positional, keywords

    def expr_field_expression(self, node: tree_sitter.Node) -> Closure:
        value, name = _named(node)
        key = (_text(value), _text(name))
        if value.type == "identifier" and key == _NTHREADS:  # Base.Threads: no `using` needed
            module = self.mc.module
            return _constant(_Builtin("nthreads", lambda: np.int64(module.nthreads)))
        if value.type != "identifier" or key not in _QUALIFIED:
            raise _reject(node, f"field access {_text(node)} (only {sorted('.'.join(q) for q in _QUALIFIED)})")
        self.mc.require_package(key[0], node)
        return _constant(BUILTINS[key[1]])

    def expr_index_expression(self, node: tree_sitter.Node) -> Closure:
        target, indices = self.indexing(node)

        def load(frame: _Frame) -> Any:
            container = target(frame)
            idx = [i(frame) for i in indices]
            if isinstance(container, JuliaArray):
                return container.load(idx, frame.tracker)
            return _index_tuple(container, idx)

        return load

    def indexing(self, node: tree_sitter.Node) -> tuple[Closure, list[Closure]]:
        target_node, index_list = _named(node)
        if index_list.type != "vector_expression":
            raise _reject(index_list, "index form")
        if target_node.type == "identifier" and _text(target_node) in CONCRETE_TYPES:
            raise _reject(node, "typed array literal")
        indices = []
        for index in _named(index_list):
            if index.type in ("range_expression", "operator") or _text(index) in (":", "end", "begin"):
                raise _reject(index, "slices, `:` and `end` in indices")
            indices.append(self.expression(index))
        return self.expression(target_node), indices

    def expr_macrocall_expression(self, node: tree_sitter.Node) -> Closure:
        qualifier, name, args, _ = _macro_parts(node)
        if qualifier is None and name == "inbounds" and len(args) == 1:
            # Bounds stay checked: an out-of-bounds access under @inbounds is a bug, not a speed-up.
            return self.statement(args[0])
        if qualifier is None and name == "ndrange" and not args and self.kind == "kernel":
            return lambda frame: tuple(np.int64(n) for n in frame.ndrange)
        if qualifier == "Atomix" and name == "atomic" and len(args) == 1:
            self.mc.require_package("Atomix", node)
            return self.atomic(args[0])
        if qualifier is None and name == "synchronize" and not args and self.kind == "kernel":
            self.cooperates = True

            def synchronize(frame: _Frame) -> None:
                try:
                    frame.group.barrier.wait()
                except threading.BrokenBarrierError:
                    raise JuliaRuntimeError("another work-item of the group failed before @synchronize") from None

            return synchronize
        if qualifier is None and name == "localmem" and len(args) == 2 and self.kind == "kernel":
            self.cooperates = True
            element, dims = self.expression(args[0]), self.expression(args[1])
            site = node.start_byte

            def localmem(frame: _Frame) -> JuliaArray:
                t, sizes = element(frame), dims(frame)
                if not isinstance(t, JuliaType) or not isinstance(sizes, tuple):
                    raise JuliaRuntimeError("@localmem T (n...,) needs a type and a tuple of sizes")
                ints = _index_ints(sizes)
                return frame.group.localmem(site, lambda: JuliaArray(np.zeros(tuple(reversed(ints)), t.dtype),
                                                                     private=True))

            return localmem
        if qualifier is None and name == "index":
            raise _reject(node, "@index is only supported as the right-hand side of a top-level assignment "
                                "in a @kernel body (KernelAbstractions' CPU backend hoists exactly those)")
        raise _reject(node, f"macro @{name}" if qualifier is None else f"macro {qualifier}.@{name}")

    def atomic(self, node: tree_sitter.Node) -> Closure:
        if node.type != "compound_assignment_expression":
            raise _reject(node, "Atomix.@atomic supports `A[i...] += v` and `A[i...] -= v`")
        lhs, op_node, rhs = _named(node)
        op = _text(op_node)
        if lhs.type != "index_expression" or op not in ("+=", "-="):
            raise _reject(node, "Atomix.@atomic supports `A[i...] += v` and `A[i...] -= v`")
        target, indices = self.indexing(lhs)
        value = self.expression(rhs)

        def run(frame: _Frame) -> Any:
            array = target(frame)
            if not isinstance(array, JuliaArray):
                raise JuliaRuntimeError("Atomix.@atomic needs an array element")
            idx = [i(frame) for i in indices]
            old = _normalize(array.flat[array.linear(idx)])
            new = _arith(op[0], old, value(frame))
            array.store(idx, new, frame.tracker, atomic=True)
            return _convert(array.jtype, new)

        return run

    def expr_assignment(self, node: tree_sitter.Node) -> Closure:
        return self.assignment(node)

    def assignment(self, node: tree_sitter.Node) -> Closure:
        lhs, op_node, rhs = _named(node)
        if _text(op_node) != "=":
            raise _reject(node, f"assignment operator {_text(op_node)}")
        if lhs.type == "call_expression":
            raise _reject(node, "function definition inside a function")
        value = self.expression(rhs)
        store = self.store_target(lhs)

        def run(frame: _Frame) -> Any:
            result = value(frame)
            store(frame, result)
            return result

        return run

    def store_target(self, lhs: tree_sitter.Node) -> Callable[[_Frame, Any], None]:
        if lhs.type in ("identifier", "typed_expression"):
            name_node = lhs if lhs.type == "identifier" else _named(lhs)[0]
            name = _text(name_node)
            depth = self.depth_of(name)
            if depth is None or name_node.type != "identifier":
                raise _reject(lhs, f"assignment to `{name}` outside a local scope")
            if self.kind == "kernel" and depth == 0 and name in self.parameters:
                # KA's CPU backend runs the body in a loop over work-items inside the kernel function,
                # so an assigned parameter would carry over from one work-item to the next.
                raise _reject(lhs, f"assignment to the kernel parameter `{name}`; use a new local")
            declared = self.scopes[depth].types.get(name)
            if lhs.type == "typed_expression":
                declared = _concrete_type(_named(lhs)[1])

            def store_local(frame: _Frame, value: Any) -> None:
                frame.scopes[depth][name] = value if declared is None else _convert(declared, value)

            return store_local
        if lhs.type == "index_expression":
            target, indices = self.indexing(lhs)

            def store_element(frame: _Frame, value: Any) -> None:
                array = target(frame)
                if not isinstance(array, JuliaArray):
                    raise JuliaRuntimeError(f"MethodError: no method matching setindex!(::{_type_name(array)}, ...)")
                array.store([i(frame) for i in indices], value, frame.tracker)

            return store_element
        if lhs.type in ("tuple_expression", "open_tuple"):
            elements = _named(lhs)
            if any(e.type != "identifier" for e in elements):
                raise _reject(lhs, "destructuring into anything but plain names")
            stores = [self.store_target(e) for e in elements]

            def store_tuple(frame: _Frame, value: Any) -> None:
                if not isinstance(value, tuple) or len(value) < len(stores):
                    raise JuliaRuntimeError(f"cannot destructure {_type_name(value)} into {len(stores)} names")
                for store, item in zip(stores, value):
                    store(frame, item)

            return store_tuple
        raise _reject(lhs, "assignment target")

    def expr_compound_assignment_expression(self, node: tree_sitter.Node) -> Closure:
        lhs, op_node, rhs = _named(node)
        op = _text(op_node)
        if op not in _COMPOUND:
            raise _reject(node, f"update operator {op} (supported: {', '.join(_COMPOUND)})")
        binop = _COMPOUND[op]
        value = self.expression(rhs)
        if lhs.type == "identifier":
            read, store = self.expression(lhs), self.store_target(lhs)

            def update_local(frame: _Frame) -> Any:
                result = _binary(binop, read(frame), value(frame))
                store(frame, result)
                return result

            return update_local
        if lhs.type == "index_expression":
            target, indices = self.indexing(lhs)

            def update_element(frame: _Frame) -> Any:
                array = target(frame)
                if not isinstance(array, JuliaArray):
                    raise JuliaRuntimeError(f"MethodError: cannot update an element of {_type_name(array)}")
                idx = [i(frame) for i in indices]
                result = _binary(binop, array.load(idx, frame.tracker), value(frame))
                array.store(idx, result, frame.tracker)
                return result

            return update_element
        raise _reject(lhs, "update target")

    # -- definitions ----------------------------------------------------------------------------

    def index_statement(self, node: tree_sitter.Node) -> Closure:
        lhs, _, rhs = _named(node)
        qualifier, _, args, parenthesized = _macro_parts(rhs)
        words = [_text(a) for a in args]
        if not parenthesized or any(a.type != "identifier" for a in args) or not 1 <= len(words) <= 2:
            raise _reject(rhs, "@index(Global[, Linear|Cartesian|NTuple])")
        if words[0] not in ("Global", "Local", "Group"):
            raise _reject(rhs, f"@index({words[0]}, ...): only Global, Local and Group indices are in the subset")
        kind = words[1] if len(words) == 2 else "Linear"
        if kind not in ("Linear", "Cartesian", "NTuple"):
            raise _reject(rhs, f"@index kind {kind}")
        if words[0] != "Global" and kind != "Linear":
            raise _reject(rhs, f"@index({words[0]}, {kind}): only Linear positions in and of groups")
        store = self.store_target(lhs)
        if words[0] != "Global":
            self.cooperates = True
            group = words[0] == "Group"

            def in_group(frame: _Frame) -> None:
                (item,) = frame.item
                store(frame, np.int64(frame.group.number if group else (item - 1) % frame.group.size + 1))

            return _with_line(in_group, _line(node))

        def run(frame: _Frame) -> None:
            item = tuple(np.int64(i) for i in frame.item)
            if kind == "NTuple":
                store(frame, item)
            elif kind == "Cartesian":
                store(frame, CartesianIndex(item))
            else:
                linear, stride = 1, 1
                for i, extent in zip(frame.item, frame.ndrange):
                    linear += (i - 1) * stride
                    stride *= extent
                store(frame, np.int64(linear))

        return _with_line(run, _line(node))


def _index_tuple(container: Any, idx: list[Any]) -> Any:
    if isinstance(container, CartesianIndex):
        container = container.I
    if not isinstance(container, tuple) or len(idx) != 1:
        raise JuliaRuntimeError(f"MethodError: cannot index {_type_name(container)} with {len(idx)} indices")
    (k,) = _index_ints(idx)
    if not 1 <= k <= len(container):
        raise JuliaRuntimeError(f"BoundsError: attempt to access {len(container)}-element tuple at index [{k}]")
    return container[k - 1]


class _ModuleCompiler:
    """Compiles the top level: one `module ... end` block (or bare definitions)."""

    def __init__(self, root: tree_sitter.Node, seed: int, nthreads: int):
        statements = _named(root)
        if len(statements) == 1 and statements[0].type == "module_definition":
            block = statements[0]
            name_node = block.child_by_field_name("name")
            self.module = JuliaModule(_text(name_node), seed, nthreads)
            body = [c for c in _named(block) if c.id != name_node.id]
        else:
            # Bare definitions are evaluated by the bridge in a container that already has
            # `using KernelAbstractions, Atomix`.
            self.module = JuliaModule("Main", seed, nthreads)
            self.module.imports.update(_PACKAGES)
            body = statements
        self.references: list[tuple[str, tree_sitter.Node]] = []
        self.package_uses: list[tuple[str, tree_sitter.Node]] = []
        for node in body:
            self.toplevel(node)
        self.check_references()

    # -- name checks (after every definition is known) ------------------------------------------

    def require(self, name: str, node: tree_sitter.Node) -> None:
        self.references.append((name, node))

    def require_package(self, package: str, node: tree_sitter.Node) -> None:
        self.package_uses.append((package, node))

    def check_references(self, start: int = 0) -> None:
        """Every name referenced (from the ``start``-th reference on) must be defined or a builtin."""
        for package, node in self.package_uses:
            if package not in self.module.imports:
                raise UndefinedName(package, _line(node), f"needs `using {package}` in the module")
        for name, node in self.references[start:]:
            if name in self.module.defs:
                continue
            builtin = BUILTINS.get(name)
            if builtin is None:
                raise UndefinedName(name, _line(node), "not a supported function or a local variable in scope")
            package = getattr(builtin, "package", None)
            if package is not None and package not in self.module.imports:
                raise UndefinedName(name, _line(node), f"needs `using {package}`")

    # -- top-level statements -------------------------------------------------------------------

    def toplevel(self, node: tree_sitter.Node) -> None:
        kind = node.type
        if kind in ("using_statement", "import_statement"):
            self.imports(node)
        elif kind in ("export_statement", "string_literal"):  # exports, docstrings
            pass
        elif kind == "const_statement":
            self.constant(node)
        elif kind == "function_definition":
            self.function(node)
        elif kind == "assignment" and _named(node)[0].type == "call_expression":
            self.short_function(node)
        elif kind == "macrocall_expression":
            self.toplevel_macro(node)
        else:
            raise _reject(node, "at module level (only using/import, const, export, function and @kernel "
                                "definitions)")

    def imports(self, node: tree_sitter.Node) -> None:
        for child in _named(node):
            if child.type != "identifier" or _text(child) not in _PACKAGES:
                raise _reject(child, f"import of {_text(child)} (only `using/import KernelAbstractions, Atomix`)")
            self.module.imports.add(_text(child))

    def define(self, name: str, value: Any, node: tree_sitter.Node) -> None:
        if name in self.module.defs:
            raise _reject(node, f"second definition of `{name}` (methods/dispatch are outside the subset)")
        if name in BUILTINS:
            raise _reject(node, f"definition of `{name}` shadows a supported builtin")
        self.module.defs[name] = value

    def constant(self, node: tree_sitter.Node) -> None:
        children = _named(node)
        if len(children) != 1 or children[0].type != "assignment" or _named(children[0])[0].type != "identifier":
            raise _reject(node, "const must be `const NAME = expression`")
        lhs, _, rhs = _named(children[0])
        first_reference = len(self.references)
        value = _BodyCompiler(self, "const").expression(rhs)
        self.check_references(first_reference)  # a constant may only use what is defined above it
        with np.errstate(all="ignore"):
            self.define(_text(lhs), value(_Frame(self.module, {})), node)

    def toplevel_macro(self, node: tree_sitter.Node) -> None:
        qualifier, name, args, parenthesized = _macro_parts(node)
        if qualifier is None and name == "kernel" and not parenthesized and args:
            self.require_package("KernelAbstractions", node)
            self.kernel(args[:-1], args[-1])
        elif qualifier is None and name == "inline" and len(args) == 1 and args[0].type == "function_definition":
            self.function(args[0])
        elif qualifier is None and name == "inline" and len(args) == 1 and args[0].type == "assignment":
            self.short_function(args[0])
        else:
            raise _reject(node, f"top-level macro @{name}")

    def signature(self, node: tree_sitter.Node, kernel: bool) -> tuple[str, list[_Param]]:
        signature = [c for c in _named(node) if c.type == "signature"]
        call = _named(signature[0])[0] if signature else None
        if call is None or call.type != "call_expression":
            raise _reject(node, "function signature (return-type annotations, `where` and empty "
                                "`function f end` are outside the subset)")
        return self.call_signature(call, kernel)

    def call_signature(self, call: tree_sitter.Node, kernel: bool) -> tuple[str, list[_Param]]:
        name_node, arguments = _named(call)
        if name_node.type != "identifier" or arguments.type != "argument_list":
            raise _reject(call, "function name")
        params = []
        for child in arguments.children:
            if child.type == ";":
                raise _reject(child, "keyword parameters")
            if child.is_named and child.type not in _COMMENTS:
                params.append(self.parameter(child, kernel))
        names = [p.name for p in params]
        if len(set(names)) != len(names):
            raise _reject(call, "repeated parameter name")
        return _text(name_node), params

    def parameter(self, node: tree_sitter.Node, kernel: bool) -> _Param:
        if node.type == "identifier":
            return _Param(_text(node), False, None)
        if node.type == "typed_expression":
            name_node, type_node = _named(node)
            if name_node.type != "identifier":
                raise _reject(node, "parameter")
            return _Param(_text(name_node), False, _annotation(type_node))
        if node.type == "macrocall_expression" and kernel:
            qualifier, name, args, parenthesized = _macro_parts(node)
            if (qualifier, name) == (None, "Const") and parenthesized and len(args) == 1:
                inner = self.parameter(args[0], kernel=False)
                return _Param(inner.name, True, inner.annotation)
        raise _reject(node, "parameter (plain, typed `x::T`, or `@Const(x)` in kernels)")

    def function(self, node: tree_sitter.Node) -> None:
        name, params = self.signature(node, kernel=False)
        body_nodes = [c for c in _named(node) if c.type != "signature"]
        compiler = _BodyCompiler(self, "function")
        compiler.push_scope(body_nodes, [p.name for p in params])
        body = compiler.statements(body_nodes) if body_nodes else _constant(None)
        self.define(name, _FunctionDef(name, params, body, self.module), node)

    def short_function(self, node: tree_sitter.Node) -> None:
        call, op_node, rhs = _named(node)
        if _text(op_node) != "=":
            raise _reject(node)
        name, params = self.call_signature(call, kernel=False)
        compiler = _BodyCompiler(self, "function")
        compiler.push_scope([rhs], [p.name for p in params])
        body = compiler.statement(rhs)
        self.define(name, _FunctionDef(name, params, body, self.module), node)

    def kernel(self, options: list[tree_sitter.Node], definition: tree_sitter.Node) -> None:
        for option in options:
            parts = _named(option)
            if (option.type != "assignment" or len(parts) != 3 or _text(parts[0]) != "inbounds"
                    or parts[2].type != "boolean_literal"):
                raise _reject(option, "@kernel option (only inbounds=true/false; cpu=false and "
                                      "unsafe_indices=true change the CPU semantics)")
        if definition.type != "function_definition":
            raise _reject(definition, "@kernel must be followed by `function name(args) ... end`")
        name, params = self.signature(definition, kernel=True)
        body_nodes = [c for c in _named(definition) if c.type != "signature"]
        compiler = _BodyCompiler(self, "kernel")
        compiler.parameters = {p.name for p in params}
        compiler.push_scope(body_nodes, compiler.parameters)
        index_statements = [compiler.index_statement(n) for n in body_nodes
                            if n.type == "assignment" and _is_index_macro(_named(n)[-1])]
        others = [n for n in body_nodes if not (n.type == "assignment" and _is_index_macro(_named(n)[-1]))]
        body = compiler.statements(others) if others else _constant(None)
        self.define(name, _KernelDef(name, params, index_statements, body, self.module, compiler.cooperates),
                    definition)
