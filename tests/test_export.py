"""A jitted function holding tullax c kernels (forward and gradient steps), exported with ``jax.export`` for the CPU
and run in a NEW process: its custom calls name each kernel by content and carry its spec, so that process builds
them (from its compile cache, or compiled from the spec when its cache is empty) and gives the same results."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tullax
from tests.loop_backends import c_param

ROOT = Path(__file__).resolve().parents[1]
RUN = textwrap.dedent("""
    import sys
    import jax, numpy as np
    from jax import export
    import tullax
    jax.config.update("jax_enable_x64", True)
    tullax.prepare_exported()
    exported = export.deserialize(bytearray(open(sys.argv[1], "rb").read()))
    args = np.load(sys.argv[2])
    got = exported.call(args["W"], args["X"])
    np.savez(sys.argv[3], *[np.asarray(g) for g in got])
""")


def _function(backend: str):
    dist = tullax.einsum_kernel("D[i,j] := (W[k,i] - X[k,j])^2", backend=backend)
    rows = tullax.einsum_kernel("(logsumexp) r[i] := x[i,j]", backend=backend)
    return jax.jit(jax.grad(lambda W, X: jnp.sum(rows(dist(W, X)) ** 2), (0, 1)))


@pytest.mark.parametrize("backend", [c_param(), "auto"])
@pytest.mark.parametrize("cache", ["shared", "empty"])
def test_exported_program_runs_in_a_new_process(backend: str, cache: str, tmp_path: Path) -> None:
    from jax import export

    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        W, X = rng.standard_normal((5, 7)), rng.standard_normal((5, 6))
        function = _function(backend)
        want = function(W, X)
        checks = [export.DisabledSafetyCheck.custom_call("tullax_c_kernel")]
        exported = export.export(function, platforms=("cpu",), disabled_checks=checks)(W, X)
    if backend == "c":
        assert "tullax_c_kernel" in exported.mlir_module()
    (tmp_path / "program.bin").write_bytes(exported.serialize())
    np.savez(tmp_path / "args.npz", W=W, X=X)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if cache == "empty":
        env["TULLAX_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run([sys.executable, "-c", RUN, str(tmp_path / "program.bin"), str(tmp_path / "args.npz"),
                           str(tmp_path / "out.npz")], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = np.load(tmp_path / "out.npz")
    for k, w in enumerate(want):
        np.testing.assert_allclose(got[f"arr_{k}"], w, rtol=1e-12)


RUN_PROGRAM = textwrap.dedent("""
    import sys
    import jax, numpy as np
    from jax import export
    import tullax
    jax.config.update("jax_enable_x64", True)
    tullax.prepare_exported()
    exported = export.deserialize(bytearray(open(sys.argv[1], "rb").read()))
    got = exported.call(np.load(sys.argv[2])["s"])
    np.save(sys.argv[3], np.asarray(got))
""")


def test_an_exported_fused_program_runs_in_a_new_process(tmp_path: Path) -> None:
    """A fused program (softmax: one kernel with a row buffer) exported and run in a process with an empty cache: its
    call carries the printed module, which that process compiles."""
    from jax import export

    kernel = tullax.einsum_kernel("(max) local m[b,i] := s[b,i,j]; local z[b,i] := exp(s[b,i,j] - m[b,i]); "
                                  "p[b,i,j] := exp(s[b,i,j] - m[b,i]) / z[b,i]", backend="c")
    with jax.enable_x64(True):
        s = np.random.default_rng(1).standard_normal((2, 3, 5))
        want = np.asarray(jax.jit(kernel)(s))
        np.testing.assert_allclose(want, np.asarray(jax.nn.softmax(s, -1)), rtol=1e-12)
        checks = [export.DisabledSafetyCheck.custom_call("tullax_c_kernel")]
        exported = export.export(jax.jit(kernel), platforms=("cpu",), disabled_checks=checks)(s)
    assert exported.mlir_module().count("tullax_c_kernel") >= 1
    (tmp_path / "program.bin").write_bytes(exported.serialize())
    np.savez(tmp_path / "args.npz", s=s)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TULLAX_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", RUN_PROGRAM, str(tmp_path / "program.bin"),
                           str(tmp_path / "args.npz"), str(tmp_path / "out.npy")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want, rtol=1e-12)
