"""The benchmark machinery (tullax bench, benchmarks/run.py) on tiny inputs: real child processes, real timings."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tullax import ShapeError, TullaxError
from tullax.backends import availability
from tullax.benchmarking.case import (
    BenchCase,
    parse_range_arg,
    parse_shape_arg,
)
from tullax.benchmarking.runner import case_document, run_child
from tullax.benchmarking.worker import relative_error
from tullax.spec.examples import make_inputs
from tullax.spec.frontend import compile_spec

NORM = "n[i] := x[i,j]^2 |> sqrt"
NUMBA_USABLE = any(name == "numba" and ok for name, ok, _ in availability())


def test_shape_and_range_arguments_parse():
    assert parse_shape_arg("W=784x1024") == ("W", (784, 1024))
    assert parse_shape_arg(" w = 31 ") == ("w", (31,))
    assert parse_shape_arg("s=") == ("s", ())
    assert parse_range_arg("i=10") == ("i", 10)
    assert parse_range_arg("i=2:12") == ("i", (2, 12))
    for bad in ("W=784x", "784x1024", "W=a"):
        with pytest.raises(TullaxError, match="NAME=AxB"):
            parse_shape_arg(bad)
    with pytest.raises(TullaxError, match="NAME=N"):
        parse_range_arg("i=2:")


def test_inputs_fit_the_spec_and_index_arrays_stay_in_range():
    _, spec = compile_spec("out[b,d] := W[ix[b],d]")
    W, ix = make_inputs(spec, {"W": (7, 3), "ix": (500,)}, "float32")
    assert W.shape == (7, 3) and W.dtype == np.float32
    assert ix.dtype == np.int64 and ix.min() >= 0 and ix.max() == 6  # 500 draws cover every row of W


def test_shapes_are_checked_before_any_child_starts():
    dist = "D[i,j] := (W[k,i]-X[k,j])^2"
    with pytest.raises(ShapeError, match="no shape given for X"):
        case_document(BenchCase("d", dist, {"W": (4, 5)}), "float32")
    with pytest.raises(ShapeError, match="must be equal"):
        case_document(BenchCase("d", dist, {"W": (4, 5), "X": (3, 5)}), "float32")
    # TTFK runs on every extent capped at 32, unless that breaks the spec (position 40 of a 32-wide axis).
    doc = case_document(BenchCase("c", "y[i] := x[i+k]*w[k]", {"x": (100,), "w": (40,)}), "float32")
    assert doc["ttfk_shapes"] == {"x": [32], "w": [32]}
    doc = case_document(BenchCase("c", "C[i] := A[i,40]", {"A": (100, 50)}), "float32")
    assert doc["ttfk_shapes"] == {"A": [100, 50]}


def test_relative_error_is_normwise_and_catches_non_finite_values():
    ref = np.array([1.0, -4.0, 2.0])
    assert relative_error(ref + [0, 0, 1e-3], ref) == pytest.approx(1e-3 / 4)
    assert relative_error(np.array([1.0, np.nan, 2.0]), ref) == math.inf
    assert relative_error(np.array([-np.inf]), np.array([-np.inf])) == 0.0
    assert relative_error(np.zeros(2), np.zeros(3)) == math.inf


def test_a_child_past_its_timeout_is_killed(tmp_path):
    job = {"spec": NORM, "ranges": None, "shapes": {"x": [4, 4]}, "check_shapes": {"x": [4, 4]},
           "ttfk_shapes": {"x": [4, 4]}, "backend": "xla", "dtype": "float32", "repeat": 1, "seed": 0,
           "phases": ["fwd"]}
    result = run_child(job, str(tmp_path), timeout_s=0.05, extra_env={})
    assert result.returncode is None  # killed: importing jax alone takes longer than that


@pytest.mark.slow
def test_tullax_bench_measures_a_kernel_against_xla(tmp_path):
    from tullax.cli import main

    backends = "xla,numba" if NUMBA_USABLE else "xla"
    out = {ext: tmp_path / f"norm.{ext}" for ext in ("json", "md", "png")}
    status = main(["bench", NORM, "--shape", "x=8x16", "--backends", backends, "--repeat", "1", "--quiet",
                   "--json", str(out["json"]), "--markdown", str(out["md"]), "--plot", str(out["png"])])
    assert status == 0
    doc = json.loads(out["json"].read_text())
    assert doc["machine"]["usable_cores"] >= 1 and doc["machine"]["versions"]["jax"]
    results = doc["cases"][0]["results"]
    assert list(results) == backends.split(",")
    for backend, row in results.items():
        assert row["status"] == "ok", row
        assert row["fwd_ms"] > 0 and row["bwd_ms"] > 0 and row["ttfk_cold_ms"] > 0 and row["peak_rss_mb"] > 0
        assert row["max_rel_err"] <= 1e-4 and set(row["rel_err"]) == {"out", "x"}
        assert row["grad_fwd_ratio"] == pytest.approx(row["bwd_ms"] / row["fwd_ms"])
        # timed in three processes (the main child, then two more on its cache), the median kept
        for which in ("fwd", "bwd"):
            samples = row[f"{which}_process_ms"]
            assert len(samples) == 3 and row[f"{which}_ms"] == sorted(samples)[1]
    if NUMBA_USABLE:
        numba = results["numba"]
        assert numba["ttfk_warm_ms"] > 0 and numba["cache_entries"], numba
        # best of 3 cold processes (each on an empty cache) and of 5 warm ones (on the populated cache)
        assert len(numba["ttfk_cold_samples_ms"]) == 3 and numba["ttfk_cold_ms"] == min(numba["ttfk_cold_samples_ms"])
        assert len(numba["ttfk_warm_samples_ms"]) == 5 and numba["ttfk_warm_ms"] == min(numba["ttfk_warm_samples_ms"])
        assert numba["fwd_speedup"] == pytest.approx(results["xla"]["fwd_ms"] / numba["fwd_ms"])
    assert "| n[i] := x[i,j]^2 \\|> sqrt | xla |" in out["md"].read_text()
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_rejects_a_shape_for_an_input_the_spec_does_not_take(capsys):
    from tullax.cli import main

    assert main(["bench", NORM, "--shape", "x=8x16", "--shape", "y=3"]) == 2
    assert "does not take" in capsys.readouterr().err


def test_the_suite_writes_its_results_and_checks_the_targets(tmp_path):
    from benchmarks.report import check_targets
    from benchmarks.run import main

    # XLA alone keeps this cheap (the Numba path is measured above): no tullax backend, so no target passes.
    status = main(["--quick", "--cases", "row norm", "--backends", "xla", "--repeat", "1", "--no-ttfk",
                   "--quiet", "--out-dir", str(tmp_path), "--name", "t", "--check-targets"])
    assert status == 1
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["config"]["quick"] is True and [c["name"] for c in doc["cases"]] == ["row norm"]
    assert doc["cases"][0]["shapes"] == {"x": [1024, 1024]}
    assert doc["cases"][0]["results"]["xla"]["max_rel_err"] <= 1e-4
    # the hand-written jnp formulation runs next to the reference, and the best of them is the yardstick
    hand = doc["cases"][0]["results"]["jnp"]
    assert hand["status"] == "ok" and hand["max_rel_err"] <= 1e-4, hand
    best = min(doc["cases"][0]["results"][b]["fwd_ms"] for b in ("xla", "jnp"))
    assert hand["fwd_vs_best_xla"] == pytest.approx(best / hand["fwd_ms"])
    assert check_targets(doc) == []
    assert "| row norm | xla |" in (tmp_path / "t.md").read_text()
    assert (tmp_path / "t.png").exists()


def test_bench_plot_checks_matplotlib_before_running_anything(tmp_path, monkeypatch, capsys):
    import sys
    import time

    from tullax.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as in an environment without matplotlib
    out = tmp_path / "norm.json"
    start = time.perf_counter()
    assert main(["bench", NORM, "--shape", "x=8x16", "--backends", "xla", "--quiet", "--json", str(out),
                 "--plot", str(tmp_path / "norm.png")]) == 2
    assert "--plot needs matplotlib, which is not installed: pip install matplotlib" in capsys.readouterr().err
    assert not out.exists() and time.perf_counter() - start < 5  # nothing ran: no child process was started
    from benchmarks.run import main as suite_main

    with pytest.raises(SystemExit, match="--plot needs matplotlib.*--no-plot"):
        suite_main(["--quick", "--cases", "row norm", "--backends", "xla", "--out-dir", str(tmp_path)])
    assert not (tmp_path / "latest-quick.json").exists()


def test_the_chart_shows_linear_speed_up_bars_with_the_cases_named_in_full(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tullax.benchmarking.report import derive, plot

    def row(fwd, bwd):
        return {"status": "ok", "fwd_ms": fwd, "bwd_ms": bwd}

    doc = derive({"config": {"backends": ["xla", "jnp", "auto"], "dtype": "float32"},
                  "machine": {"cpu": "test cpu", "usable_cores": 2},
                  "cases": [{"name": "Gaussian kernel sum", "results": {"xla": row(4, 8), "jnp": row(2, 8),
                                                                        "auto": row(1, 2)}},
                            {"name": "attention scores", "results": {"xla": row(1, 1), "auto": row(1, 1)}}]})
    def drawn(name: str):
        """The one figure ``plot`` saves as ``name``."""
        shown = []
        savefig = plt.Figure.savefig

        def keep(figure, *args, **kwargs):
            shown.append(figure)
            return savefig(figure, *args, **kwargs)

        plt.Figure.savefig = keep
        try:
            plot(doc, tmp_path / name)
        finally:
            plt.Figure.savefig = savefig
        (figure,) = shown
        return figure

    figure = drawn("chart.png")
    forward, backward = figure.axes[:2]
    assert forward.get_xscale() == "linear" and backward.get_xscale() == "linear"
    assert [t.get_text() for t in forward.get_yticklabels()] == ["Gaussian kernel sum", "attention scores"]
    # one bar per backend that is no XLA comparator, against the fastest XLA formulation of each case (jnp's
    # 2 ms for the Gaussian kernel sum, xla's 1 ms for the attention scores): auto 2x and 1x
    widths = sorted(round(p.get_width(), 6) for p in forward.patches)
    assert widths == [1.0, 2.0]
    assert figure.legends and not forward.get_legend()  # the legend sits off the bars, below the panels
    assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a run of XLA comparators alone has no bar to draw, and says so instead of failing on an empty legend
    for case in doc["cases"]:
        del case["results"]["auto"]
    doc["config"]["backends"].remove("auto")
    figure = drawn("xla_only.png")
    assert not figure.legends and not figure.axes[0].patches
    assert "no tullax backend in this run" in [t.get_text() for t in figure.axes[0].texts]


def test_targets_are_judged_on_ratios():
    from benchmarks.report import check_targets

    def row(**fields):
        return {"status": "ok", **fields}

    doc = {"config": {"backends": ["xla", "numba"]}, "cases": [
        {"name": "Dist", "results": {"xla": row(), "numba": row(fwd_speedup=2.5, fwd_speedup_naive=40.0,
                                                                 bwd_speedup=4.0,
                                                                 grad_fwd_ratio=2.0, ttfk_warm_over_cold=0.1,
                                                                 max_rel_err=2e-5)}},
        {"name": "Linear", "results": {"xla": row(), "numba": row(fwd_speedup=0.5, grad_fwd_ratio=2.6,
                                                                   ttfk_warm_over_cold=0.3, max_rel_err=1e-6)}},
    ]}
    verdicts = {v.target.text: (v.status, v.measured) for v in check_targets(doc)}
    assert verdicts["Dist forward >= 30x faster than XLA materialising K*I*J (naive XLA)"] == ("PASS", "40.0x")
    # Information only: shown, never a pass or a fail.
    assert verdicts["Dist forward vs fused XLA (free indices first: no K*I*J temporary)"] == ("INFO", "2.5x")
    assert verdicts["Dist backward >= 5x faster than XLA"] == ("FAIL", "4.0x")
    assert verdicts["Linear grad/fwd <= 2.5"][0] == "FAIL"
    assert verdicts["Linear forward within 3x of XLA (time / XLA time)"] == ("PASS", "2.0x")
    assert verdicts["conv1d grad/fwd <= 3"][0] == "MISSING"
    assert verdicts["warm TTFK <= 25% of cold, every case (worst)"] == ("FAIL", "30% (Linear)")
    assert verdicts["float32 max rel err <= 1e-4 vs float64 XLA, every case (worst)"][0] == "PASS"
    from benchmarks.report import all_pass

    assert not any("auto" in v.target.text for v in check_targets(doc))  # the planner's targets: auto only
    assert not all_pass(check_targets(doc))
    assert all_pass([v for v in check_targets(doc) if v.status in ("PASS", "INFO")])


def test_the_later_timing_processes_run_in_rounds_over_the_backends(monkeypatch):
    """Each row's forward and backward are timed in ``timing_processes`` processes; the later ones run in rounds
    over the case's backends (xla, auto, xla, auto, ...), so a slow spell of the machine falls on every row
    alike. Timed row after row, auto's row max forward read 0.90x of the xla row's, the very same program."""
    from tullax.benchmarking import runner
    from tullax.benchmarking.case import BenchCase

    log: list[tuple[str, tuple[str, ...]]] = []
    figures = {"xla": iter([5.0, 9.0, 4.0]), "auto": iter([3.0, 1.0, 2.0])}

    def fake_child(job, cache_dir, timeout_s, extra_env, on_record=None):
        log.append((job["backend"], tuple(job["phases"])))
        if job["phases"] == ["h2h"]:  # last: auto head to head with the best XLA formulation of each phase
            assert job["h2h"] == {"fwd": "xla", "bwd": "xla"}
            paired = {w: {"comparator": c, "ratio": 1.5, "rounds": 15, "subject_ms": 2.0, "comparator_ms": 3.0}
                      for w, c in job["h2h"].items()}
            return runner.ChildResult(records=[{"phase": "h2h", "h2h": paired}], returncode=0, stderr_tail="",
                                      wall_s=0.0)
        ms = next(figures[job["backend"]])
        records = [{"phase": "fwd", "fwd_ms": ms}, {"phase": "bwd", "bwd_ms": 10 * ms}]
        return runner.ChildResult(records=records, returncode=0, stderr_tail="", wall_s=0.0)

    monkeypatch.setattr(runner, "run_child", fake_child)
    config = runner.RunConfig(backends=("xla", "auto"), ttfk=False, check=False, timing_processes=3)
    doc = runner.run_cases([BenchCase(name="norm", spec=NORM, shapes={"x": (4, 4)})], config, show_progress=False)
    assert [backend for backend, _ in log] == ["xla", "auto", "xla", "auto", "xla", "auto", "auto"]
    assert all(phases == ("fwd", "bwd") for _, phases in log[2:-1]) and log[-1] == ("auto", ("h2h",))
    results = doc["cases"][0]["results"]
    assert results["xla"]["fwd_process_ms"] == [5.0, 9.0, 4.0] and results["xla"]["fwd_ms"] == 5.0
    assert results["auto"]["fwd_ms"] == 2.0 and results["auto"]["bwd_ms"] == 20.0
    assert results["auto"]["h2h"]["fwd"]["ratio"] == 1.5 and "h2h" not in results["xla"]


def test_the_jax_cache_script_turns_on_jax_s_own_persistent_cache(tmp_path):
    """``benchmarks/ttfk_jax_cache.py`` turns JAX's persistent compilation cache on through JAX's environment
    variables: if JAX stopped reading them, its "warm + JAX cache" column would silently measure the plain warm
    TTFK. A TTFK child given them must leave compiled programs in the directory."""
    from benchmarks.ttfk_jax_cache import jax_cache_env, ttfk_ms

    job = {"spec": NORM, "ranges": None, "shapes": {"x": [4, 4]}, "check_shapes": {"x": [4, 4]},
           "ttfk_shapes": {"x": [4, 4]}, "idiomatic": None, "backend": "xla", "dtype": "float32", "repeat": 1,
           "seed": 0}
    (tmp_path / "tullax").mkdir()
    assert ttfk_ms(job, str(tmp_path / "tullax"), jax_cache_env(str(tmp_path / "jax"))) > 0
    assert any((tmp_path / "jax").iterdir())


def test_the_ttfk_timeline_records_the_backend_the_race_and_every_compile(tmp_path):
    """``benchmarks/ttfk_timeline.py`` runs make bench's TTFK child with its wrappers: a cold ``auto`` process
    records the C compiler's probe, resolving its loop backend (``auto`` itself is never resolved: the planner
    asks for the loop backend), the forward's race and the XLA compiles of the user's programs, each span
    from the first call on; a warm one generates and compiles no C module. If a wrapped function were renamed,
    its spans would silently vanish from the timeline: this test would see it."""
    from benchmarks.ttfk_timeline import run_child, totals

    # above the serial work threshold: a tiny call on a new cache runs on XLA and never looks at the loops
    job = {"spec": NORM, "ranges": None, "shapes": {"x": [4, 4]}, "check_shapes": {"x": [4, 4]},
           "ttfk_shapes": {"x": [1024, 512]}, "idiomatic": None, "backend": "auto", "dtype": "float32", "repeat": 1,
           "seed": 0}
    cold, warm = run_child(job, str(tmp_path)), run_child(job, str(tmp_path))
    labels = [label for _, _, label, _ in cold["spans"]]
    assert "c probe" in labels and "race n" in labels and labels.count("XLA compile") >= 2, labels
    assert "resolve auto" not in labels and any(label.startswith("resolve ") for label in labels), labels
    # the first kernel's own path (the main thread) lies within the TTFK; the optimised builds started beside the
    # fast tier run in the background and may end after it (under load they do)
    assert all(0 <= start <= end <= cold["ttfk_ms"] + 1 for start, end, _, thread in cold["spans"]
               if thread == "MainThread"), cold["spans"]
    assert all(0 <= start <= cold["ttfk_ms"] + 1 for start, _, _, _ in cold["spans"]), cold["spans"]
    assert totals(cold["spans"])["XLA compile"] > 0
    assert not any(label.startswith(("C codegen", "C compile")) for _, _, label, _ in warm["spans"])
    # the CPU time over the TTFK: this process's threads, and the C compiler's processes (the cold one probes)
    assert cold["process_cpu_ms"] > 0 and warm["process_cpu_ms"] > 0 and cold["compiler_cpu_ms"] > 0


def test_one_program_traced_from_two_functions_has_one_fingerprint():
    import jax
    import jax.numpy as jnp

    from tullax.benchmarking.programs import fingerprint, normalised_hlo

    x = jnp.ones((64, 32), jnp.float32)

    def row_sums(a):
        return jnp.sum(a * a, axis=1)

    def squares_summed(values):  # another function, other source lines: names and metadata differ
        squared = values * values
        return squared.sum(axis=1)

    text = jax.jit(row_sums).lower(x).compile().as_text()
    assert "metadata=" in text or "FileNames" in text  # what the fingerprint has to see through
    assert fingerprint(jax.jit(row_sums), x) == fingerprint(jax.jit(squares_summed), x)
    assert fingerprint(jax.jit(row_sums), x) != fingerprint(jax.jit(lambda a: jnp.sum(a + a, axis=1)), x)
    assert "metadata=" not in normalised_hlo(text) and "row_sums" not in normalised_hlo(text)
    assert fingerprint(lambda a: a, x) is None  # not a jax.jit function (a torch one): nothing to compare


def test_a_row_running_the_best_formulation_s_very_program_counts_as_1x():
    from benchmarks.report import check_targets
    from tullax.benchmarking.report import cells, derive

    def case(auto_program):
        return {"name": "Linear", "results": {
            "xla": {"status": "ok", "fwd_ms": 8.0, "bwd_ms": 8.0, "fwd_program": "A", "bwd_program": "B"},
            "jnp": {"status": "ok", "fwd_ms": 9.0, "bwd_ms": 9.0, "fwd_program": "C", "bwd_program": "D"},
            "auto": {"status": "ok", "fwd_ms": 8.9, "bwd_ms": 8.1, "fwd_program": auto_program,
                     "bwd_program": "E"}}}

    same = derive({"config": {"backends": ["xla", "jnp", "auto"]}, "cases": [case("A")]})
    auto = same["cases"][0]["results"]["auto"]
    assert auto["fwd_same_program"] == ["xla"] and auto["bwd_same_program"] == []
    assert auto["fwd_vs_best_xla"] == pytest.approx(8.0 / 8.9)  # the measurement stays in the results
    shown = cells(same["cases"][0], "auto", auto)
    assert "≡ (0.9x)" in shown and "0.99x" in shown  # forward: the same program; backward: measured
    verdicts = {v.target.text: (v.status, v.measured) for v in check_targets(same)}
    assert verdicts["auto forward >= 0.95x the best XLA formulation (head to head), every case (worst)"][0] == "PASS"
    assert verdicts["auto Linear forward within 1.1x of XLA (time / XLA time)"] == ("PASS", "1.00x")

    other = derive({"config": {"backends": ["xla", "jnp", "auto"]}, "cases": [case("F")]})
    verdicts = {v.target.text: (v.status, v.measured) for v in check_targets(other)}
    forward = "auto forward >= 0.95x the best XLA formulation (head to head), every case (worst)"
    assert verdicts[forward] == ("FAIL", "0.90x (Linear)")
    assert verdicts["auto Linear forward within 1.1x of XLA (time / XLA time)"] == ("FAIL", "1.11x")


def test_a_program_that_cannot_be_fingerprinted_keeps_its_timings(monkeypatch):
    from tullax.benchmarking import programs, worker

    def broken(jitted, *args):
        raise RuntimeError("no HLO text here")

    monkeypatch.setattr(programs, "fingerprint", broken)
    job = {"spec": NORM, "ranges": None, "shapes": {"x": [4, 4]}, "backend": "xla", "dtype": "float32",
           "repeat": 1, "seed": 0, "idiomatic": None, "fingerprint": True}
    record = worker._timed_phase(job, {}, "fwd")
    assert record["fwd_ms"] > 0 and "fwd_program" not in record
    assert record["fwd_program_error"] == "RuntimeError: no HLO text here"


def test_auto_against_the_best_xla_formulation_counts_the_head_to_head_ratio():
    """The rows time each backend in processes of their own; the target on auto counts the ratio measured head
    to head in one process, where it was measured against the comparator that is best, else the rows' ratio."""
    from benchmarks.report import check_targets
    from tullax.benchmarking.report import derive, head_to_head_lines

    def doc(h2h):
        return derive({"config": {"backends": ["xla", "jnp", "auto"]}, "cases": [{"name": "conv2d", "results": {
            "xla": {"status": "ok", "fwd_ms": 46.0, "bwd_ms": 950.0},
            "jnp": {"status": "ok", "fwd_ms": 13.1, "bwd_ms": 28.5},
            "auto": {"status": "ok", "fwd_ms": 15.7, "bwd_ms": 16.8, "h2h": h2h}}}]})

    def verdicts(d):
        return {v.target.text: (v.status, v.measured) for v in check_targets(d)}

    forward = "auto forward >= 0.95x the best XLA formulation (head to head), every case (worst)"
    backward = "auto backward >= 0.95x the best XLA formulation (head to head), every case (worst)"
    rows_only = doc({})
    assert verdicts(rows_only)[forward] == ("FAIL", "0.83x (conv2d)")  # 13.1 / 15.7, two processes
    paired = {"fwd": {"comparator": "jnp", "ratio": 1.07, "rounds": 15, "subject_ms": 17.6, "comparator_ms": 18.6},
              "bwd": {"comparator": "xla", "ratio": 0.5, "rounds": 15, "subject_ms": 17.0, "comparator_ms": 8.5}}
    both = doc(paired)
    assert verdicts(both)[forward] == ("PASS", "1.07x (conv2d)")
    # measured against xla, but jnp is the best backward formulation: the rows' ratio (28.5 / 16.8) counts
    assert verdicts(both)[backward] == ("PASS", "1.70x (conv2d)")
    assert head_to_head_lines(both) == ["| conv2d | forward | jnp | 17.6 ms | 18.6 ms | 1.07 | 15 |"]


def test_the_head_to_head_phase_pairs_the_two_round_by_round_in_alternating_order(monkeypatch):
    """``phase_h2h`` on a clock that only the calls move: the subject takes 2 units, the comparator 6, so every
    round's ratio is 3; the first of each round alternates, and a quick call runs several times per round."""
    from types import SimpleNamespace

    from tullax.benchmarking import worker

    clock = [0.0]
    calls: list[str] = []

    def subject(name, cost):
        def run(*args):
            calls.append(name)
            clock[0] += cost
            return np.zeros(1)
        return SimpleNamespace(fwd=run, bwd=run, wrt=(0,), inputs=lambda *a: ([np.ones(2)], np.ones(2)))

    made = {"auto": subject("auto", 2e-3), "jnp": subject("jnp", 6e-3)}
    monkeypatch.setattr(worker, "make_subject", lambda job: made[job["backend"]])
    monkeypatch.setattr(worker, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(worker, "block", lambda value: value)
    job = {"backend": "auto", "shapes": {}, "dtype": "float32", "seed": 0, "h2h": {"fwd": "jnp"}}
    found = worker.phase_h2h(job, {})["h2h"]
    assert set(found) == {"fwd"}
    fwd = found["fwd"]
    assert fwd["comparator"] == "jnp" and fwd["ratio"] == pytest.approx(3.0)
    assert fwd["rounds"] == worker.H2H_ROUNDS and fwd["calls_per_round"] == 3  # ceil(5 ms / 2 ms)
    assert fwd["subject_ms"] == pytest.approx(2.0) and fwd["comparator_ms"] == pytest.approx(6.0)
    rounds = calls[4:]  # after two warm-up calls each
    firsts = [rounds[i * 6] for i in range(worker.H2H_ROUNDS)]
    assert firsts[:4] == ["auto", "jnp", "auto", "jnp"]


def test_a_failed_head_to_head_child_is_reported_in_auto_s_errors(monkeypatch):
    from tullax.benchmarking import runner

    results = {"xla": {"fwd_ms": 2.0, "bwd_ms": 3.0}, "auto": {"fwd_ms": 1.0, "errors": {"check": "old"}}}
    outcomes = iter([
        runner.ChildResult(records=[{"phase": "h2h", "error": "ValueError: no"}], returncode=0, stderr_tail="",
                           wall_s=0.0),
        runner.ChildResult(records=[], returncode=None, stderr_tail="", wall_s=0.0),
        runner.ChildResult(records=[], returncode=3, stderr_tail="Segmentation fault", wall_s=0.0),
    ])
    monkeypatch.setattr(runner, "run_child", lambda *args, **kwargs: next(outcomes))
    config = runner.RunConfig(backends=("xla", "auto"), timeout_s=60.0)
    job = {"backend": "auto", "phases": ["fwd"]}
    found = [runner.head_to_head(results, job, "/nowhere", config) for _ in range(3)]
    assert [f["errors"]["h2h"] for f in found] == [
        "ValueError: no", "timed out after 60 s", "the child exited with status 3: Segmentation fault"]
    assert all(f["errors"]["check"] == "old" and "h2h" not in f for f in found)
    assert runner.head_to_head({"auto": {}}, job, "/nowhere", config) == {}  # no comparator timed: no child


C_USABLE = any(name == "c" and ok for name, ok, _ in availability())


@pytest.mark.skipif(not C_USABLE, reason="needs the c backend for a second row")
def test_an_interrupted_bench_reports_progress_and_leaves_valid_partial_results(tmp_path):
    """Issue 45: `tullax bench` printed nothing for minutes (rich's bar shows on a terminal only) and, when
    interrupted, left no JSON or chart. Each finished backend is a line on stderr and the results are saved after
    it; Ctrl-C writes what was measured (valid JSON, marked incomplete), the table and the chart."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    out = {ext: tmp_path / f"partial.{ext}" for ext in ("json", "md", "png")}
    # Ctrl-C's handler restored: a process started in the background of a non-interactive shell (a CI runner's,
    # nohup's) inherits SIGINT ignored, and Python keeps it ignored
    command = [sys.executable, "-c", "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
               "from tullax.cli import main; sys.exit(main(sys.argv[1:]))",
               "bench", NORM, "--shape", "x=8x16", "--backends", "c", "--repeat", "1", "--no-ttfk",
               "--timing-processes", "1", "--json", str(out["json"]), "--markdown", str(out["md"]),
               "--plot", str(out["png"])]
    # the c row must still be running when the interrupt comes: its compiles (not the probe's) sleep first, and
    # no fast tier serves it meanwhile (a row that finished first left nothing to interrupt: rc 0 under load)
    slow = tmp_path / "slowcc"
    slow.write_text('#!/bin/sh\ncase "$*" in *tullax-c-probe-*) ;; *) sleep 5 ;; esac\nexec cc "$@"\n')
    slow.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
           "TULLAX_CACHE_DIR": str(tmp_path / "cache"), "TULLAX_CC": str(slow), "TULLAX_C_TIERS": "off"}
    bench = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not out["json"].exists() and bench.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # the xla row's main child has finished once the file is there
    assert out["json"].exists(), bench.communicate()
    bench.send_signal(signal.SIGINT)  # while the c row's child runs
    stdout, stderr = bench.communicate(timeout=120)
    assert bench.returncode == 130, stderr
    doc = json.loads(out["json"].read_text())
    assert doc["complete"] is False and doc["cases"][0]["results"]["xla"]["fwd_ms"] > 0
    assert "xla: ok, forward" in stderr and "interrupted: the results so far are in" in stderr
    assert "interrupted: partial results" in stdout and out["md"].exists()
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_one_case_table_names_its_spec_once_and_drops_empty_columns():
    """A spec in the case column of every row wrapped over three lines in 160 columns."""
    from rich.console import Console

    from tullax.benchmarking.report import derive, print_table

    spec = "D[i,j] := (W[k,i] - X[k,j])^2"
    doc = derive({"config": {"backends": ["xla", "c"], "dtype": "float32", "repeat": 1},
                  "machine": {"cpu": "test cpu", "usable_cores": 2, "versions": {}, "python": "3", "date": "today"},
                  "cases": [{"name": spec, "canonical": spec, "shapes": {}, "results": {
                      "xla": {"status": "ok", "fwd_ms": 1.0, "bwd_ms": 2.0},
                      "c": {"status": "ok", "fwd_ms": 0.5, "bwd_ms": 1.0}}}]})
    console = Console(width=160, record=True)
    print_table(doc, console, title="tullax bench")
    text = console.export_text()
    assert f"tullax bench: {spec}" in text and text.count(spec) == 1
    header = next(line for line in text.splitlines() if "backend" in line)
    assert "naive" not in text and "TTFK" not in text and "forward" in header  # no value in any row: left out


def test_no_title_of_the_chart_is_clipped(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tullax.benchmarking.report import derive, plot

    doc = derive({"config": {"backends": ["xla", "c"], "dtype": "float32"},
                  "machine": {"cpu": "AMD EPYC 7B13 64-Core Processor", "usable_cores": 2},
                  "cases": [{"name": "D[i,j] := (W[k,i] - X[k,j])^2", "results": {
                      "xla": {"status": "ok", "fwd_ms": 1.0, "bwd_ms": 2.0},
                      "c": {"status": "ok", "fwd_ms": 0.5, "bwd_ms": 1.0}}}]})
    boxes = []
    savefig = plt.Figure.savefig

    def keep(figure, *args, **kwargs):
        done = savefig(figure, *args, **kwargs)  # laid out now: the titles have their final places
        renderer = figure.canvas.get_renderer()
        titles = [axis.title for axis in figure.axes] + [figure._suptitle]
        boxes.extend((t.get_text(), t.get_window_extent(renderer), figure.bbox.width) for t in titles)
        return done

    plt.Figure.savefig = keep
    try:
        plot(doc, tmp_path / "chart.png")
    finally:
        plt.Figure.savefig = savefig
    assert len(boxes) == 3
    for text, box, width in boxes:
        assert box.x0 >= 0 and box.x1 <= width, (text, box, width)


def test_a_row_times_the_optimised_build_never_the_fast_tier_serving_a_cold_process():
    """A c module the compile cache does not hold runs its first calls on the fast tier while the optimised build
    compiles (a compile in flight, ``own_compiles``); the timed runs start only once it has landed."""
    import threading
    from types import SimpleNamespace

    from tullax.benchmarking import worker
    from tullax.runtime import own_compiles

    seen: list[int] = []

    def forward(*args):
        if not seen:  # the warm-up: its call starts the optimised build, which lands a moment later
            build = own_compiles.begin("optimised build")
            threading.Timer(0.5, own_compiles.end, (build,)).start()
        seen.append(own_compiles.running())
        return 0.0

    worker.block(0.0)  # jax imported before the warm-up (an import slower than the build would hide it)
    subject = SimpleNamespace(fwd=forward, wrt=())
    state = {"subject": subject, "args": [], "cotangent": None, "rss_before_mb": 0.0}
    record = worker._timed_phase({"backend": "c", "repeat": 3}, state, "fwd")
    assert seen[0] == 1 and len(seen) == 1 + record["fwd_runs"]
    assert seen[1:] == [0] * record["fwd_runs"]  # no timed run beside the build


def test_auto_s_rows_record_the_whole_gradient_decisions_their_phase_made():
    """The race of a differentiated call's whole gradient (derived steps against JAX's autodiff of the forward's XLA
    form) decides the backward's structure: an auto row records it beside the kernels' plans."""
    from types import SimpleNamespace

    from tullax.benchmarking import worker
    from tullax.planner import autodiff

    _, spec = compile_spec("(logsumexp) l[i] := x[i,j]")
    key = ((spec, (("x", (4, 8)),)), "float32", ("x",), "cpu")
    chosen = autodiff._as_plan("autodiff:grid", "raced", (("derived", 2.0), ("autodiff:grid", 1.0)), "timed")

    def backward(*args):
        autodiff._MEMO[key] = chosen  # the race runs as the VJP is traced
        return 0.0

    subject = SimpleNamespace(bwd=backward, wrt=(0,))
    state = {"subject": subject, "args": [], "cotangent": None, "rss_before_mb": 0.0}
    try:
        record = worker._timed_phase({"backend": "auto", "repeat": 1}, state, "bwd")
    finally:
        autodiff._MEMO.pop(key, None)
    assert record["bwd_plans"] == ["l (whole gradient w.r.t. x): xla (autodiff:grid): gradient: raced; timed: "
                                   "derived 2 ms, autodiff:grid 1 ms (timed on first use)"]
