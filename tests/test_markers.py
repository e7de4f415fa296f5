"""The automatic `compiles` marker of tests/conftest.py: what reaches jax, Numba or a process is marked, what
only parses, lowers and prints is not (``make test-fast`` runs the latter). These tests only look: the helpers
they name are never called."""
from __future__ import annotations

import subprocess

import pytest

from tullax.spec.frontend import compile_spec


def _builds_a_numba_kernel(text: str):
    from tullax.backends.numba.backend import NumbaBackend  # a local import inside a helper

    return NumbaBackend, compile_spec(text)


def _helper_of_a_helper(text: str):
    return _builds_a_numba_kernel(text)


@pytest.fixture
def starts_a_process():
    return subprocess.run


def _marked(request: pytest.FixtureRequest) -> bool:
    return request.node.get_closest_marker("compiles") is not None


def test_a_compiler_level_test_is_not_marked(request):
    assert compile_spec("y[i] := x[i]")[0] == "y[i] := x[i]"
    assert not _marked(request)


def test_a_helper_two_calls_down_that_imports_numba_marks_the_test(request):
    assert callable(_helper_of_a_helper)
    assert _marked(request)


def test_a_fixture_that_starts_a_process_marks_the_test(request, starts_a_process):
    assert _marked(request)


def test_a_tullax_call_that_runs_a_kernel_marks_the_test(request):
    import tullax

    assert callable(tullax.einsum_kernel)
    assert _marked(request)
