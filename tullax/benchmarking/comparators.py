"""The comparators every tullax backend is measured against (they are not tullax backends).

The runner always runs the XLA ones, the worker builds them instead of a tullax kernel, the report divides by them.
"""
from __future__ import annotations

# jax.jit of tullax's plain jnp lowering (free indices first, einsum for contractions), differentiated by jax
# itself: the reference of every speed-up.
REFERENCE = "xla"
# The same jnp lowering with the broadcast axes in the order the indices appear, as the expression is usually
# written by hand (``((W[:,:,None]-X[:,None,:])**2).sum(0)``); XLA then materialises the broadcast.
NAIVE_XLA = "xla-naive"
# What a user would write by hand in jnp/lax for the case (``tullax.benchmarking.idiomatic``): lax.conv for
# convolutions, shifted slices for conv1d, einsum for contractions, segment_sum for embedding bags. Only for
# cases that name a formulation.
IDIOMATIC = "jnp"
# The same formulation in torch, compiled by torch.compile (inductor): only where torch is installed.
TORCH = "torch.compile"
XLA_COMPARATORS = (REFERENCE, NAIVE_XLA, IDIOMATIC)  # "the best XLA formulation" is the fastest of these
COMPARATORS = (REFERENCE, NAIVE_XLA, IDIOMATIC, TORCH)
