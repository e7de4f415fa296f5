"""End-to-end scenarios of the real Julia backend, each run in its own Python process by test_julia_backend.py.

    python tests/julia_e2e.py <scenario>

A fresh process per scenario keeps Julia away from numba (each loads its own LLVM: numba issue 7857) and from
pytest's faulthandler (Julia uses SIGSEGV for its garbage collector's safepoints). Prints ``OK`` on success,
``SKIP: <reason>`` when the backend cannot start here, and fails with a traceback otherwise.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import CASES_BY_ID  # noqa: E402

import tullax  # noqa: E402
from tullax.errors import BackendUnavailableError  # noqa: E402
from tullax.spec.examples import random_inputs, shapes_for  # noqa: E402
from tullax.spec.frontend import compile_spec  # noqa: E402
from tullax.testing.oracle import naive_eval  # noqa: E402

FORWARD_CASES = ["matmul", "dot", "dist", "conv1d", "strided", "embedding", "row_max", "row_logsumexp",
                 "scalar_params", "logsumexp_all", "maxpool", "pad_stencil", "upsample_pad_div", "two_indirect",
                 "ifelse", "powers", "assign_self", "accumulate_matmul", "scatter_indirect", "scatter_embedding_grad"]
GRAD_CASES = ["matmul", "dist", "conv1d", "strided", "embedding", "row_max", "row_logsumexp", "scalar_params",
              "full_conv", "sigmoid"]
CACHE_SPECS = ["D[i,j] := (W[k,i] - X[k,j])^2", "y[i] := x[i+k]*w[k]", "h[ix[b]] += v[b]"]


def inputs_for(case_id: str, dtype=np.float64, seed: int = 0):
    case = CASES_BY_ID[case_id]
    spec = compile_spec(case.spec, case.ranges)[1]
    shapes = dict(case.shapes or {})
    if any(i.name not in shapes for i in spec.inputs if i.kind != "scalar"):
        shapes = {**shapes_for(spec, seed=0), **shapes}
    env = random_inputs(spec, shapes, seed=seed, dtype=dtype)
    return case, spec, env


def kernel(case, backend: str):
    return tullax.einsum_kernel(case.spec, backend=backend, ranges=case.ranges)


def scenario_forward(backend: str = "julia") -> None:
    for dtype, tol in ((np.float64, 1e-10), (np.float32, 2e-4)):
        for case_id in FORWARD_CASES:
            case, spec, env = inputs_for(case_id, dtype)
            got = kernel(case, backend)(*[env[n] for n in spec.input_names])
            assert got.dtype == np.dtype(dtype), (case_id, got.dtype)
            np.testing.assert_allclose(got, naive_eval(spec, env), rtol=tol, atol=tol, err_msg=case_id)


def scenario_jax(backend: str = "julia") -> None:
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    for case_id in GRAD_CASES:
        case, spec, env = inputs_for(case_id)
        args = [jnp.asarray(env[n]) for n in spec.input_names]
        ours, reference = kernel(case, backend), kernel(case, "xla")
        np.testing.assert_allclose(jax.jit(ours)(*args), reference(*args), rtol=1e-10, err_msg=case_id)
        wrt = tuple(k for k, a in enumerate(args) if jnp.issubdtype(a.dtype, jnp.floating))

        def loss(k):
            return lambda *a: (k(*a) * jnp.cos(k(*a))).sum()

        got = jax.jit(jax.grad(loss(ours), wrt))(*args)
        expected = jax.grad(loss(reference), wrt)(*args)
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-9, atol=1e-12, err_msg=case_id)
    # vmap: one batched kernel, equal to looping the reference
    case, spec, env = inputs_for("dist")
    W = jnp.stack([jnp.asarray(env["W"]) * s for s in (1.0, 2.0, -1.0)])
    X = jnp.asarray(env["X"])
    got = jax.jit(jax.vmap(kernel(case, backend), in_axes=(0, None)))(W, X)
    expected = jnp.stack([kernel(case, "xla")(w, X) for w in W])
    np.testing.assert_allclose(got, expected, rtol=1e-10)


def scenario_cache_cold() -> None:
    """Cold process: kernels compile (ttfk_cold_ms recorded), then the precompiled package is written."""
    from tullax.backends.julia import JuliaBackend, cached_modules

    for text in CACHE_SPECS:
        tullax.warm(text, backend="julia", dtype="float64")
    assert len(cached_modules()) >= len(CACHE_SPECS), cached_modules()
    result = JuliaBackend().warm_package()
    assert result["modules"] and Path(result["path"], "Project.toml").is_file(), result
    rows = [r for r in tullax_cache().entries() if r.get("backend") == "julia" and r.get("kind") == "module"]
    assert rows and all("ttfk_cold_ms" in r for r in rows), rows


def scenario_cache_warm() -> None:
    """A new process on the same cache: the kernels come from the package image (ttfk_warm_ms), same results."""
    from tullax.backends.julia import runtime

    for text in CACHE_SPECS:
        spec = compile_spec(text, None)[1]
        env = random_inputs(spec, seed=3)
        got = tullax.einsum_kernel(text, backend="julia")(*[env[n] for n in spec.input_names])
        np.testing.assert_allclose(got, naive_eval(spec, env), rtol=1e-10)
        assert runtime()._packages, "the kernels were not taken from the precompiled package"
    rows = [r for r in tullax_cache().entries() if r.get("backend") == "julia" and r.get("kind") == "module"]
    assert any("ttfk_warm_ms" in r for r in rows), rows
    print(json.dumps(tullax_cache().stats()["by_backend"].get("julia"), default=str))


def scenario_bridge() -> None:
    """TullaxBridge's own Julia test suite, inside this juliacall process."""
    from tullax.backends.julia import runtime

    runtime().start()
    tests = Path(__file__).resolve().parent.parent / "julia" / "TullaxBridge" / "test" / "runtests.jl"

    def include() -> None:  # returns nothing: no Julia object leaves the Julia thread
        runtime()._jl.seval(f'include(raw"{tests}"); nothing')

    runtime().run(include)


def scenario_cuda() -> None:
    from tullax.backends.julia import JuliaCudaBackend

    ok, why = JuliaCudaBackend().availability()
    if not ok:
        raise BackendUnavailableError(why)
    scenario_forward("julia-cuda")
    scenario_jax("julia-cuda")


def tullax_cache():
    from tullax.runtime.cache import get_cache

    return get_cache()


def main(name: str) -> None:
    try:
        globals()[f"scenario_{name}"]()
    except BackendUnavailableError as err:
        print(f"SKIP: {err}")
        return
    assert "numba" not in sys.modules, "the Julia backend imported numba"
    print("OK")


if __name__ == "__main__":
    main(sys.argv[1])
