"""c kernels of programs this process never traced: a ``jax.export`` artefact deserialised here, or an executable
from JAX's persistent compilation cache.

Their custom calls name each kernel by its content (``ffi.content_identity``) and carry its spec and dtypes
(``ffi.kernel_payload``), or, for a fused program's kernel, its printed module (``program_host.program_payload``).
The handler looks the identity up in its table; where this process has not built the kernel, it calls the resolver
installed here, which builds it from the payload (from the compile cache, or compiled now) and registers it. A
payload of another code generator (another tullax version) is refused: its packed entry's layout may differ.

``prepare()`` (``tullax.prepare_exported``) loads the handler, registers it with XLA and installs the resolver:
call it in a new process before running an exported program that holds c kernels. A resolver failure is a
warning and the handler's error (an exception from inside XLA's thread could not reach the caller).
"""
from __future__ import annotations

import ctypes
import functools
import json
import warnings
from typing import Any

from tullax.errors import BackendUnavailableError, TullaxError

RESOLVER = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)


class ExportedKernelWarning(UserWarning):
    """A kernel an exported program names could not be built here."""


def resolve(identity: int, payload: str) -> int:
    """The handler's slot for the kernel ``payload`` describes, built and registered now; raises a TullaxError
    where it cannot be."""
    from tullax.backends import ffi

    if ffi.content_identity(payload) != identity:
        raise TullaxError("the kernel a program names does not match the spec its call carries")
    if payload == ffi.PERMUTE_PAYLOAD:
        found = ffi._permute_slot()
        if found is None:
            raise BackendUnavailableError("the XLA FFI handler's layout change is unavailable here")
        return found[0]
    if payload.startswith("permute:"):
        raise TullaxError("the program was exported with another version of tullax's XLA FFI handler")
    return _build(identity, payload)


def _build(identity: int, payload: str) -> int:
    from tullax import backends
    from tullax.backends.base import Signature
    from tullax.backends.c.backend import generator_fingerprint
    from tullax.spec.serial import from_json

    found = json.loads(payload)
    if found.get("generator") != generator_fingerprint():
        raise TullaxError("the program was exported by another version of tullax's C code generator: export it "
                          "again with this one")
    if "program" in found:  # a fused program's kernel: its call carries the printed module
        from tullax.backends import ffi
        from tullax.backends.program_host import packed_entry

        slot = ffi.register(packed_entry(found["program"], found["name"]), identity)
        if slot is None:
            raise BackendUnavailableError("the XLA FFI handler's table is full or the handler is unavailable")
        return slot
    spec = from_json(found["spec"])
    kernel = backends.resolve("c").build(spec, Signature(tuple(found["in"]), found["out"]))
    if getattr(kernel, "_packed", None) is None:
        raise TullaxError("the c kernel built for an exported program has no packed entry")
    slot = kernel.slot(identity)  # (a fast tier's kernel moves its slot to its optimised build when that lands)
    if slot is None:
        raise BackendUnavailableError("the XLA FFI handler's table is full or the handler is unavailable")
    return slot


def _callback(identity: int, pointer: int, length: int) -> int:
    try:  # nothing may escape into XLA's thread: a failure is -1, and the handler's error
        return resolve(identity, ctypes.string_at(pointer, length).decode("utf-8"))
    except Exception as err:  # noqa: BLE001
        warnings.warn(f"tullax: a c kernel of an exported program could not be built here: {err}",
                      ExportedKernelWarning, stacklevel=1)
        return -1


@functools.cache
def _installed() -> Any:
    return RESOLVER(_callback)  # kept alive for the life of the process: the handler holds its address


def prepare() -> None:
    """Make this process able to run exported programs that hold c kernels (see the module docstring)."""
    from tullax.backends import ffi

    ok, why = ffi.available()
    if not ok:
        raise BackendUnavailableError(f"c kernels cannot run as XLA custom calls here: {why}")
    ffi.set_resolver(_installed())


__all__ = ["ExportedKernelWarning", "prepare", "resolve"]
