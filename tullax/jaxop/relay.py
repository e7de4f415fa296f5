"""Python callbacks of kernels that JAX's SPMD partitioner splits (``tullax.jaxop.partition``).

A callback (``buffer_callback``: numba, julia, a c kernel without its custom call, a cuda kernel on its GPU) is
registered with the module being lowered and called by its index in that module's list of callbacks. The
per-shard function of ``custom_partitioning`` is lowered into a module of its own while XLA compiles the program,
after the program's list was handed to XLA: a callback registered there is never called (XLA calls whatever sits
at its index in the program's list). So the program's lowering registers a ``Relay`` in its own list first, and
the per-shard function calls the relay's index (``relay_call``): the relay runs the runner that the per-shard
lowering built for its blocks' shapes, compiled there (at compile time, never inside the callback).
"""
from __future__ import annotations

import threading
from functools import lru_cache
from typing import Any, Callable, Sequence

# buffer_callback's own FFI targets: they call the Python function at ``index`` of the executable's callbacks
TARGETS = {"cpu": "xla_buffer_python_cpu_callback", "cuda": "xla_buffer_python_gpu_callback",
           "rocm": "xla_buffer_python_gpu_callback"}

Runner = Callable[..., None]  # runner(exec_ctx, out, *inputs): a buffer_callback's function


class Relay:
    """A callback in a program's list that runs, on a device's blocks, the runner built for their shapes."""

    def __init__(self, index: int) -> None:
        self.index = index
        self._runners: dict[tuple, Runner] = {}
        self._lock = threading.Lock()

    def add(self, operands: Sequence[Any], runner: Runner) -> None:
        with self._lock:
            self._runners[_key(operands)] = runner

    def __call__(self, exec_ctx: Any, *buffers: Any) -> tuple:
        inputs, out = buffers[:-1], buffers[-1]
        self._runners[_key(inputs)](exec_ctx, out, *inputs)
        return ()

    def emit(self, runner: Runner, result: Any, aliases: dict[int, int] | None, operands: Sequence[Any]) -> Any:
        """Call ``runner`` on ``operands`` for ``result`` (a ShapeDtypeStruct) through this relay: what the
        per-shard function binds where a kernel would call ``buffer_callback``."""
        self.add(operands, runner)
        return _primitive().bind(*operands, relay=self.index, shape=tuple(result.shape), dtype=str(result.dtype),
                                 aliases=tuple(sorted((aliases or {}).items())))


def _key(values: Sequence[Any]) -> tuple:
    return tuple((tuple(v.shape), str(v.dtype)) for v in values)


def relay_for(ctx: Any) -> Relay:
    """A new relay registered with the program ``ctx`` lowers."""
    module = ctx.module_context
    relay = Relay(len(module.host_callbacks))
    module.add_host_callback(relay)
    return relay


@lru_cache(maxsize=None)
def _primitive() -> Any:
    import numpy as np
    from jax import ffi
    from jax._src import core
    from jax.interpreters import mlir

    relay_p = core.Primitive("tullax_relay")
    relay_p.def_abstract_eval(lambda *avals, relay, shape, dtype, aliases: core.ShapedArray(shape, np.dtype(dtype)))

    def lowering(ctx, *args, relay, shape, dtype, aliases):
        platform = ctx.module_context.platforms[0]
        rule = ffi.ffi_lowering(TARGETS[platform], has_side_effect=False, operand_output_aliases=dict(aliases))
        return rule(ctx, *args, index=np.uint64(relay))

    mlir.register_lowering(relay_p, lowering)
    return relay_p


__all__ = ["Relay", "TARGETS", "relay_for"]
