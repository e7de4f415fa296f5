"""Device time of each tullax CUDA kernel (forward and every gradient step), measured with CUDA events around
many launches pipelined on one stream, beside the pipelined time per call of the jitted operation (cuda and
XLA, many calls dispatched then one wait) and a roofline: the bytes every kernel must move (its inputs and its
output, once) and its FLOPs (two per term of the spec: a multiply and an add), as a fraction of the device's
peak. Run by ``benchmarks/gpu.py`` (part ``device``); ``kernel_work`` and ``roofline_ms`` are pure and tested
on the CPU (tests/test_gpu_roofline.py).
"""
from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

# Peak FP32 (no tensor cores) FLOP/s and HBM bytes/s, by a name fragment of the device (first match wins);
# FP64 is half the FP32 rate on these parts
PEAKS = (
    ("H200", 67e12, 4.8e12),
    ("H100 PCIe", 51e12, 2.0e12),
    ("H100", 67e12, 3.35e12),
    ("A100", 19.5e12, 2.0e12),
    ("L40S", 91.6e12, 0.864e12),
    ("L4", 30.3e12, 0.3e12),
)
LAUNCHES = 200  # launches between the two events: the per-launch gap is hidden behind the kernels


def step_shapes(step_spec: Any, known: dict) -> dict:
    """Each input of a kernel step's shape: a forward input's, an earlier step's result or, for a cotangent
    (``Δname``), the shape of ``name``."""
    return {n: tuple(known[n if n in known else n[1:]]) for n in step_spec.input_names}


def kernel_work(spec_text: str, shapes: dict, dtype: str = "float32") -> list[dict]:
    """Per kernel of ``spec_text`` (forward, then each gradient step): its label, the bytes of its inputs and
    output (each read or written once: the least any kernel moves) and 2 FLOPs per term (point of the space of
    all its indices)."""
    from tullax.backends.host import kernel_steps
    from tullax.spec.frontend import compile_spec
    from tullax.spec.shapes import eval_shapes

    forward = compile_spec(spec_text)[1]
    itemsize = np.dtype(dtype).itemsize
    known, rows = dict(shapes), []
    for step in kernel_steps(forward, dtype):
        its = step_shapes(step.spec, known)
        out_shape = tuple(s.eval(its) for s in step.spec.out_shape)
        known[step.spec.out] = out_shape
        ranges = eval_shapes(step.spec, its)
        terms = math.prod(max(hi - lo, 0) for lo, hi in ranges.values())
        arrays = [its[i.name] for i in step.spec.inputs if i.kind != "scalar"] + [out_shape]
        moved = sum(math.prod(shape) for shape in arrays) * itemsize  # index arrays counted at the data width
        rows.append({"label": step.label, "spec": step.spec, "shapes": its, "out_shape": out_shape,
                     "bytes": moved, "flops": 2 * terms})
    return rows


def peaks(device: str, dtype: str) -> tuple[float, float] | None:
    """(FLOP/s, bytes/s) of ``device`` for ``dtype``, or None for a device not in ``PEAKS``."""
    for fragment, flops, bandwidth in PEAKS:
        if fragment.lower() in device.lower():
            return (flops if dtype == "float32" else flops / 2), bandwidth
    return None


def roofline_ms(work: dict, device: str, dtype: str) -> float | None:
    """The least time ``work`` (a ``kernel_work`` row) can take on ``device``: its bytes at peak bandwidth or
    its FLOPs at peak rate, whichever is longer."""
    found = peaks(device, dtype)
    if found is None:
        return None
    flops, bandwidth = found
    return max(work["bytes"] / bandwidth, work["flops"] / flops) * 1e3


def event_ms(kernel: Any, out: Any, buffers: list, launches: int = LAUNCHES) -> float:
    """Device milliseconds per launch of a ``DeviceKernel``: CUDA events around ``launches`` launches on a
    stream of our own in the primary context (the one XLA uses), after one warm-up launch."""
    from cuda.bindings import driver as cu

    def check(returned):
        returned = returned if isinstance(returned, tuple) else (returned,)
        if returned[0] != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"CUDA driver call failed: {returned[0]}")
        return returned[1] if len(returned) > 1 else None

    device = check(cu.cuDeviceGet(0))
    context = check(cu.cuDevicePrimaryCtxRetain(device))
    check(cu.cuCtxSetCurrent(context))
    stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
    start, end = check(cu.cuEventCreate(0)), check(cu.cuEventCreate(0))
    try:
        kernel(int(stream), out, buffers)
        check(cu.cuEventRecord(start, stream))
        for _ in range(launches):
            kernel(int(stream), out, buffers)
        check(cu.cuEventRecord(end, stream))
        check(cu.cuEventSynchronize(end))
        return check(cu.cuEventElapsedTime(start, end)) / launches
    finally:
        check(cu.cuEventDestroy(start))
        check(cu.cuEventDestroy(end))
        check(cu.cuStreamDestroy(stream))
        check(cu.cuDevicePrimaryCtxRelease(device))


def pipelined_ms(fn: Any, args: tuple, calls: int = LAUNCHES) -> float:
    """Milliseconds per call of a jitted ``fn`` with ``calls`` calls dispatched before one wait: the device's
    throughput when it, not the host, is the bottleneck (the per-call host overhead overlaps)."""
    import jax

    jax.block_until_ready(fn(*args))
    begin = time.perf_counter()
    results = [fn(*args) for _ in range(calls)]
    jax.block_until_ready(results)
    return (time.perf_counter() - begin) / calls * 1e3


def device_rows(name: str, spec_text: str, shapes: dict, dtype: str, device: str) -> list[dict]:
    """One row per kernel of the case: CUDA-event device time of the tullax kernel, its roofline and the
    fraction of the roofline reached, the schedule chosen (cooperative, split, register-tiled) and the grid."""
    import jax.numpy as jnp

    from tullax.backends.base import Signature
    from tullax.backends.cuda.backend import device_kernel
    from tullax.spec.examples import random_inputs

    rows = []
    for work in kernel_work(spec_text, shapes, dtype):
        spec = work["spec"]
        row: dict[str, Any] = {"case": name, "kernel": work["label"], "bytes": work["bytes"],
                               "flops": work["flops"]}
        try:
            env = random_inputs(spec, work["shapes"], seed=0, dtype=getattr(np, dtype))
            values = [jnp.asarray(env[n]) for n in spec.input_names]
            signature = Signature(tuple(str(v.dtype) for v in values), dtype)
            all_shapes = {**work["shapes"], spec.out: work["out_shape"]}
            built = device_kernel(spec, signature, all_shapes)
            out = jnp.zeros(work["out_shape"], dtype)
            kernel = built.kernel
            row["schedule"] = ("block tile" if kernel.tile is not None else
                               "warp per element" if kernel.cooperative and kernel.warp else
                               "block per element" if kernel.cooperative else "split" if kernel.split else
                               "thread per element")
            row["grid"], row["block"] = built.plan.grid, built.plan.block
            row["device_ms"] = event_ms(built, out, values)
            row["roofline_ms"] = roofline_ms(work, device, dtype)
            if row["roofline_ms"]:
                row["roofline_fraction"] = row["roofline_ms"] / row["device_ms"]
        except Exception as err:  # noqa: BLE001 - a row records what failed and the run goes on
            row["error"] = f"{type(err).__name__}: {err}"[:400]
        rows.append(row)
    return rows


def pipelined_rows(name: str, spec_text: str, shapes: dict, dtype: str) -> dict:
    """The forward operation jitted on cuda and on xla: pipelined milliseconds per call of each."""
    import jax
    import jax.numpy as jnp

    import tullax
    from tullax.spec.examples import random_inputs

    row: dict[str, Any] = {"case": name}
    for backend in ("cuda", "xla"):
        try:
            kernel = tullax.einsum_kernel(spec_text, backend=backend)
            env = random_inputs(kernel.ir, shapes, seed=0, dtype=getattr(np, dtype))
            args = tuple(jnp.asarray(env[n]) for n in kernel.ir.input_names)
            row[f"{backend}_pipelined_ms"] = pipelined_ms(jax.jit(kernel), args)
        except Exception as err:  # noqa: BLE001
            row[f"{backend}_error"] = f"{type(err).__name__}: {err}"[:400]
    return row
