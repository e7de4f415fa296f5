"""Importing the generated Numba modules: numba itself (after the two-LLVMs check), and a stored module as a
real, named module. Shared by the backend (``tullax.backends.numba.backend``) and its compile helper process
(``tullax.backends.numba.helper``), which must not import each other."""
from __future__ import annotations

import importlib.util
import sys
import types
import warnings
from pathlib import Path
from typing import Any

from tullax.backends import host
from tullax.runtime.cache import CacheWarning
from tullax.runtime.cache_files import remove


def import_numba():
    """Import numba (warning first if Julia's LLVM is loaded in this process)."""
    if "numba" not in sys.modules:
        host.warn_if_other_llvm_loaded("numba")
    import numba

    return numba


def module_code(loader: Any, path: Path) -> Any:
    """The module's code object. A damaged .pyc whose header still matches the source makes Python's loader
    fail (EOFError, ValueError: bad marshal data) on every import: it is deleted and the source compiled."""
    try:
        return loader.get_code(loader.name)
    except (EOFError, ValueError, TypeError) as err:
        bytecode = Path(importlib.util.cache_from_source(str(path)))
        remove(bytecode)
        warnings.warn(f"the bytecode {bytecode} of a cached tullax kernel was damaged ({type(err).__name__}: "
                      f"{err}); it was deleted", CacheWarning, stacklevel=4)
        return loader.get_code(loader.name)


def module_named(name: str, module: types.ModuleType, code: Any) -> types.ModuleType:
    # Registered so Numba finds the module by name: it records it in compiled code and imports it back when
    # loading from its disk cache (an unregistered module becomes '<dynamic>', which cannot be reloaded).
    sys.modules[name] = module
    exec(code, module.__dict__)
    return module


def import_stored_module(path: str | Path, key: str) -> types.ModuleType:
    """A new module object for the module stored in the cache entry ``key`` (its file is ``path``)."""
    import_numba()
    name = f"tullax_numba_{key}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    return module_named(name, importlib.util.module_from_spec(module_spec),
                         module_code(module_spec.loader, Path(path)))


# LLVM optimisation level of the ``_serial`` variants' IR passes. They only run calls below the serial work
# threshold (``tullax.backends.workload``: well under a millisecond of work), where O3's extra passes buy
# nothing measurable; O2 saves about 4% of the CPU time of a cold first kernel made of serial variants
# (Dist, conv1d forward plus gradients: 2.81 s against 2.94 s, 2.65 s against 2.76 s, means of three
# alternating processes; benchmarks/ttfk_breakdown.py). Small: most of a Numba compile is its own Python
# passes, and the machine-code level is fixed for the process (Numba's target machine is made once). O2 still
# runs LLVM's loop and SLP vectorisers, so a tiny contraction keeps its vector code. The parallel (chunk)
# variants stay at Numba's level: they run the large calls.
SERIAL_OPT = 2
SERIAL_SUFFIX = "_serial"


def compile_variant(function: Any, arg_types: tuple, chunk: bool = False) -> None:
    """``function.compile(arg_types)``, a ``_serial`` variant at ``SERIAL_OPT`` (never above the level that
    NUMBA_OPT asks for). Numba's pass builders read ``config.OPT`` when each compile optimises, so it is set
    for this compile only, under Numba's compiler lock (which every compile holds: no other one sees it).

    ``chunk``: a chunk variant (``tullax.printers.numba.chunked``) compiles with Numba's ``noalias`` flag,
    as Numba compiles the body of a prange (its gufunc) when its arrays do not alias: the array arguments are
    marked noalias for LLVM, which then hoists loads out of inner loops and vectorises them (the embedding
    gather ``W[ix[b],d]``: 2.6x slower without, its ``ix[b]`` read again for every ``d``). The arrays a
    kernel receives never overlap: inputs are only read, and the output is its own buffer (an in-place
    update is one ``inout`` argument)."""
    if chunk:
        _mark_noalias(function)
    if not function.__name__.endswith(SERIAL_SUFFIX):
        function.compile(arg_types)
        return
    from numba.core import config
    from numba.core.compiler_lock import global_compiler_lock

    with global_compiler_lock:
        saved = config.OPT
        config.OPT = type(saved)(min(int(saved), SERIAL_OPT))
        try:
            function.compile(arg_types)
        finally:
            config.OPT = saved


def _mark_noalias(function: Any) -> None:
    """Compile ``function``'s specialisations with ``flags.noalias`` (Numba has no decorator option for it;
    its dispatcher's compiler hands every compile's flags to ``_customize_flags`` first)."""
    compiler = function._compiler
    if getattr(compiler, "_tullax_noalias", False):
        return
    customize = compiler._customize_flags

    def with_noalias(flags: Any) -> Any:
        flags = customize(flags)
        flags.noalias = True
        return flags

    compiler._customize_flags = with_noalias
    compiler._tullax_noalias = True
