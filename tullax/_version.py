"""The one place the tullax version is written (pyproject.toml reads it, cache keys include it)."""

__version__ = "0.1.0"
