"""The backend registry: ``register`` a backend object under its name, ``get`` it back by name, and read what
it declares it can do with ``capabilities``."""
from __future__ import annotations

import importlib
from typing import Iterable

from tullax.backends.base import NO_CAPABILITIES, Backend, Capabilities
from tullax.errors import BackendUnavailableError

_REGISTRY: dict[str, Backend] = {}
# Built-in backends are imported lazily, so `import tullax` loads neither numba nor juliacall nor jax.
_BUILTIN = {
    "xla": "tullax.backends.xla.backend:XlaBackend",
    "numba": "tullax.backends.numba.backend:NumbaBackend",
    "julia": "tullax.backends.julia.backend:JuliaBackend",
    "julia-cuda": "tullax.backends.julia.backend:JuliaCudaBackend",
    "cuda": "tullax.backends.cuda.backend:CudaBackend",
    "c": "tullax.backends.c.backend:CBackend",
}
# The order `auto` tries them in: Julia when present (docs/design.md, section 4), else host C where a C compiler works
# (one compiler run per module: a fraction of Numba's compile time, so the first call of a kernel is fast),
# else Numba (embedded: it needs no compiler), else XLA.
AUTO_ORDER = ("julia", "c", "numba", "xla")


def register(name: str, backend: Backend) -> None:
    """Make ``backend`` available as ``einsum_kernel(..., backend=name)``."""
    _REGISTRY[name] = backend


def names() -> tuple[str, ...]:
    return tuple(dict.fromkeys(list(_BUILTIN) + list(_REGISTRY)))


def _load_builtin(name: str) -> Backend | None:
    target = _BUILTIN.get(name)
    if target is None:
        return None
    module_name, cls = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:  # a backend module that does not exist yet in this install
        if err.name and err.name.startswith("tullax"):
            return None
        raise
    backend = getattr(module, cls)()
    _REGISTRY[name] = backend
    return backend


def get(name: str) -> Backend:
    """The backend registered as ``name``; BackendUnavailableError lists the valid names otherwise."""
    if not isinstance(name, str):
        raise BackendUnavailableError(f"a backend name is a string, got {type(name).__name__}")
    backend = _REGISTRY.get(name) or _load_builtin(name)
    if backend is None:
        raise BackendUnavailableError(
            f"unknown backend {name!r}: valid names are {', '.join(names())} (or 'auto')")
    return backend


def loaded() -> tuple[Backend, ...]:
    """The backends this process has made so far (a built-in one is made on first use)."""
    return tuple(_REGISTRY.values())


def capabilities(backend: Backend) -> Capabilities:
    """What ``backend`` declares it can do beyond the Backend protocol's three methods. The built-in backends
    all declare it; a backend registered from outside tullax without a ``capabilities`` attribute (a plain
    host backend: availability, build, generate_source) declares nothing."""
    return getattr(backend, "capabilities", NO_CAPABILITIES)


def availability() -> list[tuple[str, bool, str]]:
    """(name, usable here, reason or how to fix) for every known backend."""
    rows = []
    for name in names():
        try:
            ok, why = get(name).availability()
        except BackendUnavailableError as err:
            ok, why = False, str(err)
        rows.append((name, ok, why))
    return rows


def _auto_candidates() -> tuple[str, ...]:
    """AUTO_ORDER, minus the one LLVM-carrying backend that would join another already loaded here."""
    import sys

    skip = set()
    if "numba" in sys.modules:
        skip.add("julia")
    if "juliacall" in sys.modules:
        skip.add("numba")
    return tuple(c for c in AUTO_ORDER if c not in skip)


def takes(backend: Backend, dtypes: Iterable[str]) -> bool:
    """Whether ``backend`` computes with every dtype of ``dtypes`` (a complex one needs ``complex_numbers``)."""
    return capabilities(backend).complex_numbers or not any(str(d).startswith("complex") for d in dtypes)


def warm_up(name: str) -> None:
    """Start, in the background, what resolving ``name`` will wait for: the C compiler's probe, and the imports
    and fingerprint of the c backend's first module (``c``, ``auto``: ``tullax.backends.c.warm``)."""
    if name in ("c", "auto"):
        from tullax.backends.c import warm

        warm.start()


def resolve(name: str, dtypes: Iterable[str] = ()) -> Backend:
    """``auto`` picks the first usable backend of AUTO_ORDER that takes ``dtypes`` (the call's, when known);
    any other name must be usable here."""
    if name == "auto":
        for candidate in _auto_candidates():
            try:
                backend = get(candidate)
            except BackendUnavailableError:
                continue
            if takes(backend, dtypes) and backend.availability()[0]:
                return backend
        raise BackendUnavailableError("no backend is usable here; run `tullax doctor`")
    backend = get(name)
    ok, why = backend.availability_now() if capabilities(backend).availability_now else backend.availability()
    if not ok:
        raise BackendUnavailableError(f"backend {name!r} is not usable here: {why}")
    return backend
