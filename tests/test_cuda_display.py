"""Reading the CUDA schedule for given shapes without a GPU: ``generate_source(..., backend="cuda", shapes=...)``
or ranges that fix every shape, and ``tullax explain --backend cuda --shape``, print the kernels the backend
launches at those shapes (``device_lowering``) with their launches."""
from __future__ import annotations

import pytest

import tullax
from tullax.backends.cuda.display import shapes_from_ranges
from tullax.cli import main
from tullax.errors import TullaxError
from tullax.spec.frontend import compile_spec

ROWS = "(logsumexp) l[i] := x[i,j]"


def test_long_rows_print_the_cooperative_kernel_and_short_ones_do_not():
    long = tullax.generate_source(ROWS, backend="cuda", shapes={"x": (4096, 4096)})
    assert "forward (forward): grid 4096 x block 256, a block per output element" in long
    assert "tx_block_logsumexp(" in long.split("#endif")[-1]
    short = tullax.generate_source(ROWS, backend="cuda", shapes={"x": (4096, 64)})
    assert "tx_block_" not in short.split("#endif")[-1]
    assert "grid 16 x block 256, a thread per output element" in short


def test_ranges_that_fix_the_shapes_select_the_same_kernels(monkeypatch):
    # without vector lanes: the gradient lowered from the ranged spec keeps a one-term guarded sum (acc, If, Store),
    # which tullax.compiler.vectorize does not take, while the shaped one is elementwise and takes them
    monkeypatch.setenv("TULLAX_CUDA_VECTORS", "0")

    def launches(source: str) -> list[str]:
        return [line for line in source.splitlines() if line.startswith("// ") and " x block " in line]

    by_ranges = tullax.generate_source(ROWS, backend="cuda", ranges={"i": range(4096), "j": range(4096)})
    by_shapes = tullax.generate_source(ROWS, backend="cuda", shapes={"x": (4096, 4096)})
    assert launches(by_ranges) == launches(by_shapes) and len(launches(by_ranges)) == 2
    conv = compile_spec("y[n,o,h,w] := x[n,c,h+p,w+q]*k[o,c,p,q]",
                        {"n": range(2), "o": range(3), "h": range(4), "w": range(5), "c": range(2), "p": range(3),
                         "q": range(3)})[1]
    assert shapes_from_ranges(conv) == {"x": (2, 2, 6, 7), "k": (3, 2, 3, 3)}
    assert shapes_from_ranges(compile_spec(ROWS)[1]) is None  # no ranges: the plain module, as before
    assert "launches at" not in tullax.generate_source(ROWS, backend="cuda")


def test_shapes_are_refused_by_a_backend_that_does_not_choose_by_them():
    with pytest.raises(TullaxError, match="does not choose its kernels by shapes"):
        tullax.generate_source(ROWS, backend="c", shapes={"x": (4, 4)})


def test_explain_prints_the_cuda_schedule_for_the_shapes(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich fits the printed source to the terminal's width, whatever it is
    assert main(["explain", ROWS, "--backend", "cuda", "--shape", "x=4096x4096"]) == 0
    out = capsys.readouterr().out
    assert "a block per output element (cooperative reduction)" in out
    # the roofline estimate beside each launch: 64 MiB read once at each device's bandwidth
    assert "estimate (roofline, no GPU):" in out and "bandwidth-bound: 0.0336 GFLOP, 67.1 MB" in out


def test_dist_and_its_gradients_take_block_tiles(monkeypatch):
    source = tullax.generate_source("D[i,j] := (W[k,i]-X[k,j])^2", backend="cuda",
                                    shapes={"W": (784, 1024), "X": (784, 512)})
    tiles = "a block per 64x64 tile (4x4 per thread, shared-memory chunks of 16)"
    assert f"(forward): grid 128 x block 256, {tiles}" in source
    assert f"(gradient wrt W): grid 208 x block 256, {tiles}" in source
    assert f"(gradient wrt X): grid 104 x block 256, {tiles}" in source
    assert source.split("#endif")[-1].count("__syncthreads();\n") == 6  # two per kernel


def test_the_estimate_counts_the_tiles_staged_copies_by_hand(monkeypatch):
    """Dist forward at K=784, 1024 x 512: 128 blocks of 64 x 64, 49 chunks of 16 steps, each staging 16 x 64
    values of W and of X (float32), plus the output once; two FLOPs per term. At sm_90's peaks the FLOPs bound
    it: 0.822 GFLOP at 67 TFLOP/s is 12.3 µs on an H200 (53.5 MB at 4.8 TB/s would take 11.1)."""
    from tullax.backends.cuda.estimate import estimate

    monkeypatch.setenv("TULLAX_CUDA_ARCH", "sm_80")
    from tullax.backends.base import Signature
    from tullax.backends.cuda.launch import device_lowering, size_values
    from tullax.backends.cuda.tile_sizes import tile_policy

    spec = compile_spec("D[i,j] := (W[k,i]-X[k,j])^2")[1]
    shapes = {"W": (784, 1024), "X": (784, 512), "D": (1024, 512)}
    kernel, plan = device_lowering(spec, Signature.for_dtype(spec, "float32"), shapes, "k", tiles=tile_policy("sm_80"))
    found = estimate(kernel, spec, shapes, plan.grid, size_values(kernel, shapes))
    assert found.flops == 2 * 784 * 1024 * 512
    assert found.traffic_bytes == 128 * 49 * (16 * 64 * 2) * 4 + 1024 * 512 * 4
    assert found.compulsory_bytes == (784 * 1024 + 784 * 512 + 1024 * 512) * 4
    source = tullax.generate_source("D[i,j] := (W[k,i]-X[k,j])^2", backend="cuda", shapes=shapes)
    assert "42.2 µs on A100; FLOP-bound: 0.822 GFLOP, 53.5 MB (tiles: " in source
    monkeypatch.setenv("TULLAX_CUDA_TILES", "0")  # as before the tiles: a warp per ΔW element
    source = tullax.generate_source("D[i,j] := (W[k,i]-X[k,j])^2", backend="cuda",
                                    shapes={"W": (784, 1024), "X": (784, 512)})
    assert "(gradient wrt W): grid 100352 x block 256, a warp per output element" in source
    assert "(gradient wrt X): grid 392 x block 256, a thread per output element" in source
