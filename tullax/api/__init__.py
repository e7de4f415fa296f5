"""The user-facing calls: ``einsum_kernel``/``Kernel`` (``kernel``), ``explain``, and whole-module source and
ahead-of-time warming (``source``)."""
