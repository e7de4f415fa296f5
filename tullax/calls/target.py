"""What a kernel becomes when it is lowered for a platform that its traced plan did not see.

A loop kernel runs inside XLA's program through a Python callback (``buffer_callback``, ``pure_callback``: on the
CPU, or a device backend's kernel on a GPU) or, for the c backend on the CPU, as XLA's own custom call
(``tullax.backends.c.ffi``). A Python callback can only be lowered where this process holds the platform's client,
for one platform at a time, and never into an exported artefact (``jax.export`` serialises no Python). So:

* lowered in-process for the one platform the process computes on: the path the kernel was traced with
  (``tullax.calls.path.lowered_path``), as before;
* otherwise (another platform, several platforms at once, or ``jax.export``): on the CPU, only the c backend's
  custom call serves (path ``ffi-only``: the custom call or a TullaxError, never a callback); on any other
  platform no loop kernel serves.
  A kernel that ``auto`` planned then takes XLA's form that its rules name without loops (no timing: the
  rules of ``tullax.planner.decide.rule_for``), planned for the target platform and never raced on this host;
  a kernel on an explicitly named backend raises a TullaxError that says why and what to write instead.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from tullax.calls.host import FFI_ONLY_PATH
from tullax.calls.path import CPU_PLATFORM, XLA_PATH, lowered_path
from tullax.errors import UnservedPlatformError


def callbacks_lowerable(ctx: Any, platform: str) -> bool:
    """Whether a Python callback can be lowered in this lowering context for ``platform``: one lowering platform,
    the process's own client for it, and no export."""
    module = ctx.module_context
    if getattr(module.lowering_parameters, "for_export", False) or len(module.platforms) != 1:
        return False
    return module.get_backend(optional=True) is not None and module.platforms[0] == platform


def lowered_op(op: Any, platform: str, callbacks: bool) -> Any:
    """``op`` (a ``KernelOp``) as it lowers for ``platform``; ``callbacks``: ``callbacks_lowerable``."""
    if op.path == XLA_PATH:
        return op
    if callbacks:
        return replace(op, path=lowered_path(op.path, op.backend, platform))
    if platform == CPU_PLATFORM and op.backend == "c":
        return replace(op, path=FFI_ONLY_PATH)
    return xla_instead(op, platform, why=_why(op.backend, platform))


def xla_instead(op: Any, platform: str, why: str) -> Any:
    """A kernel ``auto`` planned, on XLA's form for ``platform`` by the rules alone; a TullaxError saying ``why``
    for a kernel on a named backend."""
    if op.requested != "auto":
        raise UnservedPlatformError(f"{why}. Use backend='auto' (which lowers it to XLA's form there) or "
                                    "backend='xla'.")
    from tullax.planner.decide import rule_for

    form = rule_for(op.spec, None).default.removeprefix("xla:")
    return replace(op, backend="xla", path=XLA_PATH, form=form)


def _why(backend: str, platform: str) -> str:
    if platform == CPU_PLATFORM:
        return (f"tullax backend {backend!r} runs inside XLA's program through a Python callback, which cannot be "
                "exported or lowered for several platforms at once (only the c backend's custom call can)")
    return (f"tullax backend {backend!r} cannot be lowered for {platform!r} here: its kernels run through a Python "
            f"callback, which needs this process to compute on {platform!r} and cannot be exported")


__all__ = ["callbacks_lowerable", "lowered_op", "xla_instead"]
