"""The child process of a benchmark: one backend, one case, in a process of its own.

    python -m tullax.benchmarking.worker '<job as JSON>'

The job names the spec, the backend ('xla' means jax.jit of the plain jnp lowering, differentiated by jax
itself; any other name is a tullax backend through ``einsum_kernel``), the shapes and the phases to run:

- ``ttfk``: time to first kernel on tiny inputs, forward plus all gradients under jit (first thing in the
  process, so it is cold or warm according to the cache directory the parent chose);
- ``fwd`` / ``bwd``: best-of-N wall time of the jitted forward, and of the jitted VJP with a random cotangent
  w.r.t. every float input (it includes whatever forward work the gradient needs; XLA drops the rest). The
  main child also fingerprints the two compiled XLA programs (``tullax.benchmarking.programs``), so the
  report can tell rows that run the very same program;
- ``check``: the float results (forward and gradients) against the float64 XLA lowering, max relative error;
- ``h2h`` (``auto`` only): the planner's forward and backward head to head with the best XLA formulation of each
  (``job["h2h"]``: phase -> comparator), in this one process, alternating (``phase_h2h``).

Each phase prints one line ``@@tullax-bench {json}`` as soon as it ends (a parent that kills a slow child
keeps what was already reported); a phase that fails reports its error and the next phase still runs.
"""
from __future__ import annotations

import json
import math
import os
import resource
import statistics
import sys
import time
import traceback
from typing import Any, Callable

from tullax.benchmarking.case import differentiable_positions
from tullax.benchmarking.comparators import COMPARATORS, IDIOMATIC, NAIVE_XLA, TORCH
from tullax.spec.examples import make_inputs

LINE_PREFIX = "@@tullax-bench "
MIN_TIMING_S = 0.25  # fast kernels repeat until this much time was measured, to tame timer noise
MAX_RUNS = 100
H2H_ROUNDS = 15  # head-to-head rounds at most ...
H2H_MIN_ROUNDS = 5  # ... at least ...
H2H_BUDGET_S = 20.0  # ... and no new round after this long, per phase
H2H_ROUND_MS = 5.0  # a subject quicker than this runs several times back to back in a round, the best kept


def emit(record: dict[str, Any]) -> None:
    print(LINE_PREFIX + json.dumps(record), flush=True)


# ------------------------------------------------------------------------------------------ the functions


class Subject:
    """The jitted forward and VJP of one spec on one backend."""

    def __init__(self, spec_text: str, ranges: dict | None, backend: str, idiomatic: str | None = None):
        import jax

        import tullax

        # a comparator only needs the analysed spec from the kernel: it runs tullax's jnp lowering itself
        comparator = backend in COMPARATORS
        kernel = tullax.einsum_kernel(spec_text, backend="xla" if comparator else backend, ranges=ranges)
        if not comparator and backend != "auto":  # auto resolves its loop backend as it plans, if it needs one
            kernel.backend  # noqa: B018 - resolve it now: importing the backend is part of the first kernel
        self.ir = kernel.ir
        if backend == IDIOMATIC:
            from tullax.benchmarking.idiomatic import JNP

            self.forward_fn = JNP[idiomatic or ""]
        else:
            self.forward_fn = plain_lowering(kernel.ir, naive=backend == NAIVE_XLA) if comparator else kernel
        self.wrt = differentiable_positions(kernel.ir)
        self.fwd = jax.jit(self.forward_fn)
        self.bwd = jax.jit(vjp_of(self.forward_fn, self.wrt))

    def inputs(self, shapes: dict, dtype: str, seed: int) -> tuple[list[Any], Any]:
        return device_inputs(self.ir, shapes, dtype, seed)


class TorchSubject:
    """The idiomatic formulation in torch, compiled by torch.compile; backward by autograd (the forward runs
    again inside each backward call, as jax's VJP does)."""

    def __init__(self, spec_text: str, ranges: dict | None, idiomatic: str | None):
        import torch

        from tullax.benchmarking.idiomatic import torch_formulation
        from tullax.spec.frontend import compile_spec

        _, self.ir = compile_spec(spec_text, ranges)
        formulation = torch_formulation(idiomatic or "")
        if formulation is None:
            raise ValueError(f"no torch formulation for {idiomatic!r}")
        self.wrt = differentiable_positions(self.ir)
        compiled = torch.compile(formulation)

        def fwd(*args: Any) -> Any:
            with torch.no_grad():
                return compiled(*args)

        def bwd(cotangent: Any, *args: Any) -> tuple[Any, ...]:
            live = [a.detach().requires_grad_(pos in self.wrt) if a.is_floating_point() else a
                    for pos, a in enumerate(args)]
            out = compiled(*live)
            grads = torch.autograd.grad(out, [live[pos] for pos in self.wrt], cotangent)
            return tuple(g.detach() for g in grads)

        self.fwd, self.bwd = fwd, bwd

    def inputs(self, shapes: dict, dtype: str, seed: int) -> tuple[list[Any], Any]:
        import numpy as np
        import torch

        shapes = {name: tuple(shape) for name, shape in shapes.items()}
        host = make_inputs(self.ir, shapes, dtype, seed)
        out_shape = tuple(int(extent.eval(shapes)) for extent in self.ir.out_shape)
        cotangent = np.random.default_rng(seed + 1).standard_normal(out_shape).astype(dtype)
        return [torch.from_numpy(np.ascontiguousarray(v)) for v in host], torch.from_numpy(cotangent)


def make_subject(job: dict) -> Any:
    if job["backend"] == TORCH:
        return TorchSubject(job["spec"], job.get("ranges"), job.get("idiomatic"))
    return Subject(job["spec"], job.get("ranges"), job["backend"], job.get("idiomatic"))


def plain_lowering(spec: Any, naive: bool = False) -> Callable[..., Any]:
    """The XLA reference: the jnp lowering as a plain function of the inputs, differentiated by jax.
    ``naive``: broadcast in order of appearance, no einsum (the ``NAIVE_XLA`` comparator)."""
    from tullax.backends.xla.lower import lower

    lowered = lower(spec, einsum=False, grid="appearance") if naive else lower(spec)
    names = spec.input_names

    def forward(*values: Any) -> Any:
        return lowered(dict(zip(names, values)))

    return forward


def vjp_of(forward: Callable[..., Any], wrt: tuple[int, ...]) -> Callable[..., Any]:
    """``(cotangent, *inputs) -> gradients w.r.t. the inputs at positions wrt`` (index arrays stay inputs
    of the jitted function instead of becoming baked-in constants)."""
    import jax

    def pullback(cotangent: Any, *values: Any) -> tuple[Any, ...]:
        def partial(*diff_values: Any) -> Any:
            full = list(values)
            for pos, value in zip(wrt, diff_values):
                full[pos] = value
            return forward(*full)

        _, vjp = jax.vjp(partial, *[values[pos] for pos in wrt])
        return vjp(cotangent)

    return pullback


def device_inputs(spec: Any, shapes: dict, dtype: str, seed: int) -> tuple[list[Any], Any]:
    """jax inputs for ``spec`` at ``shapes`` and a random cotangent for its output."""
    import jax.numpy as jnp
    import numpy as np

    shapes = {name: tuple(shape) for name, shape in shapes.items()}
    host = make_inputs(spec, shapes, dtype, seed)
    out_shape = tuple(int(extent.eval(shapes)) for extent in spec.out_shape)
    # Every data input is made in `dtype`, so the result (jnp.result_type of the data inputs) is `dtype` too.
    cotangent = np.random.default_rng(seed + 1).standard_normal(out_shape).astype(dtype)
    return [jnp.asarray(value) for value in host], jnp.asarray(cotangent)


def block(value: Any) -> Any:
    """Wait for jax's asynchronous dispatch (torch on the CPU returns finished tensors)."""
    import jax

    if "torch" in sys.modules:
        return value
    return jax.block_until_ready(value)


# ------------------------------------------------------------------------------------------------ phases


def phase_ttfk(job: dict) -> dict:
    """Kernel construction, tracing, compilation and the first forward and gradient call, on tiny inputs."""
    from tullax.spec.frontend import compile_spec

    _, spec = compile_spec(job["spec"], job.get("ranges"))
    shapes = job["ttfk_shapes"]
    if job["backend"] == TORCH:
        args, cotangent = TorchSubject(job["spec"], job.get("ranges"), job.get("idiomatic")).inputs(
            shapes, job["dtype"], job["seed"])
    else:
        args, cotangent = device_inputs(spec, shapes, job["dtype"], job["seed"])
    start = time.perf_counter()
    subject = make_subject(job)
    loaded = time.perf_counter()
    block(subject.fwd(*args))
    forward_done = time.perf_counter()
    if subject.wrt:
        block(subject.bwd(cotangent, *args))
    end = time.perf_counter()
    return {
        "ttfk_ms": (end - start) * 1e3, "ttfk_fwd_ms": (forward_done - start) * 1e3,
        "ttfk_load_ms": (loaded - start) * 1e3,
        "ttfk_shapes": shapes, "cache_entries": cache_timings(job["backend"]),
    }


def cache_timings(backend: str) -> list[dict]:
    """The compile cache's own timings (parse+codegen, compile, first run) of what this process built."""
    if backend in COMPARATORS:
        return []
    from tullax.runtime.cache import get_cache

    keep = ("kind", "spec", "backend")
    return [{name: value for name, value in entry.items() if name in keep or name.endswith("_ms")}
            for entry in get_cache().entries()]


def _subject_and_inputs(job: dict, state: dict) -> tuple[Any, list[Any], Any]:
    """The process's subject and its timing inputs and cotangent, made by the first phase that needs them and
    kept in ``state`` for the others."""
    subject = state.get("subject") or state.setdefault("subject", make_subject(job))
    if "args" not in state:
        state["rss_before_mb"] = current_rss_mb()
        state["args"], state["cotangent"] = subject.inputs(job["shapes"], job["dtype"], job["seed"])
    return subject, state["args"], state["cotangent"]


def _phase_call(subject: Any, which: str, args: list[Any], cotangent: Any) -> Callable[[], Any]:
    """One call of ``subject``'s jitted forward ("fwd") or VJP ("bwd"), waited for."""
    if which == "fwd":
        return lambda: block(subject.fwd(*args))
    return lambda: block(subject.bwd(cotangent, *args))


def _timed_phase(job: dict, state: dict, which: str) -> dict:
    subject, args, cotangent = _subject_and_inputs(job, state)
    if which == "bwd" and not subject.wrt:
        return {"skipped": "no input is differentiable"}
    call = _phase_call(subject, which, args, cotangent)
    planned_before = set(_planned(job))
    gradients_before = set(_gradients_planned(job))
    start = time.perf_counter()
    call()  # the warm-up: tracing, compiling and the first run
    first_ms = (time.perf_counter() - start) * 1e3
    builds_landed()
    best_ms, runs = best_of(call, job["repeat"])
    program = {}
    # after the timings: it traces and lowers the function again (the compiled program comes from jax's cache)
    if job.get("fingerprint") and job["backend"] != TORCH:
        from tullax.benchmarking.programs import fingerprint

        try:
            program[f"{which}_program"] = (fingerprint(subject.fwd, *args) if which == "fwd"
                                           else fingerprint(subject.bwd, cotangent, *args))
        except Exception as err:  # noqa: BLE001 - a program we cannot print costs its mark, not the timings
            program[f"{which}_program_error"] = f"{type(err).__name__}: {err}"
    return {f"{which}_ms": best_ms, f"first_{which}_ms": first_ms, f"{which}_runs": runs, **program,
            "rss_before_mb": state["rss_before_mb"], "peak_rss_mb": peak_rss_mb(),
            **({f"{which}_plans": [f"{key[0].out}: {_described(found)}" for key, found in _planned(job).items()
                                   if key not in planned_before]
                + [f"{key[0][0].out} (whole gradient w.r.t. {', '.join(key[2])}): {_described(found)}"
                   for key, found in _gradients_planned(job).items() if key not in gradients_before]}
               if job["backend"] == "auto" else {})}


def builds_landed() -> None:
    """Until this process's compiles in flight have ended: a c module the compile cache does not hold serves its
    first calls from the fast tier while the optimised build compiles (``TULLAX_C_TIERS``), and a row times the
    kernels a warm process runs, never that tier (a cold process timing it moves the median of the processes)."""
    from tullax.runtime import own_compiles

    own_compiles.wait()


def _described(found: Any) -> str:
    from tullax.planner.explain import describe

    return describe(found)


def _planned(job: dict) -> dict:
    """Under ``auto``: the planner's decisions so far in this process (kernel, shapes -> plan), so a phase can
    report where each of its kernels ran and why."""
    if job["backend"] != "auto" or "tullax.planner.decide" not in sys.modules:
        return {}
    from tullax.planner import decide as planner

    return dict(planner._MEMO)


def _gradients_planned(job: dict) -> dict:
    """Under ``auto``: this process's decisions on a differentiated call's whole gradient (the derived steps or
    JAX's autodiff of the forward's XLA form, ``tullax.planner.autodiff``), by (call key, out dtype, inputs
    differentiated, platform); a gradient the rule decides without a race is not among them."""
    if job["backend"] != "auto" or "tullax.planner.autodiff" not in sys.modules:
        return {}
    from tullax.planner import autodiff

    return dict(autodiff._MEMO)


def best_of(call: Callable[[], Any], repeat: int) -> tuple[float, int]:
    """Best wall time in ms over at least ``repeat`` calls; quick calls repeat until MIN_TIMING_S was spent."""
    times: list[float] = []
    while len(times) < repeat or (sum(times) < MIN_TIMING_S and len(times) < MAX_RUNS):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3, len(times)


def phase_h2h(job: dict, state: dict) -> dict:
    """The subject (``auto``) against the best XLA formulation of each phase (``job["h2h"]``: "fwd"/"bwd" ->
    comparator), in this one process on the same inputs: both jitted and run twice, then rounds in which each runs
    once (or a few times back to back, the best kept, where a call is quicker than H2H_ROUND_MS), the order
    alternating from round to round; per round the ratio comparator time / subject time, and the median ratio.

    The rows of the table time each backend in processes of its own, and their ratio includes what differs between
    processes: conv2d's lax.conv read 11.7, 13.1 and 14.1 ms in three jnp processes and 12.9, 15.7 and 15.8 ms in
    three of auto's, the very same convolution; within one process, round by round, the two read alike."""
    subject, args, cotangent = _subject_and_inputs(job, state)
    found: dict[str, dict] = {}
    for which, comparator in sorted(job.get("h2h", {}).items()):
        if which == "bwd" and not subject.wrt:
            continue
        rival = make_subject({**job, "backend": comparator})
        calls = {name: _phase_call(s, which, args, cotangent) for name, s in (("subject", subject), ("rival", rival))}
        quickest = float("inf")
        for call in calls.values():  # compile, then one warm run timed to size the rounds
            call()
            builds_landed()
            start = time.perf_counter()
            call()
            quickest = min(quickest, (time.perf_counter() - start) * 1e3)
        inner = max(1, min(20, math.ceil(H2H_ROUND_MS / max(quickest, 1e-3))))
        times: dict[str, list[float]] = {name: [] for name in calls}
        began = time.perf_counter()
        for round_ in range(H2H_ROUNDS):
            if round_ >= H2H_MIN_ROUNDS and time.perf_counter() - began > H2H_BUDGET_S:
                break
            for name in (("subject", "rival") if round_ % 2 == 0 else ("rival", "subject")):
                best = float("inf")
                for _ in range(inner):
                    start = time.perf_counter()
                    calls[name]()
                    best = min(best, time.perf_counter() - start)
                times[name].append(best * 1e3)
        ratios = [r / s for s, r in zip(times["subject"], times["rival"])]
        found[which] = {"comparator": comparator, "ratio": statistics.median(ratios), "rounds": len(ratios),
                        "calls_per_round": inner, "subject_ms": statistics.median(times["subject"]),
                        "comparator_ms": statistics.median(times["rival"])}
    return {"h2h": found}


def phase_check(job: dict, state: dict) -> dict:
    """Max relative error (max |a-b| / max |b| per result) of forward and gradients vs float64 XLA."""
    import jax
    import numpy as np

    subject = state.get("subject") or make_subject(job)
    args, cotangent = subject.inputs(job["check_shapes"], job["dtype"], job["seed"] + 7)
    results = [block(subject.fwd(*args))]
    if subject.wrt:
        results += list(block(subject.bwd(cotangent, *args)))
    if job["backend"] == TORCH:  # the same values as jax arrays, for the reference
        import jax.numpy as jnp

        results = [r.numpy() for r in results]
        args, cotangent = [jnp.asarray(a.numpy()) for a in args], jnp.asarray(cotangent.numpy())
    with jax.enable_x64(True):
        wide = [_widen(a) for a in args]
        reference_fn = plain_lowering(subject.ir)
        references = [block(jax.jit(reference_fn)(*wide))]
        if subject.wrt:
            references += list(block(jax.jit(vjp_of(reference_fn, subject.wrt))(_widen(cotangent), *wide)))
        names = ["out"] + [subject.ir.inputs[pos].name for pos in subject.wrt]
        errors = {name: relative_error(np.asarray(got), np.asarray(ref))
                  for name, got, ref in zip(names, results, references)}
    return {"rel_err": errors, "max_rel_err": max(errors.values()), "check_shapes": job["check_shapes"]}


def _widen(value: Any) -> Any:
    import jax.numpy as jnp

    return value.astype(jnp.float64) if jnp.issubdtype(value.dtype, jnp.floating) else value


def relative_error(got: Any, ref: Any) -> float:
    import numpy as np

    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        return math.inf
    if got.size == 0:
        return 0.0
    finite = np.isfinite(ref)
    if not np.array_equal(finite, np.isfinite(got)) or not np.array_equal(got[~finite], ref[~finite]):
        return math.inf  # an inf or nan where the reference has none (or a different one)
    if not finite.any():
        return 0.0
    scale = float(np.max(np.abs(ref[finite])))
    diff = float(np.max(np.abs(got[finite] - ref[finite])))
    return diff / scale if scale > 0 else diff


# ------------------------------------------------------------------------------------------------ memory


def peak_rss_mb() -> float:
    """This process's high-water resident set size (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def current_rss_mb() -> float | None:
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / (1024 * 1024)


# ---------------------------------------------------------------------------------------------- the driver


def run_job(job: dict) -> None:
    if job.get("dtype") == "float64":
        import jax

        jax.config.update("jax_enable_x64", True)
    state: dict[str, Any] = {}
    phases: dict[str, Callable[[], dict]] = {
        "ttfk": lambda: phase_ttfk(job),
        "fwd": lambda: _timed_phase(job, state, "fwd"),
        "bwd": lambda: _timed_phase(job, state, "bwd"),
        "check": lambda: phase_check(job, state),
        "h2h": lambda: phase_h2h(job, state),
    }
    for name in job["phases"]:
        emit({"begin": name})
        try:
            record = phases[name]()
        except Exception as err:  # noqa: BLE001 - reported to the parent, the next phase still runs
            record = {"error": f"{type(err).__name__}: {err}".strip(), "traceback": traceback.format_exc(limit=8)}
        emit({"phase": name, **record})
    # Numba and Julia each bring an LLVM; one process must never hold both (numba issue 7857).
    emit({"phase": "end", "llvm_runtimes": [name for name in ("numba", "juliacall") if name in sys.modules]})


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if len(arguments) != 1:
        print("usage: python -m tullax.benchmarking.worker '<job as JSON>'", file=sys.stderr)
        return 2
    start = time.perf_counter()
    import jax  # noqa: F401 - imported up front so no phase is charged for it

    import tullax  # noqa: F401

    emit({"phase": "start", "import_ms": (time.perf_counter() - start) * 1e3, "pid": os.getpid()})
    run_job(json.loads(arguments[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
