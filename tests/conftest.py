"""Shared test setup: a private compile cache, the `julia` marker that needs a real Julia, and the automatic
`compiles` marker that splits the compiler-level inner loop (``make test-fast``) from the rest.

A test is marked `compiles` when the code it runs can reach jax, Numba, Julia, a subprocess or a tullax layer
that runs kernels (see ``COMPILING``): found statically from the test function, the fixtures it uses and, through
them, the helpers of the test files, so a new test file is classified without anyone marking it.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import inspect
import os
import shutil
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import pytest

# Before anything imports the cache: tests must never touch the user's cache directory. `make test` sets a
# directory under the repository (shared by the xdist workers, which inherit this environment).
if not os.environ.get("TULLAX_CACHE_DIR"):
    _session_cache = tempfile.mkdtemp(prefix="tullax-test-cache-")
    os.environ["TULLAX_CACHE_DIR"] = _session_cache
    atexit.register(shutil.rmtree, _session_cache, ignore_errors=True)

NO_JULIA = "no Julia found (layer 4 of the Julia verification needs a real julia)"
TESTS = Path(__file__).resolve().parent

# What makes a test slow: compiling (jax/XLA, Numba, Julia), running kernels, starting processes. Every module
# at or below a root in COMPILING_TREES compiles unless COMPILER_LEVEL names it (so a new backend module counts
# as compiling until someone says otherwise); COMPILING names single modules and functions.
COMPILING_TREES = ("jax", "jaxlib", "numba", "llvmlite", "juliacall", "subprocess", "multiprocessing",
                   "tullax.backends", "tullax.jaxop", "tullax.runtime", "tullax.benchmarking", "tullax.cli",
                   "benchmarks")
COMPILER_LEVEL = frozenset({
    "tullax.backends.base",  # Signature
    "tullax.backends.julia.backend",  # the Julia modules and launch arguments, printed (running needs the julia mark)
    "tullax.backends.julia.detect",
    "tullax.jaxop.batching",  # vmap's spec transform
})
COMPILING = frozenset({
    "tullax.api.kernel", "tullax.api.source",  # calling a Kernel, warm()
    "tullax.einsum_kernel", "tullax.warm",  # defined in tullax/__init__, next to the cheap explain()
})


@functools.cache
def _julia_found() -> bool:
    # Never import juliacall here: without a Julia it tries to download one.
    if importlib.util.find_spec("tullax.backends.julia.detect") is None:
        return False
    from tullax.backends.julia.detect import find_julia

    return bool(find_julia())


@functools.cache  # every name a test uses is looked up once
def _compiling_name(name: str) -> bool:
    if name in COMPILER_LEVEL or name in COMPILING:
        return name in COMPILING
    return any(name == root or name.startswith(root + ".") for root in COMPILING_TREES)


def _compiling_object(obj: Any) -> bool:
    if isinstance(obj, types.ModuleType):
        return _compiling_name(obj.__name__)
    module = getattr(obj, "__module__", None)
    if not isinstance(module, str):  # an instance: judged by its class (a backend object, a jax array)
        module = type(obj).__module__
    return _compiling_name(module) or f"{module}.{getattr(obj, '__qualname__', '')}" in COMPILING


@functools.cache
def _under_tests(filename: str) -> bool:
    return Path(filename).resolve().is_relative_to(TESTS)


def _test_side_code(obj: Any) -> types.CodeType | None:
    """The code of a function defined in a file under tests/ (helpers, fixtures), else None."""
    code = getattr(inspect.unwrap(obj), "__code__", None) if callable(obj) else None
    return code if code is not None and _under_tests(code.co_filename) else None


def _reaches_compiling(code: types.CodeType, namespace: dict[str, Any], seen: set[types.CodeType]) -> bool:
    """Whether ``code`` (with its globals ``namespace``) imports, names or calls something that compiles."""
    if code in seen:
        return False
    seen.add(code)
    names = set(code.co_names)
    for name in names:
        if _compiling_name(name):  # a local "import jax" or "from tullax.backends.numba.backend import ..."
            return True
        obj = namespace.get(name, sys.modules.get(name))  # a module imported inside the function: sys.modules
        if obj is None:
            continue
        if _compiling_object(obj):
            return True
        if isinstance(obj, types.ModuleType):  # attributes used: tullax.einsum_kernel, backends.get
            # (vars, not getattr: a module's lazy __getattr__ would import or warn)
            attributes = (vars(obj)[attr] for attr in names if attr in vars(obj))
            if any(_compiling_object(attribute) for attribute in attributes):
                return True
            continue
        helper = _test_side_code(obj)
        if helper is not None and _reaches_compiling(helper, inspect.unwrap(obj).__globals__, seen):
            return True
    nested = (const for const in code.co_consts if isinstance(const, types.CodeType))  # lambdas, inner defs
    return any(_reaches_compiling(inner, namespace, seen) for inner in nested)


@functools.cache  # the parametrised cases of one test function share the answer
def _function_compiles(function: Any) -> bool:
    code = _test_side_code(function)
    return code is not None and _reaches_compiling(code, inspect.unwrap(function).__globals__, set())


def compiles(item: pytest.Item) -> bool:
    """Whether the test ``item`` (its function and the fixtures it uses) reaches something that compiles."""
    functions = [getattr(item, "obj", None)]
    functions += [fixture.func for defs in item._fixtureinfo.name2fixturedefs.values() for fixture in defs]
    return any(_function_compiles(function) for function in functions if function is not None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("julia") or compiles(item):
            item.add_marker(pytest.mark.compiles)
    # the minutes-long ones first, so that no worker ends the run alone on one of them while the other idles (a
    # stable sort: everything else keeps its order); `make test` distributes with --dist worksteal, which lets
    # the other worker take what the one running them has not started
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    julia_items = [item for item in items if item.get_closest_marker("julia")]
    if julia_items and not _julia_found():
        for item in julia_items:
            item.add_marker(pytest.mark.skip(reason=NO_JULIA))


@pytest.fixture
def rules_without_tiny_calls(monkeypatch):
    """No timing and no tiny calls (``TULLAX_SERIAL_WORK=0``): each kernel runs its planner rule's default, so a
    test knows what runs where."""
    from tullax.planner import decide, tuning

    monkeypatch.setenv(tuning.TIMING_ENV, "0")
    monkeypatch.setenv("TULLAX_SERIAL_WORK", "0")
    decide.forget()
    yield
    decide.forget()
