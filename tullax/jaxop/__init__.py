"""tullax kernels as JAX operations: the primitives and their rules (``primitives``), the host callback
(``callback``) and vmap's spec rewriting (``batching``). Imported only when a kernel meets jax."""
