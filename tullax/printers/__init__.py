"""Printers of the loop IR (``tullax.compiler.loops``): readable pseudo-code (``pseudo``), Numba Python
(``numba``), KernelAbstractions Julia (``julia``) and CUDA C (``cuda``), each a table of spellings and a few hooks
on the one printer in ``base``; ``launch`` says which loops a GPU-style target maps to its grid."""
