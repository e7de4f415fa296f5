"""The few CUDA driver calls the cuda backend makes, through ``cuda.bindings.driver`` (PyPI ``cuda-bindings``),
imported on first use: load a cubin, launch a kernel on a stream, copy or clear device memory on a stream,
and describe the device for ``tullax doctor``.

Cubins are loaded as context-independent libraries (``cuLibraryLoadData``, CUDA 12+): loaded once per process,
usable from XLA's context on any device of the architecture; a launch takes its context from the stream.
Nothing here synchronises: every call is enqueued on the stream it is given.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from tullax import settings
from tullax.errors import BackendUnavailableError, TullaxError

ARCH_ENV = "TULLAX_CUDA_ARCH"  # compile for this architecture (sm_90) instead of asking device 0
NAME_BYTES = 256  # room for a device's name


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    arch: str  # sm_90
    driver_version: str  # the CUDA version the driver supports, 12.8


class Driver:
    """The CUDA driver, initialised. ``load`` keeps every library for the life of the process."""

    def __init__(self) -> None:
        try:
            from cuda.bindings import driver
        except ImportError:
            raise BackendUnavailableError("cuda-bindings is not installed: pip install 'tullax[cuda]'") from None
        self._cu = driver
        try:
            self._check(driver.cuInit(0), "cuInit")
        except TullaxError as err:
            raise BackendUnavailableError(f"the CUDA driver is not usable here: {err}") from None
        except Exception as err:  # noqa: BLE001 - cuda-bindings raises its own error when libcuda is missing
            raise BackendUnavailableError(f"no NVIDIA driver (libcuda) here: {err}") from None
        self._libraries: list[Any] = []  # kept alive: unloading would invalidate their kernels
        self._lock = threading.Lock()

    def _check(self, returned: Any, call: str) -> tuple:
        returned = returned if isinstance(returned, tuple) else (returned,)
        status = returned[0]
        if status != self._cu.CUresult.CUDA_SUCCESS:
            _, name = self._cu.cuGetErrorName(status)
            raise TullaxError(f"{call} failed: {name.decode() if isinstance(name, bytes) else name}")
        return returned

    def load(self, image: bytes, name: str) -> Any:
        """The kernel ``name`` of the cubin ``image``: a CUkernel (usable in any context), as the CUfunction
        handle ``cuLaunchKernel`` takes."""
        _, library = self._check(self._cu.cuLibraryLoadData(image, None, None, 0, None, None, 0),
                                 "cuLibraryLoadData")
        with self._lock:
            self._libraries.append(library)
        _, kernel = self._check(self._cu.cuLibraryGetKernel(library, name.encode()), "cuLibraryGetKernel")
        return self._cu.CUfunction(int(kernel))

    def launch(self, kernel: Any, grid: int, block: int, stream: int, params: int) -> None:
        """Enqueue ``kernel`` on ``stream`` with the ``void**`` parameter block at address ``params``."""
        self._check(self._cu.cuLaunchKernel(kernel, grid, 1, 1, block, 1, 1, 0,
                                            self._cu.CUstream(stream), params, 0), "cuLaunchKernel")

    def copy(self, target: int, source: int, nbytes: int, stream: int) -> None:
        self._check(self._cu.cuMemcpyDtoDAsync(target, source, nbytes, self._cu.CUstream(stream)),
                    "cuMemcpyDtoDAsync")

    def clear(self, target: int, nbytes: int, stream: int) -> None:
        """Zero ``nbytes`` at ``target``, enqueued on ``stream``."""
        self._check(self._cu.cuMemsetD8Async(target, 0, nbytes, self._cu.CUstream(stream)), "cuMemsetD8Async")

    def device(self, ordinal: int = 0) -> DeviceInfo:
        cu = self._cu
        _, device = self._check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
        _, name = self._check(cu.cuDeviceGetName(NAME_BYTES, device), "cuDeviceGetName")
        attribute = cu.CUdevice_attribute
        _, major = self._check(cu.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                                       device), "cuDeviceGetAttribute")
        _, minor = self._check(cu.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                                       device), "cuDeviceGetAttribute")
        _, version = self._check(cu.cuDriverGetVersion(), "cuDriverGetVersion")  # 1000 * major + 10 * minor
        return DeviceInfo(name.split(b"\0")[0].decode(), f"sm_{major}{minor}",
                          f"{version // 1000}.{version % 1000 // 10}")


@lru_cache(maxsize=None)
def driver() -> Driver:
    """The process's driver (BackendUnavailableError without cuda-bindings, a driver or a device)."""
    found = Driver()
    found.device()  # no device: unusable
    return found


def target_arch() -> str:
    """The architecture kernels are compiled for: ``TULLAX_CUDA_ARCH``, else device 0's (all devices of one
    process are assumed to share it)."""
    from tullax.backends.cuda.compile import check_arch

    configured = settings.value(ARCH_ENV)
    return check_arch(configured) if configured else driver().device().arch


__all__ = ["ARCH_ENV", "DeviceInfo", "Driver", "driver", "target_arch"]
