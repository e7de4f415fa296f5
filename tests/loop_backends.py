"""The host loop backends a test runs on, as pytest params: ``numba`` always, ``c`` skipped with the reason when
no C compiler builds OpenMP shared libraries here; and how a test runs one kernel on a host backend, and on the
XLA lowering in float64."""
from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

from tullax.backends.base import Signature
from tullax.spec.ir import Spec


@functools.cache
def c_unavailable() -> str:
    """Why the c backend cannot run here ("" when it can)."""
    from tullax.backends.c.compile import probe

    ok, why = probe()
    return "" if ok else why


def c_param() -> object:
    """``"c"`` as a pytest param, skipped with the reason where no C compiler works."""
    why = c_unavailable()
    return pytest.param("c", marks=pytest.mark.skipif(bool(why), reason=f"c backend: {why}"))


@functools.cache
def unavailable(name: str) -> str:
    """Why the registry's backend ``name`` cannot run here ("" when it can; ``auto`` always can)."""
    if name == "auto":
        return ""
    from tullax import backends

    ok, why = backends.get(name).availability()
    return "" if ok else why


def every_backend() -> list[object]:
    """Every backend of the registry and ``auto``, as pytest params: a test parametrised with them runs on a
    backend registered later too. One that cannot run here skips with its reason when the test runs (looking
    at availability while collecting would import numba and jax for every test module)."""
    from tullax import backends

    return [*backends.names(), "auto"]


def skip_unavailable(name: str) -> None:
    """Skip the running test when the backend ``name`` cannot run here."""
    why = unavailable(name)
    if why:
        pytest.skip(f"{name}: {why}")


def run_host(backend: Any, spec: Spec, env: dict, dtype: str = "float64") -> np.ndarray:
    """Build (once per process) and run the kernel of ``spec`` on ``env`` with a host ``backend``, as an eager
    call does (a new result starts as NaN, so a position the kernel never writes shows)."""
    inputs = [env[name] for name in spec.input_names]
    signature = Signature(tuple(np.asarray(v).dtype.name for v in inputs), dtype)
    shapes = {name: np.shape(v) for name, v in zip(spec.input_names, inputs)}
    if spec.assign == ":=":
        out = np.full(tuple(s.eval(shapes) for s in spec.out_shape), np.nan, dtype)
        if spec.is_scatter:
            out[...] = 0
    else:
        out = np.array(env[spec.out], dtype=dtype, copy=True)
    backend.build(spec, signature)(out, *inputs)
    return out


def xla_eval(spec: Spec, env: dict) -> np.ndarray:
    """The XLA lowering of ``spec`` on ``env``, in float64."""
    import jax

    from tullax.backends.xla.lower import lower

    with jax.enable_x64(True):
        return np.asarray(lower(spec)(env))
