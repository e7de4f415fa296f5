"""The benchmark suite of issue 3: eight kernels, at default sizes and at --quick sizes (8-30x less work)."""
from __future__ import annotations

from tullax.benchmarking.case import BenchCase

# name, spec, default shapes, quick shapes
_SUITE = (
    ("Linear", "C[i,j] := W[k,i]*X[k,j]",
     {"W": (784, 1024), "X": (784, 512)}, {"W": (256, 256), "X": (256, 256)}),
    ("Dist", "D[i,j] := (W[k,i]-X[k,j])^2",
     {"W": (784, 1024), "X": (784, 512)}, {"W": (256, 256), "X": (256, 256)}),
    ("conv1d", "y[b,i] := x[b,i+k]*w[k]",
     {"x": (64, 16384), "w": (31,)}, {"x": (16, 4096), "w": (31,)}),
    ("conv2d", "y[n,o,h,w] := x[n,c,h+p,w+q]*k[o,c,p,q]",
     {"x": (8, 32, 64, 64), "k": (32, 32, 3, 3)}, {"x": (2, 32, 32, 32), "k": (32, 32, 3, 3)}),
    ("embedding", "out[b,d] := W[ix[b],d]",
     {"W": (50000, 256), "ix": (16384,)}, {"W": (10000, 128), "ix": (2048,)}),
    ("row max", "(max) m[i] := x[i,j]", {"x": (4096, 4096)}, {"x": (1024, 1024)}),
    ("row logsumexp", "(logsumexp) l[i] := x[i,j]", {"x": (4096, 4096)}, {"x": (1024, 1024)}),
    ("row norm", "n[i] := x[i,j]^2 |> sqrt", {"x": (4096, 4096)}, {"x": (1024, 1024)}),
)


def suite(quick: bool = False, names: list[str] | None = None) -> list[BenchCase]:
    """The suite's cases (all, or those named, case-insensitively). The error against float64 XLA is always
    measured at the quick sizes: at default sizes the float64 XLA Dist alone would need a 3 GB temporary."""
    chosen = _SUITE if not names else [c for c in _SUITE if c[0].lower() in {n.lower() for n in names}]
    return [BenchCase(name=name, spec=spec, shapes=small if quick else full, check_shapes=small)
            for name, spec, full, small in chosen]


def case_names() -> list[str]:
    return [case[0] for case in _SUITE]
