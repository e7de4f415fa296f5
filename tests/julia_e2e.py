"""End-to-end scenarios of the real Julia backend, each run in its own Python process by test_julia_backend.py.

    python tests/julia_e2e.py <scenario>

A fresh process per scenario keeps Julia away from numba (each loads its own LLVM: numba issue 7857) and from
pytest's faulthandler (Julia uses SIGSEGV for its garbage collector's safepoints). Prints ``OK`` on success,
``SKIP: <reason>`` when the backend cannot start here, and fails with a traceback otherwise.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import CASES_BY_ID  # noqa: E402

import tullax  # noqa: E402
from tullax.backends.base import Signature  # noqa: E402
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
# Tiled CPU kernels over several tiles (the tile is 512 output elements) and a long reduction: the read-modify-
# write of the output that KernelAbstractions' @Const alias scope miscompiles on Julia 1.11/1.12 (audit R1).
TILED = [("C[i,j] := A[i,k]*B[k,j]", {"A": (40, 70), "B": (70, 1100)}),
         ("D[i,j] := (W[k,i] - X[k,j])^2", {"W": (30, 50), "X": (30, 1030)}),
         ("y[i] := x[i+k]*w[k]", {"x": (2100,), "w": (7,)})]
IDLE_S = 3.0  # how long the Julia thread waits in Python while another Julia thread collects garbage


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
    from tullax.backends.julia.backend import JuliaBackend, cached_modules

    for text in CACHE_SPECS:
        tullax.warm(text, backend="julia", dtype="float64")
    assert len(cached_modules()) >= len(CACHE_SPECS), cached_modules()
    result = JuliaBackend().warm_package()
    assert result["modules"] and Path(result["path"], "Project.toml").is_file(), result
    rows = [r for r in tullax_cache().entries() if r.get("backend") == "julia" and r.get("kind") == "module"]
    assert rows and all("ttfk_cold_ms" in r for r in rows), rows


def scenario_cache_warm() -> None:
    """A new process on the same cache: the kernels come from the package image (ttfk_warm_ms), same results."""
    from tullax.backends.julia.runtime import runtime

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
    runtime = _runtime()
    tests = Path(__file__).resolve().parent.parent / "julia" / "TullaxBridge" / "test" / "runtests.jl"

    def include() -> None:  # returns nothing: no Julia object leaves the Julia thread
        runtime._jl.seval(f'include(raw"{tests}"); nothing')

    runtime.run(include)


def scenario_cuda() -> None:
    from tullax.backends.julia.backend import JuliaCudaBackend

    ok, why = JuliaCudaBackend().availability()
    if not ok:
        raise BackendUnavailableError(why)
    scenario_forward("julia-cuda")
    scenario_jax("julia-cuda")


def _runtime():
    from tullax.backends.julia.backend import cpu_availability
    from tullax.backends.julia.runtime import runtime

    runtime().start(cpu_availability)
    return runtime()


def scenario_bridge_arguments() -> None:
    """B1: write_precompile_package through juliacall with exactly what warm_package sends (bridge_workload's
    tuples), and the lists juliacall turns into PyList{Py}, which the bridge refuses with a MethodError."""
    from tullax.backends.julia.backend import bridge_workload, kernel_module, workload_call
    from tullax.printers.julia import name_of_module

    spec = compile_spec("y[i] := x[i+k]*w[k]", None)[1]
    signature = Signature(("float64", "float64"), "float64")
    kernel_ir, source = kernel_module(spec, signature)
    stored = json.loads(json.dumps(workload_call(kernel_ir, spec, name_of_module(source))))
    runtime = _runtime()
    directory = tempfile.mkdtemp()
    path, seconds = runtime.write_package(directory, "TullaxE2EKernels", (source,), (bridge_workload(stored),))
    assert Path(path, "src", "kernels_1.jl").read_text() == source and seconds >= 0, path

    def with_lists() -> str:
        try:
            runtime._bridge.write_precompile_package(directory, "TullaxE2ELists", [source], [stored])
        except Exception as err:  # noqa: BLE001 - what Julia said, as text, on the Julia thread
            return f"{type(err).__name__}: {err}"
        return "accepted"

    outcome = runtime.run(with_lists)
    assert "MethodError" in outcome, outcome


def scenario_geometry() -> None:
    """G1: the work-group size the printed CPU launcher asks for, partitioned by the real KernelAbstractions,
    gives every Julia thread groups where KA's default made one (README dist: ndrange (1 tile, 1024 rows)); the
    evaluator's model of KA (tests/julia_subset.py) agrees with KA itself."""
    from julia_subset import cpu_launch

    from tullax.backends.julia.backend import kernel_module

    spec = compile_spec("D[i,j] := (W[k,i] - X[k,j])^2", None)[1]
    source = kernel_module(spec, Signature(("float32", "float32"), "float32"))[1]
    runtime = _runtime()
    runtime.load_source("TullaxE2EGeometry", source)
    ndranges = ((1, 1024), (2, 1024), (1, 7), (3, 100_000), (5000,))

    def partition() -> list[tuple]:
        measure = runtime._jl.seval("""(mod, nd) -> let KA = TullaxBridge.KernelAbstractions
            k = Base.invokelatest(getglobal(mod, Symbol("kernel!")), KA.CPU())
            wg = Base.invokelatest(getglobal(mod, :cpu_workgroupsize), nd)
            iterspace, _ = KA.partition(k, nd, wg)
            (Threads.nthreads(), wg, length(KA.NDIteration.blocks(iterspace)))
        end""")
        module = runtime._modules["TullaxE2EGeometry"]
        return [tuple(measure(module, nd)) for nd in ndranges]

    for nd, (nthreads, workgroup, groups) in zip(ndranges, runtime.run(partition)):
        model = cpu_launch("kernel!", nd, tuple(workgroup), nthreads)
        assert groups == model.groups and model.tasks == min(nthreads, int(np.prod(nd))), (nd, groups, model)
    print(f"Julia threads: {nthreads}")


def scenario_tiled() -> None:
    """R1: the tiled CPU kernels, forward and gradients, over several tiles, against the naive evaluator and XLA
    (whatever Julia is found; the miscompile upstream needs 1.11 or 1.12)."""
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    runtime = _runtime()
    print("Julia", runtime.run(lambda: str(runtime._jl.seval("string(VERSION)"))))
    for text, shapes in TILED:
        spec = compile_spec(text, None)[1]
        for dtype, tol in ((np.float64, 1e-10), (np.float32, 2e-4)):
            env = random_inputs(spec, shapes, seed=5, dtype=dtype)
            args = [env[n] for n in spec.input_names]
            ours = tullax.einsum_kernel(text, backend="julia")
            np.testing.assert_allclose(ours(*args), naive_eval(spec, env), rtol=tol, atol=tol, err_msg=text)
        env = random_inputs(spec, shapes, seed=6, dtype=np.float64)
        args = [jnp.asarray(env[n]) for n in spec.input_names]
        reference = tullax.einsum_kernel(text, backend="xla")
        wrt = tuple(range(len(args)))
        got = jax.grad(lambda *a: (ours(*a) ** 2).sum(), wrt)(*args)
        expected = jax.grad(lambda *a: (reference(*a) ** 2).sum(), wrt)(*args)
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-9, atol=1e-9, err_msg=text)


def scenario_exit_child() -> None:
    """R4: run kernels, then let the interpreter exit (the test runs this repeatedly, with 1 and 4 threads, and
    checks the exit status)."""
    case, spec, env = inputs_for("dist")
    np.testing.assert_allclose(kernel(case, "julia")(*[env[n] for n in spec.input_names]), naive_eval(spec, env),
                               rtol=1e-10)


def scenario_gc_idle() -> None:
    """R5: a garbage collection started by another Julia thread while the tullax thread waits in Python finishes
    at once (that thread is GC-safe there), instead of waiting for tullax's next call."""
    runtime = _runtime()

    def spawn() -> None:
        runtime._jl.seval("global TULLAX_E2E_T0 = time(); global TULLAX_E2E_DONE = Threads.Atomic{Float64}(0.0); "
                          "Threads.@spawn (GC.gc(); TULLAX_E2E_DONE[] = time()); nothing")

    assert runtime.run(lambda: int(runtime._jl.seval("Threads.nthreads()"))) >= 2, "needs 2 Julia threads"
    runtime.run(spawn)
    time.sleep(IDLE_S)  # no call into Julia meanwhile
    waited = runtime.run(lambda: float(runtime._jl.seval("TULLAX_E2E_DONE[] - TULLAX_E2E_T0")))
    assert 0 < waited < IDLE_S / 2, f"the collection took {waited:.2f} s while tullax's thread idled {IDLE_S} s"


def scenario_after_jax() -> None:
    """R6: jax has loaded XLA's C++ runtime (and whatever libstdc++ it brings) before tullax starts Julia."""
    import jax.numpy as jnp

    assert float(jnp.sum(jnp.arange(10.0))) == 45.0
    case, spec, env = inputs_for("matmul")
    np.testing.assert_allclose(kernel(case, "julia")(*[env[n] for n in spec.input_names]), naive_eval(spec, env),
                               rtol=1e-10)


def scenario_pow() -> None:
    """G4: the printed pow helper on the real Julia against XLA on every edge pair, bit for bit."""
    import jax
    import jax.numpy as jnp
    from test_julia_printer import POW_EDGE_BASES, POW_EDGE_EXPONENTS, same_bits

    pairs = [(x, y) for x in POW_EDGE_BASES for y in POW_EDGE_EXPONENTS]
    for dtype in (np.float32, np.float64):
        x, z = (np.array(column, dtype) for column in zip(*pairs))
        got = tullax.einsum_kernel("y[i] := x[i]^z[i]", backend="julia")(x, z)
        with jax.enable_x64(True):
            expected = np.asarray(jnp.power(jnp.asarray(x), jnp.asarray(z)))
        same = same_bits(got, expected)
        assert same.all(), [(a, b, g, e) for a, b, g, e, ok in zip(x, z, got, expected, same) if not ok]


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
