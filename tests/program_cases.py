"""Programs of issue 50 (several statements, locals) with jnp oracles written by hand, independently of tullax."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax.numpy as jnp
import numpy as np


@dataclass(frozen=True)
class ProgramCase:
    name: str
    spec: str
    oracle: Callable  # jnp, same positional inputs as the program
    shapes: dict  # input name -> shape (() for a scalar), in the program's input order
    scalars: dict  # scalar inputs given as Python numbers

    def inputs(self, rng: np.random.Generator, dtype: str) -> list:
        out = []
        for name, shape in self.shapes.items():
            if name in self.scalars:
                out.append(self.scalars[name])
            else:
                out.append(rng.normal(size=shape).astype(dtype))
        return out


def _layernorm(x, eps, g, beta):
    mu = x.mean(1, keepdims=True)
    var = ((x - mu) ** 2).mean(1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + eps) * g + beta


def _rmsnorm(x, eps, g):
    return x / jnp.sqrt((x ** 2).mean(1, keepdims=True) + eps) * g


def _softmax(s):
    e = jnp.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _logsoftmax(s):
    m = s.max(-1, keepdims=True)
    return s - (jnp.log(jnp.exp(s - m).sum(-1, keepdims=True)) + m)


def _attention(q, k, scale, v):
    return jnp.einsum("bij,bje->bie", _softmax(jnp.einsum("bid,bjd->bij", q, k) * scale), v)


def _gelu_layer(x, W, c):
    h = x @ W + c
    return 0.5 * h * (1 + jax_erf(h * 0.7071067811865476))


def jax_erf(x):
    from jax.scipy.special import erf

    return erf(x)


def _groupnorm(x, eps, gamma, beta):
    mu = x.mean((2, 3), keepdims=True)
    var = ((x - mu) ** 2).mean((2, 3), keepdims=True)
    return (x - mu) / jnp.sqrt(var + eps) * gamma[None, :, :, None] + beta[None, :, :, None]


def _two_outputs(x, eps):
    mu = x.mean(1)
    return mu, (x - mu[:, None]) / jnp.sqrt(((x - mu[:, None]) ** 2).mean(1, keepdims=True) + eps)


LAYERNORM = """
local mu[b]  := x[b,j] |> _ / size(x,1)
local var[b] := (x[b,j] - mu[b])^2 |> _ / size(x,1)
y[b,j] := (x[b,j] - mu[b]) / sqrt(var[b] + eps) * g[j] + beta[j]     # LayerNorm
"""

CASES = (
    ProgramCase("layernorm", LAYERNORM, _layernorm, {"x": (5, 8), "eps": (), "g": (8,), "beta": (8,)},
                {"eps": 1e-5}),
    ProgramCase("rmsnorm", "local ms[b] := x[b,j]^2 |> _ / size(x,1); y[b,j] := x[b,j] / sqrt(ms[b] + eps) * g[j]",
                _rmsnorm, {"x": (5, 8), "eps": (), "g": (8,)}, {"eps": 1e-5}),
    ProgramCase("softmax", """
        (max) local m[b,i] := s[b,i,j]
        local z[b,i] := exp(s[b,i,j] - m[b,i])
        p[b,i,j] := exp(s[b,i,j] - m[b,i]) / z[b,i]
        """, _softmax, {"s": (2, 3, 6)}, {}),
    ProgramCase("logsoftmax", """
        local (max) m[b,i] := s[b,i,j]
        local lse[b,i] := exp(s[b,i,j] - m[b,i]) |> log(_) + m[b,i]
        y[b,i,j] := s[b,i,j] - lse[b,i]
        """, _logsoftmax, {"s": (2, 3, 6)}, {}),
    ProgramCase("attention", """
        local s[b,i,j] := q[b,i,d] * k[b,j,d] * scale
        (max) local m[b,i] := s[b,i,j]
        local z[b,i] := exp(s[b,i,j] - m[b,i])
        local p[b,i,j] := exp(s[b,i,j] - m[b,i]) / z[b,i]
        o[b,i,e] := p[b,i,j] * v[b,j,e]
        """, _attention, {"q": (2, 4, 3), "k": (2, 5, 3), "scale": (), "v": (2, 5, 3)}, {"scale": 0.6}),
    ProgramCase("gelu_layer", """
        local h[b,o] := x[b,i] * W[i,o] |> _ + c[o]
        y[b,o] := 0.5 * h[b,o] * (1 + erf(h[b,o] * 0.7071067811865476))
        """, _gelu_layer, {"x": (4, 6), "W": (6, 5), "c": (5,)}, {}),
    ProgramCase("groupnorm", """
        local mu[b,g] := x[b,g,c,p] |> _ / (size(x,2)*size(x,3))
        local var[b,g] := (x[b,g,c,p] - mu[b,g])^2 |> _ / (size(x,2)*size(x,3))
        y[b,g,c,p] := (x[b,g,c,p] - mu[b,g]) / sqrt(var[b,g] + eps) * gamma[g,c] + beta[g,c]
        """, _groupnorm, {"x": (2, 3, 2, 4), "eps": (), "gamma": (3, 2), "beta": (3, 2)}, {"eps": 1e-5}),
    ProgramCase("two_outputs", """
        mu[b] := x[b,j] |> _ / size(x,1)
        local var[b] := (x[b,j] - mu[b])^2 |> _ / size(x,1)
        y[b,j] := (x[b,j] - mu[b]) / sqrt(var[b] + eps)
        """, _two_outputs, {"x": (4, 6), "eps": ()}, {"eps": 1e-5}),
)
