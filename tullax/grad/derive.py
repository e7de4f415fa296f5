"""Gradient specs by index inversion (docs/design.md, section 2): one gradient program per differentiable input.

For ``OUT[free] = f(reduce over the other indices of body)`` and an input ``A``,

    ΔA[p] = Σ over occurrences A[e] of the body, Σ over every index combination with e(indices) = p, of
            ΔOUT[free] * f'(pre) * ∂OUT/∂body * ∂body/∂A[e]

Each occurrence is *inverted* (``grad.inversion``): the equations ``e_d(indices) = p_d`` are solved for an
index of coefficient ±1 (the solved index is substituted everywhere), for a coefficient c under a
divisibility-reading ``pad(../c)``, or kept as an equality guard; the indices left over stay reduced.
Accesses that may leave their axis after the substitution read through ``pad``. Only ``mod``/``clamp``/
indirect occurrences cannot be inverted: they become a scatter step (``ΔA[e] += ...``, the one kind of step
that needs atomics). The results are ordinary Specs, so they are printed, lowered and differentiated again
like any other.

The stages, each a pure function of the one before: ``forward.forward_of`` (what every gradient of a spec
shares: names, known sizes, the seed factor ΔOUT * f'(pre) * ∂OUT/∂body and its prelude steps),
``derivative`` (∂body/∂A[e]), ``inversion`` (one term per occurrence), ``assemble`` (the steps).

The environment a gradient's steps read (see ``Gradient``; ``tullax.grad.run`` runs them):
- every forward input by its name; for ':=' specs the forward result under ``spec.out`` (the residual);
  for '=' and '+=' specs ``spec.out`` is the GIVEN array (input 0, which the body may read): their gradient
  steps never read the forward result;
- the cotangent of the result under ``seed_name(spec)``;
- the output of every earlier step under its ``out`` name.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import lru_cache

from tullax.errors import SpecError
from tullax.grad.assemble import gradient_steps
from tullax.grad.forward import forward_of
from tullax.grad.names import fresh_sequence
from tullax.spec.ir import Spec
from tullax.spec.text import format_spec

__all__ = ["Gradient", "gradients", "gradient_texts"]


@dataclass(frozen=True)
class Gradient:
    """The gradient w.r.t. input ``wrt``: run ``steps`` in order, each reading the environment described in
    the module docstring; the last step's output ``result`` has the shape of ``wrt`` (scalar for a scalar
    parameter). A '+=' step whose ``out`` is not yet in the environment accumulates into zeros of the shape
    (and dtype) of ``wrt``: that is how a scatter step starts."""

    wrt: str
    steps: tuple[Spec, ...]
    result: str


@lru_cache(maxsize=1024)
def gradients(spec: Spec, complex_inputs: frozenset[str] = frozenset(),
              hoist_factor: bool = True) -> tuple[Gradient, ...]:
    """One Gradient per differentiable input ('array' and 'scalar' kinds), in ``spec.inputs`` order.
    Whether an array holds integers is a runtime matter: callers skip those. ``complex_inputs``: the inputs
    that hold complex numbers; their gradients (and those of real inputs next to them) follow jax's convention:
    the cotangent of a real loss w.r.t. a complex input is what ``jax.grad`` returns. ``hoist_factor=False``
    keeps the seed factor inside each gradient (a recurrence's adjoint must be one plain step)."""
    if complex_inputs and (spec.redop == "*" or spec.assign == "*="):
        raise SpecError("gradients of products of complex values ((*) reductions, *= updates) are not supported: "
                        "the exact gradient finds the zero factors, and complex values have no comparison; "
                        "differentiate real(..)/imag(..) parts, or use the forward only")
    if spec.scan is not None:  # a recurrence: the gradients of its unrolled form plus one rule
        from tullax.grad.scan import scan_gradients

        unhoisted = functools.partial(gradients, hoist_factor=False)
        return tuple(Gradient(*found) for found in scan_gradients(spec, complex_inputs, unhoisted))
    fw = forward_of(spec, complex_inputs, hoist_factor)
    wrt = [inp for inp in spec.inputs if inp.kind in ("array", "scalar")]
    results = fresh_sequence(["Δ" + inp.name for inp in wrt], fw.taken)
    return tuple(Gradient(inp.name, gradient_steps(fw, inp, result), result) for inp, result in zip(wrt, results))


@lru_cache(maxsize=1024)
def gradient_texts(spec: Spec, complex_inputs: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """Each gradient as text, one string per differentiable input, its steps joined with '; '."""
    return tuple("; ".join(format_spec(step) for step in grad.steps) for grad in gradients(spec, complex_inputs))
