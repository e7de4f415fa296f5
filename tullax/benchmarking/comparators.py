"""The XLA comparators every tullax backend is measured against (they are not tullax backends).

The runner always runs them, the worker builds them instead of a tullax kernel, the report divides by them.
"""
from __future__ import annotations

# jax.jit of tullax's plain jnp lowering (free indices first, einsum for contractions), differentiated by jax
# itself: the reference of every speed-up.
REFERENCE = "xla"
# The same jnp lowering with the broadcast axes in the order the indices appear, as the expression is usually
# written by hand (``((W[:,:,None]-X[:,None,:])**2).sum(0)``); XLA then materialises the broadcast.
NAIVE_XLA = "xla-naive"
COMPARATORS = (REFERENCE, NAIVE_XLA)
