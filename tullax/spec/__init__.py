"""The spec language: its IR (``ir``), symbolic sizes, the parser, range inference (``analyze``), the canonical
text, shape checks, and the function registry (``functions``). Pure: no numba, jax or juliacall."""
