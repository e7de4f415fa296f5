"""The benchmark suite of issues 3 and 14: eleven kernels, at default sizes and at --quick sizes (8-30x less work),
each with the formulation a user would write by hand in jnp (and torch), ``tullax.benchmarking.idiomatic``."""
from __future__ import annotations

from tullax.benchmarking.case import BenchCase

GAUSSIAN = "K[i,d] := exp(-((x[i,0]-y[j,0])^2 + (x[i,1]-y[j,1])^2 + (x[i,2]-y[j,2])^2))*b[j,d]"

# name, spec, default shapes, quick shapes, the hand-written formulation (tullax.benchmarking.idiomatic)
_SUITE = (
    ("Linear", "C[i,j] := W[k,i]*X[k,j]",
     {"W": (784, 1024), "X": (784, 512)}, {"W": (256, 256), "X": (256, 256)}, "linear"),
    ("Dist", "D[i,j] := (W[k,i]-X[k,j])^2",
     {"W": (784, 1024), "X": (784, 512)}, {"W": (256, 256), "X": (256, 256)}, "dist"),
    ("conv1d", "y[b,i] := x[b,i+k]*w[k]",
     {"x": (64, 16384), "w": (31,)}, {"x": (16, 4096), "w": (31,)}, "conv1d"),
    ("conv2d", "y[n,o,h,w] := x[n,c,h+p,w+q]*k[o,c,p,q]",
     {"x": (8, 32, 64, 64), "k": (32, 32, 3, 3)}, {"x": (2, 32, 32, 32), "k": (32, 32, 3, 3)}, "conv2d"),
    ("embedding", "out[b,d] := W[ix[b],d]",
     {"W": (50000, 256), "ix": (16384,)}, {"W": (10000, 128), "ix": (2048,)}, "embedding"),
    # bags of looked-up rows summed into their bag's row (segment_sum by hand)
    ("embedding bag", "out[seg[b],d] += W[ix[b],d]",
     {"out": (4096, 128), "W": (50000, 128), "ix": (65536,), "seg": (65536,)},
     {"out": (512, 64), "W": (10000, 64), "ix": (4096,), "seg": (4096,)}, "embedding bag"),
    ("row max", "(max) m[i] := x[i,j]", {"x": (4096, 4096)}, {"x": (1024, 1024)}, "row max"),
    ("row logsumexp", "(logsumexp) l[i] := x[i,j]", {"x": (4096, 4096)}, {"x": (1024, 1024)}, "row logsumexp"),
    ("row norm", "n[i] := x[i,j]^2 |> sqrt", {"x": (4096, 4096)}, {"x": (1024, 1024)}, "row norm"),
    # issue 14's Gaussian kernel sum (3-d points, 4 output columns), at sizes that keep `make bench` quick
    ("Gaussian kernel sum", GAUSSIAN,
     {"x": (4000, 3), "y": (4000, 3), "b": (4000, 4)}, {"x": (1000, 3), "y": (1000, 3), "b": (1000, 4)},
     "gaussian"),
    ("attention scores", "S[h,i,j] := q[h,i,d]*k[h,j,d]",
     {"q": (8, 512, 64), "k": (8, 512, 64)}, {"q": (4, 128, 32), "k": (4, 128, 32)}, "attention"),
)


def suite(quick: bool = False, names: list[str] | None = None) -> list[BenchCase]:
    """The suite's cases (all, or those named, case-insensitively). The error against float64 XLA is always
    measured at the quick sizes: at default sizes the float64 XLA Dist alone would need a 3 GB temporary."""
    chosen = _SUITE if not names else [c for c in _SUITE if c[0].lower() in {n.lower() for n in names}]
    return [BenchCase(name=name, spec=spec, shapes=small if quick else full, check_shapes=small, idiomatic=how)
            for name, spec, full, small, how in chosen]


def case_names() -> list[str]:
    return [case[0] for case in _SUITE]
