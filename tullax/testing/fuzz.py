"""Deep fuzzing of one backend: random specs (``tullax.testing.specgen``) at random sizes, the forward result
against the naive evaluator (``tullax.testing.oracle``, float64 on the same inputs) and the VJP w.r.t. every float
array input against the ``xla`` backend's (which ``tests/test_grad_oracle.py`` holds to ``jax.grad``).

``make test`` runs a few random specs per backend; this runs hundreds, at sizes from 1 to 70 per axis (tiles,
ragged tiles and blocked float32 sums included), which takes seconds per spec on a compiled backend. Found so
far: float32 products whose running product left float32's range (``tests/test_float32_products.py``), and a
product's gradient whose body was printed 28 times in one statement, which Numba was still compiling after
twenty minutes (seed 4000: ``tests/test_sharing.py``), and a float32 ``*=`` whose product alone left float32's range
before the given value brought it back (seed 11015).

A result is compared within ``TOLERANCE`` of the largest expected magnitude; where a finaliser amplifies the
rounding of the reduction it is given (``|> sin(_)`` of a float32 sum near 7000, ``|> cos`` of a float64 product
of 1e18), what it makes of ``PRE_ERROR`` of that value is allowed on top (``_finaliser_spread``), and an element it
moves by more than ``ILL_CONDITIONED`` of the scale is not compared.

With ``--special FRACTION`` that fraction of the input elements are NaN, +-inf or +-0 (values whose results do not
depend on the order a kernel sums or multiplies in), and the forward result is checked against the oracle with
its NaN and infinities exactly.

Usage: ``python -m tullax.testing.fuzz --backend c --dtype float32 --seeds 0:200 [--no-grad] [--special 0.1]
[--json out.json]``.
Each mismatch is printed with its seed, spec and shapes as it is found; the exit status is 1 when there was one.
Specs that do not compile, find no shapes or run into a ``TullaxError`` are skipped and counted.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

# (low, high) extent of an axis, by seed modulo 4: sizes below a vector, around one, several tiles, many
SIZE_CLASSES = ((1, 3), (2, 9), (5, 40), (30, 70))
# points of the index space: the naive evaluator interprets each in Python (tens of microseconds), so a spec stays
# within seconds; larger ones are skipped
MAX_POINTS = 250_000
# relative to the largest magnitude of the expected result: float64 computes as the oracle, float32 rounds terms
TOLERANCE = {"float64": 1e-7, "float32": 2e-3}
# the relative error of the reduction a finaliser is given (of its largest value): a finaliser that amplifies it
# is allowed what it makes of it (``_finaliser_spread``); float32 blocked sums were within 3e-6 on seed 7043
PRE_ERROR = {"float64": 1e-12, "float32": 1e-4}
ILL_CONDITIONED = 0.1  # of the result's scale: a spread beyond it leaves the element unchecked
GRAD_FACTOR = 10  # gradients run more steps (and more roundings) than the forward kernel
FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class Finding:
    """One mismatch: the seed that reproduces it, the spec, its input shapes, what differed, and by how much."""

    seed: int
    spec: str
    shapes: dict
    what: str
    detail: str


@dataclass(frozen=True)
class Outcome:
    """What one seed gave: ``checked`` (the forward, and the gradients when asked), else why it was skipped;
    ``findings`` when something differed."""

    checked: bool
    skipped: str = ""
    findings: tuple[Finding, ...] = ()


def check_seed(seed: int, backend: str, dtype: str = "float64", grads: bool = True, special: float = 0.0) -> Outcome:
    """Generate the spec of ``seed`` with inputs of its size class and check ``backend`` on it in ``dtype``.
    ``special``: the fraction of input elements that are NaN, +-inf or +-0; then the forward result alone is
    checked (a gradient through them is mostly NaN), its NaN and infinities exactly."""
    import tullax
    from tullax.backends.workload import iterations
    from tullax.errors import TullaxError
    from tullax.spec.examples import random_inputs, shapes_for, special_values
    from tullax.spec.frontend import compile_spec
    from tullax.testing.oracle import naive_eval
    from tullax.testing.specgen import random_spec

    text = random_spec(seed)
    try:
        spec = compile_spec(text)[1]
        low, high = SIZE_CLASSES[seed % len(SIZE_CLASSES)]
        shapes = shapes_for(spec, seed, low, high)
    except TullaxError as err:
        return Outcome(False, f"no spec or shapes: {err}")
    if iterations(spec, shapes) > MAX_POINTS:
        return Outcome(False, "too large for the naive evaluator")
    # NaN, +-inf, +-0 only: what a kernel makes of huge or subnormal values depends on the order it multiplies
    # in (tests/test_special_values.py puts them through every operator alone)
    pool = special_values(dtype, extremes=False)
    env = random_inputs(spec, shapes, seed=seed, special=special, pool=pool)
    try:
        with np.errstate(all="ignore"):
            expected = np.asarray(naive_eval(spec, env), np.float64)
    except TullaxError as err:
        return Outcome(False, f"the naive evaluator refused it: {err}")
    args = [_as(env[name], dtype) for name in spec.input_names]
    shapes = {name: tuple(int(e) for e in s) for name, s in shapes.items()}
    try:
        kernel = tullax.einsum_kernel(text, backend=backend)
        got = np.asarray(kernel(*args), np.float64)
    except TullaxError as err:
        return Outcome(False, f"{backend} refused it: {err}")
    problem = _compare(got, expected, TOLERANCE[dtype], dtype)
    if problem and spec.finalizer is not None:
        with np.errstate(all="ignore"):
            spread = _finaliser_spread(spec, env, expected, PRE_ERROR[dtype])
            problem = _compare(got, expected, TOLERANCE[dtype], dtype, spread)
    if problem:
        return Outcome(True, findings=(Finding(seed, text, shapes, "forward", problem),))
    if not grads or special:
        return Outcome(True)
    wrt = [k for k, (item, a) in enumerate(zip(spec.inputs, args))
           if item.kind == "array" and np.asarray(a).dtype.kind == "f"]
    if not wrt:
        return Outcome(True)
    cotangent = np.random.default_rng(seed + 1).standard_normal(np.shape(got)).astype(dtype)
    try:
        mine = _vjp(kernel, args, wrt, cotangent)
        reference = _vjp(tullax.einsum_kernel(text, backend="xla"), args, wrt, cotangent)
    except TullaxError as err:
        return Outcome(True, f"gradients refused: {err}")
    findings = []
    for k, a, b in zip(wrt, mine, reference):
        problem = _compare(a, b, GRAD_FACTOR * TOLERANCE[dtype], dtype)
        if problem:
            findings.append(Finding(seed, text, shapes, f"gradient w.r.t. {spec.inputs[k].name}", problem))
    return Outcome(True, findings=tuple(findings))


def _finaliser_spread(spec: Any, env: dict, centre: np.ndarray, error: float) -> np.ndarray:
    """How far the finaliser moves each element of ``centre`` (the spec's result on ``env``, float64) when the
    value it is given moves by ``error`` (relative) of the largest such value, either way (the naive evaluator):
    a reduction is only that accurate, and
    ``|> sin(_)`` of a float32 sum near 7000 turns a last-bit difference of the sum into one in the second digit of
    the result (seed 7043 on numba), ``|> cos`` of a float64 product of 1e18 into any value (seed 12121 on xla):
    the problem's own conditioning, not a wrong kernel. Where the finaliser moves an element by more than
    ``ILL_CONDITIONED`` of the result's scale, the element is not compared at all (infinite spread)."""
    from dataclasses import replace

    from tullax.spec.ir import Binary, Hole, Num, map_expr
    from tullax.testing.oracle import naive_eval

    step = error * _largest(np.asarray(naive_eval(replace(spec, finalizer=None), env), np.float64))
    spread = np.zeros(centre.shape)
    for delta in (step, -step):
        moved = map_expr(spec.finalizer, lambda node: Binary("+", node, Num(delta)) if isinstance(node, Hole) else node)
        shifted = np.asarray(naive_eval(replace(spec, finalizer=moved), env), np.float64)
        spread = np.fmax(spread, np.abs(shifted - centre))
    scale = max(1.0, _largest(centre))
    # two samples of an oscillating finaliser bound nothing where they already differ this much (cos of 1e18):
    # such an element is not compared
    return np.where(spread > ILL_CONDITIONED * scale, np.inf, spread).ravel()


def _largest(values: np.ndarray) -> float:
    """The largest finite magnitude in ``values`` (0 when there is none)."""
    finite = np.abs(values[np.isfinite(values)])
    return float(finite.max()) if finite.size else 0.0


def _as(value: Any, dtype: str) -> Any:
    """Float arrays and scalars in ``dtype``; index arrays as they are."""
    array = np.asarray(value)
    if array.dtype.kind != "f":
        return value
    return array.astype(dtype) if array.ndim else np.dtype(dtype).type(value)


def _vjp(kernel: Any, args: list, wrt: Sequence[int], cotangent: np.ndarray) -> list[np.ndarray]:
    import jax

    def partial(*chosen):
        full = list(args)
        for k, value in zip(wrt, chosen):
            full[k] = value
        return kernel(*full)

    out, pullback = jax.vjp(partial, *[args[k] for k in wrt])
    return [np.asarray(g, np.float64) for g in pullback(jax.numpy.asarray(cotangent, out.dtype))]


def _compare(got: np.ndarray, expected: np.ndarray, tolerance: float, dtype: str,
             allowance: np.ndarray | None = None) -> str:
    """Why ``got`` is not ``expected`` within ``tolerance`` of the largest expected magnitude, plus ``allowance``
    per element (flat; ``_finaliser_spread``), ("" when it is); an infinity must be matched exactly. Where the
    expected value is beyond float32's range, a float32 result is not compared."""
    if got.shape != expected.shape:
        return f"shape {got.shape}, expected {expected.shape}"
    got, expected = got.ravel(), expected.ravel()  # a 0-d result too; positions are flat
    compared = np.abs(expected) <= FLOAT32_MAX if dtype == "float32" else np.ones(expected.shape, bool)
    infinite = compared & np.isinf(expected)  # float64: an infinity is matched exactly, sign included
    if np.any(got[infinite] != expected[infinite]):
        worst = int(np.flatnonzero(infinite & (got != expected))[0])
        return f"at flat {worst}: {got[worst]!r}, expected {expected[worst]!r}"
    compared &= ~infinite
    nan_got, nan_expected = np.isnan(got) & compared, np.isnan(expected) & compared
    if not np.array_equal(nan_got, nan_expected):
        return f"NaN at flat {np.flatnonzero(nan_got != nan_expected)[:3].tolist()} (got NaN: {bool(nan_got.any())})"
    compared &= ~nan_expected
    if not compared.any():
        return ""
    scale = max(1.0, float(np.max(np.abs(expected[compared]))))
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf where a value is not compared
        error = np.where(compared, np.abs(got - expected), 0.0)
    if allowance is not None:
        error = np.maximum(error - np.nan_to_num(allowance, nan=np.inf, posinf=np.inf), 0.0)
    worst = int(np.argmax(np.where(np.isnan(error), np.inf, error)))
    if not np.isfinite(error[worst]) or error[worst] > tolerance * scale:
        return f"at flat {worst}: {got[worst]!r}, expected {expected[worst]!r} (scale {scale:.3g})"
    return ""


def _seeds(text: str) -> range:
    """``START:STOP`` or one seed, as argparse's type (a malformed one is a usage error, not a traceback)."""
    start, _, stop = text.partition(":")
    try:
        return range(int(start), int(stop)) if stop else range(int(start), int(start) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds are START:STOP or one seed (integers), not {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tullax.testing.fuzz", description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="c")
    parser.add_argument("--dtype", default="float64", choices=sorted(TOLERANCE))
    parser.add_argument("--seeds", default="0:100", type=_seeds, help="START:STOP (or one seed)")
    parser.add_argument("--no-grad", dest="grads", action="store_false", help="check the forward kernel only")
    parser.add_argument("--special", type=float, default=0.0, metavar="FRACTION",
                        help="this fraction of the inputs are NaN, +-inf or +-0 (forward only)")
    parser.add_argument("--json", help="write the findings and the counts here")
    options = parser.parse_args(argv)
    from tullax import backends
    from tullax.errors import TullaxError

    try:  # an unknown or unusable backend would skip every seed: say so once, with the valid names
        backends.resolve(options.backend)
    except TullaxError as err:
        parser.error(str(err))
    import jax

    jax.config.update("jax_enable_x64", True)  # the float64 runs compute in float64; float32 stays float32
    from rich.progress import Progress

    seeds = options.seeds
    findings: list[Finding] = []
    checked, skipped = 0, 0
    with Progress(transient=True) as progress:
        task = progress.add_task(f"{options.backend} {options.dtype}", total=len(seeds))
        for seed in seeds:
            outcome = check_seed(seed, options.backend, options.dtype, options.grads, options.special)
            checked += outcome.checked
            skipped += not outcome.checked
            for found in outcome.findings:
                findings.append(found)
                progress.console.print(f"MISMATCH seed {found.seed}: {found.spec}  {found.shapes}  "
                                       f"{found.what}: {found.detail}", markup=False)
            progress.advance(task)
    span = f"{seeds.start}:{seeds.stop}"
    print(f"{options.backend} {options.dtype}, seeds {span}: {checked} checked, {skipped} skipped, "
          f"{len(findings)} mismatches")
    if options.json:
        with open(options.json, "w", encoding="utf-8") as out:
            json.dump({"backend": options.backend, "dtype": options.dtype, "seeds": span,
                       "checked": checked, "skipped": skipped, "findings": [asdict(f) for f in findings]},
                      out, indent=1)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
