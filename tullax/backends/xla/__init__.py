"""The XLA backend: a jax.numpy lowering of a spec (the oracle) and XLA's other formulations."""
