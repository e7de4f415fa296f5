"""Install the optional CUDA side of the Julia backend (``tullax julia install-cuda``).

CUDA.jl is a large download (the CUDA runtime comes as Julia artifacts), so it is not in
``tullax/juliapkg.json``, which every juliacall user of tullax resolves. It is described in
``tullax/juliapkg_cuda.json`` (a name juliapkg does not scan) and added on request to the
user's own juliapkg environment with ``juliapkg.add``, then resolved. TullaxBridge's package
extension ``TullaxBridgeCUDAExt`` loads as soon as CUDA.jl is loaded next to it.

The compat ``CUDA = "5, 6"`` resolves to CUDA.jl 5: every Atomix 1.x (which TullaxBridge needs)
declares ``CUDA = "5"`` for its CUDA extension.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from tullax.backends.julia.detect import availability, find_julia, julia_env_vars

CUDA_DEPS_FILE = Path(__file__).resolve().parents[2] / "juliapkg_cuda.json"


def cuda_packages(deps_file: Path = CUDA_DEPS_FILE) -> dict[str, dict[str, str]]:
    """The Julia packages of the CUDA backend: name -> {"uuid": ..., "version": ...}."""
    return json.loads(deps_file.read_text())["packages"]


def install_cuda(deps_file: Path = CUDA_DEPS_FILE) -> None:
    """Add CUDA.jl to the juliapkg environment and resolve it (downloads; needs network).

    Runs only when a Julia is installed: juliapkg is pointed at it so that it never downloads
    a Julia of its own. Run it in a fresh process (the CLI does): juliapkg reads its
    configuration from the environment when first imported.
    """
    from tullax.errors import BackendUnavailableError

    install = find_julia()
    if install is None:
        raise BackendUnavailableError(availability()[1])
    exe_setting = julia_env_vars(threads=1, install=install).get("PYTHON_JULIAPKG_EXE")
    if exe_setting is not None:
        os.environ.setdefault("PYTHON_JULIAPKG_EXE", exe_setting)
    import juliapkg

    for name, spec in cuda_packages(deps_file).items():
        juliapkg.add(name, spec["uuid"], version=spec.get("version"))
    juliapkg.resolve()
