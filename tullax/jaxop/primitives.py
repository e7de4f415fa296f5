"""A tullax kernel as a first-class JAX operation: jit, grad (any order), vmap, shard_map, in any composition.

Two primitives, registered on first use (so ``import tullax`` stays jax-free), both parameterised by a
``KernelOp`` (spec, backend, result dtype, callback path):

``tullax_kernel(*inputs; op)``
    runs ``op.spec``. Lowered to a host callback (``tullax.calls.host``: zero-copy ``buffer_callback``, or
    ``pure_callback``), or for the xla backend to the jnp lowering. Its batching rule rewrites the spec with a
    batch index (``tullax.jaxop.batching``) and binds ONE batched kernel, whatever ``in_axes`` are: nothing loops over
    the batch and data arrays are not transposed. Its JVP rule binds the kernel and one linear op:

``tullax_kernel_linear(*inputs, out, *tangents; op, live)``
    the tangent of the result, linear in the tangents of the ``live`` inputs. Reverse mode transposes it: the
    transpose runs the derived gradient specs (docs/design.md, section 2), each again a ``tullax_kernel``, so gradients
    of gradients work, and only the gradients JAX asks for are computed. Forward mode (``jax.jvp``,
    ``jax.jacfwd``, ``jax.hessian``) evaluates it as the transpose of the gradient kernels (``_linear_value``),
    so no separate tangent kernels are needed.

Why primitives rather than ``custom_vjp`` around ``custom_vmap``: JAX batches a ``custom_vjp`` by vmapping its
backward pass, so ``grad(vmap(f))`` would compute one gradient per batch element and sum them in XLA (for an
embedding lookup, a batch-times-table temporary). Here ``grad(vmap(f))`` differentiates the batched spec: the
gradient of ``out[b,d] := W[ix[b],d]`` is the single scatter kernel ``ΔW[ix[b],d] += Δout[b,d]``. And a
custom_vmap rule only sees batch axes moved to the front (a transpose of every batched array).

Semantics under jit worth knowing:

* Shapes, ranks, dtypes and input counts are checked at trace time (TullaxError at the call site); nothing is
  checked inside a callback.
* The VALUES of index arrays cannot be checked at trace time. An out-of-range indirect index never reads or
  writes out of bounds: a gather gives NaN in a float result (as ``jnp.take``'s default fill), and a scatter
  skips the element (as ``.at[].add`` with ``mode='drop'``), so an out-of-range lookup gets no gradient and a
  dropped element's gradient is 0 (its gradient reads the cotangent through ``pad(ix[..])``).
  Eager calls with NumPy arrays raise a ShapeError instead.
* Integer inputs (and index arrays) get float0 cotangents; the result dtype is ``jnp.result_type`` of the data
  inputs, an integer one only where the body is integer-valued (``tullax.spec.dtypes``). Half-precision inputs
  are converted to float32 by XLA before the primitive and its result rounded after it (``apply``). Kernels
  write only their output buffer, never an input.
* A 0-d integer passed for a rank-1 index array is taken as shape (1,): ``out[d] := W[ix[0],d]`` is one lookup,
  and ``jax.vmap`` of it over a vector of indices is the gather ``out[b,d] := W[ix[b],d]``.
* Forward mode costs more than reverse mode: a tangent runs the gradients of the gradient kernels.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache, partial
from types import SimpleNamespace
from typing import Any, Sequence

from tullax.errors import TullaxError
from tullax.spec.dtypes import HALF
from tullax.spec.ir import Spec


@dataclass(frozen=True, eq=True)
class KernelOp:
    """The static part of one kernel call: JAX's primitive parameter (hashed on every cache lookup, so the
    hash is computed once; printed in jaxprs as the canonical spec text)."""

    spec: Spec
    backend: str
    out_dtype: str
    path: str  # 'buffer' | 'pure' | 'xla' ('device' when lowered for a GPU: tullax.calls.device)
    # On path 'xla', the form of tullax.backends.xla.forms ('' = the plain lowering of backend='xla').
    form: str = ""
    # The backend name the call asked for: 'auto' plans its gradient steps (and batched forms) afresh,
    # each one on its own (tullax.planner.decide); '' means ``backend`` itself.
    requested: str = ""
    # A '+=' gradient step whose given array (input 0) is zeros: a host kernel clears its own output instead
    # (``tullax.calls.host.host_call``); XLA's forms and device kernels take the zeros as given.
    zero_start: bool = False
    # "expand": the caller opted in to the expanded form of polynomial bodies (``einsum_kernel(algebra=...)``);
    # its gradient steps and batched forms are planned with it too
    algebra: str = ""
    # Planned without timing where a race may still decide: the race is run when the kernel is lowered for this
    # process's own devices, and never for an export or another platform (``_settled``).
    pending: bool = False
    # A kernel of a differentiated 'auto' call whose joint plan (``planner.joint_plans``: the forward and its
    # gradient steps as one XLA program) needs a race: the call's (forward spec, shapes, dtypes, out dtype,
    # inputs differentiated), decided with the race when it is lowered for this host (``_settled``)
    joint: tuple = ()
    # "derived": an 'auto' kernel's gradient is its derived steps, never JAX's autodiff of its XLA form
    # (``tullax.jaxop.autodiff``: what that planner's race times it against)
    gradient: str = ""
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_hash", hash((self.spec, self.backend, self.out_dtype, self.path, self.form,
                                                self.requested, self.zero_start, self.algebra, self.pending,
                                                self.joint, self.gradient)))

    @property
    def steps_backend(self) -> str:
        """The backend name the gradient steps of this kernel are run with."""
        return self.requested or self.backend

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        from tullax.spec.text import format_spec

        form = f" {self.form}" if self.form else ""
        planned = ", planned" if self.requested == "auto" else ""
        zeros = ", from zeros" if self.zero_start else ""
        algebra = f", algebra={self.algebra}" if self.algebra else ""
        return (f"'{format_spec(self.spec)}' on {self.backend}{form} ({self.path}, {self.out_dtype}{planned}{zeros}"
                f"{algebra})")

    def with_spec(self, spec: Spec) -> "KernelOp":
        return replace(self, spec=spec)


def apply(spec: Spec, backend_name: str, values: Sequence[Any], xla_form: str | None = None,
          zero_start: bool = False, algebra: str = "", joint: tuple = (), gradient: str = "") -> Any:
    """Run ``spec`` on jax values (arrays, tracers or numbers, one per input) on backend ``backend_name``
    (``auto`` with ``xla_form``: on XLA in that form, as the planner decided for it). ``zero_start``: ``spec``
    is a '+=' gradient step and ``values[0]`` the zeros it starts from. ``algebra="expand"``: the expanded form
    of a polynomial body is a candidate (``auto``), or the form (``xla``), where it applies. ``joint``: the
    differentiated call a gradient step belongs to (``KernelOp.joint``); ``gradient``: ``KernelOp.gradient``.
    Everything is checked here, at trace time."""
    args = prepare_inputs(spec, values)
    op = replace(_joint(_kernel_op(spec, backend_name, values, xla_form, zero_start, algebra), joint),
                 gradient=gradient)
    args = _same_variance(_weak_in_precision(spec, values, args, op.out_dtype))
    half = [item.kind in ("array", "scalar") and a.dtype.name in HALF for item, a in zip(spec.inputs, args)]
    if not any(half):
        return _prims().kernel.bind(*args, op=op)
    # Half precision: converted to float32 by XLA, the kernel (and its gradients) computes in float32, and its
    # result is rounded once. Rounding inside the primitive would break the gradients of max/min: their ties
    # compare the recomputed float32 body with the result, which a half result no longer equals.
    args = [a.astype("float32") if h else a for a, h in zip(args, half)]
    wide = [a if h else v for a, v, h in zip(args, values, half)]
    return _prims().kernel.bind(*args, op=replace(_joint(_kernel_op(spec, backend_name, wide, xla_form, zero_start,
                                                                    algebra), joint), gradient=gradient)
                                ).astype(op.out_dtype)


def _joint(op: KernelOp, joint: tuple) -> KernelOp:
    """An 'auto' kernel of a differentiated call whose joint plan waits for a race: decided at its lowering."""
    return replace(op, joint=joint, pending=True) if joint and op.requested == "auto" else op


def prepare_inputs(spec: Spec, values: Sequence[Any]) -> list[Any]:
    """jax arrays for the inputs, checked against ``spec`` (a 0-d index for a rank-1 index array: shape (1,))."""
    import jax.numpy as jnp

    from tullax.spec.arguments import check_call
    from tullax.spec.shapes import check_dtypes

    args = [jnp.asarray(v) for v in values]
    args = [a.reshape(1) if item.kind == "index" and a.ndim == 0 and item.rank == 1 else a
            for item, a in zip(spec.inputs, args)]
    check_call(spec, args)
    check_dtypes(spec, {item.name: a.dtype for item, a in zip(spec.inputs, args)})
    return args


def _same_variance(args: list[Any]) -> list[Any]:
    """Inside shard_map, make invariant inputs vary over the manual axes the others vary over (``pvary``, as
    jax does for its own primitives): the transpose of that cast sums the cotangent of a replicated input
    over the shards."""
    from jax._src import core

    insert = getattr(core, "auto_insert_reshard", None)
    return list(insert(*args)) if insert is not None else args


def _kernel_op(spec: Spec, backend_name: str, values: Sequence[Any], xla_form: str | None = None,
               zero_start: bool = False, algebra: str = "") -> KernelOp:
    import jax
    import numpy as np

    from tullax.calls.host import callback_path
    from tullax.spec.arguments import result_dtype

    dtype = result_dtype(spec, values)
    dtype = np.dtype(jax.dtypes.canonicalize_dtype(dtype))
    zero_start = zero_start and spec.assign == "+="
    if backend_name == "auto":
        return _planned_op(spec, dtype.name, values, zero_start, algebra) if xla_form is None else \
            _xla_op(spec, dtype.name, xla_form, algebra)
    if backend_name == "xla":  # with the opt-in, the expanded form wherever it applies (nothing is raced)
        from tullax.backends.xla.expand import applies

        expand = algebra == "expand" and applies(spec)
        return KernelOp(spec, backend_name, dtype.name, "xla", form="expanded" if expand else "", algebra=algebra)
    return KernelOp(spec, backend_name, dtype.name, callback_path(), zero_start=zero_start)


def _weak_in_precision(spec: Spec, values: Sequence[Any], args: list[Any], out_dtype: str) -> list[Any]:
    """The weakly typed inputs (``tullax.spec.arguments.weak_type``) converted to the result's precision, as jnp
    converts a weak operand before computing and an eager NumPy call passes a Python number (``run_eager``)."""
    from tullax.spec.arguments import weak_dtypes

    return [a if weak is None else a.astype(weak) for a, weak in zip(args, weak_dtypes(spec, values, out_dtype))]


def _planned_op(spec: Spec, out_dtype: str, values: Sequence[Any], zero_start: bool = False,
                algebra: str = "", *, timed: bool = False) -> KernelOp:
    """``backend='auto'``: the planner's choice for this kernel and these shapes (tullax.planner.decide). Traced
    (``timed`` False) with the plan known without timing; a race it may need waits for the lowering
    (``_settled``), which knows whether the kernel runs on this host."""
    from tullax.calls.host import callback_path
    from tullax.planner.call import call_shapes_and_dtypes
    from tullax.planner.decide import known_plan, plan

    shapes, dtypes = call_shapes_and_dtypes(spec, values)
    if timed:
        found, pending = plan(spec, shapes, dtypes, zero_start=zero_start, algebra=algebra), False
    else:
        found, pending = known_plan(spec, shapes, dtypes, zero_start=zero_start, algebra=algebra)
    if found.backend == "xla":
        return replace(_xla_op(spec, out_dtype, found.form, algebra), pending=pending)
    return KernelOp(spec, found.backend, out_dtype, callback_path(), requested="auto", zero_start=zero_start,
                    algebra=algebra, pending=pending)


def _settled(op: KernelOp, ctx: Any, platform: str) -> KernelOp:
    """A pending plan decided for the lowering ``ctx``: raced where the program runs in this process on its
    own platform, else the plan it was traced with (an export, another platform: no race on this host)."""
    from tullax.jaxop.target import has_client, portable

    if portable(ctx) or not has_client(ctx, platform):
        return replace(op, pending=False, joint=())
    return decided(op, ctx.avals_in)


def decided(op: KernelOp, avals: Sequence[Any]) -> KernelOp:
    """A pending plan raced (for a lowering that runs on this host): the joint plan of the differentiated call
    it belongs to, where that puts it on XLA, else its own race."""
    if op.joint:
        from tullax.planner.decide import joint_plans

        spec, shapes, dtypes, out_dtype, wrt = op.joint
        joined = joint_plans(spec, dict(shapes), dict(dtypes), out_dtype, wrt, algebra=op.algebra)
        if op.spec in joined:
            return _xla_op(op.spec, op.out_dtype, joined[op.spec].form, op.algebra)
    return _planned_op(op.spec, op.out_dtype, avals, op.zero_start, op.algebra, timed=True)


def _joint_plans(spec: Spec, args: Sequence[Any], out_dtype: str, wrt: Sequence[int],
                 algebra: str = "") -> tuple[dict, tuple]:
    """``planner.joint_plans`` for a differentiated call of ``spec`` on ``args``, from the plans known without
    timing (no race while tracing): the XLA plans of the forward and of the gradient steps of the inputs at
    positions ``wrt``, when they run as one XLA program; and, where none is known yet and a race may decide,
    the call's ``KernelOp.joint`` for its kernels to be traced with (the race runs at their lowering)."""
    from tullax.planner import tuning
    from tullax.planner.call import call_shapes_and_dtypes
    from tullax.planner.decide import joint_plans

    shapes, dtypes = call_shapes_and_dtypes(spec, args)
    names = tuple(spec.inputs[i].name for i in wrt)
    joined = joint_plans(spec, shapes, dtypes, out_dtype, names, algebra=algebra, known=True)
    if joined or not tuning.timing_enabled():
        return joined, ()
    return joined, (spec, tuple(sorted(shapes.items())), tuple(sorted((k, str(v)) for k, v in dtypes.items())),
                     out_dtype, names)


def _xla_op(spec: Spec, out_dtype: str, form: str, algebra: str = "") -> KernelOp:
    return KernelOp(spec, "xla", out_dtype, "xla", form=form, requested="auto", algebra=algebra)


# ---------------------------------------------------------------------------------------------
# The primitives
# ---------------------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def _prims() -> SimpleNamespace:
    from jax._src import dispatch
    from jax._src.core import Primitive  # jax.extend.core's own; importing jax.extend imports all of pallas
    from jax.interpreters import ad, batching, mlir

    kernel = Primitive("tullax_kernel")
    kernel.def_impl(partial(dispatch.apply_primitive, kernel))
    kernel.def_abstract_eval(_kernel_abstract_eval)
    mlir.register_lowering(kernel, _kernel_lowering)
    for platform in LOWERING_PLATFORMS:  # each platform's own rule: a multi-platform lowering branches on them
        mlir.register_lowering(kernel, partial(_kernel_lowering, platform=platform), platform=platform)
    batching.primitive_batchers[kernel] = _kernel_batch
    ad.primitive_jvps[kernel] = _kernel_jvp

    linear = Primitive("tullax_kernel_linear")
    linear.def_impl(partial(dispatch.apply_primitive, linear))
    linear.def_abstract_eval(_linear_abstract_eval)
    mlir.register_lowering(linear, _linear_lowering)
    batching.primitive_batchers[linear] = _linear_batch
    ad.primitive_jvps[linear] = _linear_jvp
    ad.primitive_transposes[linear] = _linear_transpose
    # their lowering may hold custom_partitioning (``tullax.jaxop.partition``), which needs the devices
    dispatch.prim_requires_devices_during_lowering.update((kernel, linear))
    return SimpleNamespace(kernel=kernel, linear=linear)


def _out_aval(op: KernelOp, in_avals: Sequence[Any], all_avals: Sequence[Any]):
    """The result's abstract value; inside shard_map it varies over every manual axis an operand varies over."""
    from jax._src import core
    from jax._src import mesh as mesh_lib
    from jax.sharding import NamedSharding, PartitionSpec

    shapes = {name: tuple(a.shape) for name, a in zip(op.spec.input_names, in_avals)}
    shape = tuple(s.eval(shapes) for s in op.spec.out_shape)
    varying = frozenset().union(*(getattr(getattr(a, "manual_axis_type", None), "varying", ()) for a in all_avals))
    if not varying:
        from tullax.jaxop.explicit import explicit_sharding

        explicit = explicit_sharding(op.spec, in_avals, shape)  # explicit mode: the result typed by the kernel's rule
        if explicit is not None:
            return core.ShapedArray(shape, op.out_dtype, sharding=explicit)
        return core.ShapedArray(shape, op.out_dtype)
    sharding = NamedSharding(mesh_lib.get_abstract_mesh(), PartitionSpec())
    mat = core.ManualAxisType(varying=varying, unreduced=frozenset(), reduced=frozenset())
    return core.ShapedArray(shape, op.out_dtype, sharding=sharding, manual_axis_type=mat)


def _kernel_abstract_eval(*avals, op: KernelOp):
    return _out_aval(op, avals, avals)


LOWERING_PLATFORMS = ("cpu", "cuda", "rocm")


def _kernel_lowering(ctx, *args, op: KernelOp, platform: str | None = None):
    """The kernel in ``ctx``'s program, for ``platform`` (the default rule: the module's first platform).
    Another platform than the process's, several at once, or an export: ``tullax.jaxop.target``. Under
    explicit sharding, lowered on untyped values (``tullax.jaxop.explicit.untyped``)."""
    from tullax.jaxop.explicit import untyped

    ctx, whole_program = untyped(ctx)
    with whole_program:
        return _lowering(ctx, *args, op=op, platform=platform)


def _lowering(ctx, *args, op: KernelOp, platform: str | None = None):
    from jax.interpreters import mlir

    from tullax.calls.host import FFI_ONLY_PATH
    from tullax.errors import UnservedPlatformError
    from tullax.jaxop.target import has_client, lowered_op, portable, xla_instead

    platform = platform or ctx.module_context.platforms[0]
    if op.pending:
        op = _settled(op, ctx, platform)
    lowered = lowered_op(op, platform, portable=portable(ctx), client=has_client(ctx, platform))
    from tullax.jaxop.partition import partitioned, relayed, spmd_devices

    if spmd_devices(ctx) > 1:  # split by JAX's partitioner along the spec's indices
        if lowered.path == "xla" and not portable(ctx):  # XLA's ops by the same rule (XLA's own may gather more)
            return mlir.lower_fun(partitioned(lowered, _run), multiple_results=False)(ctx, *args)
        if lowered.backend == "c" and lowered.path in ("ffi", FFI_ONLY_PATH):
            try:  # the custom call: no callback in the per-shard module
                return mlir.lower_fun(partitioned(replace(lowered, path=FFI_ONLY_PATH), _run),
                                      multiple_results=False)(ctx, *args)
            except UnservedPlatformError:
                pass
        if lowered.path in RELAYED_PATHS:  # a buffer callback, called through a relay in this program's list
            return mlir.lower_fun(relayed(ctx, lowered, _run_relayed), multiple_results=False)(ctx, *args)
    try:
        return mlir.lower_fun(partial(_run, lowered), multiple_results=False)(ctx, *args)
    except UnservedPlatformError as err:  # the c kernel has no custom call for this call: XLA's form, if planned
        if lowered.path != FFI_ONLY_PATH:
            raise
        return mlir.lower_fun(partial(_run, xla_instead(op, platform, str(err))), multiple_results=False)(ctx,
                                                                                                         *args)


# paths whose kernels run through buffer_callback: a split kernel's relay can call them (``tullax.jaxop.relay``)
RELAYED_PATHS = ("ffi", "buffer", "device")


def _run_relayed(relay: Any, op: KernelOp, *args):
    from tullax.calls.path import run_loops

    path = "buffer" if op.path == "ffi" else op.path  # a c kernel here is one its custom call does not serve
    return run_loops(op.spec, op.backend, args, op.out_dtype, path, op.zero_start, emit=relay.emit)


def _run(op: KernelOp, *args):
    if op.path == "xla":
        from tullax.backends.xla.forms import lower_form

        return lower_form(op.spec, op.form)(dict(zip(op.spec.input_names, args))).astype(op.out_dtype)
    from tullax.calls.path import run_loops

    return run_loops(op.spec, op.backend, args, op.out_dtype, op.path, op.zero_start)


def _kernel_batch(args, dims, *, op: KernelOp):
    from tullax.jaxop.batching import batch_arguments, batch_spec

    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    args, axes, extents = batch_arguments(op.spec, args, dims, size)
    batched = batch_spec(op.spec, axes, extents)
    if op.requested == "auto":
        new_op = _planned_op(batched, op.out_dtype, args, op.zero_start, op.algebra)
    elif op.form == "expanded":  # backend='xla' with the opt-in: the batched spec's own form
        new_op = _kernel_op(batched, "xla", args, algebra=op.algebra)
    else:
        new_op = op.with_spec(batched)
    return _prims().kernel.bind(*args, op=new_op), 0


def _zero_tangent(out):
    """A symbolic zero tangent for ``out`` (``Zero.from_primal_value`` is gone from newer jax)."""
    import jax
    from jax.interpreters import ad

    if hasattr(ad.Zero, "from_primal_value"):
        return ad.Zero.from_primal_value(out)
    return ad.Zero(jax.typeof(out).to_tangent_aval())


def _kernel_jvp(primals, tangents, *, op: KernelOp):
    from jax.interpreters import ad

    live = tuple(type(t) is not ad.Zero and _differentiable(item, p)
                 for item, p, t in zip(op.spec.inputs, primals, tangents))
    if not any(live):
        out = _prims().kernel.bind(*primals, op=op)
        return out, _zero_tangent(out)
    from tullax.jaxop.autodiff import autodiff_jvp

    # JAX's JVP of the forward's XLA form on the platform whose race chose it, the derived steps elsewhere
    found = autodiff_jvp(op, primals, tangents, live, apply, partial(_derived_jvp, op=op, live=live))
    if found is not None:
        return found
    return _derived_jvp(primals, [t for t, keep in zip(tangents, live) if keep], op=op, live=live)


def _derived_jvp(primals, live_tangents, *, op: KernelOp, live: tuple):
    """(result, tangent) of the derived gradient steps, given the tangents of the ``live`` inputs."""
    if op.requested == "auto" and op.path != "xla":  # one XLA program with its gradient steps, where they fit
        joined, joint = _joint_plans(op.spec, primals, op.out_dtype, [i for i, keep in enumerate(live) if keep],
                                     op.algebra)
        if op.spec in joined:
            op = _xla_op(op.spec, op.out_dtype, joined[op.spec].form, op.algebra)
        elif joint:
            op = replace(op, joint=joint, pending=True)
    out = _prims().kernel.bind(*primals, op=op)
    return out, _prims().linear.bind(*primals, out, *live_tangents, op=op, live=live)


def _differentiable(item: Any, value: Any) -> bool:
    import jax.numpy as jnp

    return item.kind in ("array", "scalar") and jnp.issubdtype(value.dtype, jnp.inexact)


# ---------------------------------------------------------------------------------------------
# The linear op: transposed in reverse mode (the gradient kernels), evaluated in forward mode
# ---------------------------------------------------------------------------------------------
def _split(op: KernelOp, operands: Sequence[Any]) -> tuple[Sequence[Any], Any, Sequence[Any]]:
    """(kernel inputs, kernel result, tangents of the live inputs)."""
    n = len(op.spec.inputs)
    return operands[:n], operands[n], operands[n + 1:]


def _linear_abstract_eval(*avals, op: KernelOp, live: tuple):
    return _out_aval(op, avals[:len(op.spec.inputs)], avals)


def _linear_transpose(ct, *operands, op: KernelOp, live: tuple):
    from jax.interpreters import ad

    from tullax.jaxop.factored import batched_factors, factored_gradient

    args, out, tangents = _split(op, operands)
    if any(ad.is_undefined_primal(x) for x in (*args, out)):
        raise TullaxError("internal: a tullax kernel's inputs must be known when its gradient runs")
    if type(ct) is ad.Zero:
        return [None] * len(operands)
    positions = [i for i, keep in enumerate(live) if keep]
    wanted = [i for i, t in zip(positions, tangents) if ad.is_undefined_primal(t)]
    factored = batched_factors(op, wanted, args, out, ct)
    grads = {i: factored_gradient(_linear_value, op, i, axes, args, out, ct) for i, axes in factored.items()}
    grads.update(input_gradients(op.spec, op.steps_backend, args, out, ct,
                                 [i for i in wanted if i not in factored], op.algebra))
    return [None] * (len(args) + 1) + [grads.get(i) for i in positions]


def _linear_value(op: KernelOp, live: tuple, *operands) -> Any:
    """Forward mode: the tangent J·t of the result. The gradient kernels compute ct -> Jᵀ·ct, a linear map whose
    transpose is J: so J·t is the VJP of the gradient kernels (their own gradient specs, derived like any
    other) at the cotangent t."""
    import jax
    import jax.numpy as jnp

    args, out, tangents = _split(op, operands)
    positions = [i for i, keep in enumerate(live) if keep]
    if op.spec.scan is not None:
        value = _tangent_recurrence(op, positions, args, out, tangents)
        if value is not None:
            return value

    def pullback(cotangent):
        grads = input_gradients(op.spec, op.steps_backend, args, out, cotangent, positions, op.algebra)
        return [grads[i] for i in positions]

    _, vjp = jax.vjp(pullback, jnp.zeros(out.shape, out.dtype))
    (value,) = vjp(list(tangents))
    return value


def _tangent_recurrence(op: KernelOp, positions: Sequence[int], args: Sequence[Any], out: Any,
                        tangents: Sequence[Any]) -> Any:
    """Forward mode of a recurrence: its tangent recurrence (``grad.tangent``), one forward scan kernel; None
    where it has none."""
    import jax.numpy as jnp

    from tullax.grad.tangent import tangent_spec
    from tullax.spec.valuetype import complex_inputs

    names = op.spec.input_names
    found = tangent_spec(op.spec, tuple(names[i] for i in positions),
                         complex_inputs(op.spec, {n: a.dtype for n, a in zip(names, args)}))
    if found is None:
        return None
    env = {**dict(zip(names, args)), op.spec.out: out}
    env.update({dot: t for (_, dot), t in zip(found.tangents, tangents)})
    value = apply(found.spec, op.steps_backend, [env[n] for n in found.spec.input_names])
    return (value if jnp.iscomplexobj(out) else jnp.real(value)).astype(out.dtype)


def _linear_lowering(ctx, *operands, op: KernelOp, live: tuple):
    from jax.interpreters import mlir

    return mlir.lower_fun(partial(_linear_value, op, live), multiple_results=False)(ctx, *operands)


def _linear_batch(operands, dims, *, op: KernelOp, live: tuple):
    import jax

    from tullax.jaxop.factored import factored_inputs, factored_value

    factored = factored_inputs(op, live, operands, dims)
    if factored:  # jacfwd of a recurrence: one sensitivity scan per factored input, not a batched scan
        return jax.vmap(partial(factored_value, _linear_value, op, live, factored), in_axes=tuple(dims))(*operands), 0
    return jax.vmap(partial(_linear_value, op, live), in_axes=tuple(dims))(*operands), 0


def _linear_jvp(primals, tangents, *, op: KernelOp, live: tuple):
    import jax
    from jax.interpreters import ad

    tangents = tuple(ad.instantiate_zeros(t) for t in tangents)
    return jax.jvp(partial(_linear_value, op, live), tuple(primals), tangents)


def input_gradients(spec: Spec, backend: str, args: Sequence[Any], out: Any, cotangent: Any,
                    wanted: Sequence[int], algebra: str = "") -> dict[int, Any]:
    """The cotangents of the inputs at positions ``wanted``, each from its derived gradient spec(s), each of
    which runs as a tullax kernel on ``backend`` (and is differentiable again), with the forward's ``algebra``."""
    from tullax.grad import gradients
    from tullax.grad.run import gradient_env, run_gradient, whole_copy, zero_start_steps
    from tullax.spec.valuetype import complex_inputs

    if not wanted:
        return {}
    joined: dict = {}
    joint: tuple = ()
    if backend == "auto":  # one compiler run for every step that may run on the loops, not one per step
        from tullax.planner.decide import build_gradient_module

        joined, joint = _joint_plans(spec, args, out.dtype.name, wanted, algebra)
        if not joined:
            build_gradient_module(spec, args, out.dtype.name)
    env = gradient_env(spec, dict(zip(spec.input_names, args)), out, cotangent)
    complex_names = complex_inputs(spec, {name: a.dtype for name, a in zip(spec.input_names, args)})
    by_input = {g.wrt: g for g in gradients(spec, complex_names)}
    from_zeros = zero_start_steps(spec, complex_names)

    done: dict = {}  # a step several gradients share (a recurrence's adjoint state) runs once per call

    def execute(step: Spec, step_env: dict) -> Any:
        copied = whole_copy(step, step_env)
        if copied is not None:  # Δx := gh: the adjoint state itself, no kernel writing a copy of it
            return step_env[copied]
        values = [step_env[name] for name in step.input_names]
        key = (step, tuple(id(v) for v in values))
        if key not in done:
            form = joined[step].form if step in joined else None  # with the forward, one XLA program
            done[key] = (apply(step, backend, values, form, step in from_zeros, algebra, joint), values)  # ids stay
        return done[key][0]

    found = {}
    for i in wanted:
        item, arg = spec.inputs[i], args[i]
        if item.name not in by_input:
            raise TullaxError(f"no gradient spec was derived for input {item.name} of {spec.out}")
        grad = run_gradient(by_input[item.name], spec, env, execute)
        found[i] = grad.astype(arg.dtype).reshape(arg.shape)
    return found


__all__ = ["apply", "prepare_inputs", "input_gradients", "KernelOp"]
