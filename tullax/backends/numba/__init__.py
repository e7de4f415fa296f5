"""The Numba backend: Python printed from the loop IR and jitted by Numba (the embedded fallback)."""
