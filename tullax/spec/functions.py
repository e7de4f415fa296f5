"""The ONE registry of the functions a spec may call: everything every stage knows about each of them.

Every stage reads this table and nothing else: the parser (name, arity), the gradient derivation
(``derivative``, ``from_output``, ``safe_at_pad``), the lowering (``lowering``), each printer (its spelling and
``julia_domain``), the XLA lowering (``jnp``) and the naive evaluator (``numpy``). Adding a function that every
target spells as a plain call (``cbrt``, ``atan``) is one ``Function(...)`` entry here.

Derivatives are written in the spec language over ``x`` (the argument) and ``y`` (the value ``f(x)``, so a
derivative can reuse it: ``exp' = y``); ``from_output`` writes ``f'(x)`` with ``y`` alone, so a finaliser's
gradient can read the forward result instead of recomputing the reduction. ``None``: the function has a zero
derivative (``imag`` of a real value, ``floor``, ``sign``) or its rule is structural (``max``, ``min``,
``ifelse``: see ``grad``). A "call" function of several arguments has one partial derivative per argument,
over ``x1``, ``x2``, ... and ``y`` (``hypot``: ``("x1/y", "x2/y")``): adding one is again one entry.

``overloads``: the spec-language name this entry also answers to with its own number of arguments (``atan(y, x)``
is ``atan2``, as in Julia). ``variadic``: a call with more arguments than ``arity`` is folded left into nested
calls (``max(a, b, c)`` is ``max(max(a, b), c)``). ``julia=None``: the Julia backends cannot print it (a SpecError
says so and what to use instead).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np

Lowering = Literal["call", "expand", "structural"]


@dataclass(frozen=True)
class Function:
    name: str
    arity: int
    # d f(x) / dx in the spec language, over x and y = f(x); for several arguments one partial derivative per
    # argument, over x1, x2, ... and y; None: zero or structural (see the module docstring)
    derivative: str | tuple[str, ...] | None
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
    # host C spelling on complex arguments for (complex64, complex128): C99 complex.h's, or a ``tx_c`` helper of
    # the printer's complex prelude (``tullax.printers.c_complex``) where complex.h has none; None: real only
    c_complex: tuple[str, str] | None = None
    # Julia throws DomainError where NumPy/XLA return NaN: the condition on x that gives NaN ({zero}, {one} are
    # literals of the argument's type); printers wrap such calls so NaN comes out, as on every other backend
    julia_domain: str | None = None
    overloads: str | None = None  # the spec-language name this entry also answers to (see the module docstring)
    variadic: bool = False  # more than ``arity`` arguments fold left into nested calls
    # On complex arguments: "holomorphic" (the derivative rule holds as written, jax's convention for complex
    # gradients needs nothing more), "real-valued" (real, imag, abs: a real result; their Wirtinger rules are
    # structural, in grad.derivative), "conjugate" (conj), "real-only" (an ordering of values, or a function
    # jnp/NumPy define on reals only: refused on complex arguments with a SpecError, see spec.valuetype)
    on_complex: Literal["holomorphic", "real-valued", "conjugate", "real-only"] = "holomorphic"
    # the glibc version from which libmvec has the ``c`` spellings for every x86-64 vector width: the c backend
    # declares them ``simd`` where its headers are that new, so loops calling them vectorise
    libmvec: tuple[int, int] | None = None

    def partials(self) -> tuple[str | None, ...]:
        """The derivative text per argument (None: that partial derivative is zero)."""
        if self.derivative is None or isinstance(self.derivative, str):
            return (self.derivative,) * self.arity
        return self.derivative


def _sigmoid(x):
    return 1 / (1 + np.exp(-x)) if np.real(x) >= 0 else np.exp(x) / (1 + np.exp(x))


def _softplus(x):
    return np.logaddexp(x, 0.0)


def _relu(x):
    return np.maximum(x, 0.0)  # as jax.nn.relu: NaN stays NaN, -inf gives 0


def _math(name: str, derivative: str | None, from_output: str | None, safe_at_pad: bool, c32: str, c64: str,
          julia_domain: str | None = None, numpy: str | None = None, julia: str | None = None,
          on_complex: str = "holomorphic", libmvec: tuple[int, int] | None = None) -> Function:
    """A function every target spells as a plain call of the same name (C: with an ``f`` suffix for float32);
    ``numpy`` is NumPy's name where it differs (``arctan``), ``julia`` Julia's (``round`` for NumPy's ``rint``).
    On complex arguments host C calls complex.h's ``c``-prefixed function (``cexpf``, ``cabs``), or the complex
    prelude's ``tx_c<name>_c64`` for the ones complex.h lacks (``_NO_COMPLEX_H``)."""
    c_complex = None
    if on_complex != "real-only":
        c_complex = ((f"tx_c{name}_c64", f"tx_c{name}_c128") if name in _NO_COMPLEX_H
                     else (f"c{name}f", f"c{name}"))
    return Function(name, 1, derivative, from_output, safe_at_pad, "call", getattr(np, numpy or name),
                    f"jax.numpy.{numpy or name}", numba=f"np.{numpy or name}", julia=julia or name, c=(c32, c64),
                    c_complex=c_complex, julia_domain=julia_domain, on_complex=on_complex,  # type: ignore[arg-type]
                    libmvec=libmvec)


_NO_COMPLEX_H = ("log1p", "expm1", "exp2", "log2", "log10")  # C99's complex.h has no complex form of these


LN2, LN10 = "0.6931471805599453", "2.302585092994046"  # log(2), log(10) as derivative literals


FUNCTIONS: dict[str, Function] = {f.name: f for f in (
    _math("exp", "y", "y", True, "expf", "exp", libmvec=(2, 22)),
    _math("log", "1/x", "exp(-y)", False, "logf", "log", julia_domain="x < {zero}", libmvec=(2, 22)),
    _math("log1p", "1/(1 + x)", "exp(-y)", False, "log1pf", "log1p", julia_domain="x < -{one}", libmvec=(2, 35)),
    _math("expm1", "exp(x)", "y + 1", True, "expm1f", "expm1", libmvec=(2, 35)),
    _math("sqrt", "0.5/y", "0.5/y", False, "sqrtf", "sqrt", julia_domain="x < {zero}"),
    _math("abs", "(x >= 0) - (x < 0)", None, True, "fabsf", "fabs", on_complex="real-valued"),
    _math("sin", "cos(x)", None, True, "sinf", "sin", julia_domain="isinf(x)", libmvec=(2, 22)),
    _math("cos", "-sin(x)", None, True, "cosf", "cos", julia_domain="isinf(x)", libmvec=(2, 22)),
    _math("tan", "1 + y^2", "1 + y^2", False, "tanf", "tan", julia_domain="isinf(x)", libmvec=(2, 35)),
    _math("tanh", "1 - y^2", "1 - y^2", True, "tanhf", "tanh", libmvec=(2, 35)),
    _math("sinh", "cosh(x)", "sqrt(1 + y^2)", True, "sinhf", "sinh", libmvec=(2, 35)),
    _math("cosh", "sinh(x)", None, True, "coshf", "cosh", libmvec=(2, 35)),
    _math("cbrt", "1/(3*y^2)", "1/(3*y^2)", True, "cbrtf", "cbrt", on_complex="real-only", libmvec=(2, 35)),
    _math("exp2", f"{LN2}*y", f"{LN2}*y", True, "exp2f", "exp2", libmvec=(2, 35)),
    _math("log2", f"1/({LN2}*x)", f"exp2(-y)/{LN2}", False, "log2f", "log2", julia_domain="x < {zero}",
          libmvec=(2, 35)),
    _math("log10", f"1/({LN10}*x)", f"exp(-{LN10}*y)/{LN10}", False, "log10f", "log10", julia_domain="x < {zero}",
          libmvec=(2, 35)),
    _math("atan", "1/(1 + x^2)", "cos(y)^2", True, "atanf", "atan", numpy="arctan", libmvec=(2, 35)),
    # zero derivative almost everywhere, as jax.grad gives; round is half-to-even on every target (NumPy rint,
    # jnp.round, Julia's round, C's rint under the default rounding mode)
    _math("floor", None, None, True, "floorf", "floor", on_complex="real-only"),
    _math("ceil", None, None, True, "ceilf", "ceil", on_complex="real-only"),
    _math("trunc", None, None, True, "truncf", "trunc", on_complex="real-only"),
    _math("round", None, None, True, "rintf", "rint", numpy="rint", julia="round", on_complex="real-only"),
    Function("sign", 1, None, None, True, "expand", np.sign, "jax.numpy.sign",  # C has no sign(): expanded
             on_complex="real-only"),
    Function("erf", 1, "1.1283791670955126*exp(-x^2)", None, True, "call", math.erf, "jax.scipy.special.erf",
             numba="math.erf", julia=None, c=("erff", "erf"),  # 2/sqrt(pi) exp(-x^2); Base Julia has no erf
             on_complex="real-only", libmvec=(2, 35)),
    Function("atan2", 2, ("x2/(x1^2 + x2^2)", "-x1/(x1^2 + x2^2)"), None, True, "call", np.arctan2,
             "jax.numpy.arctan2", numba="np.arctan2", julia="atan", c=("atan2f", "atan2"), overloads="atan",
             on_complex="real-only", libmvec=(2, 35)),
    Function("hypot", 2, ("x1/y", "x2/y"), None, True, "call", np.hypot, "jax.numpy.hypot", numba="np.hypot",
             julia="hypot", c=("hypotf", "hypot"), libmvec=(2, 35), on_complex="real-only"),
    Function("sigmoid", 1, "y*(1 - y)", "y*(1 - y)", True, "expand", _sigmoid, "jax.nn.sigmoid",
             on_complex="real-only"),
    Function("softplus", 1, "sigmoid(x)", "-expm1(-y)", True, "expand", _softplus, "jax.nn.softplus",
             on_complex="real-only"),
    Function("relu", 1, "x > 0", "y > 0", True, "expand", _relu, "jax.nn.relu", on_complex="real-only"),
    # the rules here are those of a real argument; on a complex one grad.derivative has Wirtinger rules
    Function("conj", 1, "1", "1", True, "structural", np.conj, "jax.numpy.conj",
             numba="np.conj", julia="conj", c_complex=("conjf", "conj"), on_complex="conjugate"),
    Function("real", 1, "1", "1", True, "structural", np.real, "jax.numpy.real",
             numba="np.real", julia="real", c_complex=("crealf", "creal"), on_complex="real-valued"),
    Function("imag", 1, None, None, True, "structural", np.imag, "jax.numpy.imag",
             numba="np.imag", julia="imag", c_complex=("cimagf", "cimag"), on_complex="real-valued"),
    Function("max", 2, None, None, True, "structural", None, "jax.numpy.maximum", variadic=True,
             on_complex="real-only"),
    Function("min", 2, None, None, True, "structural", None, "jax.numpy.minimum", variadic=True,
             on_complex="real-only"),
    Function("ifelse", 3, None, None, True, "structural", None, "jax.numpy.where"),
)}

UNARY = tuple(name for name, f in FUNCTIONS.items() if f.arity == 1)
CALLS = tuple(name for name, f in FUNCTIONS.items() if f.lowering == "call")


def get(name: str) -> Function:
    """The entry of ``name``; a KeyError for a name the parser would have rejected."""
    return FUNCTIONS[name]


def resolve(name: str, nargs: int) -> Function | None:
    """The entry a spec's ``name(...)`` with ``nargs`` arguments calls: ``name`` itself when the count fits
    (a variadic one takes ``arity`` or more), else the entry that overloads ``name`` with that many arguments
    (``atan(y, x)`` is ``atan2``); None when nothing fits."""
    entry = FUNCTIONS.get(name)
    if entry is not None and (nargs == entry.arity or (entry.variadic and nargs > entry.arity)):
        return entry
    return next((f for f in FUNCTIONS.values() if f.overloads == name and f.arity == nargs), None)


def arities(name: str) -> tuple[int, ...]:
    """The argument counts ``name`` accepts (for error messages); the lowest of a variadic one."""
    return tuple(sorted(f.arity for f in FUNCTIONS.values() if name in (f.name, f.overloads)))
