"""The Numba backend: every corpus spec and every gradient step compiled and run (float64) against the naive
evaluator and the XLA lowering, float32 against float64, scatter kernels on 2 and 4 threads, the cache (a
second build compiles nothing; a new process with a populated cache compiles nothing), and the generated source.

Numba compiles are slow (about a second each here): every kernel is built once per (spec, signature) in a
process, and the session's cache directory (conftest.py) lets xdist workers and subprocesses load each other's
compiled kernels.
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from corpus import CASES_BY_ID, CORPUS, Case, analysed, gradient_cases
from loop_backends import run_host, xla_eval

pytest.importorskip("numba")

from tullax.backends.base import Signature  # noqa: E402
from tullax.backends.numba.backend import NumbaBackend, compile_stats, module_source  # noqa: E402
from tullax.grad import gradients  # noqa: E402
from tullax.grad.run import gradient_env, run_gradient  # noqa: E402
from tullax.spec.examples import random_inputs  # noqa: E402
from tullax.spec.ir import Spec  # noqa: E402
from tullax.testing.oracle import naive_eval  # noqa: E402

BACKEND = NumbaBackend()
REPO = Path(__file__).resolve().parents[1]


def run_numba(spec: Spec, env: dict, dtype: str = "float64") -> np.ndarray:
    return run_host(BACKEND, spec, env, dtype)


def test_available():
    assert BACKEND.availability() == (True, "")
    assert BACKEND.name == "numba"


# =============================================================================================
# Correctness: forward and gradients, float64
# =============================================================================================
@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.id)
def test_corpus_forward_matches_naive_and_xla(case: Case):
    spec = analysed(case.spec, case.ranges)
    env = random_inputs(spec, case.shapes, seed=7)
    got = run_numba(spec, env)
    expected = naive_eval(spec, env)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got, xla_eval(spec, env), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case, wrt", list(gradient_cases()))
def test_gradient_steps_match_xla(case: Case, wrt: str):
    """Every step of every gradient through Numba vs the XLA lowering of the same step."""
    spec = analysed(case.spec, case.ranges)
    grad = next(g for g in gradients(spec) if g.wrt == wrt)
    inputs = random_inputs(spec, case.shapes, seed=8)
    if np.asarray(inputs[wrt]).dtype.kind != "f":
        pytest.skip("integer inputs get no gradient")
    result = run_numba(spec, inputs)  # the residual comes from the same backend, as in real use
    cotangent = np.random.default_rng(9).standard_normal(np.shape(result))
    env = gradient_env(spec, inputs, result, cotangent)
    got = run_gradient(grad, spec, env, run_numba)
    np.testing.assert_allclose(got, run_gradient(grad, spec, env, xla_eval), rtol=1e-9, atol=1e-10)


FLOAT32_CASES = ("matmul", "dist", "conv1d", "row_logsumexp", "row_norm", "softplus_sum", "embedding", "dot")


@pytest.mark.parametrize("case_id", FLOAT32_CASES)
def test_float32_within_1e4_of_float64(case_id: str):
    case = CASES_BY_ID[case_id]
    spec = analysed(case.spec, case.ranges)
    env64 = random_inputs(spec, case.shapes, seed=10)
    env32 = {n: (v.astype(np.float32) if np.asarray(v).dtype == np.float64 else v) for n, v in env64.items()}
    got = run_numba(spec, env32, "float32")
    assert got.dtype == np.float32
    reference = run_numba(spec, env64)
    scale = max(float(np.abs(reference).max()), 1.0)
    np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-4 * scale)


def test_special_values():
    """-inf initial values and infinities survive fastmath; an index array pointing outside reads NaN in a
    gather and is skipped in a scatter (the host kernel itself does not check: the API boundary does)."""
    x = np.array([[-np.inf, -np.inf], [1.0, np.inf], [0.0, 1.0]])
    np.testing.assert_array_equal(run_numba(analysed("(max) m[i] := x[i,j]"), {"x": x}), [-np.inf, np.inf, 1.0])
    lse = run_numba(analysed("(logsumexp) m[i] := x[i,j]"), {"x": x})
    np.testing.assert_allclose(lse, [-np.inf, np.inf, np.logaddexp(0.0, 1.0)])
    gather = run_numba(analysed("y[b] := W[ix[b]]"), {"W": np.array([1.0, 2.0]), "ix": np.array([1, 5, -1, 0])})
    np.testing.assert_array_equal(gather, [2.0, np.nan, np.nan, 1.0])
    env = {"h": np.zeros(2), "ix": np.array([1, 7, -3, 1]), "v": np.array([1.0, 10.0, 100.0, 2.0])}
    np.testing.assert_array_equal(run_numba(analysed("h[ix[b]] += v[b]"), env), [0.0, 3.0])


def test_generated_names_never_clash_with_user_names():
    """Array and scalar names that are Python/Numba names still work: the source only uses generated names."""
    spec = analysed("prange[i,j] := np[i,k]*range[k,j] + njit")
    rng = np.random.default_rng(0)
    env = {"np": rng.standard_normal((3, 4)), "range": rng.standard_normal((4, 5)), "njit": np.float64(0.5)}
    np.testing.assert_allclose(run_numba(spec, env), naive_eval(spec, env), rtol=1e-12)
    source = BACKEND.generate_source(spec, Signature(("float64",) * 3, "float64"))
    allowed = re.compile(r"(a|s|n|i|t)\d+(_lo|_|_q|_u\d+|_s\d*)?$|acc[ms]?$|shift$|tile(_lo|_hi)?$|p_flat$|p_ext\d+$"
                         r"|p_lo$|p_hi$")
    builtins = {"np", "njit", "prange", "range", "max", "min", "abs", "_FASTMATH", "_ix"}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            assert node.id in builtins or allowed.match(node.id), node.id
        if isinstance(node, ast.FunctionDef):
            assert node.name.startswith("kernel")
            assert all(allowed.match(a.arg) for a in node.args.args)


def test_non_contiguous_inputs_and_output():
    spec = analysed("C[i,j] := A[i,k]*B[k,j]")
    rng = np.random.default_rng(1)
    a_t = rng.standard_normal((4, 3)).T  # a transposed view: copied once, not miscomputed
    b = rng.standard_normal((8, 5))[::2]  # every other row
    signature = Signature(("float64", "float64"), "float64")
    kernel = BACKEND.build(spec, signature)
    out = np.zeros((5, 7))[:3, 1:6]  # a non-contiguous view of a bigger array
    kernel(out, a_t, b)
    np.testing.assert_allclose(out, a_t @ b, rtol=1e-12)


def test_flat_and_nested_variants_agree(monkeypatch):
    """With a short outermost parallel loop the host runs one prange over all parallel indices; a long one
    keeps the nest. Both compute the same thing."""
    monkeypatch.setenv("TULLAX_SERIAL_WORK", "0")  # these small calls would otherwise run the serial variant
    spec = analysed("D[i,j] := (W[k,i] - X[k,j])^2")
    rng = np.random.default_rng(2)
    short = {"W": rng.standard_normal((5, 3)), "X": rng.standard_normal((5, 40))}
    long = {"W": rng.standard_normal((5, 64)), "X": rng.standard_normal((5, 6))}
    for env in (short, long):
        np.testing.assert_allclose(run_numba(spec, env), naive_eval(spec, env), rtol=1e-12)
    kernel = BACKEND.build(spec, Signature(("float64", "float64"), "float64"))
    assert {"kernel", "kernel_flat"} <= set(kernel.variants_run)  # (earlier tiny calls ran the serial one)


# =============================================================================================
# Scatter: race-free on any number of threads
# =============================================================================================
_SCATTER_SCRIPT = textwrap.dedent("""
    import sys, numpy as np, numba
    from tullax.spec.analyze import analyze
    from tullax.spec.parse import parse_spec
    from tullax.backends.base import Signature
    from tullax.backends.numba.backend import NumbaBackend
    assert numba.get_num_threads() == int(sys.argv[1])
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
        NumbaBackend().build(spec, sig)(out, *[env[n] for n in spec.input_names])
        saved[f"out{number}"] = out
        saved.update({f"in{number}_{k}": env[n] for k, n in enumerate(spec.input_names)})
    np.savez(sys.argv[2], **saved)
""")


def test_scatter_kernels_are_race_free_on_2_and_4_threads(tmp_path: Path):
    outputs = []
    for threads in (2, 4):
        target = tmp_path / f"threads{threads}.npz"
        # TULLAX_SERIAL_WORK=0: these small scatters must run their parallel variants, never the serial one
        env = {**os.environ, "NUMBA_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO), "TULLAX_SERIAL_WORK": "0"}
        subprocess.run([sys.executable, "-c", _SCATTER_SCRIPT, str(threads), str(target)], check=True, env=env,
                       cwd=REPO, timeout=600)
        outputs.append(dict(np.load(target)))
    first = outputs[0]
    expected = first["in0_0"].copy()  # dW, g, ix
    np.add.at(expected, first["in0_2"], first["in0_1"])
    histogram = first["in1_0"].copy()  # h, v, ix
    np.add.at(histogram, first["in1_2"], first["in1_1"])
    shifted = first["in2_0"].copy()  # y, x, w
    shifted[1:] += first["in2_1"] * first["in2_2"]
    for result in outputs:
        np.testing.assert_allclose(result["out0"], expected, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(result["out1"], histogram, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(result["out2"], shifted, rtol=1e-12, atol=1e-12)
    for key in ("out0", "out1", "out2"):
        np.testing.assert_array_equal(outputs[0][key], outputs[1][key])  # same order of additions: identical


# =============================================================================================
# Caching and compile counts
# =============================================================================================
def test_second_build_in_process_compiles_nothing():
    spec = analysed("y[i] := x[i,j]*w[j] |> tanh")
    env = random_inputs(spec, seed=11)
    signature = Signature(("float64", "float64"), "float64")
    first = run_numba(spec, env)
    before = compile_stats()
    assert BACKEND.build(spec, signature) is BACKEND.build(spec, signature)
    np.testing.assert_array_equal(run_numba(spec, env), first)
    assert compile_stats()["compiled"] == before["compiled"]
    assert compile_stats()["loaded"] == before["loaded"]


_CACHE_SCRIPT = textwrap.dedent("""
    import json, sys, numpy as np
    from tullax.spec.analyze import analyze
    from tullax.spec.parse import parse_spec
    from tullax.backends.base import Signature
    from tullax.backends.numba.backend import NumbaBackend, compile_stats
    spec = analyze(parse_spec("D[i,j] := (W[k,i] - X[k,j])^2"))
    rng = np.random.default_rng(0)
    W, X = rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    out = np.empty((3, 2))
    NumbaBackend().build(spec, Signature(("float64", "float64"), "float64"))(out, W, X)
    from tullax.backends.numba.fastload import fast_load_problem
    print(json.dumps({"stats": compile_stats(), "out": out.tolist(), "fast_load_problem": fast_load_problem(),
                      "numba_target_loaded": "numba.np.arraymath" in sys.modules}))
""")


def test_new_process_with_a_populated_cache_compiles_nothing(tmp_path: Path):
    env = {**os.environ, "TULLAX_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _CACHE_SCRIPT], env=env, cwd=REPO, timeout=600,
                              capture_output=True, text=True, check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    assert cold["stats"]["compiled"] == 1 and cold["stats"]["loaded"] == 0
    assert warm["stats"]["compiled"] == 0 and warm["stats"]["loaded"] == 1
    assert cold["out"] == warm["out"]
    # The warm process loaded the kernel without initialising Numba's whole CPU target (numba_fastload).
    assert cold["numba_target_loaded"] and not warm["numba_target_loaded"]
    assert warm["fast_load_problem"] is None
    index = json.loads((tmp_path / "cache" / "index.json").read_text())["entries"]
    (record,) = index.values()
    assert record["backend"] == "numba" and record["spec"] == "D[i,j] := (W[k,i] - X[k,j])^2"
    assert record["compile_ms"] > 0 and record["ttfk_cold_ms"] > 0 and record["ttfk_warm_ms"] > 0
    assert record["hits"] == 1
    (source,) = (tmp_path / "cache" / "entries").glob("*/kernels.py")
    assert "def kernel(" in source.read_text()
    assert list(source.parent.glob("__pycache__/kernels.*.pyc")), "the generated module's bytecode is cached"
    assert list(source.parent.glob("*.nbi")) and list(source.parent.glob("*.nbc")), "Numba's code is in the entry"


def test_jit_lowering_compiles_the_kernel_at_trace_time():
    """The JAX path prepares the host kernel while lowering, so a compile error would surface at trace time,
    not inside the callback: lowering alone (no execution) already compiled or loaded the kernel."""
    import jax

    import tullax

    kernel = tullax.einsum_kernel("t[i] := x[i,j]*w[j] + 3", backend="numba")
    x, w = np.ones((5, 4), np.float32), np.ones(4, np.float32)
    before = compile_stats()
    jax.jit(kernel).lower(x, w)
    after = compile_stats()
    assert after["compiled"] + after["loaded"] == before["compiled"] + before["loaded"] + 1
    np.testing.assert_allclose(np.asarray(jax.jit(kernel)(x, w)), np.full(5, 16.0))  # sum over j of (1*1 + 3)
    assert compile_stats()["compiled"] + compile_stats()["loaded"] == after["compiled"] + after["loaded"]


def test_four_processes_building_one_spec_at_once_compile_it_once(tmp_path: Path):
    """The entry lock is held around the first compile: one process compiles, the others load its result."""
    env = {**os.environ, "TULLAX_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", _CACHE_SCRIPT], env=env, cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    runs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr
        runs.append(json.loads(stdout.strip().splitlines()[-1]))
    assert sum(run["stats"]["compiled"] for run in runs) == 1
    assert sum(run["stats"]["loaded"] for run in runs) == 3
    assert all(run["out"] == runs[0]["out"] for run in runs)
    assert len(json.loads((tmp_path / "cache" / "index.json").read_text())["entries"]) == 1
    assert len(list((tmp_path / "cache" / "entries").glob("*/kernels.py"))) == 1


# =============================================================================================
# The generated module
# =============================================================================================
def test_module_source_holds_forward_and_every_gradient_kernel():
    spec = analysed("y[i] := x[i+k]*w[k]")
    source = module_source(spec, "float32")
    tree = ast.parse(source)
    names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert names == ["forward", "forward_serial", "grad0_step0", "grad0_step0_serial", "grad1_step0",
                     "grad1_step0_serial"]
    assert "np.float32(0.0)" in source and "range(p_lo, p_hi)" in source  # chunk variants: no prange
    assert "# forward: y[i] := x[i+k]*w[k]" in source
    assert BACKEND.module_source(spec, "float64") == module_source(spec, "float64")


def test_generate_source_is_one_kernel_and_its_flat_and_serial_variants():
    spec = analysed("C[i,j] := A[i,k]*B[k,j]")
    source = BACKEND.generate_source(spec, Signature(("float32", "float32"), "float32"))
    functions = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)]
    assert [n.name for n in functions] == ["kernel", "kernel_flat", "kernel_serial"]
    serial = ast.get_source_segment(source, functions[2])
    assert "prange" not in serial and "parallel=False" in ast.unparse(functions[2].decorator_list[0])
    assert "fastmath=_FASTMATH" in source and "'nnan'" not in source
    # one parallel nest: the nested and flat variants are chunk functions, serial code over (p_lo, p_hi) of
    # the outermost parallel loop (flat: of the product), run on the host's threads (no Numba parfor)
    for function in functions[:2]:
        assert [a.arg for a in function.args.args][-2:] == ["p_lo", "p_hi"]
        assert "prange" not in ast.get_source_segment(source, function)
        assert "parallel=False" in ast.unparse(function.decorator_list[0])
        assert "in range(p_lo, p_hi):" in ast.get_source_segment(source, function)


def test_a_scalar_result_and_two_parallel_nests_keep_numbas_prange():
    """Chunks need ONE parallel loop nest: a scalar result's reduction (Numba's partial sums) keeps its prange."""
    spec = analysed("ssum := x[i]*y[i]")
    source = BACKEND.generate_source(spec, Signature(("float32", "float32"), "float32"))
    assert "prange(" in source and "p_lo" not in source


# =============================================================================================
# Tiny kernels run serially
# =============================================================================================
def test_work_estimate_puts_a_tiny_matmul_below_the_serial_threshold():
    from tullax.backends import workload

    spec = analysed("C[i,j] := A[i,k]*B[k,j]")
    assert workload.work(spec, {"A": (32, 24), "B": (24, 48)}) == 32 * 48 * 24 * 3  # one *, two reads
    assert workload.runs_serially(spec, {"A": (32, 24), "B": (24, 48)})
    assert not workload.runs_serially(spec, {"A": (256, 256), "B": (256, 256)})
    # an MLP layer's 256x64 by 64x64 (3.1M) runs on one thread: its team cost more than its loops (issue 45)
    mlp = analysed("h[b,o] := x[b,i]*W[i,o] |> tanh(_ + c[o])")
    assert workload.runs_serially(mlp, {"x": (256, 64), "W": (64, 64), "c": (64,)})
    assert workload.work(spec, {"A": (96, 40), "B": (40, 30)}) >= workload.serial_threshold()  # still raced
    exp = analysed("y[i] := exp(x[i,j])")  # a call costs more than arithmetic
    assert workload.body_cost(exp) > workload.body_cost(analysed("y[i] := x[i,j]*2"))


@pytest.mark.parametrize("text, small, large", [
    ("Cs[i,j] := A[i,k]*B[k,j]", {"A": (4, 3), "B": (3, 5)}, {"A": (96, 80), "B": (80, 70)}),
    ("(max) ms := x[i]", {"x": (9,)}, {"x": (300_000,)}),
    ("ss := x[i]*y[i]", {"x": (9,), "y": (9,)}, {"x": (300_000,), "y": (300_000,)}),
    ("(min) mr[i] := x[i,j]", {"x": (3, 4)}, {"x": (600, 600)}),
    ("dWs[ix[b],d] += g[b,d]", {"dWs": (5, 3), "ix": (11,), "g": (11, 3)}, {"dWs": (50, 64), "ix": (20000,),
                                                                             "g": (20000, 64)}),
])
def test_serial_variant_runs_tiny_calls_and_agrees_with_xla(text, small, large, monkeypatch):
    monkeypatch.setenv("TULLAX_SERIAL_WORK", str(1 << 18))  # small shapes on both sides of the threshold
    spec = analysed(text)
    kernel = None
    for shapes, variant in ((small, "_serial"), (large, None)):
        rng = np.random.default_rng(4)
        env = {n: rng.integers(0, shapes["dWs"][0], shapes[n]) if n == "ix" else rng.standard_normal(shapes[n])
               for n in spec.input_names}
        if variant and "max" in text:
            env["x"][3] = np.nan  # NaN propagates through the serial max too
        np.testing.assert_allclose(run_numba(spec, env), xla_eval(spec, env), rtol=1e-10, atol=1e-10)
        kernel = BACKEND.build(spec, Signature(tuple(np.asarray(env[n]).dtype.name for n in spec.input_names),
                                               "float64"))
        if variant:
            assert kernel.variants_run == ("kernel_serial",), kernel.variants_run
    assert len(kernel.variants_run) == 2 and "kernel_serial" in kernel.variants_run


_OPT_LEVELS = textwrap.dedent("""
    import json
    import numpy as np
    from numba.core import config, event
    import tullax

    seen = []

    class Levels(event.Listener):  # Numba's own compile event: which function, at which optimisation level
        def on_start(self, ev):
            seen.append((ev.data["dispatcher"].py_func.__name__, int(config.OPT)))

        def on_end(self, ev):
            pass

    event.register("numba:compile", Levels())
    from tullax.backends.numba.backend import compile_stats
    kernel = tullax.einsum_kernel("Copt[i,j] := A[i,k]*B[k,j]", backend="numba")
    rng = np.random.default_rng(0)
    compiled = []
    for n in (3, 90):  # a tiny call (the serial variant), then a large one (a parallel variant)
        a, b = rng.standard_normal((n, n + 1)), rng.standard_normal((n + 1, n))
        np.testing.assert_allclose(np.asarray(kernel(a, b)), a @ b, rtol=1e-10)
        compiled.append(compile_stats()["compiled"])
    from tullax.backends.numba.backend import _DISPATCHERS
    parallel = {fn.__name__: fn.targetoptions.get("parallel") for fn in _DISPATCHERS if fn.signatures}
    noalias = {fn.__name__: all(c.fndesc.noalias for c in fn.overloads.values()) for fn in _DISPATCHERS
               if fn.signatures}
    print(json.dumps({"seen": seen, "after": int(config.OPT), "compiled": compiled, "parallel": parallel,
                      "noalias": noalias}))
""")


def test_each_call_compiles_only_its_variant_serial_at_o2_and_no_parfor_but_noalias(tmp_path):
    """A tiny call compiles the serial variant alone, with LLVM's O2 passes (a few % less compile time); a large
    call then compiles its chunk variant alone, at Numba's level (3), without Numba's parfor pipeline (no
    gufunc is compiled: only kernel functions); the level is restored after the serial compile."""
    env = {**os.environ, "TULLAX_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO),
           "TULLAX_SERIAL_WORK": str(1 << 18)}  # the 90x91x90 call above the threshold
    env.pop("NUMBA_OPT", None)
    done = subprocess.run([sys.executable, "-c", _OPT_LEVELS], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    levels = {name: level for name, level in result["seen"] if name.startswith("kernel")}
    assert levels["kernel_serial"] == 2, result
    assert levels.get("kernel", levels.get("kernel_flat")) == 3, result
    assert result["after"] == 3
    assert result["compiled"] == [1, 2], result  # one function per call: nothing compiled that did not run
    assert result["parallel"] == {"kernel_serial": False, "kernel": False}, result  # no parfor compiled
    # the chunk variant's arrays are noalias, as in the gufunc Numba compiles for a prange (LLVM hoists and
    # vectorises: the embedding gather was 2.6x slower without); the serial one is compiled as before
    assert result["noalias"] == {"kernel_serial": False, "kernel": True}, result
