"""The import graph of tullax's own modules has no cycle, and no module imports one of a layer above its own.

Built statically from the AST of every module, imports inside functions included: a lazy import that closes
a cycle still ties two modules together (neither can be understood, tested or moved without the other), it
only hides the knot from ``import tullax``.

An edge goes to the module an import names (``from tullax.spec import functions`` names
``tullax.spec.functions``, ``from tullax.spec.ir import Spec`` names ``tullax.spec.ir``), not to the packages
above it: every module imports ``tullax/__init__`` on the way, which would make everything one cycle.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tullax"


def module_files(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, packages named by their ``__init__.py``."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_modules(tree: ast.AST, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``tree`` (the code of ``module``) imports, anywhere in it."""
    here = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: ``from . import x`` in a.b.c names a.b.x
                anchor = here.split(".")[:len(here.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # ``from X import Y`` names the module X.Y when there is one, else a name inside X
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                         for alias in node.names)
    return (found & modules) - {module}


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the tullax modules it imports."""
    files = module_files(package)
    return {module: imported_modules(ast.parse(path.read_text(encoding="utf-8")), module,
                                     path.name == "__init__.py", set(files))
            for module, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path [a, b, ..., a], or None."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" after
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def test_tullax_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 40 and graph["tullax"], "the graph builder found no modules or no imports"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# tullax's layers, bottom first: a module imports modules of its own layer or below, never above (lazy imports
# included). The longest prefix names a module's layer.
LAYERS = (
    ("tullax.errors", "tullax._version", "tullax.settings"),
    ("tullax.spec",),
    ("tullax.grad", "tullax.compiler", "tullax.runtime"),
    ("tullax.printers",),
    ("tullax.backends",),  # the backend families, and what they share (registry, host template, FFI handler)
    ("tullax.calls",),  # how a loop kernel runs inside jit: below the primitive and the planner, which both use it
    ("tullax.planner",),
    ("tullax.jaxop",),
    ("tullax.api",),
    ("tullax",),
    ("tullax.benchmarking", "tullax.testing", "tullax.cli"),
)
# inside the planner: the call record and the tuning first, the explanation (a view of plans) last
PLANNER_LAYERS = (
    ("tullax.planner.call", "tullax.planner.tuning"),
    ("tullax.planner.rules", "tullax.planner.store"),
    ("tullax.planner.candidates",),
    ("tullax.planner.race",),
    ("tullax.planner.autodiff",),
    ("tullax.planner.decide",),
    ("tullax.planner.explain",),
)


def layer_of(module: str, layers: tuple[tuple[str, ...], ...]) -> int | None:
    found = [(len(name), i) for i, names in enumerate(layers) for name in names
             if module == name or module.startswith(name + ".")]
    return max(found)[1] if found else None


def upward_imports(graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...]) -> list[tuple[str, str]]:
    """The edges of ``graph`` from a module of ``layers`` to one of a higher layer."""
    return sorted((a, b) for a, imported in graph.items() for b in imported
                  if layer_of(a, layers) is not None and layer_of(b, layers) is not None
                  and layer_of(b, layers) > layer_of(a, layers))


def test_no_module_imports_upwards():
    graph = import_graph()
    assert all(layer_of(module, LAYERS) is not None for module in graph), "a module outside every layer"
    assert graph["tullax.planner.decide"] and graph["tullax.jaxop.primitives"], "no imports found"
    assert upward_imports(graph, LAYERS) == []
    assert upward_imports(graph, PLANNER_LAYERS) == []


def test_an_upward_import_is_found(tmp_path):
    pkg = tmp_path / "tullax"
    (pkg / "spec").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "spec" / "__init__.py").write_text("")
    (pkg / "spec" / "ir.py").write_text("def f():\n    from tullax.api import kernel\n")
    (pkg / "api").mkdir()
    (pkg / "api" / "__init__.py").write_text("")
    (pkg / "api" / "kernel.py").write_text("from tullax.spec import ir\n")
    assert upward_imports(import_graph(pkg), LAYERS) == [("tullax.spec.ir", "tullax.api.kernel")]


def test_the_graph_sees_lazy_and_relative_imports(tmp_path):
    pkg = tmp_path / "tullax"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from tullax.sub import a\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("def f():\n    from tullax.sub.b import g\n    return g\n")
    (pkg / "sub" / "b.py").write_text("from . import a\nfrom .a import f\n")
    graph = import_graph(pkg)
    assert graph == {"tullax": {"tullax.sub.a"}, "tullax.sub": set(), "tullax.sub.a": {"tullax.sub.b"},
                     "tullax.sub.b": {"tullax.sub.a"}}
    assert find_cycle(graph) == ["tullax.sub.a", "tullax.sub.b", "tullax.sub.a"]


MAX_MODULE_LINES = 600  # a module longer than this does more than one job: split it by job
MAX_CLASS_LINES = 300


def oversized(package: Path = PACKAGE) -> list[str]:
    """Every module of ``package`` over MAX_MODULE_LINES lines and every class over MAX_CLASS_LINES."""
    found = []
    for module, path in module_files(package).items():
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > MAX_MODULE_LINES:
            found.append(f"{module}: {text.count(chr(10))} lines")
        classes = [node for node in ast.walk(ast.parse(text)) if isinstance(node, ast.ClassDef)]
        found += [f"{module}.{c.name}: {c.end_lineno - c.lineno + 1} lines" for c in classes
                  if c.end_lineno - c.lineno + 1 > MAX_CLASS_LINES]
    return found


def test_no_module_or_class_is_oversized():
    assert oversized() == []


def test_an_oversized_module_and_class_are_found(tmp_path):
    package = tmp_path / "tullax"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "big.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (package / "wide.py").write_text("class Wide:\n" + "    x = 1\n" * MAX_CLASS_LINES)
    assert oversized(package) == [f"tullax.big: {MAX_MODULE_LINES + 1} lines",
                                  f"tullax.wide.Wide: {MAX_CLASS_LINES + 1} lines"]
