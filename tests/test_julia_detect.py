"""Julia detection runs real lookups against real (scripted) executables, never juliacall."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tullax.backends import julia_detect
from tullax.backends.julia_detect import (
    JuliaInstall,
    availability,
    find_julia,
    julia_env_vars,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def env(tmp_path, monkeypatch):
    """An environment with no Julia anywhere: empty PATH, fresh HOME, depots and juliapkg project."""
    # Outside a virtualenv, juliapkg's project is PYTHON_JULIAPKG_PROJECT / the depot (both under tmp).
    monkeypatch.setattr(julia_detect.sys, "prefix", sys.base_prefix)
    (tmp_path / "bin").mkdir()
    return {
        "PATH": str(tmp_path / "bin"),
        "HOME": str(tmp_path / "home"),
        "JULIA_DEPOT_PATH": str(tmp_path / "depot"),
        "JULIAUP_DEPOT_PATH": str(tmp_path / "juliaup-depot"),
        "PYTHON_JULIAPKG_PROJECT": str(tmp_path / "project"),
    }


def fake_julia(path: Path, output: str = "julia version 1.11.2", status: int = 0) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho '{output}'\nexit {status}\n")
    path.chmod(0o755)
    julia_detect._probe_cached.cache_clear()  # same path, size and (coarse) mtime as a previous script
    return str(path)


def test_no_julia_anywhere(env):
    assert find_julia(env) is None
    ok, message = availability(env)
    assert not ok
    assert "No Julia >= 1.10.3 was found" in message
    assert "juliaup" in message and "PATH" in message and "PYTHON_JULIAPKG_EXE" in message
    assert "tullax never triggers that download" in message


def test_julia_on_path(env):
    exe = fake_julia(Path(env["PATH"]) / "julia")
    assert find_julia(env) == JuliaInstall(exe=exe, version=(1, 11, 2), source="PATH")
    ok, message = availability(env)
    assert ok and "Julia 1.11.2" in message and exe in message


def test_too_old_julia_is_rejected_and_reported(env):
    exe = fake_julia(Path(env["PATH"]) / "julia", "julia version 1.9.4")
    assert find_julia(env) is None
    ok, message = availability(env)
    assert not ok and "1.9.4" in message and exe in message and "too old" in message


def test_minimum_patch_version_is_enforced_and_prereleases_ignored(env):
    fake_julia(Path(env["PATH"]) / "julia", "julia version 1.10.2")
    assert find_julia(env) is None
    fake_julia(Path(env["PATH"]) / "julia", "julia version 1.12.0-rc1")
    assert find_julia(env) is None
    fake_julia(Path(env["PATH"]) / "julia", "julia version 1.10.3")
    assert find_julia(env).version == (1, 10, 3)


def test_executables_that_are_not_julia_are_ignored(env):
    fake_julia(Path(env["PATH"]) / "julia", "Python 3.11.7")
    assert find_julia(env) is None
    fake_julia(Path(env["PATH"]) / "julia", "julia version 1.11.2", status=1)
    assert find_julia(env) is None


def test_explicit_settings_win_over_path(env, tmp_path):
    fake_julia(Path(env["PATH"]) / "julia", "julia version 1.12.0")
    chosen = fake_julia(tmp_path / "opt" / "julia-1.10.5" / "bin" / "julia", "julia version 1.10.5")
    assert find_julia({**env, "PYTHON_JULIAPKG_EXE": chosen}).source == "PYTHON_JULIAPKG_EXE"
    found = find_julia({**env, "PYTHON_JULIACALL_EXE": chosen})
    assert (found.exe, found.version, found.source) == (chosen, (1, 10, 5), "PYTHON_JULIACALL_EXE")


def test_juliapkgs_own_install_is_found_before_path(env):
    fake_julia(Path(env["PATH"]) / "julia", "julia version 1.12.0")
    bundled = Path(env["PYTHON_JULIAPKG_PROJECT"]) / "pyjuliapkg" / "install" / "bin" / "julia"
    fake_julia(bundled, "julia version 1.11.7")
    assert find_julia(env) == JuliaInstall(exe=str(bundled), version=(1, 11, 7), source="juliapkg")


def test_juliapkg_install_in_the_depot_environment(env):
    bundled = Path(env["JULIA_DEPOT_PATH"]) / "environments" / "pyjuliapkg" / "pyjuliapkg" / "install" / "bin"
    exe = fake_julia(bundled / "julia")
    assert find_julia(env).exe == exe


def test_juliaup_versions_newest_first(env):
    juliaup = Path(env["JULIAUP_DEPOT_PATH"]) / "juliaup"
    old = fake_julia(juliaup / "julia-1.10.4+0.x64.linux.gnu" / "bin" / "julia", "julia version 1.10.4")
    new = fake_julia(juliaup / "julia-1.11.5+0.x64.linux.gnu" / "bin" / "julia", "julia version 1.11.5")
    (juliaup / "juliaup.json").write_text(json.dumps({"InstalledVersions": {
        "1.10.4+0.x64.linux.gnu": {"Path": "julia-1.10.4+0.x64.linux.gnu"},
        "1.11.5+0.x64.linux.gnu": {"Path": "julia-1.11.5+0.x64.linux.gnu"},
    }}))
    found = find_julia(env)
    assert (found.exe, found.source) == (new, "juliaup") and old != new


def test_env_vars_for_starting_julia(env):
    exe = fake_julia(Path(env["PATH"]) / "julia")
    assert julia_env_vars(4, environ=env) == {
        "PYTHON_JULIACALL_THREADS": "4",
        "PYTHON_JULIACALL_HANDLE_SIGNALS": "yes",
        "PYTHON_JULIAPKG_EXE": exe,
    }
    user_choice = {**env, "PYTHON_JULIACALL_THREADS": "2"}
    assert "PYTHON_JULIACALL_THREADS" not in julia_env_vars("auto", environ=user_choice)
    assert julia_env_vars("auto", environ=env, offline=True)["PYTHON_JULIAPKG_OFFLINE"] == "yes"


def test_env_vars_never_set_juliacall_exe_alone(env, tmp_path):
    # juliacall refuses PYTHON_JULIACALL_EXE without PYTHON_JULIACALL_PROJECT.
    chosen = fake_julia(tmp_path / "j" / "julia")
    explicit = {**env, "PYTHON_JULIAPKG_EXE": chosen}
    assert not any(k.endswith("_EXE") for k in julia_env_vars(1, environ=explicit))
    assert "PYTHON_JULIACALL_EXE" not in julia_env_vars(1, environ=env)


def test_detection_imports_neither_juliacall_nor_juliapkg():
    code = ("import sys, tullax.backends.julia_detect as d; d.availability(); "
            "bad = {'juliacall', 'juliapkg'} & set(sys.modules); assert not bad, bad")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert result.returncode == 0, result.stderr


def test_cuda_packages_and_install_without_julia(env, monkeypatch):
    from tullax.backends.julia_install import cuda_packages, install_cuda
    from tullax.errors import BackendUnavailableError

    assert cuda_packages()["CUDA"]["uuid"] == "052768ef-5323-5732-b1bb-66c8b64840ba"
    for key in list(os.environ):
        if key.startswith(("PYTHON_JULIA", "JULIA")):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(BackendUnavailableError, match="No Julia"):
        install_cuda()
