"""The XLA FFI handler both loop and XLA families use: one compiled library that runs the c backend's kernels inside
XLA's own program with no Python, and the layout change (``permute``) that XLA's forms call in place of a transpose.

``jax.experimental.buffer_callback`` runs a Python function on every call (the GIL, NumPy views of XLA's buffers,
the argument marshalling), and XLA's dispatch around it runs with cold caches after a large kernel: tens of
microseconds per call, most of a tiny kernel's cost and the gap between a row max read at memory speed and
``jnp.max`` (``benchmarks/ffi_call.py`` measures both paths). Here the call is a custom call of XLA's:

* The handler (``HANDLER_SOURCE``, C against XLA's FFI C API, ``xla/ffi/api/c_api.h`` from jaxlib's headers) is
  compiled once per (jaxlib, compiler, CPU) into the compile cache and registered with XLA as ``TARGET``.
* Every C kernel has a packed entry with one signature (``tullax.printers.c_packed``): the handler
  gathers the buffers' data pointers in the kernel's parameter order and passes the sizes and extents, which are
  static under jit and so worked out at trace time.
* A kernel is registered in the handler's table (``register``): the XLA program names its slot and identity (a
  hash of its content: ``content_identity``) in an int64 array attribute, never an address, and carries the
  kernel's spec and dtypes in a string attribute (``kernel_payload``). A program run in another process (JAX's
  persistent compilation cache, a ``jax.export`` artefact) whose slot does not hold that kernel there finds it by
  its identity, or has the resolver ``tullax.backends.c.exported`` installed build it from the payload; failing
  that it stops with an error instead of calling into someone else's code.
* The handler counts each slot's launches; ``tullax.runtime.stats`` reads them (``watch``).

Where this cannot work (no ``jax.ffi``, no headers, a compile error) the kernels keep the buffer callback;
``available()`` says why.

The handler's library also holds one kernel of its own, a layout change (``permute``: a transpose, with any axes
reversed, of an array of any dtype), which XLA programs on the CPU call in place of a transpose: XLA compiles
each transpose it emits into a loop of its own (tens of milliseconds per transpose on every first call of a
program in every process; an NCHW convolution has three, ``tullax.backends.xla.forms``), where this call
compiles to nothing.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import tempfile
import threading
from pathlib import Path
from typing import Any, Sequence

from tullax.backends.c.load import load_library, threads
from tullax.errors import TullaxError
from tullax.runtime import forks

TARGET = "tullax_c_kernel"
LIBRARY_FILE = "handler.so"
HANDLER_SPEC = "(the XLA FFI handler of c kernels)"  # its line in the cache index
SOURCE_FILE = "handler.c"
SLOTS = 65536  # kernels one process can register; beyond them kernels keep the buffer callback
MAX_POINTERS = 256  # arrays and scalars of one kernel: the handler's stack array

# meta: slot, identity, team, the count of pointers, the count of integers, then each pointer's operand (0: the
# result, k: argument k-1, -r: result r of a call with several, a fused program's), then the integers (sizes, then
# extents)
HEADER = 5

HANDLER_SOURCE = r"""
#include <stdint.h>
#include <string.h>
#ifdef __TINYC__
#include <stdatomic.h>  // tcc's: it defines GCC's __atomic_*_n builtins (the fast tier compiles this handler)
#endif
#include "xla/ffi/api/c_api.h"

typedef void (*tx_packed)(void* const*, const int64_t*, int);
typedef struct { tx_packed fn; int64_t identity; int64_t launches; } tx_slot;
#define TX_SLOTS @SLOTS@
#define TX_MAX_POINTERS @MAX_POINTERS@
#define TX_HEADER @HEADER@
static tx_slot tx_slots[TX_SLOTS];
static int64_t tx_used;

// A new slot for `fn` (its identity: the hash the XLA program names it by), or -1 when the table is full.
// Python calls it under its lock; the handler reads a slot only below tx_used, published after the slot.
int64_t tullax_ffi_register(void* fn, int64_t identity) {
    int64_t slot = __atomic_load_n(&tx_used, __ATOMIC_ACQUIRE);
    if (slot >= TX_SLOTS) return -1;
    tx_slots[slot].fn = (tx_packed)fn;
    tx_slots[slot].identity = identity;
    tx_slots[slot].launches = 0;
    __atomic_store_n(&tx_used, slot + 1, __ATOMIC_RELEASE);
    return slot;
}

// The optimised build of a kernel takes the place of its fast tier's (tullax.backends.c.tiers): a call reads the
// function once, so it runs one or the other, whole
void tullax_ffi_replace(int64_t slot, void* fn) {
    if (slot >= 0 && slot < __atomic_load_n(&tx_used, __ATOMIC_ACQUIRE))
        __atomic_store_n(&tx_slots[slot].fn, (tx_packed)fn, __ATOMIC_RELEASE);
}

void* tullax_ffi_function(int64_t slot) {
    return (void*)__atomic_load_n(&tx_slots[slot].fn, __ATOMIC_ACQUIRE);
}

// An exported program run in a process that never traced it names its kernels by content (their identity):
// the slot it names holds another kernel or none, so the handler finds the identity in its table, or asks the
// resolver Python installed (it compiles the kernel from the spec the call carries, or loads it from the compile
// cache, and registers it). The table only grows, so a found slot stays valid.
typedef int64_t (*tx_resolver)(int64_t identity, const char* payload, int64_t length);
static tx_resolver tx_resolve;

void tullax_ffi_set_resolver(void* fn) { __atomic_store_n(&tx_resolve, (tx_resolver)fn, __ATOMIC_RELEASE); }

static int64_t tx_find(int64_t identity) {
    const int64_t used = __atomic_load_n(&tx_used, __ATOMIC_ACQUIRE);
    for (int64_t k = 0; k < used; ++k)
        if (tx_slots[k].identity == identity) return k;
    return -1;
}

int64_t tullax_ffi_launches(int64_t slot) {
    return __atomic_load_n(&tx_slots[slot].launches, __ATOMIC_RELAXED);
}

static XLA_FFI_Error* tx_error(const XLA_FFI_CallFrame* frame, const char* message) {
    XLA_FFI_Error_Create_Args args;
    memset(&args, 0, sizeof args);
    args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
    args.message = message;
    args.errc = XLA_FFI_Error_Code_FAILED_PRECONDITION;
    return frame->api->XLA_FFI_Error_Create(&args);
}

// The layout change of an array (a packed kernel of the table): out[i_0, ..., i_{r-1}] = in[base + sum_k i_k *
// stride_k], strides in elements (negative where an axis is reversed). integers: element size, rank, the result's
// shape, the strides, base. The result's last two axes are copied in tiles (one of them is usually the input's
// contiguous axis); the rest are the parallel loop.
#define TX_TILE 16
#define TX_PLANE(T) do { \
    T* o = (T*)out; const T* s = (const T*)in; \
    for (int64_t a0 = 0; a0 < n0; a0 += TX_TILE) \
        for (int64_t a1 = 0; a1 < n1; a1 += TX_TILE) { \
            const int64_t e0 = a0 + TX_TILE < n0 ? a0 + TX_TILE : n0, e1 = a1 + TX_TILE < n1 ? a1 + TX_TILE : n1; \
            for (int64_t i = a0; i < e0; ++i) \
                for (int64_t j = a1; j < e1; ++j) o[to + i * n1 + j] = s[from + i * s0 + j * s1]; \
        } \
} while (0)
static void tx_plane(char* out, const char* in, int64_t size, int64_t to, int64_t from, int64_t n0, int64_t n1,
                     int64_t s0, int64_t s1) {
    switch (size) {
    case 1: TX_PLANE(uint8_t); break;
    case 2: TX_PLANE(uint16_t); break;
    case 4: TX_PLANE(uint32_t); break;
    case 8: TX_PLANE(uint64_t); break;
    default:
        for (int64_t i = 0; i < n0; ++i)
            for (int64_t j = 0; j < n1; ++j)
                memcpy(out + (to + i * n1 + j) * size, in + (from + i * s0 + j * s1) * size, size);
    }
}

void tullax_permute_packed(void* const* p, const int64_t* m, int team) {
    const int64_t size = m[0], rank = m[1];
    const int64_t* shape = m + 2;
    const int64_t* stride = m + 2 + rank;
    const int64_t base = m[2 + 2 * rank];
    const int64_t n0 = rank >= 2 ? shape[rank - 2] : 1, n1 = rank >= 1 ? shape[rank - 1] : 1;
    const int64_t s0 = rank >= 2 ? stride[rank - 2] : 0, s1 = rank >= 1 ? stride[rank - 1] : 0;
    int64_t outer = 1;
    for (int64_t k = 0; k + 2 < rank; ++k) outer *= shape[k];
    if (outer == 0 || n0 == 0 || n1 == 0) return;
    #pragma omp parallel for num_threads(team) if(team > 1 && outer > 1) schedule(static)
    for (int64_t q = 0; q < outer; ++q) {
        int64_t rest = q, from = base;
        for (int64_t k = rank - 3; k >= 0; --k) {
            from += (rest % shape[k]) * stride[k];
            rest /= shape[k];
        }
        tx_plane((char*)p[0], (const char*)p[1], size, q * n0 * n1, from, n0, n1, s0, s1);
    }
}

XLA_FFI_Error* tullax_ffi_handler(XLA_FFI_CallFrame* frame) {
    for (XLA_FFI_Extension_Base* ext = frame->extension_start; ext; ext = ext->next) {
        if (ext->type == XLA_FFI_Extension_Metadata) {  // XLA asks which FFI version this handler speaks
            XLA_FFI_Metadata* metadata = ((XLA_FFI_Metadata_Extension*)ext)->metadata;
            metadata->api_version.major_version = XLA_FFI_API_MAJOR;
            metadata->api_version.minor_version = XLA_FFI_API_MINOR;
            metadata->traits = 0;
            return NULL;
        }
    }
    if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE) return NULL;
    const XLA_FFI_Array* meta = NULL;
    const XLA_FFI_ByteSpan* payload = NULL;
    for (int64_t k = 0; k < frame->attrs.size; ++k) {
        const XLA_FFI_ByteSpan* name = frame->attrs.names[k];
        if (name->len == 4 && !memcmp(name->ptr, "meta", 4) && frame->attrs.types[k] == XLA_FFI_AttrType_ARRAY)
            meta = (const XLA_FFI_Array*)frame->attrs.attrs[k];
        else if (name->len == 4 && !memcmp(name->ptr, "spec", 4) && frame->attrs.types[k] == XLA_FFI_AttrType_STRING)
            payload = (const XLA_FFI_ByteSpan*)frame->attrs.attrs[k];
    }
    if (meta == NULL)
        return tx_error(frame, "tullax: a c kernel's custom call has no int64 meta array attribute");
    const int64_t* m = (const int64_t*)meta->data;
    if (meta->dtype != XLA_FFI_DataType_S64 || meta->size < TX_HEADER)
        return tx_error(frame, "tullax: a c kernel's meta attribute is not an int64 array of its header");
    int64_t slot = m[0];
    const int64_t pointers = m[3], integers = m[4];
    if (slot < 0 || slot >= __atomic_load_n(&tx_used, __ATOMIC_ACQUIRE) || tx_slots[slot].identity != m[1]) {
        slot = tx_find(m[1]);
        tx_resolver resolve = __atomic_load_n(&tx_resolve, __ATOMIC_ACQUIRE);
        if (slot < 0 && resolve != NULL && payload != NULL) slot = resolve(m[1], payload->ptr, (int64_t)payload->len);
        if (slot < 0 || slot >= __atomic_load_n(&tx_used, __ATOMIC_ACQUIRE) || tx_slots[slot].identity != m[1])
            return tx_error(frame, "tullax: this XLA program calls a c kernel that is not loaded in this process and "
                                   "could not be built from the spec it carries (call tullax.prepare_exported() "
                                   "before running an exported program; see the warnings it gives)");
    }
    if (pointers < 0 || pointers > TX_MAX_POINTERS || integers < 0
            || (int64_t)meta->size != TX_HEADER + pointers + integers)
        return tx_error(frame, "tullax: a c kernel's meta attribute is malformed");
    void* p[TX_MAX_POINTERS];
    for (int64_t k = 0; k < pointers; ++k) {
        const int64_t operand = m[TX_HEADER + k];
        if (operand <= 0) {
            if (frame->rets.size < 1 - operand || frame->rets.types[-operand] != XLA_FFI_RetType_BUFFER)
                return tx_error(frame, "tullax: a c kernel's custom call has no result buffer");
            p[k] = ((XLA_FFI_Buffer*)frame->rets.rets[-operand])->data;
        } else {
            if (operand < 1 || operand > frame->args.size || frame->args.types[operand - 1] != XLA_FFI_ArgType_BUFFER)
                return tx_error(frame, "tullax: a c kernel's meta attribute names an operand the call lacks");
            p[k] = ((XLA_FFI_Buffer*)frame->args.args[operand - 1])->data;
        }
    }
    const tx_packed fn = __atomic_load_n(&tx_slots[slot].fn, __ATOMIC_ACQUIRE);
    fn(p, m + TX_HEADER + pointers, (int)m[2]);
    __atomic_fetch_add(&tx_slots[slot].launches, 1, __ATOMIC_RELAXED);
    return NULL;
}
""".replace("@SLOTS@", str(SLOTS)).replace("@MAX_POINTERS@", str(MAX_POINTERS)).replace("@HEADER@", str(HEADER))

_LOCK = forks.lock()
_HANDLER_LOCK = forks.lock()
_SLOTS: dict[tuple[int, int], int] = {}  # (packed function's address, identity) -> slot


def _handler() -> tuple[Any, str]:
    """The loaded handler library, registered with XLA (None and why not, where it cannot be): built and
    registered once, whichever thread asks first (the forward and steps modules load on different threads)."""
    with _HANDLER_LOCK:
        return _load_handler()


@functools.cache
def _load_handler() -> tuple[Any, str]:
    try:
        import jax
        import jax.ffi
        import jaxlib
    except ImportError as err:
        return None, f"no jax.ffi ({err})"
    include = Path(jax.ffi.include_dir())
    if not (include / "xla" / "ffi" / "api" / "c_api.h").exists():
        return None, f"jaxlib ships no XLA FFI C header under {include}"
    version = getattr(jaxlib, "__version__", "?")
    try:
        lib = _fast_handler(include, version)
        if lib is None:
            lib = load_library(str(_library(include, version)))  # libgomp linked: the spin is bound first
        lib.tullax_ffi_register.argtypes, lib.tullax_ffi_register.restype = [ctypes.c_void_p, ctypes.c_int64], \
            ctypes.c_int64
        lib.tullax_ffi_launches.argtypes, lib.tullax_ffi_launches.restype = [ctypes.c_int64], ctypes.c_int64
        lib.tullax_ffi_set_resolver.argtypes, lib.tullax_ffi_set_resolver.restype = [ctypes.c_void_p], None
        lib.tullax_ffi_replace.argtypes, lib.tullax_ffi_replace.restype = [ctypes.c_int64, ctypes.c_void_p], None
        lib.tullax_ffi_function.argtypes, lib.tullax_ffi_function.restype = [ctypes.c_int64], ctypes.c_void_p
        jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.tullax_ffi_handler), platform="cpu")
    except Exception as err:  # noqa: BLE001 - any failure here only means "keep the buffer callback"
        return None, f"the XLA FFI handler could not be built or registered: {err}"
    return lib, ""


PERMUTE = "tullax_permute_packed"  # the handler library's own layout-change kernel
PARALLEL_ELEMENTS = 1 << 18  # a layout change of fewer elements runs on one thread: a team costs more


@functools.cache
def _permute_slot() -> tuple[int, int] | None:
    """(slot, identity) of the handler library's layout change in the handler's table, registered once per
    process; None without the handler."""
    lib, _ = _handler()
    if lib is None:
        return None
    kernel_identity = content_identity(PERMUTE_PAYLOAD)
    slot = register(ctypes.cast(getattr(lib, PERMUTE), ctypes.c_void_p).value, kernel_identity)
    return None if slot is None else (slot, kernel_identity)


def permute_available() -> bool:
    """Whether ``permute`` can run here (the handler builds and registers, once per process)."""
    return _permute_slot() is not None


def permute(value: Any, axes: Sequence[int], extents: Sequence[int] | None = None,
            reversed_axes: Sequence[int] = ()) -> Any:
    """``jnp.transpose(jnp.flip(value[:extents], reversed_axes), axes)`` on a jax value of any dtype (traced, on
    the CPU), as one custom call of the handler's layout change: the first ``extents[a]`` elements of each axis
    ``a`` (all of them without ``extents``), the axes in ``reversed_axes`` read backwards, result axis ``k``
    from axis ``axes[k]``. Call it only where ``permute_available()``."""
    import jax
    import numpy as np

    slot, kernel_identity = _permute_slot()
    shape = tuple(int(n) for n in value.shape)
    extents = shape if extents is None else tuple(int(n) for n in extents)
    if sorted(axes) != list(range(len(shape))) or any(not 0 <= e <= n for e, n in zip(extents, shape)):
        raise TullaxError(f"internal: permute's axes {tuple(axes)} and extents {extents} do not fit shape {shape}")
    contiguous = [1] * len(shape)
    for axis in range(len(shape) - 2, -1, -1):
        contiguous[axis] = contiguous[axis + 1] * shape[axis + 1]
    base = sum((extents[a] - 1) * contiguous[a] for a in set(reversed_axes) if extents[a] > 0)
    strides = [-contiguous[a] if a in reversed_axes else contiguous[a] for a in axes]
    out_shape = tuple(extents[a] for a in axes)
    elements = int(np.prod(out_shape, dtype=np.int64))
    team = 1
    if elements >= PARALLEL_ELEMENTS:
        team = threads()
    integers = [np.dtype(value.dtype).itemsize, len(shape), *out_shape, *strides, base]
    return call(meta(slot, kernel_identity, team, [0, 1], integers), [value],
                jax.ShapeDtypeStruct(out_shape, value.dtype), None, PERMUTE_PAYLOAD)


def available() -> tuple[bool, str]:
    """Whether c kernels can run as XLA custom calls in this process, and why not."""
    lib, why = _handler()
    return lib is not None, why


class _FastHandler:
    """The handler compiled by the c backend's fast tier (``tullax.backends.c.tiers``) into memory: its functions
    by name, as a loaded library's."""

    def __init__(self, compiled: Any):
        self._compiled = compiled

    def __getattr__(self, name: str) -> Any:
        address = self._compiled.address(name)
        if address is None:
            raise AttributeError(name)
        function = ctypes.CFUNCTYPE(None)(address)
        setattr(self, name, function)  # one object per name: its argtypes stay set
        return function


def _fast_handler(include: Path, jaxlib_version: str) -> Any:
    """Where tiers are on and the compile cache holds no handler: the handler compiled by tcc (milliseconds, where
    the optimising compiler takes 0.3-1.5 s on the first call's path), the optimising build started in a thread
    that stores it for later processes and moves the layout change to it. None otherwise."""
    from tullax.backends.c import tcc, tiers

    if not tiers.enabled() or _library(include, jaxlib_version, build=False, hit=False) is not None:
        return None
    try:
        lib = _FastHandler(tcc.compile_module(HANDLER_SOURCE, [include]))
        lib.tullax_ffi_handler  # noqa: B018 - a module without it is no handler
    except (TullaxError, AttributeError):
        return None
    if tiers.mode() != tiers.ONLY:
        threading.Thread(target=_optimise_handler, args=(include, jaxlib_version), name="tullax-ffi-optimise").start()
    return lib


def _optimise_handler(include: Path, jaxlib_version: str) -> None:
    """The optimised handler, built and stored; its layout change replaces the fast tier's in its slot (the
    slot is taken first, so a later registration cannot take the fast tier's function again)."""
    try:
        library = load_library(str(_library(include, jaxlib_version, background=True)))
        found = _permute_slot()
        if found is not None:
            replace(found[0], ctypes.cast(getattr(library, PERMUTE), ctypes.c_void_p).value)
    except Exception:  # noqa: BLE001 - the fast tier's layout change stays (correct); a thread must not raise
        pass


def _library(include: Path, jaxlib_version: str, build: bool = True, background: bool = False,
             hit: bool = True) -> Path | None:
    """The compiled handler: from the compile cache, or compiled now (and stored there); None where the cache
    holds none and not ``build``. ``hit=False``: a look that loads nothing counts no hit (the load after does)."""
    from tullax.backends.c import compile as c_compile
    from tullax.runtime.cache import cache_key, get_cache

    cache = get_cache()
    key = cache_key(kind="c-ffi-handler", source=HANDLER_SOURCE, jaxlib=jaxlib_version,
                    compiler=c_compile.identity())
    found, problem = cache.read_checked(key, LIBRARY_FILE)
    if found is not None and problem is None:
        if hit:
            cache.hit_later(key, spec=HANDLER_SPEC, backend="c", kind="ffi handler")
        return cache.entry_path(key) / LIBRARY_FILE
    if not build:
        return None
    with tempfile.TemporaryDirectory(prefix="tullax-ffi-") as scratch:
        source = Path(scratch) / SOURCE_FILE
        source.write_text(HANDLER_SOURCE, encoding="utf-8")
        built = Path(scratch) / LIBRARY_FILE
        c_compile.compile_library(source, built, units=1, include=(include,), background=background)
        data = built.read_bytes()
    stored = cache.write_bytes(key, LIBRARY_FILE, data)
    if stored is not None:
        cache.write_text(key, SOURCE_FILE, HANDLER_SOURCE)
        cache.record(key, spec=HANDLER_SPEC, backend="c", kind="ffi handler")
        return stored
    return c_compile.private_library(data, "tullax-ffi-")  # the cache stores nothing


# The payload the layout change's calls carry: the handler library's own kernel, of this handler's source
PERMUTE_PAYLOAD = "permute:" + hashlib.sha256(HANDLER_SOURCE.encode("utf-8")).hexdigest()[:16]


def content_identity(payload: str) -> int:
    """A kernel's identity in XLA programs: a hash of the payload its calls carry (``kernel_payload``: the spec,
    its dtypes and the code generator's fingerprint), so any process that builds the same kernel names it alike
    (a positive int64)."""
    digest = hashlib.sha256(f"tullax c kernel\0{payload}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def kernel_payload(spec: Any, in_dtypes: Sequence[str], out_dtype: str, generator: str) -> str:
    """What a kernel's custom call carries (its ``spec`` attribute): enough to build the kernel again in a process
    that never traced it (``tullax.backends.c.exported``)."""
    import json

    return json.dumps({"spec": _spec_json(spec), "in": list(in_dtypes), "out": out_dtype, "generator": generator},
                      separators=(",", ":"))


@functools.lru_cache(maxsize=4096)
def _spec_json(spec: Any) -> str:
    from tullax.spec.serial import to_json

    return to_json(spec)


def set_resolver(function: Any) -> bool:
    """Install ``function`` (a ctypes callback: identity, payload pointer, length -> slot or -1) as the handler's
    resolver of kernels an exported program names; False without the handler."""
    lib, _ = _handler()
    if lib is None:
        return False
    lib.tullax_ffi_set_resolver(ctypes.cast(function, ctypes.c_void_p))
    return True


def register(address: int, kernel_identity: int) -> int | None:
    """The handler's slot for the packed function at ``address`` (registered once per process); None when the
    handler is unavailable or its table is full."""
    lib, _ = _handler()
    if lib is None:
        return None
    with _LOCK:
        slot = _SLOTS.get((address, kernel_identity))
        if slot is None:
            slot = int(lib.tullax_ffi_register(address, kernel_identity))
            if slot < 0:
                return None
            _SLOTS[(address, kernel_identity)] = slot
    return slot


def replace(slot: int, address: int) -> None:
    """Call the packed function at ``address`` from the handler's ``slot`` on (a fast tier's kernel switching to
    its optimised build)."""
    lib, _ = _handler()
    if lib is not None:
        lib.tullax_ffi_replace(slot, address)


def function(slot: int) -> int | None:
    """The address of the packed function the handler's ``slot`` calls (None without the handler)."""
    lib, _ = _handler()
    return lib.tullax_ffi_function(slot) if lib is not None else None


def launches(slot: int) -> int:
    """How many times the handler ran the kernel of ``slot``."""
    lib, _ = _handler()
    return int(lib.tullax_ffi_launches(slot)) if lib is not None else 0


def meta(slot: int, kernel_identity: int, team: int, operands: Sequence[int], integers: Sequence[int]) -> Any:
    """The int64 attribute of one call (the handler's layout: ``HEADER``)."""
    import numpy as np

    return np.array([slot, kernel_identity, team, len(operands), len(integers), *operands, *integers], np.int64)


def call(meta_array: Any, operands: Sequence[Any], result: Any, aliases: dict[int, int] | None,
         payload: str) -> Any:
    """The custom call of one kernel on jax values ``operands`` (traced), returning its result; ``payload``: how
    another process builds the kernel (``kernel_payload``)."""
    import jax

    return jax.ffi.ffi_call(TARGET, result, input_output_aliases=aliases)(*operands, meta=meta_array, spec=payload)


__all__ = ["PERMUTE_PAYLOAD", "TARGET", "available", "call", "content_identity", "function", "kernel_payload",
           "launches", "meta", "register", "replace", "set_resolver"]
