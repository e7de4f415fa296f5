"""The spec corpus: every construct of docs/design.md, section 1 and every row of the gradient table of section 2.

Other test modules import ``CORPUS`` (and ``CASES_BY_ID``); keep the ids stable. ``ranges`` is passed to
``analyze``; ``shapes`` (input name -> shape) overrides ``tullax.spec.examples.shapes_for`` where a case needs
particular sizes (explicit ranges, meaningful sizes for a convolution). Sizes stay tiny: the naive evaluator
loops in Python.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

RangeArg = int | tuple[int, int]


@dataclass(frozen=True)
class Case:
    id: str
    spec: str
    ranges: Mapping[str, RangeArg] | None = None
    shapes: Mapping[str, tuple[int, ...]] | None = None


CORPUS: tuple[Case, ...] = (
    # -- contractions (the einsum path) ---------------------------------------------------------
    Case("matmul", "C[i,j] := A[i,k]*B[k,j]"),
    Case("batched_matmul", "C[b,i,j] := A[b,i,k]*B[b,k,j]"),
    Case("outer", "O[i,j] := x[i]*y[j]"),
    Case("dot", "s := x[i]*y[i]"),
    Case("transpose", "T[j,i] := A[i,j]"),
    Case("sum_all", "s := A[i,j]"),
    Case("row_sum", "r[i] := A[i,j]"),
    Case("repeated_array", "s := x[i]*x[i]"),
    Case("matvec_three", "y[i] := A[i,j]*B[j,k]*x[k]"),
    # -- the gradient table of docs/design.md, section 2 ---------------------------------------------------
    Case("dist", "D[i,j] := (W[k,i] - X[k,j])^2"),
    Case("conv1d", "y[i] := x[i+k]*w[k]", shapes={"x": (7,), "w": (3,)}),
    Case("strided", "z[i] := x[2i]+x[2i+1]", shapes={"x": (7,)}),
    Case("embedding", "out[b,d] := W[ix[b],d]", shapes={"W": (4, 3), "ix": (6,)}),
    Case("row_max", "(max) m[i] := x[i,j]"),
    Case("row_min", "(min) m[i] := x[i,j]"),
    Case("row_logsumexp", "(logsumexp) l[i] := x[i,j]"),
    Case("scalar_params", "y[i] := a*x[i] + b"),
    # -- reductions and finalisers ------------------------------------------------------------------
    Case("logsumexp_bias", "(logsumexp) l[i] := x[i,j] + c[j]"),
    Case("logsumexp_all", "(logsumexp) l := A[i,j]*B[j]"),
    Case("max_all", "(max) m := x[i,j]*w[j]"),
    Case("products", "(*) p[i] := x[i,j]"),
    Case("row_norm", "n[i] := x[i,j]^2 |> sqrt"),
    Case("relu_finaliser", "h[i] := W[i,k]*x[k] |> relu"),
    Case("exp_finaliser", "(logsumexp) e[i] := x[i,j] |> exp"),
    Case("maxpool", "(max) pool[i] := x[2i+k]", ranges={"k": 2}, shapes={"x": (8,)}),
    # a stride with a reduced window index of coefficient 1: the input gradient divides (pad((m-k)/2)), summing K
    # terms, not every output position behind guards; a patchify's free i is solved for instead (issue 45)
    Case("strided_window", "y[i] := x[2i+k]*w[k]", shapes={"x": (9,), "w": (3,)}),
    Case("patchify", "P[h,i] := x[4h+i] (i in 0:4)", shapes={"x": (12,)}),
    Case("strided_padded_window", "y[i] := x[pad(2i+k-1)]*w[k]", shapes={"x": (9,), "w": (3,)}),
    # -- finalisers that are expressions of _ (the reduced value), size(A,d), (k in lo:hi) clauses ----------
    Case("bias_after_reduction", "y[i,j] := W[k,i]*X[k,j] |> relu(_ + b[j])"),
    Case("matmul_bias", "C[i,j] := A[i,k]*B[k,j] |> _ + b[j]"),
    Case("mean_by_size", "m[i] := x[i,j] |> _ / size(x,1)"),
    Case("max_finaliser_array", "(max) m[i] := x[i,j] |> max(_, a*A[i])"),
    Case("affine_finaliser_scalars", "y[i] := x[i,k]*w[k] |> c*_ + d"),
    Case("finaliser_shifted_read", "y[i] := x[i,k] |> _ * z[i+1] + i"),
    Case("logsumexp_finaliser_expr", "(logsumexp) e[i] := x[i,j] |> _ - b[i]"),
    Case("finaliser_reads_body_array", "y[i] := x[i,k]^2 |> sqrt(_) / x[i,0]"),
    Case("assign_finaliser_expr", "n[i] = x[i,j]^2 |> sqrt(_ + b[i])"),
    Case("size_in_body", "y[i] := x[i,j]*(j + 1)/size(x,1)"),
    Case("range_clause", "y[i] := x[i+k]*w[k]  (k in 0:3)", shapes={"x": (8,), "w": (4,)}),
    Case("range_clause_unseen", "s[i] := x[i]  (k in 0:4)"),
    Case("range_clause_symbolic", "y[i] := x[i,k]  (k in 1:size(x,1)-1)", shapes={"x": (3, 5)}),
    # -- indices: diagonals, shifts, scaling, constants, index values -----------------------------
    Case("diagonal", "d[i] := A[i,i]"),
    Case("trace", "t := A[i,i]"),
    # a result index whose inferred range does not start at 0 is refused (issue 44): these two write it
    Case("conv_reversed", "y[i] := x[i-k]*w[k]  (i in size(w,0)-1:size(x,0))", shapes={"x": (7,), "w": (3,)}),
    Case("conv2d_nchw", "o[b,c,i,j] := x[b,k,i+p,j+q]*w[c,k,p,q]",
         shapes={"x": (2, 2, 5, 4), "w": (3, 2, 2, 3)}),
    Case("strided_odd_even", "z[i] := x[2*i+1] - x[2i]", shapes={"x": (8,)}),
    Case("reverse", "r[i] := x[3-i]*y[i]  (i in 0:size(y,0))", shapes={"x": (4,), "y": (4,)}),
    Case("laplace", "L[i,j] := x[i+1,j] + x[i,j+1] - 2*x[i,j]", shapes={"x": (4, 5)}),
    Case("constant_position", "o[i] := x[0,i]"),
    Case("constant_position_late", "o[i] := x[i,2]*x[1,i]", shapes={"x": (4, 4)}),
    # a register tile over literal cases whose guarded terms read nothing of the tiled index: the copies of the
    # tile shared one accumulator, so A[i] landed in every column (and x[i,1]'s gradient, ΔO[i]*(m == 1), in
    # column 0 too) on the loop backends
    Case("literal_case_guard", "O[i,m] := A[i]*(m == 1)  (m in 0:2)"),
    Case("constant_position_one", "o[i] := x[i,1]*w[i]"),
    Case("index_values", "y[i] := i*x[i]"),
    Case("index_value_reduced", "y[i] := (j + 1)*A[i,j]"),
    Case("explicit_subrange", "y[i] := x[i]", ranges={"i": (1, 4)}, shapes={"x": (5,)}),
    # -- mod, clamp, pad --------------------------------------------------------------------------
    Case("mod_shift", "y[i] := x[mod(i+1)] - x[i]"),
    Case("circular_conv", "y[i] := x[mod(i-k)]*w[k]", ranges={"i": 5}, shapes={"x": (5,), "w": (3,)}),
    Case("clamp_smooth", "y[i] := x[clamp(i-1)] + x[i] + x[clamp(i+1)]"),
    Case("pad_stencil", "y[i] := x[pad(i-1)] - 2*x[i] + x[pad(i+1)]"),
    Case("full_conv", "y[i] := x[pad(i-k)]*w[k]", ranges={"i": 7}, shapes={"x": (5,), "w": (3,)}),
    Case("upsample_pad_div", "u[m] := z[pad(m/2)] + z[pad((m-1)/2)]", ranges={"m": 6}, shapes={"z": (3,)}),
    # -- indirect ---------------------------------------------------------------------------------
    Case("two_indirect", "y[b] := W[ix[b],jx[b]]", shapes={"W": (3, 4), "ix": (5,), "jx": (5,)}),
    Case("indirect_shifted_inner", "y[b] := x[ix[b+1]]*v[b]", shapes={"x": (4,), "ix": (6,), "v": (5,)}),
    # -- functions, comparisons, ifelse -----------------------------------------------------------
    Case("comparisons", "y[i] := (x[i] > z[i]) + 2*(x[i] <= z[i]) + (x[i] == x[i]) - (x[i] != z[i])"),
    Case("ifelse", "y[i,j] := ifelse(x[i] > z[j], x[i], z[j])"),
    Case("relu", "y[i] := relu(x[i])"),
    Case("softplus_sum", "y[i] := softplus(x[i,j])"),
    Case("sigmoid", "p[i] := sigmoid(x[i]*w[i] + b)"),
    Case("exp_log", "y[i] := log(x[i,j])*exp(z[j])"),
    Case("max_min_calls", "y[i] := max(x[i], z[i]) + min(x[i], 0)"),
    Case("powers", "y[i] := x[i]^3 - x[i]^-2 + x[i]^0.5 + 2^x[i]"),
    Case("scalar_power", "y[i] := x[i]^p"),
    Case("division", "y[i] := x[i] / z[i]"),
    Case("trig", "y[i] := sin(x[i])*cos(x[i]) + tanh(x[i]) + tan(x[i])"),
    Case("hyperbolic", "y[i] := sinh(x[i]) + cosh(x[i]) + expm1(x[i]) + log1p(x[i]^2) + abs(x[i])"),
    # erf is left out: the Julia backends refuse it (tests/test_julia_printer.py)
    Case("more_functions", "y[i] := cbrt(x[i]) + exp2(x[i]) + log2(x[i]) + log10(w[i]) + atan(x[i]) "
                           "+ atan(x[i], w[i]) + hypot(x[i], w[i]) + max(x[i], w[i], 1) + floor(x[i]) "
                           "+ round(w[i]) + sign(x[i] - 1)"),
    Case("real_conj", "y[i] := real(x[i])*conj(z[i]) + imag(x[i])"),
    Case("softmax_numerator", "e[i,j] := exp(x[i,j] - m[i])"),
    Case("index_and_scalar", "y[i] := x[i] + i*a"),
    Case("negation_nesting", "y[i] := -(x[i] - -z[i])^2"),
    # -- '=' and '+=' updates, scatter --------------------------------------------------------------
    Case("assign", "y[i] = 2*x[i]"),
    Case("assign_self", "y[i] = y[i]*x[i] + 1"),
    Case("assign_reduce_finaliser", "n[i] = x[i,j]^2 |> sqrt"),
    Case("accumulate_matmul", "C[i,j] += A[i,k]*B[k,j]"),
    Case("accumulate_scalar", "s += x[i]"),
    Case("scatter_indirect", "h[ix[b]] += v[b]", shapes={"h": (3,), "ix": (6,), "v": (6,)}),
    Case("scatter_embedding_grad", "dW[ix[b],d] += g[b,d]", shapes={"dW": (4, 3), "ix": (5,), "g": (5, 3)}),
    Case("scatter_shift", "y[i+1] += x[i]"),
    Case("scatter_mod", "y[mod(i+2)] += x[i]*z[i]"),
    Case("scatter_pad", "y[pad(2i)] += x[i]", shapes={"y": (5,), "x": (4,)}),
)

CASES_BY_ID: dict[str, Case] = {case.id: case for case in CORPUS}
assert len(CASES_BY_ID) == len(CORPUS), "corpus ids must be unique"


def analysed(text: str, ranges=None):
    """The analysed Spec of a corpus text."""
    from tullax.spec.analyze import analyze
    from tullax.spec.parse import parse_spec

    return analyze(parse_spec(text), ranges)


def gradient_cases():
    """One pytest param (case, wrt) per gradient of every corpus case that has gradients."""
    import pytest

    from tullax.errors import TullaxError
    from tullax.grad import gradients

    for case in CORPUS:
        try:
            grads = gradients(analysed(case.spec, case.ranges))
        except TullaxError:
            continue
        for grad in grads:
            yield pytest.param(case, grad.wrt, id=f"{case.id}-{grad.wrt}")
