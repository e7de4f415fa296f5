"""A race's candidates made ready to run: each candidate ("xla:<form>" or "loops") becomes a call of no arguments
that runs the kernel on fixed inputs as a planned kernel runs it (jitted; a loop kernel on the path the tullax
primitive's lowering takes), compiled and run once. XLA candidates of several races may be compiled ahead, all
at once, in threads (``compile_ahead``)."""
from __future__ import annotations

import functools
import os
import threading
from typing import Any, Callable

from tullax.planner import rules, tuning
from tullax.planner.call import Call, call_shapes_and_dtypes
from tullax.runtime import own_compiles
from tullax.spec.ir import Spec

Run = Callable[[], None]

# (spec, form, shapes, dtypes, zero_start) -> a Future of the compiled XLA candidate: a cache that the race of
# each kernel takes its candidates from, guarded by its lock (compiles finish in the pool's threads)
_AHEAD: dict[tuple, Any] = {}
_AHEAD_LOCK = threading.Lock()


def _ahead_key(call: Call, form: str) -> tuple:
    return (call.spec, form, tuple(sorted(call.shapes.items())), tuple(sorted(call.dtypes.items())), call.zero_start)


def compile_ahead(call: Call, candidates: tuple[str, ...]) -> None:
    """Lower the XLA ``candidates`` of a race on ``call`` (its timed shapes) now and compile them in threads: XLA
    compiles without the GIL, so the gradient steps' races find their candidates compiled. Nothing is timed."""
    import jax

    env = {name: jax.ShapeDtypeStruct(call.shapes[name], jax.dtypes.canonicalize_dtype(call.dtypes[name]))
           for name in call.spec.input_names}
    for candidate in candidates:
        key = _ahead_key(call, candidate)
        if not candidate.startswith("xla:") or key in _AHEAD:
            continue
        try:
            lowered = jax.jit(xla_function(call.spec, candidate, call.zero_start)).lower(env)
        except Exception:  # noqa: BLE001 - the race prepares it again, and reports nothing either
            continue
        with _AHEAD_LOCK:
            _AHEAD[key] = _compile_pool().submit(_compile_beside, lowered)


def _compile_beside(lowered: Any) -> Any:
    with own_compiles.compiling("XLA compile ahead"):  # a race of this process waits for it before timing
        return lowered.compile()


def forget_ahead() -> None:
    with _AHEAD_LOCK:
        _AHEAD.clear()


@functools.cache
def _compile_pool():
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2), thread_name_prefix="tullax-compile")


def _compiled_ahead(call: Call, form: str) -> Any:
    """The compiled executable ``compile_ahead`` made for this candidate, or None (none was made, or it failed:
    the race then compiles the candidate itself)."""
    with _AHEAD_LOCK:
        future = _AHEAD.pop(_ahead_key(call, form), None)
    if future is None:
        return None
    try:
        return future.result()
    except Exception:  # noqa: BLE001
        return None


def start_module_build(call: Call, values: list, out_dtype: str) -> threading.Thread | None:
    """A thread that builds the loop backend's kernel of the call for ``values``, where the backend builds the
    forward kernel and every gradient step together (``whole_module_cached``); the loop candidate then finds its
    kernel built. Its compiler runs in subprocesses, so XLA's compiles of the other candidates (which release the
    GIL) go on meanwhile. A failed build is left to the loop candidate, which then fails the same way."""
    if not rules.whole_module_cached(call.loops):
        return None
    import jax
    import numpy as np

    from tullax import backends
    from tullax.backends.base import Signature

    def canonical(dtype: Any) -> str:  # as the loop candidate's jax arrays have it (``_loop_call``)
        return np.dtype(jax.dtypes.canonicalize_dtype(dtype)).name

    signature = Signature(tuple(canonical(v.dtype) for v in values), canonical(out_dtype))

    def build() -> None:
        try:
            kernel = backends.resolve(call.loops).build(call.spec, signature)
            own_compiles.wait(kernel)  # a fast tier's kernel: the race times its optimised build
        except Exception:  # noqa: BLE001 - a bug too: the loop candidate builds again under ``prepared``,
            pass  # which is not chosen when it fails; uncaught, the thread would print its traceback to stderr

    thread = threading.Thread(target=build, name="tullax-module-build", daemon=True)
    thread.start()
    return thread


def prepared(call: Call, candidate: str, values: list) -> Run | None:
    """A run of one candidate on NumPy ``values``, already compiled and run once; None when it cannot run
    (it is then never chosen)."""
    try:
        if candidate.startswith("xla:"):
            run = _xla_call(call, candidate, values)
        else:
            run = _loop_call(call, values)
        run()  # compile, first run
        return run
    except Exception:  # noqa: BLE001 - a candidate that cannot run here is simply not chosen
        return None


def _xla_call(call: Call, candidate: str, values: list) -> Run:
    """A run of the XLA form ``candidate`` on NumPy ``values``: the executable ``compile_ahead`` compiled for it
    where that runs on them, else jitted here."""
    import jax

    spec = call.spec
    env = dict(zip(spec.input_names, on_device(values)))
    fn = None
    ahead = _compiled_ahead(Call.of(spec, *call_shapes_and_dtypes(spec, values), call.loops, call.zero_start),
                            candidate)
    if ahead is not None:
        _check_temporaries(candidate, ahead)
        try:
            with jax.ensure_compile_time_eval():
                jax.block_until_ready(ahead(env))
            fn = ahead
        except Exception:  # noqa: BLE001 - it does not take these arguments: the jitted form compiles them
            pass
    if fn is None:
        with jax.ensure_compile_time_eval():
            fn = jax.jit(xla_function(spec, candidate, call.zero_start)).lower(env).compile()
        _check_temporaries(candidate, fn)

    def run() -> None:
        with jax.ensure_compile_time_eval():
            jax.block_until_ready(fn(env))

    return run


class _TooMuchMemory(Exception):
    """A candidate's compiled program needs more than MAX_TEMP_BYTES of temporaries: not run."""


def _check_temporaries(candidate: str, compiled: Any) -> None:
    try:
        temp = compiled.memory_analysis().temp_size_in_bytes
    except Exception:  # noqa: BLE001 - a runtime that reports nothing: only 'product' relies on the check
        temp = None
    if (temp is None and candidate == "xla:product") or (temp is not None and temp > tuning.MAX_TEMP_BYTES):
        raise _TooMuchMemory(f"{candidate}: {temp} bytes of temporaries")


def xla_function(spec: Spec, candidate: str, zero_start: bool) -> Callable[[dict], Any]:
    """The function of the XLA form ``candidate`` on an environment of inputs; with ``zero_start``, it starts
    from zeros of its own, as in a gradient (XLA writes them into the scatter's output; the given array is
    not read)."""
    from tullax.backends.xla.forms import lower_form

    form = lower_form(spec, candidate[4:])
    if not zero_start:
        return form

    def from_zeros(env: dict) -> Any:
        import jax.numpy as jnp

        given = env[spec.out]
        return form({**env, spec.out: jnp.zeros(given.shape, given.dtype)})

    return from_zeros


def on_device(values: list) -> list:
    """``values`` (NumPy) as concrete JAX arrays, even while jax traces (planning runs then). Not
    ``jnp.asarray`` under ``ensure_compile_time_eval``: that stages each value through a jitted identity, an
    XLA compile per shape."""
    import jax
    import numpy as np

    with jax.ensure_compile_time_eval():
        return [jax.device_put(np.asarray(v)) for v in values]


def _loop_call(call: Call, values: list) -> Run:
    """A run of the loop backend's kernel on ``values`` (NumPy, in ``spec.inputs`` order) as a planned kernel
    runs it: jitted, on the path the tullax primitive's lowering takes (``tullax.calls.path``: the host
    callback, or a GPU backend's device kernel). Not the bare kernel: the callback costs what the bare kernel
    does not see, and a race on bare kernels handed the loops calls they lose in a program."""
    import jax

    from tullax.calls.path import backend_path, run_loops
    from tullax.spec.shapes import result_dtype

    spec, loops = call.spec, call.loops
    args = on_device(values)
    dtype = jax.dtypes.canonicalize_dtype(result_dtype(spec, {i.name: a.dtype for i, a in zip(spec.inputs, args)}))
    path = backend_path(loops)  # the choice the primitive's lowering makes: the host callback or the device kernel
    fn = jax.jit(lambda *given: run_loops(spec, loops, given, dtype, path, call.zero_start))

    def run() -> None:
        with jax.ensure_compile_time_eval():
            jax.block_until_ready(fn(*args))

    return run
