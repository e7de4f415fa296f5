"""Which backend ``backend='auto'`` runs on a GPU platform, and what ``tullax doctor`` says about the GPU.

On a GPU: ``julia-cuda`` when Julia with CUDA.jl is installed, else ``cuda`` when NVRTC and a driver are
usable, else the host backend ``auto`` picks on the CPU, whose kernels then copy every input to the host and the
result back through ``pure_callback`` (tullax warns once, at lowering: ``tullax.jaxop.device``).
"""
from __future__ import annotations

from functools import lru_cache

from tullax.errors import BackendUnavailableError

GPU_ORDER = ("julia-cuda", "cuda")
JAX_GPU_PLATFORM = "gpu"  # jax.default_backend() of an NVIDIA (or AMD) GPU


@lru_cache(maxsize=None)
def gpu_choice() -> tuple[str, str]:
    """(backend name, why) for ``auto`` on a GPU platform; decided once per process."""
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
    try:
        host = backends.resolve("auto").name
    except BackendUnavailableError as err:
        return "xla", f"no GPU backend ({'; '.join(reasons)}) and no host backend ({err})"
    return host, f"no GPU backend ({'; '.join(reasons)}): the host backend {host} copies to the host and back"


def auto_backend_for_jax() -> str | None:
    """The GPU backend ``auto`` means for jax inputs when jax computes on a GPU; None on the CPU."""
    import jax

    return gpu_choice()[0] if jax.default_backend() == JAX_GPU_PLATFORM else None


def gpu_report() -> str:
    """A few lines for ``tullax doctor``: the GPU and its driver, NVRTC, and which backend ``auto`` would run
    on a GPU and why."""
    from tullax.backends.cuda_compile import nvrtc_version
    from tullax.backends.cuda_driver import driver

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
    lines.append(f"on a GPU, backend='auto' runs {name}: {why}")
    return "\n".join(lines)


__all__ = ["GPU_ORDER", "auto_backend_for_jax", "gpu_choice", "gpu_report"]
