"""The CUDA module of a spec as the backend would launch it at given extents: ``generate_source(spec,
backend="cuda", ranges=...)`` with every index's range given prints, for the shapes those ranges imply, the
kernel ``device_lowering`` selects for each step (block-tiled, cooperative, split or one thread per element,
with the index width the host would pick), its launch and a roofline estimate of its device time
(``tullax.backends.cuda.estimate``), so the schedule for those shapes can be read without a GPU."""
from __future__ import annotations

from typing import Mapping

from tullax.backends.base import Signature
from tullax.spec.ir import Affine, Spec, spec_accesses
from tullax.spec.sizes import Sym


def shapes_from_ranges(spec: Spec) -> dict[str, tuple[int, ...]] | None:
    """Each input's shape when every position of every access is an affine form with positive coefficients
    over indices whose ranges are constants from 0: the least extent holding every position; else None."""
    ranges = {}
    for name, extent in spec.ranges:
        if extent.lo != Sym(0) or extent.hi.terms:
            return None
        ranges[name] = extent.hi.const
    kinds = {i.name: i for i in spec.inputs}
    found: dict[str, list[int]] = {}
    for access in spec_accesses(spec):
        if access.array not in kinds:
            continue
        extents = found.setdefault(access.array, [0] * len(access.idx))
        for axis, idx in enumerate(access.idx):
            if not isinstance(idx, Affine) or idx.div != 1 or idx.const.terms or \
                    any(c <= 0 or n not in ranges for n, c in idx.terms):
                return None
            top = idx.const.const + sum(c * (ranges[n] - 1) for n, c in idx.terms)
            extents[axis] = max(extents[axis], top + 1)
    if any(i.kind != "scalar" and i.name not in found for i in spec.inputs):
        return None
    return {name: tuple(extents) for name, extents in found.items()}


def shaped_module_source(spec: Spec, signature: Signature, shapes: Mapping[str, tuple[int, ...]]) -> str:
    """Every kernel of ``spec`` (forward, then each gradient step) as ``device_lowering`` selects it for these
    input ``shapes``, each headed by its launch, in one module."""
    import numpy as np

    from tullax import settings
    from tullax.backends.cuda.driver import ARCH_ENV
    from tullax.backends.cuda.estimate import describe, estimate
    from tullax.backends.cuda.launch import START_GIVEN, device_lowering, size_values
    from tullax.backends.cuda.tile_sizes import tile_policy
    from tullax.backends.host import kernel_steps
    from tullax.compiler.scan_chunks import is_chunked
    from tullax.printers.cuda import print_module

    signature = signature.widened()
    # TULLAX_CUDA_ARCH's block tiles when set; no device is asked (printing works without one)
    arch = settings.value(ARCH_ENV) or None
    tiles = tile_policy(arch)
    known = dict(shapes)
    kernels, launches = [], []
    steps = kernel_steps(spec, signature.out_dtype)
    if np.dtype(signature.out_dtype).kind in "iu":  # integers have no gradient
        steps = steps[:1]
    for number, step in enumerate(steps):
        its = {n: tuple(known[n if n in known else n[1:]]) for n in step.spec.input_names}
        its[step.spec.out] = tuple(s.eval(its) for s in step.spec.out_shape)
        known[step.spec.out] = its[step.spec.out]
        step_signature = signature if number == 0 else Signature.for_dtype(step.spec, signature.out_dtype)
        kernel, plan = device_lowering(step.spec, step_signature, its, step.name, tiles=tiles)
        tile = kernel.tile
        schedule = (f"a block per {tile.rows}x{tile.cols} tile ({tile.thread_rows}x{tile.thread_cols} per thread, "
                    f"shared-memory chunks of {tile.chunk})" if tile is not None else
                    "a warp per output element (cooperative reduction)" if kernel.cooperative and kernel.warp else
                    "a block per lane, the scan in chunks over its threads" if is_chunked(kernel) else
                    "a block per batch row walking the scan, a barrier per step" if kernel.cooperative
                    and step.spec.scan is not None else
                    "a block per output element (cooperative reduction)" if kernel.cooperative else
                    "a split sum (atomic adds)" if kernel.split else
                    "a thread per lane walking the scan" if step.spec.scan is not None else
                    "a thread per output element or tile")
        launches.append(f"// {step.name} ({step.label}): grid {plan.grid} x block {plan.block}, {schedule}, "
                        f"{plan.index_bits}-bit indices")
        found = estimate(kernel, step.spec, its, plan.grid, size_values(kernel, its), plan.start == START_GIVEN)
        launches.append(f"//   {describe(found, signature.out_dtype, arch)}")
        kernels.append((kernel, plan.index_bits))
    first, rest = print_module(kernels).split("\n", 1)  # the generated-by line stays first
    shown = ", ".join(f"{n} {tuple(s)}" for n, s in shapes.items())
    return "\n".join([first, f"// launches at {shown}:", *launches, rest])


__all__ = ["shaped_module_source", "shapes_from_ranges"]
