"""Which values of a spec are complex: a small type inference over the body, given the inputs that hold complex
numbers.

A body is complex-valued where a complex input (or a complex literal, which only derived gradient specs hold)
reaches it through arithmetic, ``conj`` or a holomorphic function; ``real``, ``imag`` and ``abs`` of anything,
comparisons and index values are real. The result of a spec is real where its body (and finaliser) is, whatever
the inputs, as in jnp: ``real(z[i]*conj(z[i]))`` on complex64 gives float32. What has no meaning on complex
values (orderings: comparisons, ``max``/``min``, ``relu``, ``(max)`` reductions, ...) is a SpecError here, so it
never reaches a backend, where jnp would order complex numbers lexicographically and a loop kernel would not
compile.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from tullax.errors import SpecError
from tullax.spec import functions
from tullax.spec.ir import COMPARISONS, Access, Binary, Call, Expr, Hole, Num, Param, Spec, Unary, walk

HOLE = "_"  # in ``names``: the finaliser's ``_`` (the reduced value) is complex

__all__ = ["complex_inputs", "is_complex", "body_is_complex", "result_is_complex", "check_complex",
           "has_complex_literal"]


def complex_inputs(spec: Spec, dtypes: Mapping[str, Any]) -> frozenset[str]:
    """The data inputs (and scalars) of ``spec`` whose dtype in ``dtypes`` (dtypes, Python types, values or
    None) is complex."""
    found = set()
    for inp in spec.inputs:
        dtype = dtypes.get(inp.name)
        if inp.kind in ("array", "scalar") and dtype is not None and _complex_dtype(dtype):
            found.add(inp.name)
    return frozenset(found)


def _complex_dtype(dtype: Any) -> bool:
    import numpy as np

    if isinstance(dtype, type) and not issubclass(dtype, np.generic):
        return dtype is complex  # a weak Python scalar type
    try:
        return np.dtype(getattr(dtype, "dtype", dtype)).kind == "c"
    except TypeError:  # bfloat16 and other dtypes NumPy does not name: not complex
        return False


def is_complex(expr: Expr, names: frozenset[str]) -> bool:
    """True when ``expr`` is complex-valued, the arrays and scalars in ``names`` being the complex ones."""
    if not names and not has_complex_literal(expr):
        return False  # the common case, all real: no walk
    if isinstance(expr, Num):
        return isinstance(expr.value, complex)
    if isinstance(expr, (Access, Param)):
        return (expr.array if isinstance(expr, Access) else expr.name) in names
    if isinstance(expr, Hole):
        return HOLE in names
    if isinstance(expr, Unary):
        return is_complex(expr.arg, names)
    if isinstance(expr, Binary):
        return expr.op not in COMPARISONS and (is_complex(expr.lhs, names) or is_complex(expr.rhs, names))
    if isinstance(expr, Call):
        if expr.fn == "ifelse":
            return any(is_complex(a, names) for a in expr.args[1:])
        if functions.get(expr.fn).on_complex == "real-valued":
            return False
        return any(is_complex(a, names) for a in expr.args)
    return False  # index values


def has_complex_literal(expr: Expr) -> bool:
    if isinstance(expr, Num):
        return isinstance(expr.value, complex)
    if isinstance(expr, Unary):
        return has_complex_literal(expr.arg)
    if isinstance(expr, Binary):
        return has_complex_literal(expr.lhs) or has_complex_literal(expr.rhs)
    if isinstance(expr, Call):
        return any(has_complex_literal(a) for a in expr.args)
    return False


def body_is_complex(spec: Spec, names: frozenset[str]) -> bool:
    """The value the reduction runs over (before the finaliser) is complex."""
    return is_complex(spec.body, names)


def _finalizer_names(spec: Spec, names: frozenset[str]) -> frozenset[str]:
    """``names`` with the finaliser's ``_`` when the reduced value is complex."""
    return names | {HOLE} if body_is_complex(spec, names) else names


def result_is_complex(spec: Spec, names: frozenset[str]) -> bool:
    """The result is complex: a complex body not made real by the finaliser (``|> abs``), or a complex given
    output that '='/'+=' writes into."""
    if spec.finalizer is not None:
        value = is_complex(spec.finalizer, _finalizer_names(spec, names))
    else:
        value = body_is_complex(spec, names)
    return value or (spec.assign != ":=" and spec.out in names)


def _has_hole(expr: Expr) -> bool:
    return any(isinstance(node, Hole) for node in walk(expr))


def _linear_in_hole(expr: Expr) -> bool:
    """``_`` reaches ``expr`` through sums, differences, negation and products with ``_``-free factors only
    (``_ + Δh[b,t,m]``, the adjoint of a recurrence that mixes its lanes): a holomorphic finaliser, whose
    derivative w.r.t. ``_`` is a constant, so its gradient needs no complex-aware derivative of a function."""
    if isinstance(expr, Hole) or not _has_hole(expr):
        return True
    if isinstance(expr, Unary):
        return _linear_in_hole(expr.arg)
    if isinstance(expr, Binary) and expr.op in ("+", "-"):
        return _linear_in_hole(expr.lhs) and _linear_in_hole(expr.rhs)
    if isinstance(expr, Binary) and expr.op == "*":
        return (not _has_hole(expr.lhs) and _linear_in_hole(expr.rhs)) or \
            (not _has_hole(expr.rhs) and _linear_in_hole(expr.lhs))
    return False


def check_complex(spec: Spec, names: frozenset[str]) -> None:
    """A SpecError for what has no meaning on complex values: orderings of them (comparisons, max/min, relu,
    sigmoid, softplus, a condition of ifelse, a (max)/(min)/(logsumexp) reduction) and a real-only finaliser."""
    if not names and not has_complex_literal(spec.body):
        return
    from tullax.spec.text import format_expr

    def refuse(what: str, node: Expr) -> None:
        raise SpecError(f"{what} of complex values is not defined (in {format_expr(node)}): apply it to "
                        "real(..), imag(..) or abs(..) of them")

    stack = [spec.body]
    if spec.finalizer is not None:
        inner = _finalizer_names(spec, names)
        if not (isinstance(spec.finalizer, Call) and len(spec.finalizer.args) == 1
                and isinstance(spec.finalizer.args[0], Hole)) and not _linear_in_hole(spec.finalizer) and any(
                is_complex(node, inner) for node in walk(spec.finalizer)):
            raise SpecError(f"a finaliser expression on complex values ({format_expr(spec.finalizer)}) is not "
                            "supported: write the function form (|> abs), a form linear in _ (|> _ + b[i]) or move the "
                            "expression into the body")
        check_complex(replace(spec, body=spec.finalizer, finalizer=None, redop="+"), inner)
    while stack:
        node = stack.pop()
        if isinstance(node, Binary) and node.op in COMPARISONS and \
                (is_complex(node.lhs, names) or is_complex(node.rhs, names)):
            refuse(f"the comparison {node.op}", node)
        if isinstance(node, Call):
            if node.fn == "ifelse" and is_complex(node.args[0], names):
                refuse("a condition", node)
            if functions.get(node.fn).on_complex == "real-only" and any(is_complex(a, names) for a in node.args):
                refuse(node.fn, node)
        stack.extend(getattr(node, "args", ()) or
                     ((node.lhs, node.rhs) if isinstance(node, Binary) else
                      (node.arg,) if isinstance(node, Unary) else ()))
    if body_is_complex(spec, names) and spec.redop not in ("+", "*"):
        refuse(f"a ({spec.redop}) reduction", spec.body)
