"""``auto``'s gradient as JAX's autodiff of the forward kernel's XLA form, where the planner chose it for the
differentiated call (``tullax.planner.autodiff``): the JVP rule of the tullax primitive returns JAX's JVP of that
form on the platform whose race chose it (``lax.platform_dependent``: the derived steps on every other platform,
whose lowering keeps what it planned before), so reverse mode keeps the form's residuals (a logsumexp's
``exp(x - max)``) from the forward for the backward, as jnp's own gradient does, instead of derived steps that
compute them again. Everything above the rule (jit, vmap, higher orders, forward mode) differentiates
``platform_dependent``'s branches from there on, and a lowering for one platform holds that platform's branch only.
Where a rule that holds on every platform chose it (``COLD``: a tiny call on a new compile cache), the JVP is
JAX's alone, and the derived steps are not traced.

The race's two candidates are the whole gradient of the call, jitted: the forward and the derived steps as
``auto`` plans them (the primitive, with this rule off: ``KernelOp.gradient``), and JAX's VJP of the form."""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, Mapping, Sequence

SCOPE = "tullax_autodiff_gradient"
DERIVED_ONLY = "derived"  # ``KernelOp.gradient``: the derived steps, whatever the planner would choose
# untimed runs of each candidate before the race: a whole gradient's first runs through host callbacks (a loop
# team starting, its buffers' first touch) took 5-10x its later ones, and a race of a few runs timed only those
WARM_RUNS = 4


def autodiff_jvp(op: Any, primals: Sequence[Any], tangents: Sequence[Any], live: Sequence[bool],
                 apply: Callable[..., Any], derived: Callable[..., tuple]) -> tuple | None:
    """(result, tangent) of this call of the 'auto' kernel ``op`` differentiated w.r.t. the ``live`` inputs where
    the planner chose JAX's JVP of the forward's XLA form on this process's platform P (the race ran there):
    ``lax.platform_dependent`` with that JVP for P and ``derived`` (the derived steps' JVP, given the primals and
    the live tangents) for every other platform, so a lowering for another platform (an export traced here for
    cuda) keeps what it planned without a race timed here, and a lowering for P holds only P's branch (JAX drops
    the other when it lowers). None: the derived gradient steps everywhere. ``apply``:
    ``tullax.jaxop.primitives.apply`` (the module above this one), what the race's derived candidate calls."""
    if op.requested != "auto" or op.gradient == DERIVED_ONLY or op.algebra:
        return None  # with the opt-in (``algebra``), the expanded steps the caller asked for
    from tullax.planner.autodiff import AUTODIFF, COLD, gradient_plan, race_platform, refusal
    from tullax.planner.call import call_shapes_and_dtypes

    shapes, dtypes = call_shapes_and_dtypes(op.spec, primals)
    if refusal(op.spec, dtypes) is not None:
        return None
    positions = tuple(i for i, keep in enumerate(live) if keep)
    wrt = [op.spec.inputs[i].name for i in positions]
    platform = race_platform()
    found = gradient_plan(op.spec, shapes, dtypes, op.out_dtype, wrt,
                          lambda s, d, close: _runs(op, positions, s, d, close, apply), platform=platform)
    if not found.form.startswith(AUTODIFF):
        return None
    import jax

    form = found.form[len(AUTODIFF):]

    def autodiff(values: Sequence[Any], live_tangents: Sequence[Any]) -> tuple:
        forward = _forward(op.spec, form, op.out_dtype, values, positions)
        with jax.named_scope(SCOPE):  # the branch's name in a lowering's locations and a profile
            return jax.jvp(forward, tuple(values[i] for i in positions), tuple(live_tangents))

    live_tangents = [tangents[i] for i in positions]
    if found.rule == COLD:  # decided by a rule that holds on every platform: the derived steps are never traced
        return autodiff(primals, live_tangents)
    return jax.lax.platform_dependent(list(primals), live_tangents, **{platform: autodiff}, default=derived)


def _forward(spec: Any, form: str, out_dtype: str, primals: Sequence[Any],
             positions: Sequence[int]) -> Callable[..., Any]:
    """The forward's XLA ``form`` as a function of the inputs at ``positions`` (the others held at ``primals``)."""
    from tullax.backends.xla.forms import lower_form

    lowered = lower_form(spec, form)

    def forward(*chosen: Any) -> Any:
        values = list(primals)
        for i, value in zip(positions, chosen):
            values[i] = value
        return lowered(dict(zip(spec.input_names, values))).astype(out_dtype)

    return forward


def _runs(op: Any, positions: Sequence[int], shapes: Mapping[str, tuple], dtypes: Mapping[str, str],
          close: Sequence[str], apply: Callable[..., Any]) -> dict[str, Callable[[], None] | None]:
    """Each candidate's run: the whole gradient (forward and backward) of a call of ``op.spec`` on random inputs of
    these ``shapes`` and ``dtypes`` and a random cotangent, jitted, compiled and run once; None where it cannot run."""
    import numpy as np

    from tullax.planner.autodiff import AUTODIFF
    from tullax.planner.candidates import on_device
    from tullax.spec.examples import make_inputs

    spec = op.spec
    values = [np.asarray(v).astype(dtypes[item.name])
              for item, v in zip(spec.inputs, make_inputs(spec, shapes, op.out_dtype, seed=0))]
    out_shape = tuple(int(s.eval(dict(shapes))) for s in spec.out_shape)
    cotangent = np.random.default_rng(1).standard_normal(out_shape).astype(op.out_dtype)
    given = on_device(values + [cotangent])
    runs: dict[str, Callable[[], None] | None] = {}
    for candidate in close:
        if candidate.startswith(AUTODIFF):
            make = partial(_forward, spec, candidate[len(AUTODIFF):], op.out_dtype)
        else:
            make = _derived_forward(spec, apply)
        runs[candidate] = _prepared(make, positions, given[:-1], given[-1])
    return runs


def _derived_forward(spec: Any, apply: Callable[..., Any]) -> Callable[..., Callable[..., Any]]:
    """Like ``_forward``, the kernel as ``auto`` runs it, with its derived gradient steps."""
    def make(values: Sequence[Any], positions: Sequence[int]) -> Callable[..., Any]:
        def forward(*chosen: Any) -> Any:
            given = list(values)
            for i, value in zip(positions, chosen):
                given[i] = value
            return apply(spec, "auto", given, gradient=DERIVED_ONLY)

        return forward

    return make


def _prepared(make: Callable[..., Callable[..., Any]], positions: Sequence[int], values: list,
              cotangent: Any) -> Callable[[], None] | None:
    """A run of the gradient of ``make(values, positions)`` at ``cotangent``, jitted over every input."""
    import jax

    def gradient(values: list, cotangent: Any) -> Any:
        _, pullback = jax.vjp(make(values, positions), *[values[i] for i in positions])
        return pullback(cotangent)

    try:
        with jax.ensure_compile_time_eval():
            compiled = jax.jit(gradient).lower(values, cotangent).compile()

        def run() -> None:
            with jax.ensure_compile_time_eval():
                jax.block_until_ready(compiled(values, cotangent))

        for _ in range(WARM_RUNS):
            run()
        return run
    except Exception:  # noqa: BLE001 - a candidate that cannot run here is simply not chosen
        return None
