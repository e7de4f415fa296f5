"""Julia detection runs real lookups against real (scripted) executables, never juliacall."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tullax.backends.julia import detect as julia_detect
from tullax.backends.julia.detect import (
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
    code = ("import sys, tullax.backends.julia.detect as d; d.availability(); "
            "bad = {'juliacall', 'juliapkg'} & set(sys.modules); assert not bad, bad")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert result.returncode == 0, result.stderr


def test_cuda_packages_and_install_without_julia(env, monkeypatch):
    from tullax.backends.julia.install import cuda_packages, install_cuda
    from tullax.errors import BackendUnavailableError

    assert cuda_packages()["CUDA"]["uuid"] == "052768ef-5323-5732-b1bb-66c8b64840ba"
    for key in list(os.environ):
        if key.startswith(("PYTHON_JULIA", "JULIA")):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(BackendUnavailableError, match="No Julia"):
        install_cuda()


# ---------------------------------------------------------------------------------------------
# juliapkg's Julia compat (audit R2) and juliacall's own settings (audit G5)
# ---------------------------------------------------------------------------------------------
OLD_OPENSSL = julia_detect.julia_compat((3, 0, 19))
NEW_OPENSSL = julia_detect.julia_compat((3, 5, 1))


@pytest.mark.parametrize("openssl", [(1, 1, 1), (3, 0, 19), (3, 4, 9), (3, 5, 0), (3, 6, 2)])
def test_julia_compat_mirrors_juliapkgs_openssl_rule(openssl):
    from juliapkg.compat import Compat, Version
    from juliapkg.deps import openssl_compat

    ours = julia_detect.julia_compat(openssl)
    theirs = openssl_compat(openssl)[1]
    allowed = Compat.parse("^1.10.3") if theirs is None else Compat.parse("^1.10.3") & Compat.parse(theirs)
    for version in [(1, 10, 2), (1, 10, 3), (1, 11, 7), (1, 12, 0), (1, 13, 1), (2, 0, 0)]:
        assert (version in ours) == (Version.parse(".".join(map(str, version))) in allowed), (openssl, version)


def _juliaup(env, *versions: str) -> dict[str, str]:
    juliaup = Path(env["JULIAUP_DEPOT_PATH"]) / "juliaup"
    exes = {v: fake_julia(juliaup / f"julia-{v}" / "bin" / "julia", f"julia version {v}") for v in versions}
    (juliaup / "juliaup.json").write_text(json.dumps({"InstalledVersions": {
        f"{v}+0.x64.linux.gnu": {"Path": f"julia-{v}"} for v in versions}}))
    return exes


def test_julias_outside_juliapkgs_compat_are_skipped(env):
    exes = _juliaup(env, "1.11.5", "1.12.1")
    assert find_julia(env, OLD_OPENSSL).exe == exes["1.11.5"]  # newest first, but 1.12 needs OpenSSL 3.5
    assert find_julia(env, NEW_OPENSSL).exe == exes["1.12.1"]


def test_a_julia_too_new_for_this_python_is_reported(env):
    exe = fake_julia(Path(env["PATH"]) / "julia", "julia version 1.12.0")
    ok, message = availability(env, OLD_OPENSSL)
    assert not ok and exe in message and "too new" in message and "OpenSSL" in message and "1.10.3 - 1.11" in message


def test_an_explicit_choice_decides_alone(env, tmp_path):
    fake_julia(Path(env["PATH"]) / "julia", "julia version 1.11.2")
    old = fake_julia(tmp_path / "old" / "julia", "julia version 1.9.4")
    ok, message = availability({**env, "PYTHON_JULIAPKG_EXE": old})
    assert not ok and "PYTHON_JULIAPKG_EXE, which decides alone" in message and "too old" in message
    new = fake_julia(tmp_path / "new" / "julia", "julia version 1.12.0")
    assert find_julia({**env, "PYTHON_JULIAPKG_EXE": new}, OLD_OPENSSL) is None  # juliapkg would use it anyway


@pytest.mark.parametrize("settings", [{"PYTHON_JULIACALL_EXE": "exe"}, {"PYTHON_JULIACALL_BINDIR": "bin"},
                                      {"PYTHON_JULIACALL_PROJECT": "project"}])
def test_juliacall_settings_given_alone_make_the_backend_unavailable(env, tmp_path, settings):
    fake_julia(Path(env["PATH"]) / "julia")
    exe = fake_julia(tmp_path / "exe" / "julia")
    paths = {"exe": exe, "bin": str(Path(exe).parent), "project": str(tmp_path / "project")}
    ok, message = availability({**env, **{k: paths[v] for k, v in settings.items()}})
    assert not ok and "set together" in message and "PYTHON_JULIAPKG_EXE" in message


def test_a_juliacall_project_must_hold_tullaxs_julia_packages(env, tmp_path):
    exe = fake_julia(tmp_path / "exe" / "julia")
    project = tmp_path / "project"
    project.mkdir()
    (project / "Project.toml").write_text('[deps]\nPythonCall = "6099a3de-0909-46bc-b1f4-468b9a2dfc0d"\n')
    chosen = {**env, "PYTHON_JULIACALL_EXE": exe, "PYTHON_JULIACALL_PROJECT": str(project)}
    ok, message = availability(chosen)
    assert not ok and "TullaxBridge, KernelAbstractions, Atomix" in message and "Pkg.develop" in message
    deps = "\n".join(f'{name} = "00000000-0000-0000-0000-00000000000{k}"'
                     for k, name in enumerate(julia_detect.PROJECT_PACKAGES))
    (project / "Project.toml").write_text(f"[deps]\n{deps}\n")
    ok, message = availability(chosen)
    assert ok and exe in message and "PYTHON_JULIACALL_EXE" in message
