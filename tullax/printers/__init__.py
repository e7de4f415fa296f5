"""Printers of the loop IR: readable pseudo-code (``pseudo``), Numba Python (``numba``) and KernelAbstractions
Julia (``julia``)."""
