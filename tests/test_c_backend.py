"""The ``c`` backend (tullax.backends.c.backend, tullax.printers.c): every corpus spec against the naive evaluator and
the XLA lowering, every gradient step against XLA, float32, special values, scatters on several threads, the
serial team of tiny calls, one compiler run per module, the compile cache across processes, and the errors it
raises (no compiler, a compiler that fails). Skipped only where no C compiler works."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from corpus import CASES_BY_ID, CORPUS, Case, analysed, gradient_cases
from loop_backends import run_host, xla_eval

from tullax.backends.base import Signature
from tullax.backends.c import backend as cmod
from tullax.backends.c import generate as cgen
from tullax.backends.c.backend import CBackend, compile_stats, module_source
from tullax.errors import BackendUnavailableError, TullaxError
from tullax.grad import gradients
from tullax.grad.run import gradient_env, run_gradient
from tullax.printers.c_packed import PACKED_SUFFIX
from tullax.spec.examples import random_inputs
from tullax.spec.ir import Spec
from tullax.testing.oracle import naive_eval

BACKEND = CBackend()


@pytest.fixture(autouse=True)
def _optimising_build_only(monkeypatch):
    """These tests are of the optimising build (its modules, compiles and cache files); the fast tier that serves a
    module's first calls where tiers are on has its own (tests/test_c_tiers.py)."""
    monkeypatch.setenv("TULLAX_C_TIERS", "off")
REPO = Path(__file__).resolve().parents[1]
NO_CC = "no C compiler that builds OpenMP shared libraries here"
pytestmark = pytest.mark.skipif(not BACKEND.availability()[0], reason=NO_CC)


def run_c(spec: Spec, env: dict, dtype: str = "float64") -> np.ndarray:
    return run_host(BACKEND, spec, env, dtype)


def test_available_and_registered():
    from tullax import backends

    assert BACKEND.availability() == (True, "")
    assert backends.get("c").name == "c"


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.id)
def test_corpus_forward_matches_naive_and_xla(case: Case):
    spec = analysed(case.spec, case.ranges)
    env = random_inputs(spec, case.shapes, seed=7)
    got = run_c(spec, env)
    np.testing.assert_allclose(got, naive_eval(spec, env), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got, xla_eval(spec, env), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case, wrt", list(gradient_cases()))
def test_gradient_steps_match_xla(case: Case, wrt: str):
    spec = analysed(case.spec, case.ranges)
    grad = next(g for g in gradients(spec) if g.wrt == wrt)
    inputs = random_inputs(spec, case.shapes, seed=8)
    if np.asarray(inputs[wrt]).dtype.kind != "f":
        pytest.skip("integer inputs get no gradient")
    result = run_c(spec, inputs)
    cotangent = np.random.default_rng(9).standard_normal(np.shape(result))
    env = gradient_env(spec, inputs, result, cotangent)
    got = run_gradient(grad, spec, env, run_c)
    np.testing.assert_allclose(got, run_gradient(grad, spec, env, xla_eval), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("case_id", ("matmul", "dist", "conv1d", "row_logsumexp", "row_norm", "softplus_sum",
                                     "embedding", "dot"))
def test_float32_within_1e4_of_float64(case_id: str):
    case = CASES_BY_ID[case_id]
    spec = analysed(case.spec, case.ranges)
    env64 = random_inputs(spec, case.shapes, seed=10)
    env32 = {n: (v.astype(np.float32) if np.asarray(v).dtype == np.float64 else v) for n, v in env64.items()}
    got = run_c(spec, env32, "float32")
    assert got.dtype == np.float32
    reference = run_c(spec, env64)
    scale = max(float(np.abs(reference).max()), 1.0)
    np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-4 * scale)


def test_long_float32_sums_use_the_irs_blocked_float64_totals():
    """A float32 sum of 2^20 ones and one 1e-3 per element: float32 running sums stop at 2^24 (here they
    would lose the 1e-3s); the IR's blocked sums keep them."""
    spec = analysed("s[i] := x[i,j]")
    x = np.full((2, 1 << 20), 1.0 + 1e-3, np.float32)
    got = run_c(spec, {"x": x}, "float32")
    np.testing.assert_allclose(got, x.astype(np.float64).sum(1), rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sum_lanes_keep_nan_and_inf_at_every_position_of_every_length(dtype: str):
    """Float sums along a row are printed as vector lanes of partial sums with a fixed-order fold and a scalar
    remainder (CPrinter.sum_lanes): a NaN, NaN*0 or inf-inf in any lane, the last vector or the remainder stays
    NaN, inf stays inf, and the finite sums agree with float64, at lengths with no lane block, one, and more."""
    spec = analysed("s[i] := x[i,j]*y[i,j]")
    assert "tx_vfoldadd_" in module_source(spec, dtype)
    rng = np.random.default_rng(3)
    for n in (1, 7, 8, 15, 16, 24, 37, 64):
        x = rng.standard_normal((3 * n + 1, n)).astype(dtype)
        y = rng.standard_normal((3 * n + 1, n)).astype(dtype)
        want = [np.float64("nan")] * (3 * n) + [None]
        for j in range(n):  # row j: NaN*0 at j; row n+j: inf*1 and -inf*1; row 2n+j: inf alone
            x[j, j], y[j, j] = np.nan, 0.0
            x[n + j, j], y[n + j, j], x[n + j, (j + 1) % n], y[n + j, (j + 1) % n] = np.inf, 1.0, -np.inf, 1.0
            x[2 * n + j, j], y[2 * n + j, j] = np.inf, 2.0
            if n == 1:  # one element: inf alone, and -inf alone in row n+j
                want[n + j] = -np.inf
            want[2 * n + j] = np.inf
        got = run_c(spec, {"x": x, "y": y}, dtype)
        for row, value in enumerate(want[:-1]):
            np.testing.assert_array_equal(got[row], value, err_msg=f"n={n} row={row}")
        exact = (x[-1].astype(np.float64) * y[-1]).sum()
        np.testing.assert_allclose(got[-1], exact, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-5)


def test_sum_lanes_of_plain_arithmetic_run_on_vectors_and_keep_ieee_values():
    """A lane loop whose terms are plain arithmetic of row reads, broadcast values and locals is printed on GCC
    vectors (``printers/c_vector.py``), one with a call through the block of terms: float64's sums, zero for
    a row of -0.0 terms, NaN for a NaN term in the remainder."""
    spec_text = "s[i] := -(x[i,j] / (2*y[i,j] - z[i]))"
    spec = analysed(spec_text)

    def forward(text: str) -> str:
        source = module_source(analysed(text), "float32")
        return source[source.index("void forward("):source.index("void forward_packed(")]

    assert "tx_vload_f32(&" in forward(spec_text) and "_t[16]" not in forward(spec_text)
    assert "_t[16]" in forward("s[i] := exp(x[i,j])")  # a call: the block of terms
    rng = np.random.default_rng(5)
    n = 37  # two blocks of 16, a vector of 8 and a remainder of 5
    x, y = rng.standard_normal((4, n)).astype("float32"), rng.uniform(1, 2, (4, n)).astype("float32")
    z = np.array([-1.0, 0.5, -1.0, 0.25], "float32")
    x[1] = 0.0  # -(0/positive) = -0.0 in every term
    x[2, 30] = np.nan  # in the remainder
    got = run_c(spec, {"x": x, "y": y, "z": z}, "float32")
    want = (-(x.astype(np.float64) / (2 * y.astype(np.float64) - z[:, None]))).sum(1)
    np.testing.assert_allclose(got[[0, 3]], want[[0, 3]], rtol=1e-5)
    assert got[1] == 0 and np.isnan(got[2])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_remainder_of_a_lane_loop_is_one_more_vector_whose_old_lanes_hold_the_identity(dtype: str):
    """The iterations after the lanes' last whole vector are the loop's last vector, with the lanes the blocks
    already took set to the op's identity by a bitwise select (``c_vector.vector_rest``), not a scalar loop, which
    only a loop shorter than a vector runs (the ``else``): each term counted once (a row of 30 ones sums to 30, of
    30 twos multiplies to 2**30), and an inf in an overlapped lane is not turned into NaN by a product with a zero
    mask."""
    n = 30  # float32: a block of 16, a vector of 8, then 6 (lanes 22..29); float64: one of 8, one of 4, then 2
    source = module_source(analysed("s[i] := x[i,j]*y[i,j]"), dtype)
    forward = source[source.index("void forward("):source.index("void forward_packed(")]
    assert "_new = (tx_m" in forward and "} else {" in forward
    x, y = np.ones((5, n), dtype), np.ones((5, n), dtype)
    x[1] = -0.0  # -0.0 lanes: zero
    x[2, n - 8] = np.inf  # in the blocks and in a lane of the last vector that the blocks took
    x[3, n - 1] = np.nan
    x[4, n - 8] = -np.inf
    x[4, n - 1] = np.inf
    got = run_c(analysed("s[i] := x[i,j]*y[i,j]"), {"x": x, "y": y}, dtype)
    assert got[0] == n and got[1] == 0 and got[2] == np.inf
    assert np.isnan(got[3]) and np.isnan(got[4])
    if dtype == "float32":
        twos = np.full((2, n), 2.0, dtype)
        twos[1, n - 8] = np.inf
        np.testing.assert_array_equal(run_c(analysed("(*) p[i] := x[i,j]"), {"x": twos}, dtype), [2.0 ** n, np.inf])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_row_shorter_than_a_vector_but_of_half_of_one_is_a_half_vector_and_its_rest(dtype: str):
    """A lane loop's row of at least half a vector but less than one (4-7 float32 terms, 2-3 float64: a Gaussian
    kernel's 4 columns) is a half vector from the row's start and one more half vector for the rest, whose lanes
    the first took hold the op's identity (``c_vector.half_row``), not 4-7 serial terms; shorter rows stay the
    scalar loop. Each term counted once (ones sum to n, twos multiply to 2**n), NaN and inf reach the result."""
    source = module_source(analysed("s[i] := x[i,j]*y[i,j]"), dtype)
    forward = source[source.index("void forward("):source.index("void forward_packed(")]
    half = 4 if dtype == "float32" else 2
    assert f"tx_vh{half}_" in forward and "tx_hfoldadd_" in forward and "} else if (" in forward
    for n in range(1, 2 * half):
        x, y = np.ones((5, n), dtype), np.ones((5, n), dtype)
        x[1] = -0.0
        x[2, n - 1] = np.inf  # in the rest's new lane, or the first half's where n == half
        x[3, 0] = np.nan  # in the first half vector's lanes, and in the rest's overlapped ones
        x[4, 0], x[4, n - 1] = -np.inf, np.inf  # -inf + inf: NaN, each counted once (inf alone where n == 1)
        got = run_c(analysed("s[i] := x[i,j]*y[i,j]"), {"x": x, "y": y}, dtype)
        assert got[0] == n and got[1] == 0 and got[2] == np.inf and np.isnan(got[3]), n
        assert np.isnan(got[4]) if n > 1 else got[4] == np.inf, n
        twos = np.full((1, n), 2.0, dtype)
        assert run_c(analysed("(*) p[i] := x[i,j]"), {"x": twos}, dtype)[0] == 2.0 ** n, n


def test_special_values():
    x = np.array([[-np.inf, -np.inf], [1.0, np.inf], [0.0, 1.0]])
    np.testing.assert_array_equal(run_c(analysed("(max) m[i] := x[i,j]"), {"x": x}), [-np.inf, np.inf, 1.0])
    lse = run_c(analysed("(logsumexp) m[i] := x[i,j]"), {"x": x})
    np.testing.assert_allclose(lse, [-np.inf, np.inf, np.logaddexp(0.0, 1.0)])
    gather = run_c(analysed("y[b] := W[ix[b]]"), {"W": np.array([1.0, 2.0]), "ix": np.array([1, 5, -1, 0])})
    np.testing.assert_array_equal(gather, [2.0, np.nan, np.nan, 1.0])
    env = {"h": np.zeros(2), "ix": np.array([1, 7, -3, 1]), "v": np.array([1.0, 10.0, 100.0, 2.0])}
    np.testing.assert_array_equal(run_c(analysed("h[ix[b]] += v[b]"), env), [0.0, 3.0])
    x = np.arange(5.0)  # floor modulo of a negative position (C's % truncates)
    np.testing.assert_array_equal(run_c(analysed("y[i] := x[mod(i-2)] + 10*x[clamp(i+3)]"), {"x": x}),
                                  [x[(i - 2) % 5] + 10 * x[min(i + 3, 4)] for i in range(5)])


def test_non_contiguous_inputs_and_output():
    spec = analysed("C[i,j] := A[i,k]*B[k,j]")
    rng = np.random.default_rng(1)
    a_t = rng.standard_normal((4, 3)).T
    b = rng.standard_normal((8, 5))[::2]
    kernel = BACKEND.build(spec, Signature(("float64", "float64"), "float64"))
    out = np.zeros((5, 7))[:3, 1:6]
    kernel(out, a_t, b)
    np.testing.assert_allclose(out, a_t @ b, rtol=1e-12)


def test_two_modules_compile_at_once_and_the_gradient_steps_are_found_in_the_second(monkeypatch, tmp_path):
    """The forward module and the steps module of a spec compile at once; the steps are found in the steps module
    (waiting for it while it builds), and nothing else compiles. A fresh cache: a developer's second run found both
    modules on disk and compiled nothing."""
    monkeypatch.setenv("TULLAX_CACHE_DIR", str(tmp_path))
    spec = analysed("Dm[i,j] := (Wm[k,i] - Xm[k,j])^2 + bm[j]")
    signature = Signature(("float64",) * 3, "float64")
    cmod.finish_step_builds()
    before = compile_stats()
    forward = BACKEND.build(spec, signature)
    assert [k.name for k, _, _ in cmod.part_kernels(spec, signature, cmod.FORWARD)] == [forward.kernel.name]
    for grad in gradients(spec):
        for step in grad.steps:
            built = BACKEND.build(step, Signature.for_dtype(step, "float64"))
            assert built.generated.spec == spec  # the step's function in the steps module of the forward spec
            assert built.generated.key != forward.generated.key
    assert compile_stats()["compiled"] == before["compiled"] + 2
    source = module_source(spec, "float64")
    kernels = 1 + sum(len(g.steps) for g in gradients(spec))
    assert source.count("\nvoid ") == 2 * kernels  # each kernel and its packed entry
    assert source.count(f"{PACKED_SUFFIX}(void* const* tx_p") == kernels


@pytest.mark.parametrize("text, small, large", [
    ("Cs[i,j] := A[i,k]*B[k,j]", {"A": (4, 3), "B": (3, 5)}, {"A": (96, 80), "B": (80, 70)}),
    ("(max) ms := x[i]", {"x": (9,)}, {"x": (300_000,)}),
    ("ss := x[i]*y[i]", {"x": (9,), "y": (9,)}, {"x": (300_000,), "y": (300_000,)}),
    ("(min) mr[i] := x[i,j]", {"x": (3, 4)}, {"x": (600, 600)}),
    ("dWs[ix[b],d] += g[b,d]", {"dWs": (5, 3), "ix": (11,), "g": (11, 3)}, {"dWs": (50, 64), "ix": (20000,),
                                                                             "g": (20000, 64)}),
])
def test_tiny_calls_run_serially_and_both_agree_with_xla(text, small, large, monkeypatch):
    monkeypatch.setenv("TULLAX_C_THREADS", "2")
    monkeypatch.setenv("TULLAX_SERIAL_WORK", str(1 << 18))  # small shapes on both sides of the threshold
    spec = analysed(text)
    kernel = None
    for shapes, serial in ((small, True), (large, False)):
        rng = np.random.default_rng(4)
        env = {n: rng.integers(0, shapes["dWs"][0], shapes[n]) if n == "ix" else rng.standard_normal(shapes[n])
               for n in spec.input_names}
        np.testing.assert_allclose(run_c(spec, env), xla_eval(spec, env), rtol=1e-10, atol=1e-10)
        if "max" in text:  # NaN propagates through the serial and the split max (as np.max; XLA's CPU max
            env["x"][3] = np.nan  # reduction of 300000 elements drops it)
            assert np.isnan(run_c(spec, env))
        kernel = BACKEND.build(spec, Signature(tuple(np.asarray(env[n]).dtype.name for n in spec.input_names),
                                               "float64"))
        if serial:
            assert kernel.teams_run == {1}
    assert kernel.teams_run == {1, 2}


_SCATTER_SCRIPT = textwrap.dedent("""
    import sys, numpy as np
    from tullax.spec.analyze import analyze
    from tullax.spec.parse import parse_spec
    from tullax.backends.base import Signature
    from tullax.backends.c.backend import CBackend
    rng = np.random.default_rng(0)
    saved = {}
    for number, (text, shapes) in enumerate([
            ("dW[ix[b],d] += g[b,d]", {"dW": (50, 64), "ix": (3000,), "g": (3000, 64)}),
            ("h[ix[b]] += v[b]", {"h": (7,), "ix": (5000,), "v": (5000,)}),
            ("y[i+1] += x[i]*w[i]", {"y": (4001,), "x": (4000,), "w": (4000,)})]):
        spec = analyze(parse_spec(text))
        rows = shapes[spec.out][0]
        env = {n: rng.integers(0, rows, shapes[n]) if n == "ix" else rng.standard_normal(shapes[n])
               for n in spec.input_names}
        sig = Signature(tuple(np.asarray(env[n]).dtype.name for n in spec.input_names), "float64")
        out = np.array(env[spec.out], copy=True)
        kernel = CBackend().build(spec, sig)
        kernel(out, *[env[n] for n in spec.input_names])
        assert kernel.teams_run == {int(sys.argv[1])}, kernel.teams_run
        saved[f"out{number}"] = out
        saved.update({f"in{number}_{k}": env[n] for k, n in enumerate(spec.input_names)})
    np.savez(sys.argv[2], **saved)
""")


def test_scatter_kernels_are_race_free_on_2_and_4_threads(tmp_path: Path):
    outputs = []
    for threads in (2, 4):
        target = tmp_path / f"threads{threads}.npz"
        env = {**os.environ, "TULLAX_C_THREADS": str(threads), "PYTHONPATH": str(REPO), "TULLAX_SERIAL_WORK": "0"}
        subprocess.run([sys.executable, "-c", _SCATTER_SCRIPT, str(threads), str(target)], check=True, env=env,
                       cwd=REPO, timeout=600)
        outputs.append(dict(np.load(target)))
    first = outputs[0]
    expected = first["in0_0"].copy()
    np.add.at(expected, first["in0_2"], first["in0_1"])
    histogram = first["in1_0"].copy()
    np.add.at(histogram, first["in1_2"], first["in1_1"])
    shifted = first["in2_0"].copy()
    shifted[1:] += first["in2_1"] * first["in2_2"]
    for result in outputs:
        np.testing.assert_allclose(result["out0"], expected, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(result["out1"], histogram, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(result["out2"], shifted, rtol=1e-12, atol=1e-12)


_CACHE_SCRIPT = textwrap.dedent("""
    import json, sys, numpy as np
    from tullax.spec.analyze import analyze
    from tullax.spec.parse import parse_spec
    from tullax.backends.base import Signature
    from tullax.backends.c.backend import CBackend, compile_stats
    from tullax.grad import gradients
    spec = analyze(parse_spec("D[i,j] := (W[k,i] - X[k,j])^2"))
    rng = np.random.default_rng(0)
    W, X = rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    out = np.empty((3, 2))
    CBackend().build(spec, Signature(("float64", "float64"), "float64"))(out, W, X)
    for grad in gradients(spec):
        for step in grad.steps:
            CBackend().build(step, Signature.for_dtype(step, "float64"))
    print(json.dumps({"stats": compile_stats(), "out": out.tolist(), "numba": "numba" in sys.modules}))
""")


def test_new_process_with_a_populated_cache_compiles_nothing(tmp_path: Path):
    env = {**os.environ, "TULLAX_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _CACHE_SCRIPT], env=env, cwd=REPO, timeout=600,
                              capture_output=True, text=True, check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    assert cold["stats"]["compiled"] == 2 and cold["stats"]["loaded"] == 0  # the forward and the steps modules
    assert warm["stats"]["compiled"] == 0 and warm["stats"]["loaded"] == 2
    assert cold["out"] == warm["out"]
    assert not cold["numba"] and not warm["numba"]  # the c backend never imports numba
    entries = json.loads((tmp_path / "cache" / "index.json").read_text())["entries"]
    records = [r for r in entries.values() if r.get("backend") == "c" and r.get("kind") != "ffi handler"]
    assert len(records) == 2 and all(r["hits"] == 1 for r in records)  # each module recorded when written
    (record,) = [r for r in records if "compile_ms" in r]  # the forward's timings: the steps never ran
    assert record["compile_ms"] > 0 and record["ttfk_cold_ms"] > 0 and record["ttfk_warm_ms"] > 0
    sources = sorted((tmp_path / "cache" / "entries").glob("*/kernels.c"),
                     key=lambda p: "void forward(" in p.read_text())
    steps, forward = (p.read_text() for p in sources)
    assert "void forward(" in forward and "void grad" not in forward
    assert "void grad0_step0(" in steps and "void grad1_step0(" in steps and "void forward(" not in steps
    for source in sources:
        (library,) = source.parent.glob("kernels-*.so")
        assert library.name == f"kernels-{__import__('hashlib').sha256(source.read_bytes()).hexdigest()[:16]}.so"


def test_an_old_generators_library_is_never_loaded(monkeypatch):
    """The key holds the generator's fingerprint, so what an older printer wrote (here: a source computing x*3
    under another fingerprint) is another entry; the library compiled from it never runs."""
    from tullax.backends.c import backend as cmod
    from tullax.backends.host import HostBuilder

    spec, other = analysed("yr[i] := xr[i]*2"), analysed("yr[i] := xr[i]*3")
    signature = Signature(("float64",), "float64")
    real, real_fingerprint = cmod.generate_part, cmod.generator_fingerprint()
    x = np.arange(4.0)
    for printed, fingerprint, factor in ((other, "an-old-generator", 3), (spec, real_fingerprint, 2)):
        monkeypatch.setattr(cmod, "_BUILDER", HostBuilder())
        monkeypatch.setattr(cmod, "generate_part", lambda s, sig, part, printed=printed: real(printed, sig, part))
        monkeypatch.setattr(cmod, "generator_fingerprint", lambda fingerprint=fingerprint: fingerprint)
        out = np.empty(4)
        BACKEND.build(spec, signature)(out, x)
        np.testing.assert_array_equal(out, x * factor)


def test_a_source_rewritten_in_its_entry_is_compiled_again(monkeypatch):
    """A hit loads the library the entry's source was compiled from (its hash is in the library's name): when
    the source in the entry was rewritten, the hit is refused and the module is generated again (its own
    library is still in the entry, so nothing compiles) rather than running a library the source does not
    describe."""
    from tullax.backends.c import backend as cmod
    from tullax.backends.host import HostBuilder, module_key
    from tullax.runtime.cache import get_cache

    spec, other = analysed("yr[i] := xr[i]*5"), analysed("yr[i] := xr[i]*7")
    signature = Signature(("float64",), "float64")
    x = np.arange(4.0)
    monkeypatch.setattr(cmod, "_BUILDER", HostBuilder())
    BACKEND.build(spec, signature)(np.empty(4), x)
    key = module_key(spec, signature, "c", cmod._recipe().options)
    rewritten = cmod.generate_part(other, signature, cmod.FORWARD)[1]
    get_cache().write_text(key, cmod.SOURCE_FILE, rewritten)
    assert cmod._load_cached(get_cache(), key, spec, signature) is None
    monkeypatch.setattr(cmod, "_BUILDER", HostBuilder())
    out = np.empty(4)
    BACKEND.build(spec, signature)(out, x)
    np.testing.assert_array_equal(out, x * 5)
    assert (get_cache().entry_path(key) / cmod.SOURCE_FILE).read_text() == \
        cmod.generate_part(spec, signature, cmod.FORWARD)[1]


def test_a_hit_generates_nothing_and_a_generator_change_misses(monkeypatch):
    from tullax.backends.c import backend as cmod
    from tullax.backends.host import HostBuilder

    spec, signature, x = analysed("yr[i] := xr[i]*4 + 1"), Signature(("float64",), "float64"), np.arange(4.0)
    monkeypatch.setattr(cmod, "_BUILDER", HostBuilder())
    BACKEND.build(spec, signature)(np.empty(4), x)  # the cache holds it now (compiled here or before)

    def no_generating(*args):
        raise AssertionError("a cache hit generated the module")

    real = cmod.generate_part
    monkeypatch.setattr(cmod, "generate_part", no_generating)
    monkeypatch.setattr(cmod, "_BUILDER", HostBuilder())
    cmod.finish_step_builds()
    before = compile_stats()
    out = np.empty(4)
    BACKEND.build(spec, signature)(out, x)
    np.testing.assert_array_equal(out, x * 4 + 1)
    assert compile_stats()["loaded"] == before["loaded"] + 1 and compile_stats()["compiled"] == before["compiled"]
    # an edited generator has another fingerprint: a miss, generated and compiled again
    monkeypatch.setattr(cmod, "generate_part", real)
    edited = f"an-edited-generator-{time.time_ns()}"  # a new one each run: a kept cache holds the last run's entry
    monkeypatch.setattr(cmod, "generator_fingerprint", lambda: edited)
    monkeypatch.setattr(cmod, "_BUILDER", HostBuilder())
    BACKEND.build(spec, signature)(out, x)
    assert compile_stats()["compiled"] == before["compiled"] + 1
    np.testing.assert_array_equal(out, x * 4 + 1)


def test_a_corrupt_kernels_file_is_generated_again(monkeypatch):
    from tullax.backends.c import backend as cmod
    from tullax.backends.host import HostBuilder, module_key
    from tullax.runtime.cache import get_cache

    spec, signature, x = analysed("yr[i] := xr[i]*6"), Signature(("float64",), "float64"), np.arange(4.0)
    monkeypatch.setattr(cmod, "_BUILDER", HostBuilder())
    BACKEND.build(spec, signature)(np.empty(4), x)
    key = module_key(spec, signature, "c", cmod._recipe().options)
    get_cache().write_bytes(key, cmod.KERNELS_FILE, b"not a pickle")  # checksummed, but not loadable
    assert cmod._load_cached(get_cache(), key, spec, signature) is None
    monkeypatch.setattr(cmod, "_BUILDER", HostBuilder())
    out = np.empty(4)
    BACKEND.build(spec, signature)(out, x)  # generated again (the library is still good), the file rewritten
    np.testing.assert_array_equal(out, x * 6)
    assert cmod._load_cached(get_cache(), key, spec, signature) is not None


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.id)
def test_every_corpus_module_round_trips_through_its_kernels_file(case: Case):
    """A hit runs the kernels unpickled from ``kernels.pickle``: they must be the lowered ones (compared by
    their reprs, which show every field: a NaN constant is never == itself)."""
    import pickle

    from tullax.backends.c.generate import module_kernels

    spec = analysed(case.spec, case.ranges)
    try:
        kernels = module_kernels(spec, Signature.for_dtype(spec, "float64"))
    except TullaxError:
        pytest.skip("does not lower for the c backend")
    back = pickle.loads(pickle.dumps(kernels, protocol=4))
    assert repr(back) == repr(kernels) and "object at 0x" not in repr(kernels)


def test_the_fingerprint_follows_every_generating_module(tmp_path: Path):
    import shutil

    from tullax.backends.c import backend as cmod

    package = REPO / "tullax"
    copy = tmp_path / "tullax"
    for name in cgen._GENERATOR_PACKAGES:
        shutil.copytree(package / name, copy / name)
    for name in cgen._GENERATOR_MODULES:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(package / name, copy / name)
    assert cgen.fingerprint_of(copy) == cmod.generator_fingerprint()
    seen = {cmod.generator_fingerprint()}
    for edited in ("printers/c.py", "compiler/lower.py", "grad/derive.py", "spec/functions.py",
                   "backends/c/generate.py"):
        original = (copy / edited).read_text()
        (copy / edited).write_text(original + "\n# edited\n")
        seen.add(cgen.fingerprint_of(copy))
        (copy / edited).write_text(original)
    assert len(seen) == 6


_WARM_SCRIPT = textwrap.dedent("""
    import json, sys, numpy as np, jax
    import tullax
    kernel = tullax.einsum_kernel("D[i,j] := (W[k,i] - X[k,j])^2", backend=sys.argv[1])
    W, X = np.ones((4, 3), np.float32), np.ones((4, 2), np.float32)
    out = jax.jit(kernel)(W, X)
    grads = jax.jit(jax.grad(lambda W, X: kernel(W, X).sum(), argnums=(0, 1)))(W, X)
    heavy = sorted(m for m in ("tullax.compiler.lower", "tullax.compiler.loops", "tullax.printers.c",
                               "tullax.backends.xla.lower", "numba", "jax.extend") if m in sys.modules)
    print(json.dumps({"heavy": heavy, "sum": float(np.asarray(out).sum() + sum(np.asarray(g).sum() for g in grads))}))
""")


@pytest.mark.parametrize("backend", ["c", "auto"])
def test_a_warm_process_imports_no_compiler_printer_or_numba(tmp_path: Path, backend: str):
    """A warm process loads the module the cold one compiled: no lowering, printing or Numba, not the loop IR (the
    cache holds each kernel's interface), not the XLA lowering (nothing runs on XLA), and not jax.extend (it
    imports all of Pallas: 20-70 ms of every process's first kernel). Under ``auto`` too, whose tiny calls run
    on the cached C module (a tiny spec at these shapes; with Numba as the loop backend they run on XLA): the
    cold process is ``c``'s there, since auto compiles no module for a tiny call (issue 45 item 5)."""
    if backend == "auto" and planner_loops() != "c":
        pytest.skip("auto's loop backend here is not host C")
    env = {**os.environ, "TULLAX_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO),
           "JAX_PLATFORMS": "cpu"}
    runs = [json.loads(subprocess.run([sys.executable, "-c", _WARM_SCRIPT, name], env=env, cwd=REPO, timeout=600,
                                      capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
            for name in ("c", backend)]
    # cold: it generated the module
    assert runs[0]["heavy"] == ["tullax.compiler.loops", "tullax.compiler.lower", "tullax.printers.c"]
    assert runs[1]["heavy"] == [] and runs[1]["sum"] == runs[0]["sum"] == 0.0


def planner_loops() -> str | None:
    from tullax.planner.rules import loop_backend

    return loop_backend(["float32"])


def test_a_changed_compiler_is_another_cache_entry(monkeypatch):
    from tullax.backends.c import backend as cmod

    first = cmod._recipe().options
    monkeypatch.setenv("TULLAX_CC", "gcc")
    assert cmod._recipe().options != first
    with_gcc = cmod._recipe().options  # identity() is remembered per setting of the variables it reads
    monkeypatch.setenv("TULLAX_CFLAGS", "-O2")
    assert cmod._recipe().options != with_gcc and "-O2" in cmod._recipe().options["compiler"]["flags"]
    monkeypatch.setenv("PATH", "/nonexistent-tullax")
    assert cmod._recipe().options["compiler"]["path"] is None and not CBackend().availability()[0]


def test_without_a_compiler_it_says_why(monkeypatch):
    monkeypatch.setenv("TULLAX_CC", "no-such-compiler-tullax")
    ok, why = CBackend().availability()
    assert not ok and "no-such-compiler-tullax" in why and "TULLAX_CC" in why
    with pytest.raises(BackendUnavailableError, match="no-such-compiler-tullax"):
        CBackend().build(analysed("y[i] := x[i]"), Signature(("float64",), "float64"))


def test_a_compiler_that_cannot_build_is_unavailable(tmp_path, monkeypatch):
    broken = tmp_path / "brokencc"
    broken.write_text("#!/bin/sh\necho 'brokencc: internal compiler error' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("TULLAX_CC", str(broken))
    ok, why = CBackend().availability()
    assert not ok and "internal compiler error" in why


def test_compile_errors_are_tullax_errors_with_the_message_and_the_source(tmp_path):
    from tullax.backends.c.compile import compile_library

    source = tmp_path / "bad.c"
    source.write_text("void f(void) { undeclared_thing = 1; }\n")
    with pytest.raises(TullaxError, match="undeclared_thing") as err:
        compile_library(source, tmp_path / "bad.so")
    assert str(source) in str(err.value)


def test_a_module_is_cut_into_units_each_kernel_in_exactly_one(tmp_path):
    """A module of several kernels compiles as two translation units at once (the prelude in both, each kernel
    function in one) linked into one library; a unit that fails reports the compiler's words."""
    import ctypes

    from tullax.backends.c.compile import compile_library, split_units
    from tullax.printers.c import UNIT_MARK

    spec = analysed("Du[i,j] := (Wu[k,i] - Xu[k,j])^2 + exp(bu[j])")
    source = module_source(spec, "float32")
    names = ["forward"] + [f"grad{p}_step0" for p in range(3)]
    units = split_units(source)
    assert len(units) == 2 and all(u.startswith(source.split(UNIT_MARK)[0]) for u in units)
    for name in names:
        assert sum(f"\nvoid {name}(" in unit for unit in units) == 1, name
    assert split_units(source, units=1) == [source]
    single = UNIT_MARK.join(source.split(UNIT_MARK)[:2])
    assert split_units(single) == [single]
    path = tmp_path / "module.c"
    path.write_text(source)
    compile_library(path, tmp_path / "module.so")
    library = ctypes.CDLL(str(tmp_path / "module.so"))
    assert all(hasattr(library, name) for name in names)
    broken = source.replace("void grad1_step0(", "void grad1_step0(undeclared_type_here x, ")
    path.write_text(broken)
    with pytest.raises(TullaxError, match="undeclared_type_here"):
        compile_library(path, tmp_path / "broken.so")
    assert not list(tmp_path.glob(".broken.so.*")) and not (tmp_path / "broken.so").exists()  # nothing left


def test_compiler_runs_are_started_as_the_room_allows(tmp_path):
    """``_run`` starts as many compiler processes at once as ``room()`` allows: two that each wait for the other
    both finish with room for two; with room for one, the second starts after the first has finished; a failure
    reports its own words (written to a file: no pipe to fill)."""
    from tullax.backends.c.compile import _run

    def waits_for(mine: str, other: str) -> list[str]:  # fails unless the other runs at the same time
        return ["sh", "-c", f"touch {tmp_path / mine}; i=0; while [ ! -e {tmp_path / other} ] && [ $i -lt 2000 ]; "
                f"do sleep 0.01; i=$((i+1)); done; [ -e {tmp_path / other} ]"]

    _run([waits_for("a", "b"), waits_for("b", "a")], tmp_path / "x.c", 60, lambda: 2)
    first = ["sh", "-c", f"sleep 0.2; touch {tmp_path / 'first-done'}"]
    second = ["sh", "-c", f"[ -e {tmp_path / 'first-done'} ]"]  # fails if it starts before the first is done
    _run([first, second], tmp_path / "x.c", 60, lambda: 1)
    loud = ["sh", "-c", "yes 'a long message' | head -c 200000; echo the-last-words; exit 3"]
    with pytest.raises(TullaxError, match="the-last-words"):
        _run([loud, ["true"]], tmp_path / "x.c", 60, lambda: 1)
    slow = ["sh", "-c", f"sleep 1; touch {tmp_path / 'not-killed'}"]
    with pytest.raises(TullaxError, match="ran for more than"):
        _run([slow], tmp_path / "x.c", 0.2)
    time.sleep(1.5)
    assert not (tmp_path / "not-killed").exists()  # stopped at the timeout


def test_a_module_that_adds_into_its_output_clears_it_in_parallel(monkeypatch):
    """A module with a kernel that adds into its output (the embedding gradient's scatter) exports the parallel
    clear of ``tullax.printers.c_clear``, once; ``clear_bytes`` zeroes exactly the bytes asked, on one thread and
    on two, below and above two of its blocks. A module of ':=' kernels has none."""
    from tullax.printers.c_clear import CLEAR_BLOCK, CLEAR_FUNCTION

    spec = analysed("Ecl[b,d] := Wcl[ixcl[b],d]")
    assert module_source(spec, "float32").count(f"\nvoid {CLEAR_FUNCTION}(") == 1
    assert CLEAR_FUNCTION not in module_source(analysed("Ccl[i,j] := Acl[i,k]*Bcl[k,j]"), "float32")
    signature = Signature.for_dtype(spec, "float32")
    assert BACKEND.build(spec, signature)._clear is None  # the forward module: a gather, no kernel adds
    (step,) = [s for g in gradients(spec) for s in g.steps]  # the scatter, in the steps module
    kernel = BACKEND.build(step, cgen.step_signature(step, signature, spec))
    assert kernel.generated.spec == spec and kernel._clear is not None
    for threads in ("1", "2"):
        monkeypatch.setenv("TULLAX_C_THREADS", threads)
        for nbytes in (0, 1, 4097, 2 * CLEAR_BLOCK, 3 * CLEAR_BLOCK + 5):
            buffer = np.full(nbytes + 64, 0xAB, np.uint8)
            kernel.clear_bytes(buffer.ctypes.data + 32, nbytes)
            assert not buffer[32:32 + nbytes].any(), (threads, nbytes)
            assert (buffer[:32] == 0xAB).all() and (buffer[32 + nbytes:] == 0xAB).all(), (threads, nbytes)


def test_complex_sums_build_and_run():
    """Complex modules build (C99 ``_Complex``, ``tullax.printers.c_complex``; before, a TullaxError naming xla
    and numba): a row sum over complex128, its lanes a plain scalar loop."""
    spec = analysed("y[i] := x[i,j]")
    x = (np.arange(12.0) - 1j * np.arange(12.0)[::-1]).reshape(3, 4)
    out = np.empty(3, np.complex128)
    BACKEND.build(spec, Signature(("complex128",), "complex128"))(out, x)
    np.testing.assert_allclose(out, x.sum(1), rtol=1e-15)


def test_half_precision_through_the_widened_kernel():
    spec = analysed("y[i] := x[i,j]*x[i,j]")
    x = np.random.default_rng(3).standard_normal((5, 7)).astype(np.float16)
    out = np.empty(5, np.float16)
    BACKEND.build(spec, Signature(("float16",), "float16"))(out, x)
    np.testing.assert_allclose(out, (x.astype(np.float32) ** 2).sum(1).astype(np.float16), rtol=1e-3)


def test_the_jax_op_jit_grad_and_vmap():
    import jax
    import jax.numpy as jnp

    import tullax

    kernel = tullax.einsum_kernel("D[i,j] := (W[k,i] - X[k,j])^2", backend="c")
    rng = np.random.default_rng(5)
    W, X = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 6)).astype(np.float32)

    def reference(W, X):
        return ((W[:, :, None] - X[:, None, :]) ** 2).sum(0)

    np.testing.assert_allclose(jax.jit(kernel)(W, X), reference(W, X), rtol=1e-5)
    loss = lambda f: lambda W, X: (jnp.sin(f(W, X))).sum()  # noqa: E731
    got = jax.jit(jax.grad(loss(kernel), argnums=(0, 1)))(W, X)
    want = jax.grad(loss(reference), argnums=(0, 1))(W, X)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    Wb = rng.standard_normal((3, 4, 3)).astype(np.float32)
    np.testing.assert_allclose(jax.vmap(kernel, in_axes=(0, None))(Wb, X), jax.vmap(reference, (0, None))(Wb, X),
                               rtol=1e-5)


_SPIN_SCRIPT = textwrap.dedent("""
    import json, os, resource, sys, time
    import numpy as np
    import tullax
    from tullax.backends.c import load as c_load
    kernel = tullax.einsum_kernel("n[i] := x[i,j]^2 |> sqrt", backend="c")
    x = np.ones((2000, 2000), np.float32)  # 4M operations: a parallel call
    kernel(x)
    def cpu_ms():
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return (usage.ru_utime + usage.ru_stime) * 1e3
    idle = []
    for _ in range(5):
        kernel(x)
        before = cpu_ms()
        time.sleep(0.1)
        idle.append(cpu_ms() - before)
    print(json.dumps({"bound": c_load.bound_openmp_spin(), "idle_cpu_ms": min(idle),
                      "environ": [n for n in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY") if n in os.environ]}))
""")


@pytest.mark.parametrize("user", [None, "GOMP_SPINCOUNT", "OMP_WAIT_POLICY"])
def test_openmp_threads_stop_spinning_soon_after_a_call(user: str | None):
    """libgomp's default spin kept a core busy for ~9 ms of CPU after every parallel call here (the XLA ops
    after the kernel ran on the other core only); bounded, the team sleeps within a fraction of a ms. CPU time
    of the process itself, while it sleeps: other load on the machine can only make it smaller."""
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env.update({"PYTHONPATH": str(REPO), "TULLAX_C_THREADS": "2"})
    if user is not None:
        env[user] = "100000" if user == "GOMP_SPINCOUNT" else "active"
    done = subprocess.run([sys.executable, "-c", _SPIN_SCRIPT], env=env, cwd=REPO, timeout=600, check=True,
                          capture_output=True, text=True)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if user is None:
        assert found["bound"] and found["environ"] == []  # the environment is as it was
        assert found["idle_cpu_ms"] < 4.0, found
    else:  # the user's setting stands, untouched
        assert not found["bound"] and found["environ"] == [user]


_SPIN_RACE_SCRIPT = textwrap.dedent("""
    import ctypes, json, threading, time
    from tullax.backends.c import load as c_load
    real = ctypes.CDLL
    def slow(*args, **kwargs):  # the first thread holds GOMP_SPINCOUNT set while the others ask
        time.sleep(0.2)
        return real(*args, **kwargs)
    c_load.ctypes.CDLL = slow
    start, answers = threading.Barrier(4), []
    def ask():
        start.wait()
        answers.append(c_load.bound_openmp_spin())
    threads = [threading.Thread(target=ask) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print(json.dumps({"answers": answers, "later": c_load.bound_openmp_spin()}))
""")


def test_threads_loading_libraries_at_once_all_see_the_spin_bound():
    """The forward module, the steps module compiled beside it and the FFI handler load on different threads.
    A thread asking while the first had GOMP_SPINCOUNT set read it as the user's setting and answered (and
    cached) False: the CI run where the spin test found ``bound`` False."""
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-c", _SPIN_RACE_SCRIPT], env=env, cwd=REPO, timeout=120, check=True,
                          capture_output=True, text=True)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"answers": [True] * 4, "later": True}


def test_the_forward_kernel_is_ready_while_its_steps_module_still_compiles(monkeypatch, tmp_path):
    """The forward module does not wait for the steps module compiling beside it (held here until released);
    a gradient step asked for meanwhile waits for the steps module and comes from it, not from a module of its
    own. On 4 cores the steps module compiles as 3 units (one core left to this process), 2 at once while the
    forward module is being built, 3 once it is."""
    from tullax.backends.c import compile as c_compile

    monkeypatch.setenv("TULLAX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(c_compile, "cores", lambda: 4)
    release, asked = threading.Event(), threading.Event()
    real = c_compile.compile_library
    steps_compile = {}

    def held(source, library, timeout=600.0, units=None, room=None, background=False):
        if "void grad" in Path(source).read_text():
            steps_compile.update(units=units, room=room)
            asked.set()
            assert release.wait(120), "never released"
        return real(source, library, timeout, units, room, background=background)

    monkeypatch.setattr(c_compile, "compile_library", held)
    spec = analysed("Fq[i] := xq[i,j]*wq[j] + 1")
    signature = Signature(("float64", "float64"), "float64")
    try:
        forward = BACKEND.build(spec, signature)
        build = cmod._STEP_BUILDS[(spec, signature)]
        assert not build.done.is_set()
        assert asked.wait(120) and steps_compile["units"] == 3
        assert build.forward_built.is_set() and steps_compile["room"]() == 3
        build.forward_built.clear()
        assert steps_compile["room"]() == 2
        build.forward_built.set()
        out, x, w = np.empty(3), np.arange(6.0).reshape(3, 2), np.array([1.0, -1.0])
        forward(out, x, w)
        np.testing.assert_array_equal(out, x @ w + 2)  # the 1 is summed over j too
        step = next(s for g in gradients(spec) if g.wrt == "xq" for s in g.steps)
        found = []
        asking = threading.Thread(target=lambda: found.append(
            BACKEND.build(step, cgen.step_signature(step, signature, spec))))
        asking.start()
        asking.join(0.5)
        assert asking.is_alive()  # waiting for the steps module
    finally:
        release.set()
    asking.join(120)
    assert found and found[0].generated.spec == spec and found[0].generated.key != forward.generated.key


def test_a_loop_of_tanh_calls_glibcs_vector_tanh_where_glibc_has_one(tmp_path):
    """glibc 2.35's libmvec has tanhf/tanh (and sinh, log1p, erf, atan2, ...) for every x86-64 vector width: a
    loop calling them vectorises only where the prelude declares them ``simd`` (the MLP layer's ``|> tanh``
    finaliser ran 16k scalar tanhf per call, most of its time). The library must call a vector variant."""
    import platform

    from tullax.backends.c.compile import compile_library, vector_math
    from tullax.spec.frontend import compile_spec

    name, version = platform.libc_ver()
    if not vector_math() or name != "glibc" or tuple(int(p) for p in version.split(".")[:2]) < (2, 35):
        pytest.skip("no libmvec with tanh here (x86-64 glibc >= 2.35)")
    _, spec = compile_spec("y[i] := tanh(x[i])")
    source = tmp_path / "tanh.c"
    source.write_text(module_source(spec, "float32"))
    compile_library(source, tmp_path / "tanh.so")
    symbols = (tmp_path / "tanh.so").read_bytes()
    assert b"v_tanhf" in symbols and b"_ZGV" in symbols  # _ZGV<isa>N<lanes>v_tanhf, libmvec's vector tanhf
