"""Host kernels inside a JAX computation.

Three paths, chosen when the kernel is traced:

* ``ffi`` (the default): a kernel that can run as XLA's own custom call does, with no Python per call (the c
  backend's, ``tullax.backends.ffi``: one compiled FFI handler calls its packed entry on XLA's buffers); any
  other kernel, or a call the custom call does not serve (a '=' update XLA does not alias, a zero-start step
  that clears its own output, a widened kernel), takes ``buffer``.
* ``buffer``: ``jax.experimental.buffer_callback``. XLA calls back with its own buffers; the host
  kernel reads the inputs and writes the output through NumPy views over them (``runtime.exchange``). Zero
  copies at any size, a Python function per call (``benchmarks/ffi_call.py`` measures both paths).
* ``pure``: ``jax.pure_callback``, where buffer_callback is missing (jax < 0.6.1) or on a non-CPU platform (a host
  kernel cannot read device memory), or when ``TULLAX_CALLBACK=pure`` forces it. It copies every input and the
  output (a few hundred us for kilobytes, ~100 ms for 64 MB).

A '+=' gradient step that starts from zeros (``ΔW[ix[b],d] += Δout[b,d]``, ``zero_start``) is not handed XLA's
zeros: the callback clears its own fresh output after advising huge pages for it (``runtime.hugepages``), where
XLA would write its zeros into 4 KiB pages, each faulting on first touch (the embedding gradient's 51 MB of
zeros: 10 ms, most of XLA's whole gradient).

Everything that can fail (compiling the kernel, shapes, dtypes) happens here, at trace time: the callbacks
themselves only run the kernel and count the launch (``runtime.stats``).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable, Sequence

from tullax import settings
from tullax.spec.ir import Spec

PATHS = ("ffi", "buffer", "pure")
# emit(runner, result, aliases, operands): calls a buffer callback's runner inside the program being traced
Emit = Callable[[Callable[..., None], Any, "dict[int, int] | None", Sequence[Any]], Any]
FFI_ONLY_PATH = "ffi-only"  # tullax.jaxop.target: the custom call or a TullaxError


# Settings a host kernel reads while it runs (inside XLA's callback): read here too, at trace time, so that an
# invalid value is a TullaxError at the call site, never inside a callback.
READ_WHILE_RUNNING = ("TULLAX_HUGE_PAGES", "TULLAX_C_THREADS", "TULLAX_SERIAL_WORK")


def callback_path() -> str:
    """The path host kernels take: ``TULLAX_CALLBACK`` (``ffi`` | ``buffer`` | ``pure``) or the best available.
    Asked at trace time for every host kernel, it checks the settings read while a kernel runs too."""
    for name in READ_WHILE_RUNNING:
        settings.value(name)
    forced = settings.value("TULLAX_CALLBACK")
    if forced == "pure" or not has_buffer_callback():
        return "pure"
    return "buffer" if forced == "buffer" else "ffi"


@lru_cache(maxsize=None)
def has_buffer_callback() -> bool:
    try:
        from jax.experimental.buffer_callback import buffer_callback  # noqa: F401
    except ImportError:
        return False
    return True


def host_call(spec: Spec, backend_name: str, args: Sequence[Any], out_dtype: Any, path: str,
              zero_start: bool = False, emit: Emit | None = None) -> Any:
    """Run the host kernel of ``spec`` on ``args`` (jax values) through the callback ``path``; returns the
    result as a jax value of dtype ``out_dtype``. Called while lowering, with tracers. ``zero_start``: ``spec``
    is a '+=' step whose given array (``args[0]``) is zeros: where it can, the callback clears its output itself,
    and XLA drops the unused zeros. ``emit``: how a buffer callback is called (``buffer_callback`` unless given:
    a split kernel's relay, ``tullax.jaxop.relay``)."""
    import jax
    import numpy as np

    from tullax import backends
    from tullax.backends.base import Signature
    from tullax.runtime import hugepages
    from tullax.spec.text import format_spec

    shapes = {name: tuple(a.shape) for name, a in zip(spec.input_names, args)}
    result = jax.ShapeDtypeStruct(tuple(s.eval(shapes) for s in spec.out_shape), np.dtype(out_dtype))
    shapes[spec.out] = result.shape  # static under jit: every call of this callback has these shapes
    backend = backends.resolve(backend_name)  # backends keep a table of built kernels: tracing again builds nothing
    kernel = backend.build(spec, Signature.of_values(args, result.dtype))
    declared = backends.capabilities(backend)
    if declared.prepare:  # compile now, while tracing: a compile error must not surface inside a callback
        kernel.prepare(shapes, read_only=path == "pure")  # pure_callback's inputs are read-only (_pure_runner)
    run_kernel = _with_shapes(kernel, shapes) if declared.shaped_run else _plain(kernel)
    text = format_spec(spec)
    in_place = updates_in_place(spec, args, result)
    # A zero-start step clears its own output where that output could stand in for the given zeros and huge pages
    # can be had (``runtime.hugepages``). Without them, clearing fresh 4 KiB pages in the callback was slower than
    # XLA's zeros (one memset then; the team's parallel clear of ``tullax.printers.c_clear`` was not measured
    # without huge pages).
    only_ffi = path == FFI_ONLY_PATH  # exported or another platform's lowering: no Python callback may serve
    clear = _clearer(kernel) if zero_start and in_place and hugepages.enabled() and not only_ffi else None
    operands = args[1:] if clear is not None else args
    if path in ("ffi", FFI_ONLY_PATH):
        found = _custom_call(spec, kernel, args, result, shapes, in_place, clear, text, backend_name)
        if found is not None:
            return found
    if only_ffi:
        from tullax.errors import UnservedPlatformError

        raise UnservedPlatformError(f"the c kernel of {text} has no custom call for this call (an update XLA "
                                    "does not alias, a widened dtype, or no XLA FFI handler here), and a Python "
                                    "callback cannot be exported or lowered for several platforms at once")
    if path in ("ffi", "buffer"):
        from jax.experimental.buffer_callback import buffer_callback

        aliases = {0: 0} if clear is None and in_place else None
        runner = _buffer_runner(spec, run_kernel, text, backend_name, clear)
        if emit is not None:
            return emit(runner, result, aliases, operands)
        return buffer_callback(runner, result, input_output_aliases=aliases)(*operands)
    return jax.pure_callback(_pure_runner(spec, run_kernel, text, backend_name, result, clear), result,
                             *operands, vmap_method="sequential")


def _custom_call(spec: Spec, kernel: Any, args: Sequence[Any], result: Any, shapes: dict[str, tuple[int, ...]],
                 in_place: bool, clear: Any, text: str, backend_name: str) -> Any | None:
    """The kernel as XLA's custom call (``ffi_call`` of a host kernel that has one), or None where that path does
    not serve this call: a '=' or '+=' update must be handed its starting values in the output (XLA aliases the
    given array only when ``in_place``), and a zero-start step's own clear is the buffer callback's."""
    # the kernel's own class: a wrapper that forwards attributes (``host.WidenedKernel``: a kernel of wider dtypes
    # than the call's buffers) must not hand out its inner kernel's custom call
    if getattr(type(kernel), "ffi_call", None) is None or clear is not None or (spec.assign != ":=" and not in_place):
        return None
    found = kernel.ffi_call(args, result, shapes, {0: 0} if in_place else None)
    if found is None:
        return None
    value, slot = found
    from tullax.backends import ffi
    from tullax.runtime import stats

    stats.watch(text, backend_name, "ffi", (ffi.TARGET, slot), lambda: ffi.launches(slot))
    return value


# A host kernel as the callbacks call it: run_kernel(out, inputs).
Runner = Callable[[Any, Sequence[Any]], None]


def _with_shapes(kernel: Any, shapes: dict[str, tuple[int, ...]]) -> Runner:
    """The kernel handed the shapes known at trace time, so a call does not work them out again."""
    def run_kernel(out: Any, inputs: Sequence[Any]) -> None:
        kernel.run(out, inputs, shapes)

    return run_kernel


def _plain(kernel: Callable[..., None]) -> Runner:
    def run_kernel(out: Any, inputs: Sequence[Any]) -> None:
        kernel(out, *inputs)

    return run_kernel


def updates_in_place(spec: Spec, args: Sequence[Any], result: Any) -> bool:
    """Whether XLA may hand the given array (input 0 of '=' and '+=') to the kernel AS its output buffer.

    Then nothing copies the starting values into a fresh output: a gradient's scatter step
    (``ΔW[ix[b],d] += Δout[b,d]``) adds straight into its buffer of zeros. XLA keeps it functional (it copies
    input 0 first when anything else still reads it). Only when the body never reads the given array: the
    kernel must see the values from before the update, which an aliased buffer no longer holds."""
    from tullax.spec.ir import arrays_read, spec_exprs

    if spec.assign == ":=" or not args:
        return False
    given = args[0]
    if tuple(given.shape) != tuple(result.shape) or given.dtype != result.dtype:
        return False
    return all(spec.out not in arrays_read(e, spec.lhs) for e in spec_exprs(spec))


def _clearer(kernel: Any) -> Callable[[Any], None]:
    """How a callback clears the output that stands for a zero-start step's zeros: ``start_from_zeros``, with the
    kernel's own clear where it has one (the C module's parallel clear, ``CHostKernel.clear_bytes``)."""
    from functools import partial

    from tullax.runtime.exchange import start_from_zeros

    return partial(start_from_zeros, clear_bytes=getattr(kernel, "clear_bytes", None))


def _buffer_runner(spec: Spec, run_kernel: Runner, text: str, backend_name: str,
                   clear: Callable[[Any], None] | None):
    """The buffer_callback of a host kernel. ``clear``: the given zeros were left out of the operands, and the
    output, cleared by it, stands for them (``host_call``)."""
    from tullax.runtime import stats
    from tullax.runtime.exchange import host_view, kernel_inputs, prepare_out

    def run(_ctx, out, *buffers):
        target = host_view(out)
        if clear is not None:
            inputs = kernel_inputs(spec, (target, *buffers))
            clear(target)
        else:
            inputs = kernel_inputs(spec, buffers)
            prepare_out(spec, target, inputs)
        run_kernel(target, inputs)
        stats.record_launch(text, backend_name, "buffer")

    return run


def _pure_runner(spec: Spec, run_kernel: Runner, text: str, backend_name: str, result: Any,
                 clear: Callable[[Any], None] | None):
    """The pure_callback of a host kernel; ``clear`` as in ``_buffer_runner``."""
    import numpy as np

    from tullax.runtime import stats
    from tullax.runtime.exchange import kernel_inputs, prepare_out

    def run(*arrays):
        out = np.empty(result.shape, result.dtype)
        if clear is not None:
            inputs = [_read_only(a) for a in kernel_inputs(spec, (out, *arrays))]
            clear(out)
        else:
            inputs = [_read_only(a) for a in kernel_inputs(spec, arrays)]
            prepare_out(spec, out, inputs)
        run_kernel(out, inputs)
        stats.record_launch(text, backend_name, "pure")
        return out

    return run


def _read_only(value: Any) -> Any:
    """``value`` as a read-only array view (what ``host_call`` prepared the kernel for: Numba types read-only
    arrays apart, so a writable one here would compile a new specialisation inside the callback); scalars as
    they are."""
    import numpy as np

    if not isinstance(value, np.ndarray) or not value.flags.writeable:
        return value
    view = value.view()
    view.flags.writeable = False
    return view


__all__ = ["FFI_ONLY_PATH", "callback_path", "has_buffer_callback", "host_call", "PATHS"]
