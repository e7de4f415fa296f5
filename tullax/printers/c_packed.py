"""The packed entry a C module exports beside each kernel: ``<name>_packed(pointers, integers, team)``, the kernel
called with its arguments in two arrays. It is the one signature every kernel shares, so one compiled XLA FFI
handler (``tullax.backends.ffi``) calls any kernel of any module inside XLA's own program.

The C printer prints it (``tullax.printers.c.kernel_function``); the ``c`` backend looks ``PACKED_SUFFIX`` up in a
loaded library. This module imports only the errors: a warm process loads a module's library without the printer.
"""
from __future__ import annotations

from typing import Any, Sequence

from tullax.errors import TullaxError

PACKED_SUFFIX = "_packed"  # void <kernel>_packed(void* const* tx_p, const tx_i64* tx_n, const int tx_threads)
POINTER_KINDS = ("array", "scalar")  # parameters passed in tx_p: arrays' data, then pointers to scalars' values
INTEGER_KINDS = ("size", "extent")  # parameters passed in tx_n, in order


def packed_source(name: str, params: Sequence[Any], threads: str) -> str:
    """The packed entry of kernel ``name`` whose parameters (``tullax.printers.clike.Parameter``, the team size
    ``threads`` apart) are ``params``, in order: pointers first, then integers."""
    pointers = [p for p in params if p.kind in POINTER_KINDS]
    integers = [p for p in params if p.kind in INTEGER_KINDS]
    if [p.name for p in params] != [p.name for p in pointers + integers]:
        raise TullaxError(f"internal error: {name}'s parameters are not pointers then integers")
    args = [f"({p.ctype})tx_p[{k}]" if p.kind == "array" else f"*(const {p.ctype}*)tx_p[{k}]"
            for k, p in enumerate(pointers)]
    args += [f"tx_n[{k}]" for k in range(len(integers))] + [threads]
    call = ",\n        ".join(args)
    return (f"// {name}{PACKED_SUFFIX}: {name} with its pointers in tx_p and its sizes and extents in tx_n\n"
            f"void {name}{PACKED_SUFFIX}(void* const* tx_p, const tx_i64* tx_n, const int {threads})\n"
            f"{{\n    (void)tx_p; (void)tx_n;\n    {name}(\n        {call});\n}}\n")


__all__ = ["INTEGER_KINDS", "PACKED_SUFFIX", "POINTER_KINDS", "packed_source"]
