"""What a user would write by hand for the suite's kernels: the ``jnp`` comparator (jax.jit of idiomatic jnp/lax,
differentiated by jax) and, when torch is installed, the ``torch.compile`` comparator (the same formulation in
torch, compiled by inductor, differentiated by autograd). torch is never a dependency: nothing here imports it
unless the torch comparator runs.

Each formulation takes the inputs in the spec's input order and computes exactly what the spec computes (the
worker's check phase compares it with the float64 lowering, so a wrong formulation shows as an error).
"""
from __future__ import annotations

import importlib.util
from typing import Any, Callable


def _linear(W, X):  # C[i,j] := W[k,i]*X[k,j]
    import jax.numpy as jnp

    return jnp.einsum("ki,kj->ij", W, X)


def _dist(W, X):  # D[i,j] := (W[k,i]-X[k,j])^2 broadcast and summed; NOT the |w|^2+|x|^2-2w.x expansion,
    # a different algorithm (BLAS, but with cancellation error) that the spec does not ask for
    return ((W[:, :, None] - X[:, None, :]) ** 2).sum(0)


def _conv1d(x, w):  # y[b,i] := x[b,i+k]*w[k], as the sum of shifted slices
    n = x.shape[1] - w.shape[0] + 1
    total = x[:, 0:n] * w[0]
    for k in range(1, w.shape[0]):
        total = total + x[:, k:k + n] * w[k]
    return total


def _conv2d(x, k):  # y[n,o,h,w] := x[n,c,h+p,w+q]*k[o,c,p,q]
    from jax import lax

    return lax.conv_general_dilated(x, k, (1, 1), "VALID")


def _embedding(W, ix):  # out[b,d] := W[ix[b],d]
    import jax.numpy as jnp

    return jnp.take(W, ix, axis=0)


def _embedding_bag(out, W, ix, seg):  # out[seg[b],d] += W[ix[b],d]: each looked-up row summed into its bag
    import jax
    import jax.numpy as jnp

    return out + jax.ops.segment_sum(jnp.take(W, ix, axis=0), seg, num_segments=out.shape[0])


def _row_max(x):
    return x.max(axis=1)


def _row_logsumexp(x):
    import jax

    return jax.nn.logsumexp(x, axis=1)


def _row_norm(x):
    import jax.numpy as jnp

    return jnp.sqrt((x * x).sum(axis=1))


def _gaussian(x, y, b):  # K[i,d] := exp(-|x[i,:]-y[j,:]|^2)*b[j,d]
    import jax.numpy as jnp

    d2 = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)
    return jnp.exp(-d2) @ b


def _attention(q, k):  # S[h,i,j] := q[h,i,d]*k[h,j,d]
    import jax.numpy as jnp

    return jnp.einsum("hid,hjd->hij", q, k)


JNP: dict[str, Callable[..., Any]] = {
    "linear": _linear, "dist": _dist, "conv1d": _conv1d, "conv2d": _conv2d, "embedding": _embedding,
    "embedding bag": _embedding_bag, "row max": _row_max, "row logsumexp": _row_logsumexp, "row norm": _row_norm,
    "gaussian": _gaussian, "attention": _attention,
}


# ------------------------------------------------------------------------------------------------ torch
def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def torch_formulation(name: str) -> Callable[..., Any] | None:
    """The torch version of formulation ``name`` (None when there is none); imports torch."""
    import torch
    import torch.nn.functional as F

    formulations: dict[str, Callable[..., Any]] = {
        "linear": lambda W, X: W.T @ X,
        "dist": lambda W, X: ((W[:, :, None] - X[:, None, :]) ** 2).sum(0),
        "conv1d": lambda x, w: F.conv1d(x[:, None, :], w[None, None, :])[:, 0, :],
        "conv2d": lambda x, k: F.conv2d(x, k),
        "embedding": lambda W, ix: F.embedding(ix, W),
        "embedding bag": lambda out, W, ix, seg: out.index_add(0, seg, F.embedding(ix, W)),
        "row max": lambda x: x.amax(dim=1),
        "row logsumexp": lambda x: torch.logsumexp(x, dim=1),
        "row norm": lambda x: torch.sqrt((x * x).sum(1)),
        "gaussian": lambda x, y, b: torch.exp(-((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)) @ b,
        "attention": lambda q, k: torch.einsum("hid,hjd->hij", q, k),
    }
    return formulations.get(name)


__all__ = ["JNP", "torch_available", "torch_formulation"]
