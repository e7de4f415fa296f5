"""The derived gradient specs as text (docs/design.md, section 2) and the structural promises behind them.

Numerical agreement with jax lives in test_grad_oracle.py; here the STRUCTURE is pinned: one gradient per
differentiable input, shifts inverted into pad(m-k) over the whole input, 2i inverted with divisibility (no
atomics), scatter steps only for indirect/mod/clamp occurrences, ties counted for max, exp(x - l) for
logsumexp, scalar parameters reduced over everything, and gradient specs that are ordinary, differentiable specs.
"""
from __future__ import annotations

import pytest

from tests.corpus import CORPUS
from tullax.grad import (
    Gradient,
    gradient_texts,
    gradients,
    seed_name,
)
from tullax.spec.frontend import compile_spec
from tullax.spec.ir import (
    Affine,
    Indirect,
    Spec,
    Wrapped,
    accesses,
)
from tullax.spec.sizes import Sym


def _spec(text: str, ranges=None) -> Spec:
    return compile_spec(text, ranges)[1]


def _texts(text: str, ranges=None) -> tuple[str, ...]:
    return gradient_texts(_spec(text, ranges))


# The gradient table of docs/design.md, section 2, in tullax's canonical printing.
TABLE = {
    "C[i,j] := A[i,k]*B[k,j]": ("ΔA[i,k] := ΔC[i,j]*B[k,j]", "ΔB[k,j] := ΔC[i,j]*A[i,k]"),
    "y[i] := x[i+k]*w[k]": ("Δx[m] := Δy[pad(m-k)]*w[k]", "Δw[k] := Δy[i]*x[i+k]"),
    "z[i] := x[2i]+x[2i+1]": ("Δx[m] := Δz[pad(m/2)] + Δz[pad((m-1)/2)]",),
    "out[b,d] := W[ix[b],d]": ("ΔW[ix[b],d] += Δout[b,d]",),
    "(max) m[i] := x[i,j]": (
        "count[i] := x[i,j] == m[i]; share[i] := Δm[i]/count[i]; Δx[i,j] := share[i]*(x[i,j] == m[i])",),
    "(logsumexp) l[i] := x[i,j]": ("Δx[i,j] := Δl[i]*exp(x[i,j] - l[i])",),
    "y[i] := a*x[i] + b": ("Δa := Δy[i]*x[i]", "Δx[i] := Δy[i]*a", "Δb := Δy[i]"),
}

MORE = {
    # finalisers: f' from the output where it can be (the result is the residual), else recompute pre
    "n[i] := x[i,j]^2 |> sqrt": ("Δx[i,j] := Δn[i]*(0.5/n[i])*(2*x[i,j])",),
    "h[i] := W[i,k]*x[k] |> relu": ("ΔW[i,k] := Δh[i]*(h[i] > 0)*x[k]", "Δx[k] := Δh[i]*(h[i] > 0)*W[i,k]"),
    "a[i] := x[i,j] |> abs": ("pre[i] := x[i,j]; Δx[i,j] := Δa[i]*((pre[i] >= 0) - (pre[i] < 0))",),
    "(logsumexp) e[i] := x[i,j] |> exp":
        ("(logsumexp) pre[i] := x[i,j]; Δx[i,j] := Δe[i]*e[i]*exp(x[i,j] - pre[i])",),
    # a seed factor that calls a function is a step of its own: each gradient's sum reads it, never re-evaluates
    # it per term (an MLP layer's Δx took a tanh for each of its (b,i,o))
    "h[b,o] := x[b,i]*W[i,o] |> tanh(_ + c[o])": (
        "g[b,o] := Δh[b,o]*(1 - h[b,o]^2); Δx[b,i] := g[b,o]*W[i,o]",
        "g[b,o] := Δh[b,o]*(1 - h[b,o]^2); ΔW[i,o] := g[b,o]*x[b,i]",
        "g[b,o] := Δh[b,o]*(1 - h[b,o]^2); Δc[o] := g[b,o]"),
    # f(E) with E linear in _ reads f' from the result (its slope multiplies); E = _*c needs pre for Δc
    "y[i] := x[i,k]*w[k] |> tanh(2*_ - c[i])": (
        "g[i] := Δy[i]*(1 - y[i]^2); Δx[i,k] := 2*g[i]*w[k]", "g[i] := Δy[i]*(1 - y[i]^2); Δw[k] := 2*g[i]*x[i,k]",
        "g[i] := Δy[i]*(1 - y[i]^2); Δc[i] := -g[i]"),
    "y[i] := x[i,k]*w[k] |> tanh(_ * c[i])": (
        "pre[i] := x[i,k]*w[k]; g[i] := Δy[i]*((1 - tanh(pre[i]*c[i])^2)*c[i]); Δx[i,k] := g[i]*w[k]",
        "pre[i] := x[i,k]*w[k]; g[i] := Δy[i]*((1 - tanh(pre[i]*c[i])^2)*c[i]); Δw[k] := g[i]*x[i,k]",
        "pre[i] := x[i,k]*w[k]; Δc[i] := Δy[i]*((1 - tanh(pre[i]*c[i])^2)*pre[i])"),
    # repeated indices and constant positions: equality guards, never a scatter
    "d[i] := A[i,i]": ("ΔA[i,m] := Δd[i]*(m == i)",),
    "o[i] := x[i,2]*x[1,i]": ("Δx[i,m] := Δo[i]*x[1,i]*(m == 2) + Δo[m]*x[m,2]*(i == 1)",),
    # several occurrences of one array sum into one spec when they reduce over the same indices
    "y[i] := x[pad(i-1)] - 2*x[i] + x[pad(i+1)]": ("Δx[m] := Δy[pad(m+1)] - 2*Δy[m] + Δy[pad(m-1)]",),
    # a stride with a window index of coefficient 1: divide (K terms per position), never guard the strided index
    # (every output position summed, all but K/s of them zero, and no lax.conv: the strided conv2d's input
    # gradient ran 12x slower than lax.conv's)
    "y[i] := x[2i+k]*w[k]": ("Δx[m] := Δy[pad((m-k)/2)]*w[k]", "Δw[k] := Δy[i]*x[2i+k]"),
    # ... but a free u (a patchify) is solved for: the loops narrow h's pad read to one value, where the divided
    # form read 16 of a 4x4 patch (the patchify gradient 2x slower on c, benchmarks/auto_losses.py)
    "P[h,i] := x[4h+i] (i in 0:4)": ("Δx[m] := ΔP[h,pad(m-4h)]",),
    # a strided max window divides too: each winner's share is a step of its own, since a division by the tie
    # count in every term read 0/0 between windows (the MaxPool gradient summed every window behind guards)
    "(max) y[n,h] := x[n,2h+p] (p in 0:2)": (
        "count[n,h] := x[n,2h+p] == y[n,h]; share[n,h] := Δy[n,h]/count[n,h]; "
        "Δx[n,m] := share[n,pad((m-p)/2)]*(x[n,m] == y[n,pad((m-p)/2)])",),
    "y[n,o,h,w] := x[n,c,pad(2h+p-1),pad(2w+q-1)]*k[o,c,p,q]": (
        "Δx[n,c,m,r] := Δy[n,o,pad((m-p+1)/2),pad((r-q+1)/2)]*k[o,c,p,q]",
        "Δk[o,c,p,q] := Δy[n,o,h,w]*x[n,c,pad(2h+p-1),pad(q+2w-1)]"),
    # a reduced index the gradient's body no longer reads still multiplies it: the text says so
    "y[i] := x[i,j] + x[i,k]*v[k]": ("Δx[i,j] := Δy[i] + Δy[i]*v[j]  (k in 0:size(x,1))",
                                     "Δv[k] := Δy[i]*x[i,k]  (j in 0:size(x,1))"),
    "y[i] := x[i,k] + b[i]": ("Δx[i,k] := Δy[i]", "Δb[i] := Δy[i]  (k in 0:size(x,1))"),
    # an index solved from a sum: the other one stays reduced
    "y[i] := A[i+j, j]": ("ΔA[m,j] := Δy[pad(m-j)]",),
    # a scaled index that is reduced cannot be divided (nothing reads zero off-grid): a guard instead
    "s := x[2i]*w[i]": ("Δx[m] := Δs*w[i]*(m == 2*i)",
                        "Δw[i] := Δs*x[pad(2i)]*(i+(-min(fld(size(x,0)-1,2)+1, size(w,0))) < 0)"),
    # updates: '+=' passes the cotangent through, '=' only where nothing was written
    "C[i,j] += A[i,k]*B[k,j]": ("ΔC1[i,j] := ΔC[i,j]", "ΔA[i,k] := ΔC[i,j]*B[k,j]", "ΔB[k,j] := ΔC[i,j]*A[i,k]"),
    "y[i] = 2*x[i]": ("Δy1[i] := 0", "Δx[i] := 2*Δy[i]"),
    "y[i] = y[i]*x[i] + 1": ("Δy1[i] := Δy[i]*x[i]", "Δx[i] := Δy[i]*y[i]"),
    # a scatter spec's added values get the cotangent gathered at the computed positions (0 where it dropped them)
    "h[ix[b]] += v[b]": ("Δh1[m] := Δh[m]", "Δv[b] := Δh[pad(ix[b])]"),
    # mod/clamp occurrences scatter, the plain occurrence of the same array does not
    "y[i] := x[mod(i+k)]*w[k]*x[i]": ("Δx[i] := Δy[i]*(x[mod(i+k)]*w[k]); Δx[mod(i+k)] += Δy[i]*(w[k]*x[i])",
                                      "Δw[k] := Δy[i]*(x[mod(i+k)]*x[i])"),
}


@pytest.mark.parametrize("text", list(TABLE) + list(MORE))
def test_printed_gradient_specs(text: str) -> None:
    assert _texts(text) == {**TABLE, **MORE}[text]


def test_one_gradient_per_differentiable_input_in_input_order() -> None:
    spec = _spec("y[b] := a*W[ix[b],d]*v[d] + c")
    assert [g.wrt for g in gradients(spec)] == ["a", "W", "v", "c"]  # ix is an index array: no gradient
    assert all(isinstance(g, Gradient) and g.steps[-1].out == g.result for g in gradients(spec))


def test_gradient_outputs_cover_the_whole_input_and_are_written_once() -> None:
    """':=' gradient outputs run over the input's full axes; only scatter steps have a computed lhs."""
    for case in CORPUS:
        spec = _spec(case.spec, case.ranges)
        for grad in gradients(spec):
            rank = spec.input(grad.wrt).rank if spec.input(grad.wrt).kind == "array" else 0
            final = [s for s in grad.steps if s.out == grad.result]
            first = final[0]
            if first.assign == ":=":
                assert first.out_shape == tuple(Sym.extent(grad.wrt, d) for d in range(rank)), case.id
                assert all(first.range_of[p].lo == Sym(0) for p in first.free), case.id
            for step in final[1:]:
                assert step.assign == "+=", case.id
            for step in grad.steps:
                if step.is_scatter:
                    assert step.assign == "+=" and any(
                        isinstance(i, (Indirect, Wrapped)) or not i.plain for i in step.lhs), case.id


def test_shift_inverted_into_pad_over_the_whole_input() -> None:
    (dx, dw) = gradients(_spec("y[i] := x[i+k]*w[k]"))
    (step,) = dx.steps
    assert step.range_of["m"].hi == Sym.extent("x", 0) and step.reduced == ("k",)
    assert not step.is_scatter
    assert [i.kind for i in step.inputs] == ["array", "array", "shape"]  # Δy, w, and x for its extent


def test_stride_inverted_with_divisibility_not_atomics() -> None:
    (dx,) = gradients(_spec("z[i] := x[2i]+x[2i+1]"))
    (step,) = dx.steps
    assert step.assign == ":=" and not step.is_scatter and step.reduced == ()
    divs = sorted(i.inner.div for acc in accesses(step.body) for i in acc.idx if isinstance(i, Wrapped))
    assert divs == [2, 2]


def test_indirect_occurrence_scatters_only_there() -> None:
    (dw,) = gradients(_spec("out[b,d] := W[ix[b],d]"))
    (step,) = dw.steps
    assert step.is_scatter and step.assign == "+=" and step.out == dw.result
    assert step.out not in step.input_names[1:] and step.inputs[0].name == "ΔW"  # the zeros it starts from
    assert {i.name: i.kind for i in step.inputs} == {"ΔW": "array", "Δout": "array", "ix": "index", "W": "shape"}


def test_seed_name_avoids_existing_names() -> None:
    assert seed_name(_spec("y[i] := x[i]")) == "Δy"
    assert seed_name(_spec("y[i] := Δy[i]*x[i]")) == "Δy1"
    grads = gradients(_spec("y[i] := Δy[i]*x[i]"))
    assert [g.result for g in grads] == ["ΔΔy", "Δx"]
    assert "Δy1[i]" in gradient_texts(_spec("y[i] := Δy[i]*x[i]"))[1]


def test_products_differentiate_without_dividing_by_a_zero_factor() -> None:
    (text,) = gradient_texts(_spec("(*) p[i] := x[i,j]"))
    assert "zeros[i] := x[i,j] == 0" in text and "(*) others[i] := ifelse(x[i,j] == 0, 1, x[i,j])" in text
    assert "zsum[i] := ifelse(x[i,j] == 0, x[i,j], 0)" in text


def test_gradient_specs_are_specs_and_differentiate_again() -> None:
    """Second derivatives: every step of every corpus gradient has gradients of its own."""
    count = 0
    for case in CORPUS:
        spec = _spec(case.spec, case.ranges)
        for grad in gradients(spec):
            for step in grad.steps:
                for second in gradients(step):
                    assert second.steps[-1].out == second.result
                    count += 1
    assert count > 100


def test_second_derivative_text_of_a_shift() -> None:
    (dx, _) = gradients(_spec("y[i] := x[i+k]*w[k]"))  # Δx[m] := Δy[pad(m-k)]*w[k]
    assert gradient_texts(dx.steps[0]) == ("ΔΔy[n] := ΔΔx[pad(k+n)]*w[k]", "Δw[k] := ΔΔx[m]*Δy[pad(m-k)]")


def test_uses_of_index_values_and_scalars() -> None:
    assert _texts("y[i] := x[i] + i*a") == ("Δx[i] := Δy[i]", "Δa := Δy[i]*i")
    assert _texts("y[i] := (j + 1)*A[i,j]") == ("ΔA[i,j] := Δy[i]*(j + 1)",)


def test_zero_derivative_gives_a_zero_spec() -> None:
    assert _texts("y[i] := (x[i] > 0) + z[i]") == ("Δx[i] := 0", "Δz[i] := Δy[i]")


def test_near_tie_tolerance_only_for_bodies_kernels_may_round_differently() -> None:
    exact = _texts("(max) m := x[i,j]*w[j]")[0]
    assert "==" in exact and "1e-06" not in exact
    contracted = _texts("(min) m[i] := x[i,j]*w[j] + b[j]")[0]
    assert "abs(x[i,j]*w[j] + b[j] - m[i]) <= 1e-06*max(abs(m[i]), abs(x[i,j])*abs(w[j]) + abs(b[j]))" in contracted
    assert "share[i] := Δm[i]/max(count[i], 1)" in contracted
    unsummed = _texts("(max) m[i] := exp(x[i,j]*w[j])")[0]
    assert "abs(exp(x[i,j]*w[j]) - m[i]) <= 1e-06*abs(m[i])" in unsummed  # no sum: relative to the max alone


def test_affine_helpers_are_exact() -> None:
    (dx,) = gradients(_spec("y[i] := x[3i+1]*x[3i]"))
    (step,) = dx.steps
    pads = sorted(str(i.inner) for acc in accesses(step.body) for i in acc.idx if isinstance(i, Wrapped))
    assert len(pads) == 4
    assert all(isinstance(i, (Affine, Wrapped)) for acc in accesses(step.body) for i in acc.idx)
