"""The roofline of benchmarks/gpu.py's device part (benchmarks/gpu_device.py), which runs only on a GPU: its
bytes and FLOPs per kernel, computed from the shapes, checked here by hand-counted cases."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import gpu_device  # noqa: E402


def test_linear_forward_and_gradients_are_counted_by_hand():
    k, i, j = 784, 1024, 512
    rows = gpu_device.kernel_work("C[i,j] := W[k,i]*X[k,j]", {"W": (k, i), "X": (k, j)})
    assert [r["label"] for r in rows] == ["forward", "gradient wrt W", "gradient wrt X"]
    assert rows[0]["flops"] == 2 * k * i * j
    assert rows[0]["bytes"] == 4 * (k * i + k * j + i * j)
    # ΔW[k,i] := ΔC[i,j]*X[k,j]: reads ΔC and X (W too: the step's inputs), writes ΔW
    assert rows[1]["out_shape"] == (k, i) and rows[1]["flops"] == 2 * k * i * j
    assert rows[1]["bytes"] >= 4 * (i * j + k * j + k * i)


def test_the_roofline_is_the_slower_of_bandwidth_and_arithmetic():
    work = {"bytes": 64 * 2**20, "flops": 2 * 4096 * 4096}  # a row logsumexp: bandwidth-bound
    ms = gpu_device.roofline_ms(work, "NVIDIA H200", "float32")
    assert ms == pytest.approx(64 * 2**20 / 4.8e12 * 1e3)
    dist = {"bytes": 4 * (784 * 1024 + 784 * 512 + 1024 * 512), "flops": 2 * 784 * 1024 * 512}
    h100 = "NVIDIA H100 80GB HBM3"
    assert gpu_device.roofline_ms(dist, h100, "float32") == pytest.approx(dist["flops"] / 67e12 * 1e3)
    assert gpu_device.roofline_ms(dist, h100, "float64") == pytest.approx(dist["flops"] / 33.5e12 * 1e3)
    assert gpu_device.roofline_ms(dist, "an unknown device", "float32") is None
