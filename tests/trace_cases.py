"""The GPU benchmark cases (benchmarks/gpu.py) at trace shapes, each kernel (forward and every gradient step)
with the launch the cuda backend plans for those shapes: what ``tests/test_cuda_trace.py`` traces.

Trace shapes keep each case's row lengths, strides and reduction extents; only extents that merely add more
blocks are cut (one block is traced), so the arrays stay small enough to hand to the traced binary quickly."""
from __future__ import annotations

import numpy as np
from test_cuda_host import launch_for

from tullax.backends.base import Signature
from tullax.backends.cuda.launch import LaunchPlan, plan_launch
from tullax.backends.host import kernel_steps
from tullax.compiler.tiles import TilePolicy
from tullax.spec.arguments import as_numpy_inputs, result_dtype
from tullax.spec.examples import random_inputs
from tullax.spec.frontend import compile_spec

CASES = (
    ("Dist", "D[i,j] := (W[k,i]-X[k,j])^2", {"W": (784, 1024), "X": (784, 512)}),
    ("Linear", "C[i,j] := W[k,i]*X[k,j]", {"W": (784, 1024), "X": (784, 512)}),
    ("row logsumexp", "(logsumexp) l[i] := x[i,j]", {"x": (64, 4096)}),
    ("row max", "(max) m[i] := x[i,j]", {"x": (64, 4096)}),
    ("row norm", "n[i] := x[i,j]^2 |> sqrt", {"x": (64, 4096)}),
    ("conv2d", "y[n,o,h,w] := x[n,c,h+p,w+q]*k[o,c,p,q]", {"x": (8, 32, 64, 64), "k": (32, 32, 3, 3)}),
    ("embedding", "out[b,d] := W[ix[b],d]", {"W": (5000, 256), "ix": (16384,)}),
)


def step_shapes(step_spec, full: dict) -> dict:
    """Each input of a step's shape: a forward input's, an earlier step's result (the forward result too) or,
    for a cotangent, the shape of what it is the cotangent of."""
    out = {}
    for name in step_spec.input_names:
        base = name[1:] if name.startswith("Δ") and name not in full else name
        out[name] = full[base]
    return out


def launches(name: str, text: str, shapes: dict, dtype=np.float32,
             tiles: TilePolicy = TilePolicy()) -> list[tuple[str, object, object]]:
    """(label, Launch, LaunchPlan) of every kernel of the case: the forward and each gradient step (block-tiled
    as ``tiles`` says)."""
    forward = compile_spec(text)[1]
    found, full = [], dict(shapes)
    for number, step in enumerate(kernel_steps(forward, np.dtype(dtype).name)):
        spec_shapes = step_shapes(step.spec, full)
        full[step.spec.out] = tuple(s.eval(spec_shapes) for s in step.spec.out_shape)
        env = random_inputs(step.spec, spec_shapes, seed=number, dtype=dtype)
        launch = launch_for(step.spec, env, f"k{number}", False, tiles=tiles)
        found.append((f"{name} {step.label}", launch, launch_plan(step.spec, env, launch)))
    return found


def launch_plan(step_spec, env: dict, launch) -> LaunchPlan:
    """The host's launch plan of ``launch`` (its grid and block) for the shapes of ``env``."""
    arrays = as_numpy_inputs(step_spec, [env[n] for n in step_spec.input_names])
    shapes = {n: np.shape(a) for n, a in zip(step_spec.input_names, arrays)}
    shapes[step_spec.out] = tuple(s.eval(shapes) for s in step_spec.out_shape)
    return plan_launch(launch.kernel, step_spec, shapes, Signature.for_dtype(step_spec, "float32").out_dtype
                       if result_dtype(step_spec, arrays) is None else np.dtype(result_dtype(step_spec, arrays)).name)
