"""How a loop kernel runs inside a JAX program (host callback, XLA FFI custom call, GPU device kernel)."""
