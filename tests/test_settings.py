"""The settings registry (tullax/settings.py): every TULLAX_* variable is declared there and read only through it,
an invalid value is a TullaxError naming the variable and what it accepts, values are read at each access, the
docs' table is the registry's, and a planner decision's key holds the loop backend's thread count."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tullax import settings
from tullax.errors import TullaxError

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tullax"
# Names in the code that are not environment variables: a C macro of the CUDA prelude.
NOT_VARIABLES = {"TULLAX_CUDA_PRELUDE"}
_ENV_READS = {"get", "getenv", "pop", "setdefault"}


def _python_files() -> list[Path]:
    return [path for path in sorted(PACKAGE.rglob("*.py")) if path != PACKAGE / "settings.py"]


def _tullax_constants() -> dict[str, str]:
    """Module-level names bound to a "TULLAX_..." string anywhere in tullax (FOO_ENV = "TULLAX_FOO")."""
    found = {}
    for path in _python_files():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, str) and node.value.value.startswith("TULLAX_")):
                found.update({target.id: node.value.value for target in node.targets if isinstance(target, ast.Name)})
    return found


def _names_a_tullax_variable(node: ast.AST, constants: dict[str, str]) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value.startswith("TULLAX_")
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return name in constants


def _reads_the_environment(node: ast.AST) -> bool:
    """Whether ``node`` is an environment mapping: ``os.environ``, ``environ`` or ``env``."""
    text = ast.unparse(node)
    return text.endswith("environ") or text in ("env", "os")


def stray_reads(path: Path, constants: dict[str, str]) -> list[str]:
    """``file:line`` of each read of a TULLAX_ variable from the environment outside the registry."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        key = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if node.func.attr in _ENV_READS and _reads_the_environment(node.func.value):
                key = node.args[0]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getenv" and node.args:
            key = node.args[0]
        elif isinstance(node, ast.Subscript) and _reads_the_environment(node.value):
            key = node.slice
        elif isinstance(node, ast.Compare) and any(_reads_the_environment(c) for c in node.comparators):
            key = node.left
        if key is not None and _names_a_tullax_variable(key, constants):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_module_reads_a_tullax_variable_but_the_registry():
    constants = _tullax_constants()
    assert constants, "the check finds the modules' FOO_ENV constants"
    strays = [where for path in _python_files() for where in stray_reads(path, constants)]
    assert strays == [], f"read these through tullax.settings.value: {strays}"


def test_the_stray_read_check_finds_each_form_of_read(tmp_path: Path):
    probe = tmp_path / "probe.py"
    probe.write_text('import os\nFOO_ENV = "TULLAX_FOO"\na = os.environ.get("TULLAX_X")\nb = os.getenv(FOO_ENV)\n'
                     'c = os.environ[FOO_ENV]\nd = "TULLAX_Y" in os.environ\ne = env.get(mod.FOO_ENV, "")\n'
                     'f = os.environ.get("PATH")\n', encoding="utf-8")
    original = ROOT
    try:
        globals()["ROOT"] = tmp_path
        assert stray_reads(probe, {"FOO_ENV": "TULLAX_FOO"}) == [f"probe.py:{n}" for n in (3, 4, 5, 6, 7)]
    finally:
        globals()["ROOT"] = original


def test_every_tullax_variable_the_code_names_is_declared():
    named = set()
    for path in _python_files():
        named.update(re.findall(r"\bTULLAX_[A-Z][A-Z0-9_]*\b", path.read_text(encoding="utf-8")))
    assert named - NOT_VARIABLES - set(settings.SETTINGS) == set()
    assert set(settings.SETTINGS) - named == set(), "a declared setting nothing uses"


# A value each setting refuses (settings whose type is free text have none).
INVALID = {"TULLAX_CACHE_MAX_BYTES": "lots", "TULLAX_CACHE_MAX_AGE_DAYS": "soon", "TULLAX_LOCK_TIMEOUT": "soon",
           "TULLAX_PLAN_TIMING": "maybe", "TULLAX_SERIAL_WORK": "-3", "TULLAX_CALLBACK": "fast",
           "TULLAX_HUGE_PAGES": "2", "TULLAX_C_THREADS": "0", "TULLAX_C_STREAMS": "sometimes",
           "TULLAX_NUMBA_INPROCESS_COMPILES": "many", "TULLAX_ALLOW_NUMBA_AND_JULIA": "y",
           "TULLAX_JULIA_THREADS": "lots", "TULLAX_JULIA_OFFLINE": "2", "TULLAX_CUDA_SPLIT": "x",
           "TULLAX_CUDA_COMMAND_BUFFER": "x"}


@pytest.mark.parametrize("name, bad", sorted(INVALID.items()))
def test_an_invalid_value_names_the_variable_and_what_it_accepts(monkeypatch, name, bad):
    setting = settings.SETTINGS[name]
    monkeypatch.setenv(name, bad)
    with pytest.raises(TullaxError) as caught:
        settings.value(name)
    assert f"{name}={bad!r}" in str(caught.value) and setting.accepted in str(caught.value)


def test_every_setting_has_a_default_and_a_description():
    for setting in settings.SETTINGS.values():
        assert setting.doc and setting.default_text and setting.accepted and setting.kind
        assert setting.value({}) == setting.default


def test_values_are_read_at_each_access(monkeypatch):
    monkeypatch.setenv("TULLAX_SERIAL_WORK", "5")
    assert settings.value("TULLAX_SERIAL_WORK") == 5
    monkeypatch.setenv("TULLAX_SERIAL_WORK", "7")
    assert settings.value("TULLAX_SERIAL_WORK") == 7
    monkeypatch.delenv("TULLAX_SERIAL_WORK")
    assert settings.value("TULLAX_SERIAL_WORK") is None
    assert settings.value("TULLAX_PLAN_TIMING", {"TULLAX_PLAN_TIMING": "off"}) is False


def test_the_docs_settings_page_is_the_registrys_table():
    page = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    assert page == settings.markdown(), "run `tullax settings --markdown > docs/settings.md`"


def test_tullax_settings_prints_the_page(capsys):
    from tullax.cli import main

    assert main(["settings", "--markdown"]) == 0
    assert capsys.readouterr().out == settings.markdown()


def test_doctor_prints_the_effective_settings():
    env = {**os.environ, "TULLAX_C_THREADS": "3", "TULLAX_CALLBACK": "sideways", "COLUMNS": "200"}
    report = subprocess.run([sys.executable, "-c", "from tullax.cli.main import main; main(['doctor'])"],
                            capture_output=True, text=True, env=env, check=True, timeout=300).stdout
    rows = {line.split("│")[1].strip(): line for line in report.splitlines() if line.count("│") >= 3}
    assert "3" in rows["TULLAX_C_THREADS"] and "environment" in rows["TULLAX_C_THREADS"]
    assert "invalid" in rows["TULLAX_CALLBACK"] and "default" in rows["TULLAX_PLAN_TIMING"]


@pytest.mark.parametrize("variable", ["TULLAX_C_THREADS", "OMP_NUM_THREADS"])
def test_a_plan_decided_with_two_c_threads_is_not_reused_with_sixteen(monkeypatch, variable):
    """The race's winner depends on the team size of the loop backend: its key holds the count the c backend
    runs with (the key held NUMBA_NUM_THREADS, which the c backend only reads when nothing else is set)."""
    from tullax.planner import store
    from tullax.planner.call import Call
    from tullax.spec.analyze import analyze
    from tullax.spec.parse import parse_spec

    for name in ("TULLAX_C_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NUMBA_NUM_THREADS", "2")
    spec = analyze(parse_spec("C[i,j] := A[i,k] * B[k,j]"))
    keys = []
    for threads in ("2", "16"):
        monkeypatch.setenv(variable, threads)
        keys.append(store.cache_key(Call(spec, {"A": (4, 4), "B": (4, 4)}, {"A": "float32", "B": "float32"}, "c")))
    assert keys[0] != keys[1]


def test_the_loop_threads_of_each_backend(monkeypatch):
    from tullax.backends.threads import loop_threads

    monkeypatch.setenv("TULLAX_C_THREADS", "3")
    monkeypatch.setenv("NUMBA_NUM_THREADS", "5")
    monkeypatch.setenv("TULLAX_JULIA_THREADS", "7")
    monkeypatch.delenv("PYTHON_JULIACALL_THREADS", raising=False)
    assert (loop_threads("c"), loop_threads("numba"), loop_threads("julia")) == (3, 5, 7)
    assert loop_threads("cuda") is None and loop_threads(None) is None


def _literal_writes(path: Path) -> set[str]:
    """The variables ``path`` writes by name: ``os.environ["X"] = ...`` and ``os.environ.setdefault("X", ...)``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Assign):
            found.update(t.slice.value for t in node.targets if isinstance(t, ast.Subscript)
                         and _reads_the_environment(t.value) and isinstance(t.slice, ast.Constant))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "setdefault"
              and _reads_the_environment(node.func.value) and node.args and isinstance(node.args[0], ast.Constant)):
            found.add(node.args[0].value)
    return found


def test_the_variables_tullax_writes_are_declared():
    from tullax.backends.julia import detect

    julia = detect.JuliaInstall("/opt/julia/bin/julia", (1, 11, 0), "PATH")
    written = set(detect.julia_env_vars(4, install=julia, offline=True, environ={}))  # os.environ.update(...)
    for path in _python_files():
        written |= _literal_writes(path)
    assert written == {w.name for w in settings.WRITTEN}


@pytest.mark.parametrize("name, bad", [("TULLAX_C_THREADS", "0"), ("TULLAX_HUGE_PAGES", "2")])
def test_an_invalid_setting_read_while_a_kernel_runs_is_an_error_at_trace_time(monkeypatch, name, bad):
    import jax
    import numpy as np

    import tullax

    kernel = tullax.einsum_kernel("y[i] := x[i,j]", backend="c")
    x = np.ones((3, 4), np.float32)
    monkeypatch.setenv(name, bad)
    with pytest.raises(TullaxError, match=name):
        jax.jit(kernel)(x)
