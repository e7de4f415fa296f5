"""The recurrences of issue 48 with independent ``lax.scan`` oracles (written here, in plain jnp, not derived
from tullax's lowering), shared by tests/test_scan.py and benchmarks."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np


@dataclass(frozen=True)
class ScanCase:
    name: str
    spec: str
    inputs: Callable[[np.random.Generator, str], dict]  # in the spec's input order
    oracle: Callable[..., jax.Array]


def _lru_inputs(rng, dtype, B=2, T=6, N=3):
    return {"lam": rng.uniform(0.5, 0.95, N).astype(dtype), "x": rng.normal(size=(B, T, N)).astype(dtype),
            "h0": rng.normal(size=(B, N)).astype(dtype)}


def _lru(lam, x, h0):
    def step(h, xt):
        h = lam * h + xt
        return h, h
    _, hs = jax.lax.scan(step, h0.astype(jnp.result_type(lam, x, h0)), jnp.moveaxis(x, 1, 0))
    return jnp.moveaxis(hs, 0, 1)


def _elman_inputs(rng, dtype, B=2, T=5, N=3):
    return {"W": (rng.normal(size=(N, N)) / 2).astype(dtype), "x": rng.normal(size=(B, T, N)).astype(dtype)}


def _elman(W, x):
    def step(h, xt):
        h = jnp.tanh(h @ W.T + xt)
        return h, h
    _, hs = jax.lax.scan(step, jnp.zeros((x.shape[0], W.shape[0]), x.dtype), jnp.moveaxis(x, 1, 0))
    return jnp.moveaxis(hs, 0, 1)


def _tanh_inputs(rng, dtype, B=2, T=5, N=3):
    return {"lam": rng.uniform(-1, 1, N).astype(dtype), "x": rng.normal(size=(B, T, N)).astype(dtype)}


def _tanh(lam, x):
    def step(h, xt):
        h = jnp.tanh(lam * h + xt)
        return h, h
    _, hs = jax.lax.scan(step, jnp.zeros((x.shape[0], lam.shape[0]), x.dtype), jnp.moveaxis(x, 1, 0))
    return jnp.moveaxis(hs, 0, 1)


def _second_inputs(rng, dtype, B=3, T=7):
    return {"a1": dtype_scalar(rng.uniform(0.2, 0.6), dtype), "a2": dtype_scalar(rng.uniform(-0.4, 0.3), dtype),
            "x": rng.normal(size=(B, T)).astype(dtype), "y0": rng.normal(size=(2, B)).astype(dtype)}


def dtype_scalar(value, dtype):
    return np.asarray(value, dtype)


def _second(a1, a2, x, y0):
    def step(carry, xt):
        older, prev = carry  # y0 holds (y[-2], y[-1]): most recent last
        y = a1 * prev + a2 * older + xt
        return (prev, y), y
    _, ys = jax.lax.scan(step, (y0[0], y0[1]), jnp.moveaxis(x, 1, 0))
    return jnp.moveaxis(ys, 0, 1)


def _returns_inputs(rng, dtype, B=2, T=6):
    return {"r": rng.normal(size=(B, T)).astype(dtype), "gamma": rng.uniform(0.8, 0.99, (B, T)).astype(dtype)}


def _returns(r, gamma):
    def step(G, rg):
        G = rg[0] + rg[1] * G
        return G, G
    _, Gs = jax.lax.scan(step, jnp.zeros(r.shape[0], r.dtype), (r.T, gamma.T), reverse=True)
    return Gs.T


def _runmax_inputs(rng, dtype, B=2, T=6, J=4):
    return {"x": rng.normal(size=(B, T, J)).astype(dtype)}


def _runmax(x):
    def step(m, xt):  # reads before the start give 0
        m = jnp.maximum(m, xt.max(axis=-1))
        return m, m
    _, ms = jax.lax.scan(step, jnp.zeros(x.shape[0], x.dtype), jnp.moveaxis(x, 1, 0))
    return ms.T


def _mamba_inputs(rng, dtype, B=2, T=5, D=3, N=2):
    return {"dt": rng.uniform(0.01, 0.3, (B, T, D)).astype(dtype), "A": -rng.uniform(0.5, 2, (D, N)).astype(dtype),
            "B": rng.normal(size=(B, T, N)).astype(dtype), "u": rng.normal(size=(B, T, D)).astype(dtype)}


def _mamba(dt, A, Bm, u):
    def step(h, inp):
        dtt, bt, ut = inp
        h = jnp.exp(dtt[:, :, None] * A[None]) * h + dtt[:, :, None] * bt[:, None, :] * ut[:, :, None]
        return h, h
    h0 = jnp.zeros((dt.shape[0], dt.shape[2], A.shape[1]), dt.dtype)
    _, hs = jax.lax.scan(step, h0, (jnp.moveaxis(dt, 1, 0), jnp.moveaxis(Bm, 1, 0), jnp.moveaxis(u, 1, 0)))
    return jnp.moveaxis(hs, 0, 1)


CASES = (
    ScanCase("lru", "h[b,t,n] := lam[n]*h[b,t-1,n] + x[b,t,n]  (t scan from h0)", _lru_inputs, _lru),
    ScanCase("elman", "h[b,t,n] := W[n,m]*h[b,t-1,m] |> tanh(_ + x[b,t,n])  (t scan)", _elman_inputs, _elman),
    ScanCase("tanh", "h[b,t,n] := tanh(lam[n]*h[b,t-1,n] + x[b,t,n])  (t scan)", _tanh_inputs, _tanh),
    ScanCase("second", "y[b,t] := a1*y[b,t-1] + a2*y[b,t-2] + x[b,t]  (t scan from y0)", _second_inputs, _second),
    ScanCase("returns", "G[b,t] := r[b,t] + gamma[b,t]*G[b,t+1]  (t scan reverse)", _returns_inputs, _returns),
    ScanCase("runmax", "(max) m[b,t] := max(m[b,t-1], x[b,t,j])  (t scan)", _runmax_inputs, _runmax),
    ScanCase("mamba", "h[b,t,d,n] := exp(dt[b,t,d]*A[d,n])*h[b,t-1,d,n] + dt[b,t,d]*B[b,t,n]*u[b,t,d]  (t scan)",
             _mamba_inputs, _mamba),
)
