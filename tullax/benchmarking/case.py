"""What to benchmark (a spec and the shapes of its inputs) and how to make inputs for it."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from tullax.errors import ShapeError, TullaxError

Shapes = Mapping[str, tuple[int, ...]]

# TTFK children use tiny inputs: the point is compile time, not run time.
TTFK_EXTENT_CAP = 32
_SHAPE_ARG = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(\d+(?:\s*[x×,]\s*\d+)*)?\s*\Z")
_RANGE_ARG = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(-?\d+)(?:\s*:\s*(-?\d+))?\s*\Z")


@dataclass(frozen=True)
class BenchCase:
    """One kernel to time: ``shapes`` for the timings, ``check_shapes`` (default: ``shapes``) for the error
    against float64 XLA, ``ttfk_shapes`` (default: every extent capped at 32) for time to first kernel."""

    name: str
    spec: str
    shapes: Shapes
    check_shapes: Shapes | None = None
    ttfk_shapes: Shapes | None = None
    ranges: Mapping[str, Any] | None = field(default=None)
    # the hand-written formulation of the jnp and torch.compile comparators (a key of
    # tullax.benchmarking.idiomatic.JNP); None: the case has none and those comparators skip it
    idiomatic: str | None = None

    def job_fields(self) -> dict[str, Any]:
        """The JSON-ready description a worker process receives."""
        return {
            "case": self.name,
            "spec": self.spec,
            "ranges": _jsonable_ranges(self.ranges),
            "shapes": _listed(self.shapes),
            "check_shapes": _listed(self.check_shapes or self.shapes),
            "ttfk_shapes": _listed(self.ttfk_shapes or capped_shapes(self.shapes)),
            "idiomatic": self.idiomatic,
        }


def capped_shapes(shapes: Shapes, cap: int = TTFK_EXTENT_CAP) -> dict[str, tuple[int, ...]]:
    return {name: tuple(min(extent, cap) for extent in shape) for name, shape in shapes.items()}


def _listed(shapes: Shapes) -> dict[str, list[int]]:
    return {name: [int(e) for e in shape] for name, shape in shapes.items()}


def _jsonable_ranges(ranges: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if ranges is None:
        return None
    return {name: list(value) if isinstance(value, tuple | list) else value for name, value in ranges.items()}


def parse_shape_arg(text: str) -> tuple[str, tuple[int, ...]]:
    """``"W=784x1024"`` -> ``("W", (784, 1024))``; ``"s="`` is a 0-d array."""
    match = _SHAPE_ARG.match(text)
    if not match:
        raise TullaxError(f"--shape {text!r} is not NAME=AxB (for example W=784x1024, w=31, or s= for a 0-d array)")
    name, dims = match.groups()
    return name, tuple(int(d) for d in re.split(r"\s*[x×,]\s*", dims)) if dims else ()


def parse_range_arg(text: str) -> tuple[str, int | tuple[int, int]]:
    """``"i=10"`` -> ``("i", 10)``; ``"i=2:12"`` -> ``("i", (2, 12))``."""
    match = _RANGE_ARG.match(text)
    if not match:
        raise TullaxError(f"--range {text!r} is not NAME=N or NAME=LO:HI (for example i=10 or i=2:12)")
    name, lo, hi = match.groups()
    return name, int(lo) if hi is None else (int(lo), int(hi))


def check_case_shapes(spec: Any, shapes: Shapes) -> None:
    """Every array input of the analysed ``spec`` has a shape of the right rank, and the shapes fit the spec
    (agreements, ranges). Runs in the parent, without jax, so a mistake fails before any child starts."""
    import numpy as np

    from tullax.spec.arguments import check_call

    needed = [item for item in spec.inputs if item.kind != "scalar"]
    missing = [item for item in needed if item.name not in shapes]
    if missing:
        wanted = ", ".join(f"{item.name} (rank {item.rank})" for item in missing)
        raise ShapeError(f"no shape given for {wanted}: add --shape NAME=AxB for each")
    unknown = sorted(set(shapes) - {item.name for item in needed})
    if unknown:
        raise ShapeError(f"shapes given for {', '.join(unknown)}, which the spec does not take as arrays; its "
                         f"array inputs are {', '.join(item.name for item in needed) or 'none'}")
    dummies = [_dummy(item, shapes.get(item.name, ()), np) for item in spec.inputs]
    check_call(spec, dummies)


def _dummy(item: Any, shape: tuple[int, ...], np: Any) -> Any:
    """A zero-memory stand-in with the right shape and dtype kind (a broadcast scalar)."""
    dtype = np.int64 if item.kind == "index" else np.float32
    return np.broadcast_to(np.zeros((), dtype), tuple(shape))


def differentiable_positions(spec: Any) -> tuple[int, ...]:
    """Inputs that get a gradient: float data and scalar parameters (not index arrays, not shape-only)."""
    return tuple(pos for pos, item in enumerate(spec.inputs) if item.kind in ("array", "scalar"))
