"""The ONE registry of the functions a spec may call: everything every stage knows about each of them.

Every stage reads this table and nothing else: the parser (name, arity), the gradient derivation
(``derivative``, ``from_output``, ``safe_at_pad``), the lowering (``lowering``), each printer (its spelling and
``julia_domain``), the XLA lowering (``jnp``) and the naive evaluator (``numpy``). Adding a function that every
target spells as a plain call (``cbrt``, ``atan``) is one ``Function(...)`` entry here.

Derivatives are written in the spec language over ``x`` (the argument) and ``y`` (the value ``f(x)``, so a
derivative can reuse it: ``exp' = y``); ``from_output`` writes ``f'(x)`` with ``y`` alone, so a finaliser's
gradient can read the forward result instead of recomputing the reduction. ``None``: the function has a zero
derivative (``imag`` of a real value) or its rule is structural (``max``, ``min``, ``ifelse``: see ``grad``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np

Lowering = Literal["call", "expand", "structural"]


@dataclass(frozen=True)
class Function:
    name: str
    arity: int
    # d f(x) / dx in the spec language, over x and y = f(x); None: zero or structural (see the module docstring)
    derivative: str | None
    # f'(x) in terms of y = f(x) alone, when it can be written so (a finaliser's gradient reads the forward result)
    from_output: str | None
    # f(t) stays finite when a term t is replaced by 0 (a new pad, an index value outside its old range)
    safe_at_pad: bool
    # loop backends: "call" prints the target's spelling below; "expand" is rewritten by the lowering into calls
    # and selects; "structural" has its own IR node or rule (max, min, ifelse, conj, real, imag)
    lowering: Lowering
    numpy: Callable | None  # the naive evaluator's scalar implementation (float64 / complex128)
    jnp: str  # dotted path of the jax implementation, imported when the XLA lowering runs
    numba: str | None = None  # Numba spelling of a "call" function
    julia: str | None = None  # Julia spelling of a "call" function
    c: tuple[str, str] | None = None  # C spelling for (float32, float64), for the CUDA printer
    # Julia throws DomainError where NumPy/XLA return NaN: the condition on x that gives NaN ({zero}, {one} are
    # literals of the argument's type); printers wrap such calls so NaN comes out, as on every other backend
    julia_domain: str | None = None
    # On complex arguments: "holomorphic" (the derivative rule holds as written, jax's convention for complex
    # gradients needs nothing more), "real-valued" (real, imag, abs: a real result; their Wirtinger rules are
    # structural, in grad.derivative), "conjugate" (conj), "real-only" (an ordering of values: refused on complex
    # arguments with a SpecError, see spec.valuetype)
    on_complex: Literal["holomorphic", "real-valued", "conjugate", "real-only"] = "holomorphic"


def _sigmoid(x):
    return 1 / (1 + np.exp(-x)) if np.real(x) >= 0 else np.exp(x) / (1 + np.exp(x))


def _softplus(x):
    return np.logaddexp(x, 0.0)


def _relu(x):
    return x if x > 0 else 0 * x


def _math(name: str, derivative: str | None, from_output: str | None, safe_at_pad: bool, c32: str, c64: str,
          julia_domain: str | None = None, on_complex: str = "holomorphic") -> Function:
    """A function every target spells as a plain call of the same name (C: with an ``f`` suffix for float32)."""
    return Function(name, 1, derivative, from_output, safe_at_pad, "call", getattr(np, name), f"jax.numpy.{name}",
                    numba=f"np.{name}", julia=name, c=(c32, c64), julia_domain=julia_domain,
                    on_complex=on_complex)  # type: ignore[arg-type]


FUNCTIONS: dict[str, Function] = {f.name: f for f in (
    _math("exp", "y", "y", True, "expf", "exp"),
    _math("log", "1/x", "exp(-y)", False, "logf", "log", julia_domain="x < {zero}"),
    _math("log1p", "1/(1 + x)", "exp(-y)", False, "log1pf", "log1p", julia_domain="x < -{one}"),
    _math("expm1", "exp(x)", "y + 1", True, "expm1f", "expm1"),
    _math("sqrt", "0.5/y", "0.5/y", False, "sqrtf", "sqrt", julia_domain="x < {zero}"),
    _math("abs", "(x >= 0) - (x < 0)", None, True, "fabsf", "fabs", on_complex="real-valued"),
    _math("sin", "cos(x)", None, True, "sinf", "sin", julia_domain="isinf(x)"),
    _math("cos", "-sin(x)", None, True, "cosf", "cos", julia_domain="isinf(x)"),
    _math("tan", "1 + y^2", "1 + y^2", False, "tanf", "tan", julia_domain="isinf(x)"),
    _math("tanh", "1 - y^2", "1 - y^2", True, "tanhf", "tanh"),
    _math("sinh", "cosh(x)", "sqrt(1 + y^2)", True, "sinhf", "sinh"),
    _math("cosh", "sinh(x)", None, True, "coshf", "cosh"),
    Function("sigmoid", 1, "y*(1 - y)", "y*(1 - y)", True, "expand", _sigmoid, "jax.nn.sigmoid",
             on_complex="real-only"),
    Function("softplus", 1, "sigmoid(x)", "-expm1(-y)", True, "expand", _softplus, "jax.nn.softplus",
             on_complex="real-only"),
    Function("relu", 1, "x > 0", "y > 0", True, "expand", _relu, "jax.nn.relu", on_complex="real-only"),
    # the rules here are those of a real argument; on a complex one grad.derivative has Wirtinger rules
    Function("conj", 1, "1", "1", True, "structural", np.conj, "jax.numpy.conj",
             numba="np.conj", julia="conj", on_complex="conjugate"),
    Function("real", 1, "1", "1", True, "structural", np.real, "jax.numpy.real",
             numba="np.real", julia="real", on_complex="real-valued"),
    Function("imag", 1, None, None, True, "structural", np.imag, "jax.numpy.imag",
             numba="np.imag", julia="imag", on_complex="real-valued"),
    Function("max", 2, None, None, True, "structural", None, "jax.numpy.maximum", on_complex="real-only"),
    Function("min", 2, None, None, True, "structural", None, "jax.numpy.minimum", on_complex="real-only"),
    Function("ifelse", 3, None, None, True, "structural", None, "jax.numpy.where"),
)}

UNARY = tuple(name for name, f in FUNCTIONS.items() if f.arity == 1)
CALLS = tuple(name for name, f in FUNCTIONS.items() if f.lowering == "call")


def get(name: str) -> Function:
    """The entry of ``name``; a KeyError for a name the parser would have rejected."""
    return FUNCTIONS[name]
