"""Gradients by index inversion: each gradient of a spec is itself a spec (``derive``), run step by step on any
backend (``run``)."""
from tullax.grad.derive import Gradient, gradient_texts, gradients
from tullax.grad.names import seed_name

__all__ = ["Gradient", "gradient_texts", "gradients", "seed_name"]
