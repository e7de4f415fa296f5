"""Static checks of the Julia half of the bridge and of the juliapkg declarations (no Julia needed).

Layer 1 of issue 5: every Julia file parses with tree-sitter-julia without ERROR/MISSING nodes.
Beyond syntax: exported names are defined, `include`d files exist, and juliapkg.json /
Project.toml agree with each other and with juliapkg's own parser.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from julia_subset import _named, _parse, _text, parse_errors

ROOT = Path(__file__).resolve().parent.parent
BRIDGE = ROOT / "julia" / "TullaxBridge"
PACKAGED_BRIDGE = ROOT / "tullax" / "julia" / "TullaxBridge"
JULIA_FILES = sorted(BRIDGE.rglob("*.jl"))
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
JULIAPKG_JSON = ROOT / "tullax" / "juliapkg.json"
JULIAPKG_CUDA_JSON = ROOT / "tullax" / "juliapkg_cuda.json"


def project() -> dict:
    return tomllib.loads((BRIDGE / "Project.toml").read_text())


def juliapkg_packages(path: Path) -> dict:
    return json.loads(path.read_text())["packages"]


def test_top_level_julia_dir_is_the_packaged_bridge():
    # The files live inside the Python package (so wheels ship them); julia/TullaxBridge is a link.
    assert BRIDGE.resolve() == PACKAGED_BRIDGE.resolve()
    assert not PACKAGED_BRIDGE.is_symlink() and (PACKAGED_BRIDGE / "Project.toml").is_file()


def test_bridge_has_source_extension_and_tests():
    names = {p.relative_to(BRIDGE).as_posix() for p in JULIA_FILES}
    assert {"src/TullaxBridge.jl", "ext/TullaxBridgeCUDAExt.jl", "test/runtests.jl"} <= names


@pytest.mark.parametrize("path", JULIA_FILES, ids=lambda p: p.relative_to(BRIDGE).as_posix())
def test_every_julia_file_parses_without_error_or_missing_nodes(path):
    assert parse_errors(path.read_text()) == []


def _nodes(path: Path, node_type: str):
    stack = [_parse(path.read_text()).root_node]
    while stack:
        node = stack.pop()
        if node.type == node_type:
            yield node
        stack.extend(node.children)


def _defined_names(paths) -> set[str]:
    """Functions (long and short form), consts and structs defined at any depth."""
    names: set[str] = set()
    for path in paths:
        for node in _nodes(path, "signature"):
            call = _named(node)[0]
            while call.type in ("typed_expression", "where_expression"):  # f(x)::T, f(x) where T
                call = _named(call)[0]
            names.add(_text(_named(call)[0]))
        for node in _nodes(path, "assignment"):
            lhs = _named(node)[0]
            if lhs.type == "call_expression":
                names.add(_text(_named(lhs)[0]))
        for node in _nodes(path, "const_statement"):
            names.add(_text(_named(_named(node)[0])[0]))
        for node in _nodes(path, "struct_definition"):
            names.add(_text(node.child_by_field_name("name") or _named(_named(node)[0])[0]))
    return names


def test_included_files_exist_and_exports_are_defined():
    main = BRIDGE / "src" / "TullaxBridge.jl"
    included = [_text(_named(c)[1]).strip("()\"") for c in _nodes(main, "call_expression")
                if _text(_named(c)[0]) == "include"]
    assert included, "TullaxBridge.jl includes its parts"
    for name in included:
        assert (main.parent / name).is_file(), name
    defined = _defined_names([main.parent / name for name in included])
    exported = {_text(i) for e in _nodes(main, "export_statement") for i in _named(e)}
    assert exported and exported <= defined, exported - defined


def test_extension_only_adds_methods_to_bridge_functions():
    ext = BRIDGE / "ext" / "TullaxBridgeCUDAExt.jl"
    extended = set()
    for node in _nodes(ext, "field_expression"):
        value, field = _named(node)
        if _text(value) == "TullaxBridge":
            extended.add(_text(field))
    assert extended == {"cuda_backend", "run_launcher_cuda!", "run_launcher_cuda_device!"}
    assert extended <= _defined_names(sorted((BRIDGE / "src").glob("*.jl")))


def test_project_toml_declares_uuids_compat_and_the_cuda_extension():
    proj = project()
    assert proj["name"] == "TullaxBridge" and UUID_RE.match(proj["uuid"])
    deps = proj["deps"] | proj["weakdeps"]
    assert {"KernelAbstractions", "Atomix", "PythonCall", "PrecompileTools"} <= set(proj["deps"])
    # DLPack.jl was a hard dependency nothing used: it capped BFloat16s, and its CuArray path needs CUDA.Mem,
    # which CUDA.jl 6 removed (audit N1).
    assert "DLPack" not in deps and "DLPack" not in juliapkg_packages(JULIAPKG_JSON)
    assert all(UUID_RE.match(u) for u in deps.values())
    assert set(deps) <= set(proj["compat"])
    assert proj["compat"]["KernelAbstractions"] == "0.9.38"  # CUDA.jl 5/6 and Tullio need KA < 0.10
    assert proj["extensions"] == {"TullaxBridgeCUDAExt": "CUDA"}
    assert (BRIDGE / "ext" / "TullaxBridgeCUDAExt.jl").is_file()


@pytest.mark.parametrize("path", [JULIAPKG_JSON, JULIAPKG_CUDA_JSON], ids=lambda p: p.name)
def test_juliapkg_files_use_valid_uuids_and_compat_syntax(path):
    from juliapkg.compat import Compat

    data = json.loads(path.read_text())
    if "julia" in data:
        Compat.parse(data["julia"])
    for name, spec in data["packages"].items():
        assert UUID_RE.match(spec["uuid"]), name
        if "version" in spec:
            assert ">" not in spec["version"] and "<" not in spec["version"], name  # juliapkg has no >=
            assert str(Compat.parse(spec["version"])), name


def test_juliapkg_json_agrees_with_the_bridge_project():
    packages = juliapkg_packages(JULIAPKG_JSON)
    proj = project()
    bridge = packages["TullaxBridge"]
    assert bridge["uuid"] == proj["uuid"] and bridge["dev"] is True  # Pkg.develop: a plain directory
    assert (JULIAPKG_JSON.parent / bridge["path"]).resolve() == PACKAGED_BRIDGE.resolve()
    for name, spec in packages.items():
        if name in proj["deps"]:
            assert spec["uuid"] == proj["deps"][name], name
    assert "CUDA" not in packages  # heavy: only via juliapkg_cuda.json
    assert juliapkg_packages(JULIAPKG_CUDA_JSON)["CUDA"]["uuid"] == proj["weakdeps"]["CUDA"]


def test_juliapkg_resolves_our_file_together_with_juliacalls():
    """juliapkg's own requirement merging (pure file reading, no Julia) accepts tullax/juliapkg.json."""
    from juliapkg.compat import Version
    from juliapkg.deps import deps_files, find_requirements

    files = {Path(f).resolve() for f in deps_files()}
    assert JULIAPKG_JSON.resolve() in files
    compat, packages = find_requirements()
    by_name = {p.name: p for p in packages}
    assert by_name["TullaxBridge"].dev
    assert Path(by_name["TullaxBridge"].path).resolve() == PACKAGED_BRIDGE.resolve()
    assert "PythonCall" in by_name and "KernelAbstractions" in by_name
    assert Version.parse("1.10.3") in compat and Version.parse("1.10.2") not in compat


@pytest.mark.julia
def test_bridge_julia_test_suite_passes_under_juliacall():
    """Layer 4: TullaxBridge's own Julia tests, in a fresh process that starts Julia through juliacall."""
    from tullax.backends.julia.detect import julia_env_vars

    runtests = BRIDGE / "test" / "runtests.jl"
    code = ("import juliacall; jl = juliacall.Main; jl.seval('using TullaxBridge'); "
            f"jl.include({str(runtests)!r})")
    env = {**os.environ, **julia_env_vars(2), "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=1800)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]


def test_juliacall_and_juliapkg_are_bounded_to_what_the_bridge_resolves_with():
    """Audit R3: every juliacall pins one PythonCall release, which must be inside TullaxBridge's PythonCall
    compat; juliapkg must find the juliapkg.json of an editable install (0.1.18 on)."""
    from importlib.metadata import version

    from juliapkg.compat import Compat, Version

    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "juliacall>=0.9.25,<0.10" in dependencies and "juliapkg>=0.1.18" in dependencies
    installed = tuple(int(n) for n in version("juliacall").split(".")[:3])
    assert (0, 9, 25) <= installed < (0, 10, 0)
    # juliacall's package data, located without importing it (that would start, or download, a Julia)
    pin = json.loads((Path(importlib.util.find_spec("juliacall").origin).parent / "juliapkg.json").read_text())
    pinned = pin["packages"]["PythonCall"]["version"].lstrip("=")
    assert Version.parse(pinned) in Compat.parse(project()["compat"]["PythonCall"]), pinned


def test_bindings_of_run_time_modules_are_read_in_the_latest_world():
    """Audit N6: kernel modules are evaluated at run time, often in the same top-level call that then reads
    them; a getfield in the older world warns on Julia 1.12. They are read through latest_binding
    (``invokelatest(getglobal, ...)``); only Base's own bindings are read directly."""
    reads = []
    for path in JULIA_FILES:
        for node in _nodes(path, "call_expression"):
            callee, arguments = _named(node)[0], _named(node)[-1]
            if _text(callee) in ("getfield", "getglobal", "getproperty"):
                reads.append((path.name, _text(node)))
                assert _text(_named(arguments)[0]) == "Base", (path.name, _text(node))
    assert reads, "the check found no binding reads at all"
    launch = (BRIDGE / "src" / "launch.jl").read_text()
    assert "latest_binding(mod::Module, name::Symbol) = Base.invokelatest(getglobal, mod, name)" in launch


def test_a_package_that_cannot_be_precompiled_is_an_error():
    """Audit N8: Base.compilecache returns, not throws, the exception for a package it cannot precompile."""
    source = (BRIDGE / "src" / "precompile_package.jl").read_text()
    assert "seconds = @elapsed result = Base.compilecache(pkg)\n    result isa Exception && throw(result)" in source
