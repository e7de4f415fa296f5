"""Printed CUDA C to a cubin with NVRTC (PyPI ``nvidia-cuda-nvrtc`` through ``cuda-bindings``), cached.

A cubin is machine code for ONE exact architecture (``sm_90``): PTX from a newer NVRTC does not load on an
older driver, a cubin for the device's own architecture does. Cubins live in tullax's cache directory
(``tullax.runtime.cache``: atomic, locked writes, checksums), base64-encoded because its entries are text,
under a key of the generated source, the architecture and NVRTC's version (``cache_key`` adds tullax's own).
A compile error is a TullaxError carrying NVRTC's log. NVRTC is imported on first use only, and where it comes as
the ``nvidia-cuda-nvrtc`` wheel the library is loaded only to compile: the wheel's version keys the cache, so a
process whose kernels are all cached never loads it (a tenth of a second and more of every warm first call).
"""
from __future__ import annotations

import base64
import re
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

from tullax.errors import BackendUnavailableError, TullaxError

SOURCE_FILE = "kernel.cu"
CUBIN_FILE = "kernel.cubin.b64"
_ARCH = re.compile(r"sm_\d{2,3}[a-z]?\Z")


@dataclass(frozen=True)
class Cubin:
    """A compiled module: its ``key`` in the cache, the machine code, and how long NVRTC took (None: it came
    from the cache)."""

    key: str
    image: bytes
    compile_ms: float | None


def nvrtc() -> Any:
    """``cuda.bindings.nvrtc``; BackendUnavailableError saying how to install it."""
    try:
        from cuda.bindings import nvrtc as module

        module.nvrtcVersion()  # loads libnvrtc: an installed binding without the library fails here
    except Exception as err:  # noqa: BLE001 - ImportError, or the binding's own error for a missing libnvrtc
        raise BackendUnavailableError(
            f"NVRTC is not usable ({type(err).__name__}: {err}); install it with "
            "`pip install 'tullax[cuda]'` (cuda-bindings and nvidia-cuda-nvrtc)") from None
    return module


@lru_cache(maxsize=None)
def nvrtc_version() -> tuple[int, int]:
    _, major, minor = _checked(nvrtc().nvrtcVersion(), "nvrtcVersion")
    return int(major), int(minor)


NVRTC_WHEEL = "nvidia-cuda-nvrtc"


@lru_cache(maxsize=None)
def nvrtc_wheel() -> str | None:
    """The version of the installed ``nvidia-cuda-nvrtc`` wheel (which ships the library) when cuda-bindings'
    ``nvrtc`` module is installed too, found without loading either; None otherwise (NVRTC from a CUDA
    toolkit, or none)."""
    import importlib.metadata
    import importlib.util

    try:
        if importlib.util.find_spec("cuda.bindings.nvrtc") is None:
            return None
        return importlib.metadata.version(NVRTC_WHEEL)
    except (ImportError, ValueError, importlib.metadata.PackageNotFoundError):
        return None


def nvrtc_usable() -> None:
    """BackendUnavailableError unless NVRTC can compile here: the wheel and the binding installed, or else the
    library loaded (``nvrtc``)."""
    if nvrtc_wheel() is None:
        nvrtc()


def check_arch(arch: str) -> str:
    if not isinstance(arch, str) or not _ARCH.match(arch):
        raise TullaxError(f"{arch!r} is not a CUDA architecture: use the form sm_90 (a real architecture, so "
                          "the driver loads machine code without a JIT)")
    return arch


def compile_cubin(source: str, arch: str, options: Sequence[str] = ()) -> bytes:
    """The cubin of ``source`` for ``arch``; TullaxError with NVRTC's log when it does not compile."""
    return _compile(source, arch, options)[0]


def compile_with_report(source: str, arch: str) -> tuple[bytes, str]:
    """The cubin and ptxas's report on every kernel of ``source``: registers, stack frame, spill stores and
    loads."""
    return _compile(source, arch, ("--ptxas-options=-v",))


def _compile(source: str, arch: str, options: Sequence[str]) -> tuple[bytes, str]:
    check_arch(arch)
    module = nvrtc()
    program = _checked(module.nvrtcCreateProgram(source.encode(), SOURCE_FILE.encode(), 0, [], []),
                       "nvrtcCreateProgram")[1]
    try:
        flags = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in options)]
        (result,) = module.nvrtcCompileProgram(program, len(flags), flags)
        if result != module.nvrtcResult.NVRTC_SUCCESS:
            raise TullaxError(f"NVRTC could not compile the generated CUDA kernel for {arch} ({result.name}); "
                              f"please report it. NVRTC said:\n{_log(module, program)}")
        size = _checked(module.nvrtcGetCUBINSize(program), "nvrtcGetCUBINSize")[1]
        image = bytes(size)
        _checked(module.nvrtcGetCUBIN(program, image), "nvrtcGetCUBIN")
        return image, _log(module, program)
    finally:
        module.nvrtcDestroyProgram(program)


def _log(module: Any, program: Any) -> str:
    size = _checked(module.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")[1]
    log = bytes(size)
    _checked(module.nvrtcGetProgramLog(program, log), "nvrtcGetProgramLog")
    return log.rstrip(b"\0").decode(errors="replace").strip()


def _checked(returned: tuple, call: str) -> tuple:
    status = returned[0]
    if int(status) != 0:
        raise TullaxError(f"{call} failed: {getattr(status, 'name', status)}")
    return returned


def cubin_key(source: str, arch: str) -> str:
    from tullax.runtime.cache import cache_key

    wheel = nvrtc_wheel()  # a wheel's exact version, else the loaded library's major.minor
    nvrtc_id = f"{NVRTC_WHEEL} {wheel}" if wheel else list(nvrtc_version())
    return cache_key(source=source, arch=check_arch(arch), nvrtc=nvrtc_id, backend="cuda")


def cached_cubin(source: str, arch: str, *, spec_text: str, dtypes: Sequence[str]) -> Cubin:
    """The cubin of ``source`` for ``arch``: from the cache, else compiled and stored (under the entry's lock,
    so concurrent processes compile it once)."""
    from tullax.runtime.cache import get_cache

    key = cubin_key(source, arch)
    cache = get_cache()
    with cache.lock(key):
        stored = cache.read_text(key, CUBIN_FILE)
        if stored is not None and cache.read_text(key, SOURCE_FILE) == source:
            cache.hit(key)
            return Cubin(key, base64.b64decode(stored), None)
        start = time.perf_counter()
        image = compile_cubin(source, arch)
        compile_ms = (time.perf_counter() - start) * 1e3
        cache.write_text(key, SOURCE_FILE, source)
        cache.write_text(key, CUBIN_FILE, base64.b64encode(image).decode("ascii"))
    try:
        cache.record(key, spec=spec_text, backend="cuda", kind="cubin", dtypes=list(dtypes), compile_ms=compile_ms,
                     options={"arch": arch, "nvrtc": ".".join(map(str, nvrtc_version()))})
    except OSError:  # a read-only cache already warned; the record is a nicety
        pass
    return Cubin(key, image, compile_ms)


__all__ = ["Cubin", "cached_cubin", "check_arch", "compile_cubin", "cubin_key", "nvrtc", "nvrtc_usable",
           "nvrtc_version", "nvrtc_wheel", "compile_with_report"]
