"""The ``tullax`` command: ``main`` dispatches to explain, doctor, cache, julia, demo and bench."""
from tullax.cli.main import main

__all__ = ["main"]
