"""What a kernel becomes when it is lowered for a platform that its traced plan did not see.

A loop kernel runs inside XLA's program through a Python callback (``buffer_callback``, ``pure_callback``: on the
CPU, or a device backend's kernel on a GPU) or, for the c backend on the CPU, as XLA's own custom call
(``tullax.backends.ffi``). A Python callback can only be lowered where this process holds the platform's client,
for one platform at a time, and never into an exported artefact (``jax.export`` serialises no Python). So:

* lowered for one platform: the path the kernel was traced with (``tullax.calls.path.lowered_path``), as
  before; a device backend's ``buffer_callback`` lowers for its GPU platform on any host, but a host backend
  on a GPU platform copies through ``pure_callback``, which needs that platform in this process;
* exported, or lowered for several platforms at once: no Python callback serves. On the CPU only the c
  backend's custom call does (path ``ffi-only``: the custom call or a TullaxError); on any other platform no
  loop kernel does.
  A kernel that ``auto`` planned then takes XLA's form that its rules name without loops (no timing: the
  rules of ``tullax.planner.rules.rule_for``), planned for the target platform and never raced on this host;
  a kernel on an explicitly named backend raises a TullaxError that says why and what to write instead.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from tullax.calls.host import FFI_ONLY_PATH
from tullax.calls.path import CPU_PLATFORM, XLA_PATH, lowered_path
from tullax.errors import UnservedPlatformError


def portable(ctx: Any) -> bool:
    """Whether ``ctx``'s program may hold no Python callback: an export, or a lowering for several platforms."""
    module = ctx.module_context
    return bool(getattr(module.lowering_parameters, "for_export", False)) or len(module.platforms) != 1


def has_client(ctx: Any, platform: str) -> bool:
    """Whether this process computes on ``platform`` (what ``pure_callback``'s lowering needs)."""
    module = ctx.module_context
    return module.platforms[0] == platform and module.get_backend(optional=True) is not None


def lowered_op(op: Any, platform: str, *, portable: bool, client: bool) -> Any:
    """``op`` (a ``KernelOp``) as it lowers for ``platform``; ``portable``, ``client``: as the functions of those
    names say of the lowering context."""
    if op.path == XLA_PATH:
        return op
    if portable:
        if platform == CPU_PLATFORM and op.backend == "c":
            return replace(op, path=FFI_ONLY_PATH)
        return xla_instead(op, platform, why=_why(op.backend, platform, portable))
    if platform != CPU_PLATFORM and not client and not _runs_on(op.backend, platform):
        # a host backend on a GPU copies through pure_callback, which needs the platform in this process
        return xla_instead(op, platform, why=_why(op.backend, platform, portable))
    return replace(op, path=lowered_path(op.path, op.backend, platform))


def _runs_on(backend_name: str, platform: str) -> bool:
    from tullax import backends

    return getattr(backends.get(backend_name), "platform", None) == platform


def xla_instead(op: Any, platform: str, why: str) -> Any:
    """A kernel ``auto`` planned, on XLA's form for ``platform`` by the rules alone; a TullaxError saying ``why``
    for a kernel on a named backend."""
    if op.requested != "auto":
        raise UnservedPlatformError(f"{why}. Use backend='auto' (which lowers it to XLA's form there) or "
                                    "backend='xla'.")
    from tullax.planner.rules import rule_for

    form = rule_for(op.spec, None).default.removeprefix("xla:")
    return replace(op, backend="xla", path=XLA_PATH, form=form)


def _why(backend: str, platform: str, portable: bool) -> str:
    if portable:
        return (f"tullax backend {backend!r} runs inside XLA's program through a Python callback, which cannot be "
                "exported or lowered for several platforms at once (only the c backend's custom call on the CPU "
                "can)")
    return (f"tullax backend {backend!r} cannot be lowered for {platform!r} here: its kernels run on the host, "
            f"through a callback that needs this process to compute on {platform!r}")


__all__ = ["has_client", "lowered_op", "portable", "xla_instead"]
