"""Lowering for another platform than the process computes on (``.lower(lowering_platforms=("cuda",))`` on this
CPU host, as ``jax.export`` does), and exporting for several platforms at once: a kernel ``auto`` planned lowers to
XLA's form for that platform (no Python callback, no race timed on the host); a kernel on a named loop backend
raises a TullaxError that says why (never a bare ValueError from inside jax)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tullax
from tests.loop_backends import c_param
from tullax.errors import TullaxError

DIST = "D[i,j] := (W[k,i] - X[k,j])^2"
BACKENDS = ["auto", c_param(), "numba", "xla"]
SERVES_ANY_PLATFORM = ("auto", "xla")  # the loop backends run through callbacks: lowered here for the CPU only
CALLBACK_TARGETS = ("xla_python", "xla_ffi_python", "tullax_c_kernel")


def _inputs() -> tuple[jax.Array, jax.Array]:
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.standard_normal((6, 5)), jnp.float32), jnp.asarray(rng.standard_normal((6, 4)),
                                                                               jnp.float32))


def _functions(backend: str) -> dict:
    kernel = tullax.einsum_kernel(DIST, backend=backend)
    W, X = _inputs()
    return {
        "forward": (kernel, (W, X)),
        "grad": (jax.grad(lambda W, X: jnp.sum(kernel(W, X) ** 2), (0, 1)), (W, X)),
        "vmap": (jax.vmap(kernel, in_axes=(0, None)), (jnp.stack([W, 2 * W, 3 * W]), X)),
    }


def _custom_calls(text: str) -> list[str]:
    return [target for target in CALLBACK_TARGETS if target in text]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["forward", "grad", "vmap"])
def test_lowering_for_cuda_on_a_cpu_host(backend: str, kind: str) -> None:
    from tullax.planner import decide

    function, args = _functions(backend)[kind]
    traced = jax.jit(function).trace(*args)
    timed = decide.STATS["timed"]
    if backend in SERVES_ANY_PLATFORM:
        text = traced.lower(lowering_platforms=("cuda",)).as_text()
        assert _custom_calls(text) == [], f"a host kernel in a cuda program: {_custom_calls(text)}"
    else:
        with pytest.raises(TullaxError, match="cuda"):
            traced.lower(lowering_platforms=("cuda",))
    assert decide.STATS["timed"] == timed, "lowering for cuda timed a race on the host"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["forward", "grad", "vmap"])
def test_export_for_cpu_and_cuda(backend: str, kind: str) -> None:
    """``jax.export`` for both platforms: the CPU branch runs here (deserialised) and equals the jitted call."""
    from jax import export

    function, args = _functions(backend)[kind]
    checks = [export.DisabledSafetyCheck.custom_call("tullax_c_kernel")]
    exporting = export.export(jax.jit(function), platforms=("cpu", "cuda"), disabled_checks=checks)
    if backend not in SERVES_ANY_PLATFORM:
        with pytest.raises(TullaxError):
            exporting(*args)
        return
    exported = export.deserialize(exporting(*args).serialize())
    assert exported.platforms == ("cpu", "cuda")
    got, want = exported.call(*args), jax.jit(function)(*args)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", [c_param(), "numba"])
def test_export_for_the_cpu_alone(backend: str) -> None:
    """For the CPU alone the c kernel is exported as its custom call; numba's callback cannot be: a TullaxError."""
    from jax import export

    function, args = _functions(backend)["grad"]
    checks = [export.DisabledSafetyCheck.custom_call("tullax_c_kernel")]
    exporting = export.export(jax.jit(function), platforms=("cpu",), disabled_checks=checks)
    if backend == "numba":
        with pytest.raises(TullaxError, match="callback"):
            exporting(*args)
        return
    exported = exporting(*args)
    assert "tullax_c_kernel" in exported.mlir_module()
    for g, w in zip(export.deserialize(exported.serialize()).call(*args), jax.jit(function)(*args)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_auto_races_only_when_lowered_for_this_host(monkeypatch) -> None:
    """A close call ``auto`` has not decided yet is traced with the plan known without timing; its race waits for
    the lowering: none while tracing, none for a cuda lowering or an export (they never run on this host's CPU),
    one when the jitted call is lowered to run here."""
    from jax import export

    from tullax.planner import decide, store, tuning

    monkeypatch.setenv(tuning.TIMING_ENV, "1")
    monkeypatch.setattr(store, "load", lambda key: None)  # no decision of an earlier run: it must be raced
    monkeypatch.setattr(store, "store", lambda *args, **kwargs: None)
    decide.forget()
    try:
        kernel = tullax.einsum_kernel(DIST, backend="auto")
        rng = np.random.default_rng(1)
        W, X = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((64, 300), (64, 200)))
        traced = jax.jit(kernel).trace(W, X)
        traced.lower(lowering_platforms=("cuda",))
        checks = [export.DisabledSafetyCheck.custom_call("tullax_c_kernel")]
        export.export(jax.jit(kernel), platforms=("cpu",), disabled_checks=checks)(W, X)
        assert decide.STATS["timed"] == 0, "a race was timed while tracing or lowering for export/another platform"
        got = jax.jit(kernel)(W, X)
        assert decide.STATS["timed"] == 1
        np.testing.assert_allclose(got, ((W[:, :, None] - X[:, None, :]) ** 2).sum(0), rtol=1e-4, atol=1e-3)
    finally:
        decide.forget()


def test_a_differentiated_auto_kernel_races_nothing_while_traced_for_export(monkeypatch) -> None:
    """The joint plan of a differentiated call (the forward and its gradient steps as one XLA program) needs the
    races of all its kernels: traced for an export it raced them all; now its kernels are traced with the joint
    call pending, decided when the program is lowered to run here. The gradient as a whole (``planner.autodiff``:
    the derived steps or JAX's autodiff of the forward's form) is decided when the call is traced, timed on this
    host's platform, and holds for that platform alone: here an earlier process decided it (autodiff on this CPU,
    then the derived steps), and a lowering for cuda from this CPU host keeps the derived steps either way."""
    from jax import export

    from tullax.jaxop.autodiff import SCOPE
    from tullax.planner import autodiff, decide, store, tuning
    from tullax.spec.frontend import compile_spec

    monkeypatch.setenv(tuning.TIMING_ENV, "1")
    _, spec = compile_spec(DIST)
    shapes = {"W": (64, 300), "X": (64, 200)}
    call = autodiff._call(spec, shapes, {"W": "float32", "X": "float32"})
    gradient_key = autodiff.decision_key(call, "float32", ["W", "X"], "cpu")
    decided = {"candidate": "autodiff:grid"}
    # no decision of an earlier run for the kernels: they must be raced
    monkeypatch.setattr(store, "load", lambda key: dict(decided) if key == gradient_key else None)
    monkeypatch.setattr(store, "store", lambda *args, **kwargs: None)
    decide.forget()
    try:
        kernel = tullax.einsum_kernel(DIST, backend="auto")
        rng = np.random.default_rng(1)
        W, X = (jnp.asarray(rng.standard_normal(shapes[n]), jnp.float32) for n in ("W", "X"))

        def gradient():
            return jax.jit(jax.grad(lambda W, X: jnp.sum(kernel(W, X) ** 2), (0, 1)))

        cpu = gradient().trace(W, X).lower().as_text(debug_info=True)
        assert SCOPE in cpu and "tullax_kernel" not in cpu  # the decision timed on this CPU, for the CPU
        cuda = gradient().trace(W, X).lower(lowering_platforms=("cuda",)).as_text(debug_info=True)
        assert SCOPE not in cuda, "the cuda lowering holds a decision timed on the CPU"
        assert "tullax_kernel" in cuda, "the cuda lowering lost the derived steps"
        decided["candidate"] = autodiff.DERIVED
        decide.forget()
        checks = [export.DisabledSafetyCheck.custom_call("tullax_c_kernel")]
        export.export(gradient(), platforms=("cpu",), disabled_checks=checks)(W, X)
        assert decide.STATS["timed"] == 0, "a race was timed while tracing a differentiated call for export"
        assert autodiff.STATS["timed"] == 0
        got = gradient()(W, X)
        assert decide.STATS["timed"] >= 1
        want = jax.grad(lambda W, X: jnp.sum(((W[:, :, None] - X[:, None, :]) ** 2).sum(0) ** 2), (0, 1))(W, X)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-2 * float(jnp.abs(w).max()))
    finally:
        decide.forget()
