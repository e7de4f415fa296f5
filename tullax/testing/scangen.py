"""Random recurrences (issue 48): a ``(t scan)`` spec and, built from the same random choices but not from
tullax's parser or lowering, its ``lax.scan`` oracle in jnp.

A recurrence is ``h[b,t,n] := f(c1*h[b,t∓1,n] (+ c2*h[b,t∓2,n]) + drive)`` with ``f`` one of identity, tanh, sin;
each ``c`` a per-lane ``lam[n]``, a time-varying ``g[b,t,n]``, a scalar ``a`` or a constant; the drive ``x`` (or
``x*g``, ``exp(x)``); or a state that mixes its lanes, ``W[n,m]*h[b,t∓1,m] |> f(_ + x[b,t,n])``. The result has
one lane axis or two; the scan runs forwards or ``reverse``, from zeros or ``from h0``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


@dataclass(frozen=True)
class RandomScan:
    text: str
    inputs: dict[str, np.ndarray]  # by name
    oracle: Callable[[dict], Any]  # {name: value} -> the result, through jax.lax.scan


def random_scan(seed: int, dtype: str = "float64") -> RandomScan:
    rng = np.random.default_rng(seed)
    wide = rng.random() < 0.7  # h[b,t,n], else h[b,t]
    B, T, N = int(rng.integers(1, 4)), int(rng.integers(1, 7)), int(rng.integers(1, 4)) if wide else 1
    reverse = bool(rng.random() < 0.3)
    mixing = wide and rng.random() < 0.25
    depth = 1 if mixing else int(rng.integers(1, 3))
    init = bool(rng.random() < 0.5)
    fn = str(rng.choice(["", "tanh", "sin"]))
    lanes = "b,n" if wide else "b"

    def at(k: int) -> str:  # the self-read k steps back (forward in time for reverse)
        shift = f"t+{k}" if reverse else f"t-{k}"
        return f"h[b,{shift},n]" if wide else f"h[b,{shift}]"

    here = "[b,t,n]" if wide else "[b,t]"
    values: dict[str, np.ndarray] = {}
    drive_kind = str(rng.choice(["x", "xg", "expx"]))
    values["x"] = rng.normal(size=(B, T, N) if wide else (B, T))
    coefs = [str(rng.choice(["lam", "g", "a", "const"])) for _ in range(depth)] if not mixing else []
    if "lam" in coefs:
        values["lam"] = rng.uniform(-0.9, 0.9, N if wide else B)
    if "g" in coefs or drive_kind == "xg":
        values["g"] = rng.uniform(-0.9, 0.9, values["x"].shape)
    if "a" in coefs:
        values["a"] = np.asarray(rng.uniform(-0.6, 0.6))
    if mixing:
        values["W"] = rng.normal(size=(N, N)) / (2 * N)
    if init:
        rest = (B, N) if wide else (B,)
        values["h0"] = rng.normal(size=rest if depth == 1 else (depth,) + rest)

    coef_text = {"lam": "lam[n]" if wide else "lam[b]", "g": "g" + here, "a": "a", "const": "0.5"}
    drive = {"x": "x" + here, "xg": f"x{here}*g{here}", "expx": f"exp(x{here})"}[drive_kind]
    if mixing:
        body = f"W[n,m]*h[b,{'t+1' if reverse else 't-1'},m] |> " + (f"{fn}(_ + {drive})" if fn else f"_ + {drive}")
    else:
        inner = " + ".join([f"{coef_text[c]}*{at(k + 1)}" for k, c in enumerate(coefs)] + [drive])
        body = f"{fn}({inner})" if fn else inner
    clause = "(t scan" + (" reverse" if reverse else "") + (" from h0" if init else "") + ")"
    text = f"h[{lanes.replace('b', 'b,t', 1)}] := {body}  {clause}"
    inputs = {name: values[name].astype(dtype) for name in values}

    def oracle(env: dict):
        import jax
        import jax.numpy as jnp

        x = jnp.moveaxis(env["x"], 1, 0)  # time first
        g = jnp.moveaxis(env["g"], 1, 0) if "g" in env else jnp.zeros_like(x)
        dt = jnp.result_type(*env.values())
        state_shape = x.shape[1:]
        if init:
            h0 = jnp.asarray(env["h0"], dt)
            # most recent last; for reverse the clause's h0 holds the nearest first
            start = (h0[None] if depth == 1 else (h0 if not reverse else h0[::-1]))
        else:
            start = jnp.zeros((depth,) + state_shape, dt)

        def coef(kind, gt):
            return {"lam": env.get("lam"), "g": gt, "a": env.get("a"), "const": 0.5}[kind]

        def step(window, inp):
            xt, gt = inp
            dr = {"x": xt, "xg": xt * gt, "expx": jnp.exp(xt)}[drive_kind]
            if mixing:
                pre = window[-1] @ env["W"].T + dr
            else:
                pre = dr
                for k, kind in enumerate(coefs):  # window[-1] is one step back, window[-2] two
                    pre = pre + coef(kind, gt) * window[-1 - k]
            new = {"": lambda v: v, "tanh": jnp.tanh, "sin": jnp.sin}[fn](pre)
            return jnp.concatenate([window[1:], new[None]]), new

        _, hs = jax.lax.scan(step, start, (x, g), reverse=reverse)
        return jnp.moveaxis(hs, 0, 1)

    return RandomScan(text, inputs, oracle)


__all__ = ["RandomScan", "random_scan"]
