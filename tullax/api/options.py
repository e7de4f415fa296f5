"""The keyword options of ``einsum_kernel`` that act around the compiled kernel, as Tullio's do: ``init=`` (the
starting value of the reduction) and ``nograd=`` (inputs that get no gradient), and the boolean reductions
``(&)``/``(|)``, which run as ``(min)``/``(max)`` of 0/1 values (``spec.frontend``) and come back as bools here.

All three are elementwise work on the result, or on the inputs before a JAX call, so every backend and every JAX
transformation (grad, jit, vmap) gets them through the same few lines:

* ``init=v``: the result is ``v ⊕ reduction`` for the spec's reduction ⊕ (``+``: ``v + sum``, ``max``:
  ``max(v, max)``, ``logsumexp``: ``logaddexp(v, lse)``, ``&``: ``v & all``...); an empty reduction gives ``v``.
  A diagonal write (``D[i,i] := ...``) gets it on the diagonal only: the elements it does not write stay 0.
  Differentiable by JAX like any jnp operation (a max that ``v`` wins gives the inputs zero gradient).
* ``nograd=("x",)``: on JAX values the input goes through ``jax.lax.stop_gradient``, so ``jax.grad`` with
  respect to it is zeros (JAX's usual answer for a value that does not influence the loss) and no gradient kernel
  runs for it; ``Kernel.grad_specs`` leaves it out.
* ``(&)``/``(|)``: ``all``/``any`` over the reduced indices, a nonzero body counting as true (``jnp.all``); the
  result is bool, and it has no gradient.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from tullax.errors import SpecError
from tullax.spec.ir import Spec
from tullax.spec.parse import parse_spec

# the 0/1 value each boolean reduction starts from: all() of nothing is true, any() of nothing false
BOOLEAN_START = {"&": 1, "|": 0}


@dataclass(frozen=True)
class Options:
    boolean: str | None  # "&" or "|" when the spec's reduction is boolean
    init: Any  # the reduction's starting value, or None
    nograd: frozenset[str]
    # a diagonal write (``D[i,i] := ...``): pairs of result axes that hold one index; init= reaches only the
    # elements where they agree (the others are not written: they stay 0)
    diagonal: tuple[tuple[int, int], ...] = ()
    algebra: str = ""  # "expand": polynomial bodies may run multiplied out, as contractions (check_algebra)


def make_options(canonical: str, spec: Spec, init: Any = None, nograd: str | Iterable[str] = (),
                 algebra: str | None = None, backend: str = "auto") -> Options:
    """Check ``init``, ``nograd`` and ``algebra`` against the spec and ``backend`` (SpecError on misuse) and
    collect them."""
    parsed = parse_spec(canonical)  # the text as written: the analysed spec renames a repeated left index
    redop = parsed.redop
    boolean = redop if redop in BOOLEAN_START else None
    if init is not None:
        _check_init(canonical, spec, init)
    names = (nograd,) if isinstance(nograd, str) else tuple(nograd)
    differentiable = [i.name for i in spec.inputs if i.kind in ("array", "scalar")]
    for name in names:
        if name not in differentiable:
            raise SpecError(f"nograd names {name!r}, which is not an input of this spec that could have a gradient "
                            f"(those are: {', '.join(differentiable) or 'none'})", canonical)
    return Options(boolean, init, frozenset(names), _diagonal(parsed), check_algebra(canonical, spec, algebra, backend))


ALGEBRA_BACKENDS = ("auto", "xla")  # the backends whose plans include XLA's forms: where an expansion can run


def check_algebra(canonical: str, spec: Spec, algebra: str | None, backend: str) -> str:
    """``algebra`` ("expand" or None) checked against the spec and the backend: the opt-in of the expanded form
    of polynomial bodies (``tullax.backends.xla.expand``). It names an XLA form, so a loop backend refuses it
    (the loops run the body as written); a spec with nothing to expand, in its forward kernel or any gradient
    step, refuses it too: the opt-in would silently do nothing."""
    if algebra is None:
        return ""
    if algebra != "expand":
        raise SpecError(f"algebra= takes 'expand' (multiply out a polynomial body into contractions) or None, "
                        f"got {algebra!r}", canonical)
    if backend not in ALGEBRA_BACKENDS:
        raise SpecError(f"algebra='expand' runs the multiplied-out body as XLA contractions (dot_general), and "
                        f"backend={backend!r} runs the loops as written: use backend='auto' (the expansion is "
                        f"raced against the loops) or backend='xla' (always expanded), or drop algebra=", canonical)
    from tullax.backends.xla.expand import applies
    from tullax.errors import TullaxError
    from tullax.grad import gradients

    try:
        steps = [step for grad in gradients(spec) for step in grad.steps]
    except TullaxError:
        steps = []
    if not any(applies(kernel) for kernel in (spec, *steps)):
        raise SpecError("algebra='expand' multiplies out a polynomial body summed over an index into contractions "
                        "(e.g. D[i,j] := (W[k,i] - X[k,j])^2 becomes row norms and one GEMM); neither this spec "
                        "nor its gradients has one that separates into smaller factors: drop algebra=", canonical)
    return algebra


def _diagonal(parsed: Any) -> tuple[tuple[int, int], ...]:
    if parsed.assign != ":=" or parsed.lhs is None:
        return ()
    names = [getattr(idx, "plain", None) for idx in parsed.lhs]
    return tuple((a, b) for a in range(len(names)) for b in range(a + 1, len(names))
                 if names[a] is not None and names[a] == names[b])


def _check_init(canonical: str, spec: Spec, init: Any) -> None:
    if spec.assign == "+=":
        raise SpecError("init= is the starting value of a ':=' or '=' reduction; with '+=' the existing array is "
                        "the start: add init to it instead", canonical)
    if not spec.reduced:
        raise SpecError("init= needs a reduction, and this spec reduces over no index: add the value to the "
                        "body instead", canonical)
    if spec.finalizer is not None:
        raise SpecError("init= with a finaliser ('|> f') is not supported: apply the finaliser to the kernel's "
                        "result yourself, or drop init=", canonical)
    if not isinstance(init, (bool, int, float, complex)) and getattr(init, "shape", None) != ():
        raise SpecError(f"init= must be a number, got {type(init).__name__}", canonical)


def finish(options: Options, redop: str, out: Any, xp: Any) -> Any:
    """The kernel's raw result ``out`` with ``init`` combined and a boolean reduction made bool; ``xp`` is numpy
    or jax.numpy, as ``out`` is (an array either way: NumPy would give a 0-d result back as a scalar)."""
    if options.boolean is None and options.init is None:
        return out
    value = _finish(options, redop, out, xp)
    if options.init is not None and options.diagonal:  # init= only where the diagonal write writes
        value = xp.where(_on_diagonal(options.diagonal, xp.shape(out), xp), value, _finish(
            Options(options.boolean, None, options.nograd), redop, out, xp) if options.boolean else out)
    return xp.asarray(value)


def _on_diagonal(pairs: tuple[tuple[int, int], ...], shape: tuple[int, ...], xp: Any) -> Any:
    grid = xp.indices(shape)
    mask = grid[0] == grid[0]
    for a, b in pairs:
        mask = mask & (grid[a] == grid[b])
    return mask


def _finish(options: Options, redop: str, out: Any, xp: Any) -> Any:
    if options.boolean is not None:
        # min/max of 0/1 with the start folded in: an empty reduction (+inf or -inf) becomes true or false
        start = BOOLEAN_START[options.boolean]
        value = (xp.minimum if options.boolean == "&" else xp.maximum)(out, start) != 0
        if options.init is None:
            return value
        return xp.logical_and(value, bool(options.init)) if options.boolean == "&" else \
            xp.logical_or(value, bool(options.init))
    combine = {"+": xp.add, "*": xp.multiply, "max": xp.maximum, "min": xp.minimum, "logsumexp": xp.logaddexp}
    return combine[redop](out, xp.asarray(options.init, dtype=out.dtype)).astype(out.dtype)


def stop_gradients(options: Options, spec: Spec, values: list[Any]) -> list[Any]:
    """The inputs of a JAX call, those named in ``nograd`` behind ``jax.lax.stop_gradient``."""
    if not options.nograd:
        return values
    import jax

    return [jax.lax.stop_gradient(v) if name in options.nograd and isinstance(v, jax.Array) else v
            for name, v in zip(spec.input_names, values)]
