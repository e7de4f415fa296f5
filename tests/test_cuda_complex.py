"""Complex numbers in the printed CUDA C (``tullax.printers.cuda_complex``): run by the host harness (one g++
build, tests/cuda_harness.py) against jnp and NumPy in complex128, and compiled by NVRTC for sm_80 and sm_90.

* Every function the registry computes on complex values (one kernel, a column per function, as
  tests/test_c_complex.py does on c), complex64 and complex128, small arguments included.
* IEEE special values of products and quotients as jnp's (the textbook product; Annex G division, as XLA's).
* The complex corpus of tests/test_complex.py, the complex S5/LRU scan and a complex state mixing its lanes (a
  block per row, its rows in shared memory; forward only), forward and every gradient step, each
  step on the inputs the XLA lowering of the steps before it gives, against that lowering of the same step; the
  scan's forward and gradients also against ``lax.scan`` (``jax.vjp`` of the oracle: the transpose, jax's convention).
Before the change the CUDA printer refused every complex kernel (a TullaxError naming xla, c and numba).

Cost: one g++ build of ~50 small kernels (~40 s with the thread sanitizer, less without), one NVRTC compile
per architecture of the same module."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cuda_harness import GPP, build, run
from scan_cases import CASES
from test_c_complex import _JNP, COMPLEX_FUNCTIONS, _column_spec
from test_complex import CORPUS, _inputs
from test_cuda_host import launch_for

from tullax.grad import gradients
from tullax.grad.run import gradient_env, run_gradient
from tullax.printers.cuda import print_module
from tullax.spec.frontend import compile_spec

LRU = next(case for case in CASES if case.name == "lru")
EXTRA = ["x[i]^3", "x[i]^-2", "x[i]^x[i]", "x[i]/(x[i] - 2)"]
ARGUMENTS = [0.3 + 0.2j, -1 + 2j, 1e-5 + 1e-6j, 2 - 3j, -0.4 + 1e-3j, 1e-3 - 2e-3j]
_INF, _NAN = np.inf, np.nan
SPECIAL_A = [complex(_INF, _INF), complex(_INF, 0), complex(_NAN, _INF), complex(1, 2), complex(_INF, _NAN),
             complex(0, 0), complex(_INF, 1), complex(2, 3), complex(-_INF, 2)]
SPECIAL_B = [complex(1, 0), complex(1, 0), complex(2, 1), complex(0, 0), complex(1, 1), complex(0, 0),
             complex(0, _INF), complex(_INF, _INF), complex(3, 0)]
SPECIAL = "y[i,k] := ifelse(k == 0, a[i]*b[i], a[i]/b[i])  (k in 0:2)"
MIXING = "h[b,t,n] := W[n,m]*h[b,t-1,m] + x[b,t,n]  (t scan)"
pytestmark = pytest.mark.skipif(GPP is None, reason="g++ is not installed")


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def _xla(step, env):
    from tullax.backends.xla.lower import lower as xla_lower

    return np.asarray(xla_lower(step)(env))


def _lru_inputs(dtype):
    rng = np.random.default_rng(0)
    lam, x, h0 = LRU.inputs(rng, "float64").values()
    lam = lam * np.exp(0.7j * np.arange(1, lam.size + 1))
    return {"lam": np.asarray(lam, dtype), "x": np.asarray(x + 1j * rng.normal(size=x.shape), dtype),
            "h0": np.asarray(h0 - 0.5j * rng.normal(size=h0.shape), dtype)}


class _Recorder:
    """Every kernel launch (forward and gradient steps), each on the inputs the XLA lowering of the steps
    before it gives, with that lowering's result to compare the harness's against."""

    def __init__(self):
        self.launches, self.want, self.labels = [], [], []

    def __call__(self, step, env, label=""):
        self.launches.append(launch_for(step, env, f"k{len(self.launches)}", False))
        self.want.append(_xla(step, env))
        self.labels.append(label)
        return self.want[-1]

    def chain(self, text, env, cotangent_seed=1):
        """The forward kernel and every gradient step of ``text``; returns (the forward's launch, the
        cotangent, {input: the launch of its gradient's last step})."""
        spec = compile_spec(text)[1]
        result = self(spec, env, text)
        forward = len(self.launches) - 1
        rng = np.random.default_rng(cotangent_seed)
        ct = rng.normal(size=result.shape) + (1j * rng.normal(size=result.shape) if np.iscomplexobj(result) else 0)
        ct = np.asarray(ct, result.dtype)
        genv = gradient_env(spec, env, result, ct)
        last = {}
        for g in gradients(spec, frozenset(n for n, v in env.items() if np.iscomplexobj(v))):
            run_gradient(g, spec, genv, lambda s, e, g=g: self(s, e, f"{text}: d{g.wrt}"))
            last[g.wrt] = len(self.launches) - 1
        return forward, ct, last


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    """One build: the function columns and special values in both types, the corpus and the LRU scan with
    their gradient steps; (recorder, each launch's harness output, the LRU's result, cotangent and grads)."""
    with jax.enable_x64(True):
        rec = _Recorder()
        functions = compile_spec(_column_spec(COMPLEX_FUNCTIONS, EXTRA))[1]
        for dtype in ("complex64", "complex128"):
            rec(functions, {"x": np.array(ARGUMENTS, dtype)}, f"functions {dtype}")
        special = compile_spec(SPECIAL)[1]
        rec(special, {"a": np.array(SPECIAL_A, np.complex64), "b": np.array(SPECIAL_B, np.complex64)}, "special")
        for text, kinds, _ in CORPUS:
            spec = compile_spec(text)[1]
            rec.chain(text, dict(zip(spec.input_names, _inputs(kinds, "complex128"))))
        lru = {dtype: rec.chain(LRU.spec, _lru_inputs(dtype)) for dtype in ("complex64", "complex128")}
        rng = np.random.default_rng(2)  # a state that mixes its lanes: a block per row, its rows in shared memory
        mixing = {"W": (rng.normal(size=(5, 5)) + 1j * rng.normal(size=(5, 5))) / 5,
                  "x": rng.normal(size=(2, 4, 5)) - 1j * rng.normal(size=(2, 4, 5))}
        rec(compile_spec(MIXING)[1], mixing, MIXING)  # forward only: its complex adjoint is a SpecError today
        kernels = [(launch.kernel, launch.index_bits) for launch in rec.launches]
        exe = build(kernels, tmp_path_factory.mktemp("cx"), sanitize=False)  # no atomics here: races are moot
        outputs = run(exe, list(enumerate(rec.launches)))
    return rec, outputs, lru


def test_every_complex_function_matches_jnp(harness):
    rec, outputs, _ = harness
    for n, dtype in enumerate(("complex64", "complex128")):
        got = outputs[n]
        wide = jnp.asarray(np.array(ARGUMENTS, dtype), jnp.complex128)
        columns = [getattr(jnp, _JNP.get(name, name))(wide) for name in COMPLEX_FUNCTIONS]
        columns += [wide ** 3, wide ** -2, wide ** wide, wide / (wide - 2)]
        want = np.stack([np.asarray(c, np.complex128) for c in columns], axis=1)
        rtol = 5e-6 if dtype == "complex64" else 1e-9
        for k, name in enumerate(COMPLEX_FUNCTIONS + EXTRA):
            scale = np.maximum(np.abs(want[:, k]), np.finfo(np.dtype(dtype)).tiny)
            err = np.abs(got[:, k] - want[:, k]) / scale
            assert np.all(err < rtol), (dtype, name, got[:, k], want[:, k], err)


def test_special_values_of_products_and_quotients_follow_jnp(harness):
    _, outputs, _ = harness
    a, b = np.array(SPECIAL_A, np.complex64), np.array(SPECIAL_B, np.complex64)
    want = np.stack([np.asarray(jax.jit(lambda a, b: a * b)(a, b)), np.asarray(jax.jit(lambda a, b: a / b)(a, b))],
                    axis=1)
    got = outputs[2]
    for part in (np.real, np.imag):
        np.testing.assert_array_equal(part(got), part(want), err_msg=f"{part.__name__}: {got} vs {want}")


def test_corpus_and_scan_steps_match_the_xla_lowering(harness):
    """Every forward kernel and gradient step of the complex corpus, the LRU scan (complex64 and complex128) and
    the mixing scan's forward (a block per row: a cooperative kernel, its state rows tx_c128 in shared memory)."""
    rec, outputs, _ = harness
    assert len(outputs) > 40
    assert [launch.kernel.cooperative for launch, label in zip(rec.launches, rec.labels) if label == MIXING] == [True]
    for label, got, want in zip(rec.labels, outputs, rec.want):
        assert got.dtype == want.dtype, label
        tol = 3e-4 if got.dtype in (np.complex64, np.float32) else 1e-10
        scale = max(1.0, float(np.abs(want).max(initial=0)))
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, err_msg=label)


def test_the_complex_scan_and_its_gradients_match_lax_scan(harness):
    """The harness's forward and each gradient's last step (which read the XLA lowering's outputs of the steps
    before it, equal to the harness's: test above) against lax.scan and ``jax.vjp`` of it (the transpose)."""
    _, outputs, lru = harness
    for dtype, (forward, ct, last) in lru.items():
        env = _lru_inputs(dtype)
        want, pullback = jax.vjp(LRU.oracle, *env.values())
        tol = 3e-4 if dtype == "complex64" else 1e-10
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(outputs[forward], want, rtol=tol, atol=tol * scale)
        assert set(last) == set(env)
        for name, expected in zip(env, pullback(jnp.asarray(ct))):
            scale = max(1.0, float(np.abs(expected).max()))
            got = np.reshape(outputs[last[name]], np.shape(expected))
            np.testing.assert_allclose(got, expected, rtol=tol, atol=tol * scale, err_msg=f"{dtype} d{name}")


def test_nvrtc_compiles_the_complex_kernels(harness):
    from tullax.backends.cuda import compile as cuda_compile
    from tullax.errors import BackendUnavailableError

    try:
        cuda_compile.nvrtc()
    except BackendUnavailableError as err:
        pytest.skip(f"NVRTC cannot be loaded: {err}")
    rec, _, _ = harness
    source = print_module([(launch.kernel, launch.index_bits) for launch in rec.launches])
    for arch in ("sm_80", "sm_90"):
        image, _ = cuda_compile.compile_with_report(source, arch)
        assert image[:4] == b"\x7fELF"
