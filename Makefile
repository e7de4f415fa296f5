# Every target makes its own virtualenv in .venv and installs tullax (editable) with the extras it needs.
# A stamp file per extra set, newer than pyproject.toml, means "installed": a second run installs nothing.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
ARGS ?=
PYTEST_WORKERS ?= 2
# xdist's default (load) hands each worker a quarter of its share up front, in collection order: the first worker
# got every `slow` test (tests/conftest.py sorts them first). worksteal splits the run in two and an idle worker
# takes half of what the other has not started, so they end within one test of each other.
PYTEST_DIST ?= worksteal
# Tests never touch the user's cache directory; everything else uses the default one.
TEST_CACHE_DIR := $(CURDIR)/.cache/tullax-test
# An editable install compiles no bytecode (and PYTHONDONTWRITEBYTECODE may forbid writing it on import):
# compile it, as a regular pip install would, so the time to first kernel that demo and bench measure does
# not include recompiling tullax's own sources in every new process. Only stale files are recompiled.
BYTECODE = $(BIN)/python -m compileall -q tullax

.PHONY: demo test test-fast bench lint clean-venv

demo: $(VENV)/.stamp-demo
	$(BYTECODE)
	$(BIN)/tullax demo $(ARGS)

# What CI runs (.ci/run): lint, the docs site (strict: a broken link or a page outside the nav fails; built into
# .cache/site, which git ignores), then every test (tests/test_docs.py runs the docs' examples).
test: $(VENV)/.stamp-test
	$(BIN)/ruff check .
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
	TULLAX_CACHE_DIR=$(TEST_CACHE_DIR) $(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist $(PYTEST_DIST) -p no:cacheprovider $(ARGS)

# The inner loop while working on the compiler: parse, analysis, gradient derivation, lowering, printers,
# goldens, the loop-IR interpreter and the Julia-subset evaluator; nothing that compiles with jax, Numba or
# Julia or starts a process (tests/conftest.py marks those `compiles`). Well under a minute on 2 cores.
test-fast: $(VENV)/.stamp-test
	TULLAX_CACHE_DIR=$(TEST_CACHE_DIR) $(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist $(PYTEST_DIST) -p no:cacheprovider -m "not compiles" $(ARGS)

bench: $(VENV)/.stamp-bench
	$(BYTECODE)
	$(BIN)/python benchmarks/run.py $(ARGS)

lint: $(VENV)/.stamp-test
	$(BIN)/ruff check .

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.stamp-demo: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.stamp-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,lint,cuda-test]'
	touch $@

$(VENV)/.stamp-bench: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	touch $@

clean-venv:
	rm -rf $(VENV)
