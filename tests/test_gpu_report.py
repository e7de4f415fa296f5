"""The report of ``benchmarks/gpu.py`` (its targets and Markdown), from a made-up run: the script itself needs a GPU,
its report must not wait for one to be checked."""
from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu.py"


def gpu_script():
    spec = importlib.util.spec_from_file_location("gpu_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timing_row(case: str, cuda: tuple[float, float], xla: tuple[float, float], auto: tuple[float, float]) -> dict:
    row = {"case": case, "cuda_forward_ms": cuda[0], "cuda_backward_ms": cuda[1], "xla_forward_ms": xla[0],
           "xla_backward_ms": xla[1], "auto_forward_ms": auto[0], "auto_backward_ms": auto[1]}
    row.update(grad_over_fwd=cuda[1] / cuda[0], forward_speedup_vs_xla=xla[0] / cuda[0],
               backward_speedup_vs_xla=xla[1] / cuda[1], auto_grad_over_fwd=auto[1] / auto[0],
               auto_forward_vs_best_xla=xla[0] / auto[0], auto_backward_vs_xla=xla[1] / auto[1])
    return row


def test_the_report_reads_every_part_and_its_targets():
    gpu = gpu_script()
    report = {
        "device": "NVIDIA Test GPU", "dtype": "float32", "quick": False, "parts": list(gpu.PARTS),
        "seconds": {"timings": 1.0}, "versions": {"jax": "0", "tullax": "0", "nvrtc": "13.0"},
        "timings": [timing_row("conv1d", (0.1, 0.2), (0.2, 0.4), (0.1, 0.3)),
                    timing_row("embedding", (0.1, 0.2), (0.08, 0.1), (0.1, 0.105)),
                    {"case": "Linear", "error": "stopped after 40 s (stderr: )"}],
        "unsplit": [{"case": "conv1d", "cuda_backward_ms": 150.0}],
        "overhead": {"tullax_us": 90.0, "jnp_us": 75.0, "overhead_us": 15.0},
        "ttfk": {"cold_s": 0.4, "warm_s": 0.35, "auto_cold_s": 0.5, "auto_warm_s": 0.3},
        "corpus": [{"case": "dist", "dtype": "float32", "passed": True, "max_error": 1e-7},
                   {"case": "dist", "dtype": "float64", "passed": False, "max_error": 1e-3}],
    }
    report["targets"] = gpu.targets(report["timings"], report["overhead"], report["ttfk"])
    verdicts = dict(report["targets"])
    assert verdicts["conv1d: grad/fwd <= 3"] is True and verdicts["Linear: grad/fwd <= 3"] is False
    assert verdicts["embedding gradient not slower than XLA's scatter"] is False  # 0.5x
    assert verdicts["per-call overhead <= 30 us above a jnp op"] is True
    assert verdicts["TTFK warm <= 0.3 s"] is False and verdicts["TTFK cold <= 1.5 s"] is True
    assert verdicts["auto, conv1d: >= 0.95x XLA forward and backward"] is True
    assert verdicts["auto, embedding: >= 0.95x XLA forward and backward"] is False  # 0.8x forward
    assert "auto, Linear: >= 0.95x XLA forward and backward" not in verdicts  # not measured: no verdict
    text = gpu.markdown(report)
    assert "| conv1d | 0.100 | 0.300 | 3.000 | 2.000 | 1.333 |" in text  # the auto table
    assert "| conv1d | 0.200 | 150.000 | 750.000 |" in text  # split against unsplit
    assert "- Linear: stopped after 40 s" in text
    assert "+15.0 us" in text and "under auto cold 0.500 s, warm 0.300 s" in text
    assert "float32 (rtol 0.0001): 1/1 cases pass" in text and "float64 (rtol 1e-09): 0/1 cases pass" in text
    assert "- FAIL: TTFK warm <= 0.3 s" in text and "- PASS: per-call overhead" in text


def test_a_report_of_no_parts_says_what_did_not_run():
    gpu = gpu_script()
    report = {"device": "NVIDIA Test GPU", "dtype": "float32", "seconds": {},
              "versions": {"jax": "0", "tullax": "0", "nvrtc": "13.0"}}
    report["targets"] = gpu.targets([], {}, {})
    assert all(ok is None for _, ok in report["targets"])
    assert "NOT RUN: TTFK warm <= 0.3 s" in gpu.markdown(report)
