"""A loaded ``c`` kernel: one C function of a compiled module, called through ctypes on NumPy buffers, or as a
custom call inside XLA's program (``tullax.backends.ffi``)."""
from __future__ import annotations

import ctypes
import threading
import time
from typing import Any, Sequence

import numpy as np

from tullax.backends import host, workload
from tullax.backends.base import Shapes
from tullax.backends.c.generate import generator_fingerprint
from tullax.backends.c.load import threads
from tullax.compiler.interface import KernelInterface
from tullax.printers.c_clear import CLEAR_BLOCK
from tullax.runtime import forks
from tullax.spec.ir import Spec

_CTYPES = {"float32": ctypes.c_float, "float64": ctypes.c_double, "bool": ctypes.c_bool, "int8": ctypes.c_int8,
           "int16": ctypes.c_int16, "int32": ctypes.c_int32, "int64": ctypes.c_int64, "uint8": ctypes.c_uint8,
           "uint16": ctypes.c_uint16, "uint32": ctypes.c_uint32, "uint64": ctypes.c_uint64}


class _Complex64(ctypes.Structure):
    """A ``float _Complex`` passed by value: the x86-64 and AArch64 C ABIs pass ``T _Complex`` as this struct of
    its two parts (ctypes has no complex type)."""

    _fields_ = [("real", ctypes.c_float), ("imag", ctypes.c_float)]


class _Complex128(ctypes.Structure):
    _fields_ = [("real", ctypes.c_double), ("imag", ctypes.c_double)]


_CTYPES.update(complex64=_Complex64, complex128=_Complex128)


def _numpy_scalar(value: Any, dtype: str) -> Any:
    if dtype in ("complex64", "complex128"):
        value = complex(value)
        return _CTYPES[dtype](value.real, value.imag)
    return np.dtype(dtype).type(value)


class CHostKernel:
    """``kernel(out, *inputs)``: one C function of a loaded module, called with pointers to the NumPy
    buffers (``host.marshal``), the sizes, the extents and the team size."""

    def __init__(self, generated: host.GeneratedModule, kernel: KernelInterface, spec: Spec, function: Any,
                 ready_ms: float, compiled: bool, clear: Any = None, packed: Any = None, library: str = "",
                 fast: bool = False):
        self.generated, self.kernel, self.spec = generated, kernel, spec
        self._plan = host.ArgumentPlan.of(kernel, spec, scalar=_numpy_scalar, rank0_as_vector=True)
        self._arrays = len(kernel.arrays)
        self._extents = tuple((k, axis) for k, a in enumerate(kernel.arrays) for axis in range(1, a.rank))
        self._bind(function, clear)
        # the function, the module's parallel clear (``tullax.printers.c_clear``) if it has one, and the packed
        # entry (``tullax.printers.c_packed``) that XLA's FFI handler calls (``ffi_call``); replaced together
        # when the optimised build of a fast tier's kernel lands (``switch``)
        self._function, self._clear, self._packed, self._library = function, clear, packed, library
        self._threads: dict[tuple[int, ...], int] = {}  # size arguments -> team size
        self._ready_ms, self._compiled = ready_ms, compiled
        self._ran = fast  # the fast tier's first run is not the module's (its timings are the optimised build's)
        self._lock = threading.Lock()
        self.teams_run: set[int] = set()  # the team sizes calls have run with (1: the serial variant)
        self.optimised = threading.Event()  # set once it runs its optimised build (``tullax.backends.c.tiers``)
        if not fast:
            self.optimised.set()
        self._slots: set[int] = set()  # the FFI handler's slots it was registered in

    @property
    def library(self) -> str:
        """The path of its compiled library ('' for the fast tier's, which is in memory)."""
        return self._library

    def _bind(self, function: Any, clear: Any) -> None:
        function.argtypes = ([ctypes.c_void_p] * self._arrays + [_CTYPES[s.dtype] for s in self.kernel.scalars]
                             + [ctypes.c_int64] * (len(self.kernel.sizes) + len(self._extents)) + [ctypes.c_int])
        function.restype = None
        if clear is not None:
            clear.argtypes, clear.restype = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int], None

    def switch(self, library: str) -> None:
        """Run the functions of the optimised ``library`` from now on, here and in every XLA program traced
        with this kernel (its slots in the FFI handler's table). The fast tier's code stays valid: a call
        running it finishes there."""
        from tullax.backends import ffi
        from tullax.backends.c.load import load_library
        from tullax.printers.c_clear import CLEAR_FUNCTION
        from tullax.printers.c_packed import PACKED_SUFFIX

        lib = load_library(library)
        function, clear = getattr(lib, self.kernel.name), getattr(lib, CLEAR_FUNCTION, None)
        packed = getattr(lib, self.kernel.name + PACKED_SUFFIX, None)
        self._bind(function, clear)
        with self._lock:
            self._function, self._clear, self._packed, self._library = function, clear, packed, library
            slots = sorted(self._slots)
        if packed is not None:
            for slot in slots:
                ffi.replace(slot, ctypes.cast(packed, ctypes.c_void_p).value)
        self.optimised.set()

    def __call__(self, out, *inputs) -> None:
        self.run(out, inputs, host.call_shapes(self.spec, out, inputs))

    def run(self, out, inputs: Sequence[Any], shapes: Shapes) -> None:
        args, copy_back = host.marshal(self._plan, out, inputs, shapes)
        arrays = args[:self._arrays]
        sizes = args[self._arrays + len(self.kernel.scalars):]
        team = self._team(sizes, shapes)
        call = ([a.ctypes.data for a in arrays] + args[self._arrays:]
                + [arrays[k].shape[axis] for k, axis in self._extents] + [team])
        if self._ran:
            self._function(*call)
        else:
            start = time.perf_counter()
            self._function(*call)
            self._first_run((time.perf_counter() - start) * 1e3)
        if copy_back is not None:
            out[...] = copy_back

    def ffi_call(self, operands: Sequence[Any], result: Any, shapes: Shapes,
                 aliases: dict[int, int] | None) -> tuple[Any, int] | None:
        """The kernel as a custom call inside XLA's program (``tullax.backends.ffi``), on jax values
        ``operands`` (one per spec input, traced) for the ``result`` (a ShapeDtypeStruct) of ``shapes``: its
        value and the handler's slot (which counts its launches). None where it cannot run so (no handler here,
        a library without the packed entry, a full table): the caller takes the buffer callback. Everything the
        call needs is worked out now, at trace time: the sizes and extents are static under jit."""
        from tullax.backends import ffi

        plan = self._plan
        pointers = 1 + len(plan.arrays) + len(plan.scalars)
        packed = self._packed
        if packed is None or pointers > ffi.MAX_POINTERS or not ffi.available()[0]:
            return None
        # XLA's buffers must hold exactly the element types the kernel reads and writes (a narrow integer result,
        # say, is computed by a kernel of int64: its buffers are not this one's)
        given = [np.dtype(result.dtype)] + [np.dtype(operands[position].dtype) for position in plan.arrays]
        if [np.dtype(a.dtype) for a in self.kernel.arrays] != given:
            return None
        payload = ffi.kernel_payload(self.spec, [np.dtype(o.dtype).name for o in operands],
                                     np.dtype(result.dtype).name, generator_fingerprint())
        identity = ffi.content_identity(payload)
        slot = self.slot(identity)
        if slot is None:
            return None
        sizes = plan.size_values(shapes)
        names = self.spec.input_names
        array_shapes = [(1,) if plan.rank0_as_vector else tuple(result.shape)]
        array_shapes += [tuple(shapes[names[position]]) for position in plan.arrays]
        extents = [array_shapes[k][axis] for k, axis in self._extents]
        values = list(operands)
        for position, dtype in plan.scalars:  # passed by address: in the type the kernel reads
            if values[position].dtype != np.dtype(dtype):
                values[position] = values[position].astype(dtype)
        sources = [0] + [position + 1 for position in plan.arrays] + [position + 1 for position, _ in plan.scalars]
        meta = ffi.meta(slot, identity, self._team(sizes, shapes), sources, [*sizes, *extents])
        return ffi.call(meta, values, result, aliases, payload), slot

    def slot(self, identity: int) -> int | None:
        """The FFI handler's slot of this kernel's packed entry under ``identity`` (registered once per process),
        None where there is none; a fast tier's kernel switching to its optimised build replaces it there."""
        from tullax.backends import ffi

        with self._lock:
            packed = self._packed
        if packed is None:
            return None
        slot = ffi.register(ctypes.cast(packed, ctypes.c_void_p).value, identity)
        if slot is None:
            return None
        with self._lock:  # a switch meanwhile did not see this slot: it gets the optimised build here
            self._slots.add(slot)
            current = self._packed
        if current is not packed and current is not None:
            ffi.replace(slot, ctypes.cast(current, ctypes.c_void_p).value)
        return slot

    def prepare(self, shapes: Shapes, *, read_only: bool = False) -> None:
        """Nothing to do: the module was compiled (or loaded) when it was built."""

    def clear_bytes(self, address: int, nbytes: int) -> None:
        """Zero ``nbytes`` from ``address`` (a '+=' step's fresh output, ``runtime.exchange.start_from_zeros``):
        in parallel on the kernel's team where the module has its clear and the output spans several of its
        blocks, else with one memset."""
        if self._clear is None or nbytes < 2 * CLEAR_BLOCK:
            ctypes.memset(address, 0, nbytes)
        else:
            self._clear(address, nbytes, threads())

    def _team(self, sizes: Sequence[int], shapes: Shapes) -> int:
        key = tuple(sizes)
        found = self._threads.get(key)
        if found is None:
            found = self._threads[key] = 1 if workload.runs_serially(self.spec, shapes) else threads()
            self.teams_run.add(found)
        if found > 1 and forks.lost(forks.OPENMP):  # a team chosen before a fork: one thread in the child
            return 1
        return found

    def _first_run(self, run_ms: float) -> None:
        with self._lock:
            if self._ran:
                return
            self._ran = True
        host.record_first_run(self.generated, self.kernel.name, ready_ms=self._ready_ms, run_ms=run_ms,
                              warm=not self._compiled, ready_field="compile_ms" if self._compiled else "load_ms")
