"""Helpers for tullax's own tests (and anyone testing a kernel against the spec language): the naive
evaluator (``oracle``) and random specs (``specgen``). Example shapes and inputs are product code:
``tullax.spec.examples``. Nothing here imports pytest or jax, and ``import tullax`` imports nothing here."""
