"""The GPU's loop backend, which ``backend='auto'`` races against XLA's forms on a GPU platform
(``tullax.planner.decide``), and what ``tullax doctor`` says about the GPU.

On a GPU: ``julia-cuda`` when Julia with CUDA.jl is installed, else ``cuda`` when NVRTC and a driver are
usable. Without either, ``auto`` runs XLA's forms on the GPU: the host backend's kernels would copy every input to
the host and the result back through ``pure_callback`` (tullax warns once when one is asked for by name, at
lowering: ``tullax.calls.device``).
"""
from __future__ import annotations

import sys
from functools import lru_cache

from tullax.errors import BackendUnavailableError

GPU_ORDER = ("julia-cuda", "cuda")
JAX_GPU_PLATFORM = "gpu"  # jax.default_backend() of an NVIDIA (or AMD) GPU


def on_gpu() -> bool:
    """Whether jax computes on a GPU here (``auto``'s kernels then run on the GPU: the loops as device kernels)."""
    jax = sys.modules.get("jax")
    if jax is None:
        return False
    try:
        return jax.default_backend() == JAX_GPU_PLATFORM
    except RuntimeError:  # no backend initialises
        return False


@lru_cache(maxsize=None)
def gpu_choice() -> tuple[str, str]:
    """(the GPU's loop backend, why) for ``auto`` on a GPU platform, "xla" when none is usable; decided once per
    process."""
    from tullax import backends

    reasons = []
    for name in GPU_ORDER:
        try:
            ok, why = backends.get(name).availability()
        except BackendUnavailableError as err:
            ok, why = False, str(err)
        if ok:
            return name, f"{name} is usable" + (f" ({'; '.join(reasons)})" if reasons else "")
        reasons.append(f"{name}: {why}")
    return "xla", f"no GPU loop backend ({'; '.join(reasons)}): a host backend would copy to the host and back"


def gpu_report() -> str:
    """A few lines for ``tullax doctor``: the GPU and its driver, NVRTC, and which backend ``auto`` would run
    on a GPU and why."""
    from tullax.backends.cuda.compile import nvrtc_version
    from tullax.backends.cuda.driver import driver

    lines = []
    try:
        info = driver().device()
        lines.append(f"GPU: {info.name} ({info.arch}), driver supports CUDA {info.driver_version}")
    except BackendUnavailableError as err:
        lines.append(f"GPU: none usable ({err})")
    try:
        lines.append("NVRTC: {}.{}".format(*nvrtc_version()))
    except BackendUnavailableError as err:
        lines.append(f"NVRTC: {err}")
    name, why = gpu_choice()
    if name in GPU_ORDER:
        lines.append(f"on a GPU, backend='auto' runs each kernel on {name} or XLA, whichever it times faster: {why}")
    else:
        lines.append(f"on a GPU, backend='auto' runs XLA's forms: {why}")
    return "\n".join(lines)


__all__ = ["GPU_ORDER", "JAX_GPU_PLATFORM", "gpu_choice", "gpu_report", "on_gpu"]
