"""The public API surface: names, binding of inputs, errors at the boundary, lazy imports, and the contract
every backend keeps (signatures, declared capabilities, every registry function on the XLA reference)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import tullax
from tullax.spec import functions
from tullax.spec.functions import UNARY


def test_import_loads_no_heavy_module():
    code = ("import sys, tullax; k = tullax.einsum_kernel('C[i,j] := A[i,k]*B[k,j]'); "
            "print(k.spec, k.inputs); tullax.explain('y[i] := x[i+k]*w[k]'); "
            "bad = [m for m in ('jax', 'numba', 'juliacall') if m in sys.modules]; "
            "sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_kernel_attributes():
    k = tullax.einsum_kernel("D[i,j] := (W[k,i] - X[k,j])^2")
    assert k.inputs == ("W", "X")
    assert k.spec == "D[i,j] := (W[k,i] - X[k,j])^2"
    assert len(k.grad_specs) == 2
    assert k.grad_specs[0].startswith("ΔW[") and k.grad_specs[1].startswith("ΔX[")


def test_inputs_in_order_of_first_appearance_existing_output_first():
    assert tullax.einsum_kernel("C[i,j] += B[k,j]*A[i,k]").inputs == ("C", "B", "A")
    assert tullax.einsum_kernel("y[i] := a*x[i] + b").inputs == ("a", "x", "b")
    assert tullax.einsum_kernel("out[b,d] := W[ix[b],d]").inputs == ("W", "ix")


def test_canonical_text_normalises_spelling():
    a = tullax.einsum_kernel("C[i,j]:=A[i,k] * B[k,j]")
    b = tullax.einsum_kernel("  C[i, j] := A[i,k]*B[k,j]  ")
    assert a.spec == b.spec
    assert a.ir == b.ir and hash(a.ir) == hash(b.ir)


def test_a_pickled_spec_hashes_as_the_process_that_loads_it():
    """A spec keeps its first hash, which a string's hash makes particular to a process (the c backend pickles
    specs into the compile cache): loaded in a process with another hash seed, it must find itself in a dict
    keyed by the spec that process compiled."""
    import pickle

    spec = tullax.einsum_kernel("D[i,j] := (W[k,i] - X[k,j])^2").ir
    hash(spec)
    assert "_hash" not in pickle.loads(pickle.dumps(spec)).__dict__
    code = ("import pickle, sys, tullax; loaded = pickle.loads(sys.stdin.buffer.read()); "
            "fresh = tullax.einsum_kernel('D[i,j] := (W[k,i] - X[k,j])^2').ir; "
            "print(loaded == fresh, hash(loaded) == hash(fresh), {fresh: 1}.get(loaded))")
    for seed in ("1", "2"):
        done = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(spec), capture_output=True,
                              env={**os.environ, "PYTHONHASHSEED": seed}, check=True)
        assert done.stdout.decode().split() == ["True", "True", "1"]


@pytest.mark.parametrize("call, message", [
    (lambda k, A, B: k(A), "missing input B"),
    (lambda k, A, B: k(A, B, A), "too many inputs"),
    (lambda k, A, B: k(A, C=B), "unknown input 'C'"),
    (lambda k, A, B: k(A, B, A=A), "given twice"),
    (lambda k, A, B: k(A[0], B), "rank 1"),
    (lambda k, A, B: k(A, B.T[:2]), "index k"),
])
def test_binding_errors_are_shape_errors(call, message):
    k = tullax.einsum_kernel("C[i,j] := A[i,k]*B[k,j]", backend="xla")
    A, B = np.ones((3, 4)), np.ones((4, 5))
    with pytest.raises(tullax.ShapeError, match=message):
        call(k, A, B)


def test_keyword_inputs_and_numpy_result():
    k = tullax.einsum_kernel("C[i,j] := A[i,k]*B[k,j]", backend="xla")
    A, B = np.arange(6.0).reshape(2, 3), np.arange(12.0).reshape(3, 4)
    out = k(B=B, A=A)
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, A @ B)


def test_index_array_must_be_integer_and_in_range():
    k = tullax.einsum_kernel("out[b,d] := W[ix[b],d]", backend="xla")
    W = np.ones((5, 3))
    with pytest.raises(tullax.ShapeError, match="must hold integers"):
        k(W, np.array([0.0, 1.0]))
    with pytest.raises(tullax.ShapeError, match="outside axis 0 of W"):
        k(W, np.array([0, 7]))


def test_unknown_backend_lists_valid_names():
    with pytest.raises(tullax.BackendUnavailableError, match="valid names are .*numba"):
        tullax.einsum_kernel("y[i] := x[i]", backend="cuda-magic")


def test_explain_mentions_ranges_and_gradients():
    text = tullax.explain("y[i] := x[i+k]*w[k]")
    assert "i in 0:-size(w,0)+size(x,0)+1" in text
    assert "k in 0:size(w,0)" in text
    assert "Δx[" in text and "Δw[" in text


def test_errors_are_value_errors_with_spec_context():
    with pytest.raises(ValueError) as info:
        tullax.einsum_kernel("y[i] := x[i] +")
    assert isinstance(info.value, tullax.SpecError)
    assert "y[i] := x[i] +" in str(info.value) and "^" in str(info.value)


# ---------------------------------------------------------------------------------------------
# The backend contract: signatures, declared capabilities, the function registry on every backend
# ---------------------------------------------------------------------------------------------
def test_a_signature_from_a_dtype_keeps_index_arrays_int64():
    from tullax.backends.base import Signature
    from tullax.spec.frontend import compile_spec

    spec = compile_spec("out[b,d] := W[ix[b],d]*s", None)[1]
    assert Signature.for_dtype(spec, np.float32) == Signature(("float32", "int64", "float32"), "float32")
    values = [np.ones((2, 3)), np.zeros(4, np.int32), np.float64(2.0)]
    assert Signature.of_values(values, "float64") == Signature(("float64", "int32", "float64"), "float64")


def test_backends_declare_what_they_can_do():
    from tullax import backends

    class PlainBackend:  # the three methods only, as a backend written outside tullax may be
        name = "plain"

        def availability(self):
            return True, ""

    plain = backends.capabilities(PlainBackend())
    assert not (plain.module_source or plain.prepare or plain.shaped_run or plain.host_buffers)
    xla = backends.capabilities(backends.get("xla"))
    assert not (xla.module_source or xla.host_buffers)
    for name in ("numba", "julia", "julia-cuda"):
        declared = backends.capabilities(backends.get(name))
        assert declared.module_source and declared.host_buffers and declared.shaped_run
    assert backends.capabilities(backends.get("numba")).prepare


@pytest.mark.parametrize("name", UNARY)
def test_every_registry_function_runs_on_the_xla_backend(name):
    """The XLA lowering takes each function's jax implementation from the registry (``Function.jnp``)."""
    x = np.array([0.25, 0.5, 2.0])
    got = tullax.einsum_kernel(f"y[i] := {name}(x[i])", backend="xla")(x)
    expected = np.array([np.real(functions.get(name).numpy(v)) for v in x])
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_generate_source_titles_each_kernel_for_a_backend_without_a_whole_module():
    source = tullax.generate_source("y[i] := x[i+k]*w[k]", backend="xla", dtype="float64")
    titles = [line for line in source.splitlines() if line.startswith("# ---- ")]
    assert titles == ["# ---- forward", "# ---- gradient wrt x", "# ---- gradient wrt w"]
    assert source.count("# jaxpr of the jnp lowering") == 3


def test_warm_runs_the_forward_kernel_and_every_gradient_step():
    timings = tullax.warm("s := x[i]*y[i] |> sqrt", backend="xla", dtype="float64")
    assert list(timings)[0] == "forward" and {"gradient wrt x", "gradient wrt y"} <= set(timings)
    assert all(ms > 0 for ms in timings.values())


_FIRST_USE = """
import json, sys
import jax, jax.numpy as jnp
import tullax
from tullax.backends.numba import backend as nb
k = tullax.einsum_kernel("D[i,j] := (W[k,i] - X[k,j])^2", backend="numba")
f = jax.jit(jax.value_and_grad(lambda a, b: k(a, b).sum(), argnums=(0, 1)))
for (k_, i, j) in ((40, 64, 96), (2, 2, 3)):  # long outer loops run the nested variants, short ones the flat
    jax.block_until_ready(f(jnp.ones((k_, i), jnp.float32), jnp.ones((k_, j), jnp.float32)))
print(json.dumps(nb.compile_stats()))
"""


def test_a_warmed_spec_compiles_nothing_on_first_real_use(tmp_path):
    """`tullax cache warm` warms tiny shapes, which pick the flat variant of a kernel; real shapes pick the nested
    one (issue 14: a warmed spec still compiled for 1.6 s on first use). Warm, then a new process runs forward and
    both gradients under jit at shapes that pick each variant: everything loads from the cache, nothing compiles."""
    import json
    import os

    env = {**os.environ, "TULLAX_CACHE_DIR": str(tmp_path)}
    warm = subprocess.run([sys.executable, "-m", "tullax.cli.main", "cache", "warm", "--backend", "numba",
                           "D[i,j] := (W[k,i] - X[k,j])^2"], env=env, capture_output=True, text=True, timeout=600)
    assert warm.returncode == 0, warm.stderr
    use = subprocess.run([sys.executable, "-c", _FIRST_USE], env=env, capture_output=True, text=True, timeout=600)
    assert use.returncode == 0, use.stderr
    stats = json.loads(use.stdout.strip().splitlines()[-1])
    assert stats["compiled"] == 0 and stats["loaded"] >= 3, stats
