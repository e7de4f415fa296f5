"""Fused programs (issue 50, ``tullax.compiler.fuse``) on the host: one loop kernel printed as C (compiled into a
library stored in the compile cache's ``programs`` folder, named by its source) or as Numba (run from memory),
called on NumPy buffers. A fused kernel's parameters are the program's external inputs and its one output; the
sizes are evaluated from the shapes of the inputs and of every statement's result (``program_shapes``).

Inside XLA the C kernel is a custom call whose payload carries the printed module itself (``program_payload``), so
a process that never traced the program (a ``jax.export`` artefact, JAX's persistent cache) builds it from that
(``tullax.backends.c.exported``), as a single kernel's call carries its spec."""
from __future__ import annotations

import ctypes
import functools
import types
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tullax.compiler.loops import LoopKernel, eval_int, parallel_nest

Shapes = Mapping[str, tuple[int, ...]]
_CTYPES = {"float32": ctypes.c_float, "float64": ctypes.c_double, "int64": ctypes.c_int64}


def size_values(kernel: LoopKernel, shapes: Shapes) -> list[int]:
    return [int(size.size.eval(shapes)) for size in kernel.sizes]


def outputs(kernel: LoopKernel) -> int:
    """How many returned outputs the fused kernel writes (its first array parameters)."""
    return sum(a.role != "in" for a in kernel.arrays)


def arguments(kernel: LoopKernel, out: np.ndarray | Sequence[np.ndarray], values: Mapping[str, Any]
              ) -> tuple[list[Any], list[Any]]:
    """(arrays in parameter order, ``out`` first (one array, or one per returned output), as C-contiguous NumPy
    arrays of the kernel's dtypes; scalars as NumPy scalars of theirs)."""
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    arrays = outs + [np.ascontiguousarray(np.asarray(values[a.source], a.dtype))
                     for a in kernel.arrays[len(outs):]]
    scalars = [np.dtype(s.dtype).type(values[s.source]) for s in kernel.scalars]
    return arrays, scalars


def program_library(source: str) -> str:
    """The compiled library of a printed C module of fused kernels, in the compile cache (compiled now if absent)."""
    from tullax.backends.c.compile import compile_library
    from tullax.backends.c.generate import library_file
    from tullax.runtime.cache import get_cache

    folder = Path(get_cache().root) / "programs"
    folder.mkdir(parents=True, exist_ok=True)
    library = folder / library_file(source)
    if not library.is_file():
        text = library.with_suffix(".c")
        text.write_text(source, encoding="utf-8")
        compile_library(text, library, units=1)
    return str(library)


def program_payload(source: str, name: str) -> str:
    """What a fused kernel's custom call carries: its printed module, its name and the code generator's
    fingerprint (a packed entry of another generator may take another layout)."""
    import json

    from tullax.backends.c.generate import generator_fingerprint

    return json.dumps({"program": source, "name": name, "generator": generator_fingerprint()},
                      separators=(",", ":"))


def packed_entry(source: str, name: str) -> int:
    """The address of the packed entry (what the FFI handler calls) of kernel ``name`` of the module ``source``."""
    from tullax.backends.c.load import load_library

    return ctypes.cast(getattr(load_library(program_library(source)), f"{name}_packed"), ctypes.c_void_p).value


class CProgram:
    """The fused kernel printed as C (``tullax.printers.c``), compiled once per source."""

    def __init__(self, kernel: LoopKernel):
        from tullax.backends.c.load import load_library
        from tullax.printers.c import print_module

        self.kernel = kernel
        source = print_module([kernel])
        library = program_library(source)
        function = getattr(load_library(library), kernel.name)
        self._extents = tuple((k, axis) for k, a in enumerate(kernel.arrays) for axis in range(1, a.rank))
        function.argtypes = ([ctypes.c_void_p] * len(kernel.arrays) + [_CTYPES[s.dtype] for s in kernel.scalars]
                             + [ctypes.c_int64] * (len(kernel.sizes) + len(self._extents)) + [ctypes.c_int])
        function.restype = None
        self._function = function
        self._packed = getattr(load_library(library), f"{kernel.name}_packed")
        self._source = source
        self.slot: int | None = None

    def __call__(self, out: np.ndarray, values: Mapping[str, Any], shapes: Shapes) -> None:
        from tullax.backends.c.load import threads

        arrays, scalars = arguments(self.kernel, out, values)
        self._function(*[a.ctypes.data for a in arrays], *scalars, *size_values(self.kernel, shapes),
                       *[arrays[k].shape[axis] for k, axis in self._extents], threads())


    def ffi_call(self, names: Sequence[str], operands: Sequence[Any], shapes: Shapes, result: Any) -> Any | None:
        """The kernel as a custom call inside XLA's program (``tullax.backends.ffi``, as a c kernel's) on the
        program's inputs ``operands`` (jax values in the order of ``names``, scalars as 0-d arrays of the
        kernel's dtype), or None where the handler is not there: the caller takes the buffer callback.
        ``result``: one ShapeDtypeStruct, or a tuple of one per returned output (the call returns as many)."""
        from tullax.backends import ffi
        from tullax.backends.c.load import threads

        kernel = self.kernel
        if len(kernel.arrays) + len(kernel.scalars) > ffi.MAX_POINTERS or not ffi.available()[0]:
            return None
        payload = program_payload(self._source, kernel.name)
        identity = ffi.content_identity(payload)
        slot = ffi.register(ctypes.cast(self._packed, ctypes.c_void_p).value, identity)
        if slot is None:
            return None
        self.slot = slot  # the handler's slot: ffi.launches(slot) counts the kernel's runs
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        position = {name: k + 1 for k, name in enumerate(names)}
        sources = ([-k for k in range(len(results))] + [position[a.source] for a in kernel.arrays[len(results):]]
                   + [position[s.source] for s in kernel.scalars])  # -k: the call's result k
        array_shapes = ([tuple(r.shape) for r in results]
                        + [tuple(shapes[a.source]) for a in kernel.arrays[len(results):]])
        extents = [array_shapes[k][axis] for k, axis in self._extents]
        meta = ffi.meta(slot, identity, threads(), sources, [*size_values(kernel, shapes), *extents])
        found = ffi.call(meta, list(operands), results if isinstance(result, (tuple, list)) else result, None,
                         payload)
        return tuple(found) if isinstance(result, (tuple, list)) else found


class NumbaProgram:
    """The fused kernel printed as Numba (``tullax.printers.numba``), its chunk variant run on the host's threads
    over the rows (``tullax.backends.numba.threads``)."""

    def __init__(self, kernel: LoopKernel):
        from tullax.backends.numba.modules import import_numba
        from tullax.printers.numba import chunked, print_module

        numba = import_numba()
        self.kernel, self._numba = kernel, numba
        module = types.ModuleType(f"tullax_program_{kernel.name}")
        exec(compile(print_module([kernel], disk_cache=False), f"<tullax program {kernel.name}>", "exec"),
             module.__dict__)
        self._function: Callable[..., Any] = getattr(module, kernel.name)
        self._chunked = chunked(kernel)
        self._outer = parallel_nest(kernel)[0][0]

    def __call__(self, out: np.ndarray, values: Mapping[str, Any], shapes: Shapes) -> None:
        from tullax.backends.numba.threads import run_chunks

        arrays, scalars = arguments(self.kernel, out, values)
        sizes = size_values(self.kernel, shapes)
        args: Sequence[Any] = [*arrays, *scalars, *sizes]
        if not self._chunked:
            self._function(*args)
            return
        env = {s.name: v for s, v in zip(self.kernel.sizes, sizes)}
        start, stop = eval_int(self._outer.start, env), eval_int(self._outer.stop, env)
        run_chunks(self._function, args, start, stop, self._numba.get_num_threads())


HOSTS = {"c": CProgram, "numba": NumbaProgram}


@functools.lru_cache(maxsize=128)
def host_program(backend: str, kernel: LoopKernel) -> CProgram | NumbaProgram:
    """The compiled fused kernel for ``backend`` (``c`` or ``numba``), once per kernel in a process."""
    return HOSTS[backend](kernel)
