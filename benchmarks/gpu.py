"""The cuda backend on an NVIDIA GPU against XLA on the same GPU, in one command:

    .venv/bin/python benchmarks/gpu.py            # writes benchmarks/results/gpu-<device>.{json,md}
    .venv/bin/python benchmarks/gpu.py --quick    # smaller sizes, fewer repeats

Needs JAX's CUDA build (``pip install 'jax[cuda13]'``) and ``pip install 'tullax[cuda]'`` (cuda-bindings, NVRTC);
refuses with the reason anywhere else. Three parts:

1. Correctness: every corpus kernel (tests/corpus.py), forward and the gradient of every differentiable input,
   float32 (rtol 1e-4) and float64 (rtol 1e-9), backend='cuda' against backend='xla', both jitted on the GPU.
2. Timings per case: forward, backward (the pullback alone), backward/forward, speed-up against XLA's jnp
   lowering of the same spec and, where there is one, the naive broadcast; the same for ``backend='auto'``
   (the planner: cuda or an XLA form per kernel); the per-call overhead of a tiny kernel
   under jit against a jnp op; time to first kernel (forward plus gradients) in new processes, cold (empty
   cache) and warm.
   The "unsplit" part times the cases whose gradients the cuda backend splits (few output elements, long sums:
   ``tullax.compiler.split``) again with ``TULLAX_CUDA_SPLIT=0``, one thread per output element.
3. Command buffers: the tiny kernel's per-call time and a Dist forward, in new processes with
   ``TULLAX_CUDA_COMMAND_BUFFER`` 0 and 1 (``command_buffer_compatible`` on the buffer_callback), each checked
   against XLA on fresh inputs every call (a replayed capture over stale buffers would show).
4. The targets of issue 11, each PASS or FAIL.
5. Device time (part ``device``, ``benchmarks/gpu_device.py``): each tullax kernel (forward and every gradient
   step) timed with CUDA events around many pipelined launches, its schedule, its roofline (bytes and FLOPs
   from the shapes at the device's peaks) and the fraction reached; the forward operation's pipelined time
   per call on cuda and XLA beside it (the host's per-call overhead hidden).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
RTOL = {"float32": 1e-4, "float64": 1e-9}
OVERHEAD_CALLS = 2000


def refuse_without_gpu() -> str:
    """The GPU's name; SystemExit with the reason when this machine cannot run the benchmark."""
    import jax

    from tullax import backends

    if jax.default_backend() != "gpu":
        raise SystemExit(f"benchmarks/gpu.py needs an NVIDIA GPU with JAX's CUDA build; jax runs on "
                         f"{jax.default_backend()!r} here (devices: {jax.devices()}). Nothing was measured.")
    ok, why = backends.get("cuda").availability()
    if not ok:
        raise SystemExit(f"benchmarks/gpu.py: the cuda backend is not usable here: {why}")
    return jax.devices()[0].device_kind


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def best_ms(fn: Callable[[], Any], repeat: int) -> float:
    """The best wall time of ``fn()`` (blocked until ready) over ``repeat`` runs, after one warm-up."""
    from tullax.benchmarking.timing import blocked, timed

    return timed(blocked(fn), repeat).best_ms


# ---------------------------------------------------------------------------------------------
# 1. Correctness on the corpus
# ---------------------------------------------------------------------------------------------
def corpus_check(dtype: str, shard: int = 0, shards: int = 1) -> list[dict]:
    """Rows of the corpus cases ``shard``, ``shard + shards``, ... (one shard per process: see corpus_rows)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    sys.path.insert(0, str(ROOT / "tests"))
    from corpus import CORPUS

    import tullax
    from tullax.errors import TullaxError
    from tullax.spec.examples import random_inputs, shapes_for

    rows = []
    for case in CORPUS[shard::shards]:
        row: dict[str, Any] = {"case": case.id, "dtype": dtype}
        try:
            cuda = tullax.einsum_kernel(case.spec, backend="cuda", ranges=case.ranges)
            xla = tullax.einsum_kernel(case.spec, backend="xla", ranges=case.ranges)
            spec = cuda.ir
            shapes = {**shapes_for(spec, seed=0), **(case.shapes or {})}
            env = random_inputs(spec, shapes, seed=1, dtype=getattr(np, dtype))
            args = [jnp.asarray(env[name]) for name in spec.input_names]
            live = [k for k, item in enumerate(spec.inputs) if item.kind in ("array", "scalar")]
            got, want = jax.jit(cuda)(*args), jax.jit(xla)(*args)
            errors = [_relative_error(got, want)]
            cotangent = jnp.asarray(np.random.default_rng(7).standard_normal(np.shape(want)), dtype=want.dtype)

            def gradients(kernel) -> list:
                if not live:
                    return []
                return list(jax.jit(jax.grad(lambda *a: (kernel(*a) * cotangent).sum(), argnums=live))(*args))

            try:
                errors += [_relative_error(g, w) for g, w in zip(gradients(cuda), gradients(xla))]
            except TullaxError as err:  # a spec without derivable gradients: (*) reductions
                row["note"] = f"forward only: {str(err).splitlines()[0]}"
            row["max_error"] = max(errors)
            row["passed"] = bool(row["max_error"] <= RTOL[dtype])
        except Exception as err:  # noqa: BLE001 - one failing case must not stop the benchmark
            row.update(passed=False, error=f"{type(err).__name__}: {err}"[:500])
        rows.append(row)
    return rows


def corpus_rows(dtypes: tuple[str, ...] = ("float32", "float64")) -> list[dict]:
    """``corpus_check`` of every dtype, the corpus split over new processes that run at once (each compiles
    its kernels with NVRTC and XLA: one process would take minutes); rows in corpus order."""
    shards = max(1, min(8, (os.cpu_count() or 2) // len(dtypes)))
    running = [(dtype, subprocess.Popen([sys.executable, __file__, "--corpus-child", dtype, str(k), str(shards)],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
               for dtype in dtypes for k in range(shards)]
    rows = []
    for dtype, child in running:
        out, err = child.communicate(timeout=900)
        if child.returncode != 0:
            rows.append({"case": f"shard of {dtype}", "dtype": dtype, "passed": False,
                         "error": f"the process failed: {err[-400:]}"})
            continue
        rows += json.loads(out.strip().splitlines()[-1])
    order = {case_id: k for k, case_id in enumerate(_corpus_ids())}
    return sorted(rows, key=lambda r: (r["dtype"], order.get(r["case"], -1)))


def _corpus_ids() -> list[str]:
    sys.path.insert(0, str(ROOT / "tests"))
    from corpus import CORPUS

    return [case.id for case in CORPUS]


def _relative_error(got, want) -> float:
    import numpy as np

    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    both_nan = np.isnan(got) & np.isnan(want)
    scale = np.maximum(np.abs(want), 1.0)
    diff = np.where(both_nan, 0.0, np.abs(got - want) / scale)
    return float(np.nan_to_num(diff, nan=np.inf).max(initial=0.0))


# ---------------------------------------------------------------------------------------------
# 2. Timings
# ---------------------------------------------------------------------------------------------
def cases(quick: bool) -> list[tuple[str, str, dict, Callable | None]]:
    """(name, spec, shapes, naive broadcast or None)."""
    import jax.numpy as jnp

    def dist_naive(w, x):
        return ((w[:, :, None] - x[:, None, :]) ** 2).sum(0)

    def linear_naive(w, x):
        return (w[:, :, None] * x[:, None, :]).sum(0)

    s = 4 if quick else 1
    return [
        ("Dist K=784 I=1024 J=512", "D[i,j] := (W[k,i]-X[k,j])^2",
         {"W": (784 // s, 1024 // s), "X": (784 // s, 512 // s)}, dist_naive),
        ("Dist I=J=4096 K=64", "D[i,j] := (W[k,i]-X[k,j])^2",
         {"W": (64, 4096 // s), "X": (64, 4096 // s)}, dist_naive),
        ("Linear", "C[i,j] := W[k,i]*X[k,j]", {"W": (784 // s, 1024 // s), "X": (784 // s, 512 // s)}, linear_naive),
        ("conv1d", "y[b,i] := x[b,i+k]*w[k]", {"x": (64 // s, 16384), "w": (31,)}, None),
        ("conv2d", "y[n,o,h,w] := x[n,c,h+p,w+q]*k[o,c,p,q]",
         {"x": (8 // s, 32, 64, 64), "k": (32, 32, 3, 3)}, None),
        ("embedding", "out[b,d] := W[ix[b],d]", {"W": (50000 // s, 256), "ix": (16384 // s,)},
         lambda w, ix: jnp.take(w, ix, axis=0)),
        ("row logsumexp", "(logsumexp) l[i] := x[i,j]", {"x": (4096 // s, 4096)}, None),
    ]


def time_case(name: str, spec_text: str, shapes: dict, naive: Callable | None, dtype: str, repeat: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import tullax
    from tullax.spec.examples import random_inputs

    row: dict[str, Any] = {"case": name, "spec": spec_text, "shapes": shapes, "dtype": dtype}
    try:
        kernels = {b: tullax.einsum_kernel(spec_text, backend=b) for b in BACKENDS}
        spec = kernels["cuda"].ir
        env = random_inputs(spec, shapes, seed=0, dtype=getattr(np, dtype))
        args = [jnp.asarray(env[n]) for n in spec.input_names]
        live = tuple(k for k, item in enumerate(spec.inputs) if item.kind == "array")
        for backend, kernel in kernels.items():
            forward = jax.jit(kernel)
            out = forward(*args)
            cotangent = jnp.ones_like(out)

            def pullback_of(kernel=kernel):
                def f(*live_args):
                    full = list(args)
                    for k, value in zip(live, live_args):
                        full[k] = value
                    return kernel(*full)
                _, pullback = jax.vjp(f, *(args[k] for k in live))
                return jax.jit(pullback)

            backward = pullback_of()
            row[f"{backend}_forward_ms"] = best_ms(lambda f=forward: f(*args), repeat)
            progress(row)
            row[f"{backend}_backward_ms"] = best_ms(lambda b=backward: b(cotangent), repeat)
            progress(row)
        from tullax.planner import decide as planner
        from tullax.planner.explain import describe
        from tullax.spec.text import format_spec

        row["auto_plans"] = sorted({f"{format_spec(key[0])}: {describe(found)}"
                                    for key, found in planner._MEMO.items()})
        if naive is not None:
            row["naive_forward_ms"] = best_ms(lambda f=jax.jit(naive): f(*args), repeat)
        row["grad_over_fwd"] = row["cuda_backward_ms"] / row["cuda_forward_ms"]
        row["forward_speedup_vs_xla"] = row["xla_forward_ms"] / row["cuda_forward_ms"]
        row["backward_speedup_vs_xla"] = row["xla_backward_ms"] / row["cuda_backward_ms"]
        if naive is not None:
            row["forward_speedup_vs_naive"] = row["naive_forward_ms"] / row["cuda_forward_ms"]
        best_xla_forward = min(row["xla_forward_ms"], row.get("naive_forward_ms", float("inf")))
        row["auto_grad_over_fwd"] = row["auto_backward_ms"] / row["auto_forward_ms"]
        row["auto_forward_vs_best_xla"] = best_xla_forward / row["auto_forward_ms"]
        row["auto_backward_vs_xla"] = row["xla_backward_ms"] / row["auto_backward_ms"]
    except Exception as err:  # noqa: BLE001
        row["error"] = f"{type(err).__name__}: {err}"[:500]
    return row


# the cuda backend alone, XLA's lowering of the same spec, and ``auto``: the planner, which runs each kernel
# (forward, each gradient step) on cuda or in one of XLA's forms, whichever it timed faster on this GPU
BACKENDS = ("cuda", "xla", "auto")


def progress(row: dict) -> None:
    """In a case's own process: the row so far, one JSON line, so that a case cut short keeps its timings."""
    print(json.dumps(row), flush=True)


def timed_case(name: str, dtype: str, repeat: int, quick: bool, limit_s: float, env: dict | None = None) -> dict:
    """``time_case`` of the case called ``name`` in a new process (with ``env`` added to its environment),
    stopped after ``limit_s`` seconds (XLA's GPU compiler can take minutes on a large broadcast); a stopped case
    keeps what it had measured."""
    command = [sys.executable, __file__, "--case-child", name, "--dtype", dtype, "--repeat", str(repeat)]
    try:
        done = subprocess.run(command + (["--quick"] if quick else []), capture_output=True, text=True,
                              timeout=limit_s, env={**os.environ, **(env or {})})
        out, err, stopped = done.stdout, done.stderr, None
    except subprocess.TimeoutExpired as expired:
        out, err = (expired.stdout or b""), (expired.stderr or b"")
        out, err = (x.decode() if isinstance(x, bytes) else x for x in (out, err))
        stopped = f"stopped after {limit_s:.0f} s"
    lines = [line for line in out.splitlines() if line.startswith("{")]
    row = json.loads(lines[-1]) if lines else {"case": name}
    if stopped:
        row["error"] = f"{stopped} (stderr: {err.strip()[-300:]})"
    elif not lines or done.returncode != 0:
        row.setdefault("error", f"the process failed: {err.strip()[-400:]}")
    return row


# The cases whose gradients have few output elements and long sums: the cuda backend splits those sums over
# more threads (tullax.compiler.split); the "unsplit" part times them with splitting off, for comparison
SPLIT_CASES = ("conv1d", "conv2d")


def unsplit_rows(dtype: str, repeat: int, quick: bool, limit_s: float, names: list[str]) -> list[dict]:
    """The SPLIT_CASES among ``names`` timed again with ``TULLAX_CUDA_SPLIT=0``: one thread per output element."""
    from tullax.backends.cuda.launch import SPLIT_ENV

    return [timed_case(name, dtype, repeat, quick, limit_s, {SPLIT_ENV: "0"}) for name in names
            if name in SPLIT_CASES]


def call_overhead(dtype: str) -> dict:
    """Per-call time of a tiny kernel under jit against the same jnp op (both blocked after every call)."""
    import jax
    import jax.numpy as jnp

    import tullax

    x = jnp.ones(16, dtype)
    kernel = jax.jit(tullax.einsum_kernel("y[i] := 2*x[i]", backend="cuda"))
    jnp_op = jax.jit(lambda v: 2 * v)
    per_call = {}
    for name, fn in (("tullax", kernel), ("jnp", jnp_op)):
        jax.block_until_ready(fn(x))
        start = time.perf_counter()
        for _ in range(OVERHEAD_CALLS):
            jax.block_until_ready(fn(x))
        per_call[name] = (time.perf_counter() - start) / OVERHEAD_CALLS * 1e6
    return {"tullax_us": per_call["tullax"], "jnp_us": per_call["jnp"],
            "overhead_us": per_call["tullax"] - per_call["jnp"]}


TTFK_SPEC = "D[i,j] := (W[k,i]-X[k,j])^2"


def command_buffer_child(dtype: str) -> None:
    """In a new process (``TULLAX_CUDA_COMMAND_BUFFER`` set by the parent): per-call times of the tiny kernel and
    of a Dist forward under jit, and whether every call on new inputs matched XLA."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import tullax

    found: dict[str, Any] = {}
    key = jax.random.PRNGKey(0)
    for label, spec, shapes in (("tiny", "y[i] := 2*x[i]", [(16,)]), ("dist", TTFK_SPEC, [(256, 512), (256, 384)])):
        kernel = jax.jit(tullax.einsum_kernel(spec, backend="cuda"))
        oracle = jax.jit(tullax.einsum_kernel(spec, backend="xla"))
        mismatches = 0
        for _ in range(20):  # fresh inputs each call: a replay over the captured addresses would go stale
            key, *keys = jax.random.split(key, len(shapes) + 1)
            args = [jax.random.normal(k, s, dtype) for k, s in zip(keys, shapes)]
            if not np.allclose(np.asarray(kernel(*args)), np.asarray(oracle(*args)), rtol=RTOL[dtype], atol=1e-5):
                mismatches += 1
        args = [jnp.ones(s, dtype) for s in shapes]
        jax.block_until_ready(kernel(*args))
        calls = OVERHEAD_CALLS if label == "tiny" else 200
        start = time.perf_counter()
        for _ in range(calls):
            jax.block_until_ready(kernel(*args))
        found[label] = {"per_call_us": (time.perf_counter() - start) / calls * 1e6, "mismatches": mismatches}
    print(json.dumps(found))


def command_buffers(dtype: str) -> dict:
    """``command_buffer_child`` with command buffers off and on, each in a new process."""
    found = {}
    for flag in ("0", "1"):
        env = {**os.environ, "TULLAX_CUDA_COMMAND_BUFFER": flag}
        done = subprocess.run([sys.executable, __file__, "--command-buffer-child", "--dtype", dtype], env=env,
                              capture_output=True, text=True, timeout=600)
        label = "on" if flag == "1" else "off"
        if done.returncode != 0:
            found[label] = {"error": done.stderr[-500:]}
            continue
        found[label] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def ttfk_child(dtype: str, backend: str) -> None:
    """In a new process: seconds from kernel creation to the first forward AND gradient results."""
    import jax
    import jax.numpy as jnp

    import tullax

    w, x = jnp.ones((64, 32), dtype), jnp.ones((64, 48), dtype)
    start = time.perf_counter()
    kernel = tullax.einsum_kernel(TTFK_SPEC, backend=backend)
    value, grads = jax.jit(jax.value_and_grad(lambda a, b: kernel(a, b).sum(), argnums=(0, 1)))(w, x)
    jax.block_until_ready((value, grads))
    print(json.dumps({"seconds": time.perf_counter() - start}))


def ttfk(dtype: str) -> dict:
    """Cold (empty cache directory) then warm (the same directory), each in a new process, for ``cuda`` (keys
    ``cold_s``, ``warm_s``) and for ``auto`` (``auto_cold_s``, ``auto_warm_s``)."""
    found = {}
    for backend, prefix in (("cuda", ""), ("auto", "auto_")):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TULLAX_CACHE_DIR": cache}
            for label in ("cold", "warm"):
                done = subprocess.run([sys.executable, __file__, "--ttfk-child", backend, "--dtype", dtype],
                                      env=env, capture_output=True, text=True, timeout=600)
                if done.returncode != 0:
                    found[f"{prefix}{label}_error"] = done.stderr[-500:]
                    continue
                found[f"{prefix}{label}_s"] = json.loads(done.stdout.strip().splitlines()[-1])["seconds"]
    return found


# ---------------------------------------------------------------------------------------------
# 3. Targets and the report
# ---------------------------------------------------------------------------------------------
def targets(timings: list[dict], overhead: dict, first: dict) -> list[tuple[str, bool | None]]:
    """(target, PASS True / FAIL False / None where its part was not run)."""
    by_case = {row["case"]: row for row in timings if "error" not in row}

    def check(value: Any, ok: Callable[[float], bool]) -> bool | None:
        return None if value is None else bool(ok(value))

    found: list[tuple[str, bool | None]] = []
    for row in timings:
        found.append((f"{row['case']}: grad/fwd <= 3", row.get("grad_over_fwd", float("inf")) <= 3))
    dist = by_case.get("Dist K=784 I=1024 J=512", {}) if timings else None
    embedding = by_case.get("embedding", {}) if timings else None
    found.append(("Dist forward >= 3x the naive broadcast",
                  check(dist, lambda d: d.get("forward_speedup_vs_naive", 0) >= 3)))
    found.append(("Dist forward not slower than XLA's fused lowering",
                  check(dist, lambda d: d.get("forward_speedup_vs_xla", 0) >= 1)))
    found.append(("Dist backward >= 5x faster than XLA",
                  check(dist, lambda d: d.get("backward_speedup_vs_xla", 0) >= 5)))
    found.append(("embedding gradient not slower than XLA's scatter",
                  check(embedding, lambda e: e.get("backward_speedup_vs_xla", 0) >= 1)))
    found.append(("per-call overhead <= 30 us above a jnp op",
                  check(overhead or None, lambda o: o.get("overhead_us", float("inf")) <= 30)))
    found.append(("TTFK warm <= 0.3 s", check(first or None, lambda f: f.get("warm_s", float("inf")) <= 0.3)))
    found.append(("TTFK cold <= 1.5 s", check(first or None, lambda f: f.get("cold_s", float("inf")) <= 1.5)))
    for row in timings:  # issue 14 on the GPU: the planner never slower than XLA
        if "auto_forward_ms" in row and "auto_backward_ms" in row:
            found.append((f"auto, {row['case']}: >= 0.95x XLA forward and backward",
                          min(row.get("auto_forward_vs_best_xla", 0), row.get("auto_backward_vs_xla", 0)) >= 0.95))
    return found


def _ms(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "-"


def markdown(report: dict) -> str:
    lines = [f"# tullax cuda backend on {report['device']}", "",
             f"jax {report['versions']['jax']}, tullax {report['versions']['tullax']}, NVRTC "
             f"{report['versions']['nvrtc']}, {report['dtype']}", "",
             "## Timings (ms, best of the repeats)", "",
             "| case | fwd | bwd | bwd/fwd | XLA fwd | XLA bwd | fwd vs XLA | bwd vs XLA | naive fwd | fwd vs naive |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in report.get("timings", []):
        lines.append("| " + " | ".join([row["case"]] + [_ms(row.get(k)) for k in (
            "cuda_forward_ms", "cuda_backward_ms", "grad_over_fwd", "xla_forward_ms", "xla_backward_ms",
            "forward_speedup_vs_xla", "backward_speedup_vs_xla", "naive_forward_ms", "forward_speedup_vs_naive")])
            + " |")
    lines += ["", "## backend='auto': each kernel on cuda or in an XLA form, whichever the planner timed faster", "",
              "| case | auto fwd | auto bwd | bwd/fwd | fwd vs best XLA | bwd vs XLA |", "|---|---|---|---|---|---|"]
    for row in report.get("timings", []):
        lines.append("| " + " | ".join([row["case"]] + [_ms(row.get(k)) for k in (
            "auto_forward_ms", "auto_backward_ms", "auto_grad_over_fwd", "auto_forward_vs_best_xla",
            "auto_backward_vs_xla")]) + " |")
    overhead, first = report.get("overhead"), report.get("ttfk")
    lines.append("")
    lines += [f"- {row['case']}: {row['error'].splitlines()[0]}" for row in report.get("timings", []) if "error" in row]
    if overhead:
        lines.append(f"Per-call overhead under jit: tullax {overhead['tullax_us']:.1f} us, jnp "
                     f"{overhead['jnp_us']:.1f} us (+{overhead['overhead_us']:.1f} us).")
    if first:
        lines.append(f"TTFK of forward plus gradients ({TTFK_SPEC}), new processes: cold {_ms(first.get('cold_s'))}"
                     f" s, warm {_ms(first.get('warm_s'))} s; under auto cold {_ms(first.get('auto_cold_s'))} s, "
                     f"warm {_ms(first.get('auto_warm_s'))} s" + "".join(
                         f"; {k}: {v.splitlines()[-1] if v else ''}" for k, v in first.items() if k.endswith("error"))
                     + ".")
    lines.append("")
    if report.get("unsplit"):
        timed = {row["case"]: row for row in report.get("timings", [])}
        lines += ["## Split sums (tullax.compiler.split) against one thread per output element", "",
                  "| case | bwd split | bwd unsplit | unsplit / split |", "|---|---|---|---|"]
        for row in report["unsplit"]:
            split, unsplit = timed.get(row["case"], {}).get("cuda_backward_ms"), row.get("cuda_backward_ms")
            ratio = unsplit / split if isinstance(split, float) and isinstance(unsplit, float) else None
            lines.append(f"| {row['case']} | {_ms(split)} | {_ms(unsplit)} | {_ms(ratio)} |"
                         + (f" {row['error'].splitlines()[0]}" if "error" in row else ""))
        lines.append("")
    lines += ["## Command buffers (command_buffer_compatible)", "", "| setting | tiny kernel us/call | mismatches "
              "| Dist fwd us/call | mismatches |", "|---|---|---|---|---|"]
    for label, row in report.get("command_buffers", {}).items():
        if "error" in row:
            lines.append(f"| {label} | error: {row['error'].splitlines()[-1] if row['error'] else ''} |")
            continue
        lines.append(f"| {label} | {row['tiny']['per_call_us']:.1f} | {row['tiny']['mismatches']}/20 | "
                     f"{row['dist']['per_call_us']:.1f} | {row['dist']['mismatches']}/20 |")
    lines += ["", "## Corpus against XLA on the GPU", ""]
    for dtype in ("float32", "float64") if "corpus" in report else ():
        rows = [r for r in report["corpus"] if r["dtype"] == dtype]
        failed = [r for r in rows if not r["passed"]]
        lines.append(f"- {dtype} (rtol {RTOL[dtype]:g}): {len(rows) - len(failed)}/{len(rows)} cases pass"
                     + (": failing " + ", ".join(f"{r['case']} ({str(r.get('error') or r.get('max_error'))[:80]})"
                                                  for r in failed) if failed else ""))
    if report.get("device_time"):
        lines += [""] + device_markdown(report["device_time"])
    verdict = {True: "PASS", False: "FAIL", None: "NOT RUN"}
    lines += ["", "## Targets", ""] + [f"- {verdict[ok]}: {what}" for what, ok in report["targets"]]
    lines += ["", "Seconds per part: " + ", ".join(f"{k} {v}" for k, v in report.get("seconds", {}).items())]
    return "\n".join(lines) + "\n"


PARTS = ("timings", "unsplit", "overhead", "ttfk", "buffers", "corpus", "device")


def device_part(device: str, dtype: str, quick: bool, names: list[str]) -> dict:
    """Part ``device``: per case the CUDA-event time of every kernel and the pipelined time per call."""
    import gpu_device

    found: dict[str, list] = {"kernels": [], "pipelined": []}
    for name, spec_text, shapes, _ in cases(quick):
        if name in names:
            print(f"device time of {name}", flush=True)
            found["kernels"] += gpu_device.device_rows(name, spec_text, shapes, dtype, device)
            found["pipelined"].append(gpu_device.pipelined_rows(name, spec_text, shapes, dtype))
    return found


def device_markdown(found: dict) -> list[str]:
    lines = ["## Device time (CUDA events around pipelined launches) and roofline", "",
             "| case | kernel | schedule | grid x block | device ms | roofline ms | of roofline |",
             "|---|---|---|---|---|---|---|"]
    for row in found.get("kernels", []):
        if "error" in row:
            lines.append(f"| {row['case']} | {row['kernel']} | error: {row['error'].splitlines()[0][:120]} |")
            continue
        lines.append(f"| {row['case']} | {row['kernel']} | {row.get('schedule')} | {row.get('grid')} x "
                     f"{row.get('block')} | {_ms(row.get('device_ms'))} | {_ms(row.get('roofline_ms'))} | "
                     f"{_ms(row.get('roofline_fraction'))} |")
    lines += ["", "| case | cuda fwd pipelined ms/call | XLA fwd pipelined ms/call |", "|---|---|---|"]
    for row in found.get("pipelined", []):
        lines.append(f"| {row['case']} | {_ms(row.get('cuda_pipelined_ms'))} | {_ms(row.get('xla_pipelined_ms'))} |")
    return lines + [""]


def save(report: dict, out_dir: Path) -> Path:
    """Write what has been measured so far: a run cut short still leaves its finished parts."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"gpu-{slug(report['device'])}"
    report["targets"] = targets(report.get("timings", []), report.get("overhead", {}), report.get("ttfk", {}))
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))
    stem.with_suffix(".md").write_text(markdown(report))
    return stem


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"), help="of the timings")
    parser.add_argument("--repeat", type=int, default=None, metavar="N", help="timed runs per measurement")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated, in the order run (default: all of {', '.join(PARTS)})")
    parser.add_argument("--cases", default=None, metavar="NAMES",
                        help="comma-separated case names of the timings (default: every case)")
    parser.add_argument("--out-dir", default=str(RESULTS))
    parser.add_argument("--ttfk-child", choices=("cuda", "auto"), help=argparse.SUPPRESS)
    parser.add_argument("--command-buffer-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--case-limit", type=float, default=120.0, metavar="S",
                        help="seconds each timed case may take in its own process (default 120)")
    parser.add_argument("--case-child", help=argparse.SUPPRESS)
    parser.add_argument("--corpus-child", nargs=3, metavar=("DTYPE", "SHARD", "SHARDS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}; the parts are {', '.join(PARTS)}")
    # every process of the benchmark shares the GPU: jax must not take 75% of its memory in each
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))  # gpu_device
    import jax

    jax.config.update("jax_enable_x64", True)  # float64 checks; float32 inputs stay float32
    if args.ttfk_child:
        ttfk_child(args.dtype, args.ttfk_child)
        return 0
    if args.command_buffer_child:
        command_buffer_child(args.dtype)
        return 0
    if args.case_child:
        repeat = args.repeat or (5 if args.quick else 20)
        found = [c for c in cases(args.quick) if c[0] == args.case_child]
        if not found:
            raise SystemExit(f"no case {args.case_child!r}")
        progress(time_case(*found[0], args.dtype, repeat))
        return 0
    if args.corpus_child:
        dtype, shard, shards = args.corpus_child
        print(json.dumps(corpus_check(dtype, int(shard), int(shards))))
        return 0
    names = [name for name, *_ in cases(args.quick)]
    if args.cases:
        chosen = [c.strip() for c in args.cases.split(",") if c.strip()]
        unknown_cases = sorted(set(chosen) - set(names))
        if unknown_cases:
            parser.error(f"unknown cases {unknown_cases}; the cases are {', '.join(names)}")
        names = [name for name in names if name in chosen]
    device_name = refuse_without_gpu()
    import tullax
    from tullax.backends.cuda.compile import nvrtc_version

    repeat = args.repeat or (5 if args.quick else 20)
    out_dir = Path(args.out_dir)
    report: dict[str, Any] = {
        "device": device_name, "dtype": args.dtype, "quick": args.quick, "parts": parts, "seconds": {},
        "versions": {"jax": jax.__version__, "tullax": tullax.__version__,
                     "nvrtc": ".".join(map(str, nvrtc_version()))}}
    print(f"benchmarking the cuda backend on {device_name}: {', '.join(parts)}", flush=True)
    for part in parts:
        start = time.perf_counter()
        if part == "timings":
            report["timings"] = []
            for name in names:
                print(f"timing {name}", flush=True)
                report["timings"].append(timed_case(name, args.dtype, repeat, args.quick, args.case_limit))
                save(report, out_dir)
        elif part == "unsplit":
            report["unsplit"] = unsplit_rows(args.dtype, repeat, args.quick, args.case_limit, names)
        elif part == "overhead":
            report["overhead"] = call_overhead(args.dtype)
        elif part == "ttfk":
            report["ttfk"] = ttfk(args.dtype)
        elif part == "buffers":
            report["command_buffers"] = command_buffers(args.dtype)
        elif part == "corpus":
            report["corpus"] = corpus_rows()
        elif part == "device":
            report["device_time"] = device_part(device_name, args.dtype, args.quick, names)
        report["seconds"][part] = round(time.perf_counter() - start, 1)
        stem = save(report, out_dir)
        print(f"{part} done in {report['seconds'][part]:.1f} s", flush=True)
    print(markdown(report))
    print(f"wrote {stem}.json and {stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
