"""What the planner knows of one kernel call, examined once: ``Analysis`` (what a spec is, from its text alone:
the XLA forms that apply, its windows, its factors, the indices a call can be cut along) and ``Call`` (the
frozen call record: spec, shapes, dtypes, loop backend, whether it starts from zeros, and the clock a race
reads). The rules, the race and ``explain`` all read these records; none asks the spec again."""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from tullax.spec.ir import Access, Indirect, Spec, accesses

Shapes = Mapping[str, tuple[int, ...]]


@dataclass(frozen=True)
class Analysis:
    """One spec, examined once: ``forms`` (``xla.recognise.forms``, best first), ``windows`` (the reduced
    indices that shift an access), ``factor_indices`` (the index sets of the factors of its products, when its
    body is a plain sum of products), ``cuttable`` (free index -> the input axes a slice cuts), and whether it
    is a pure gather or reads or scatters through an index array."""

    forms: tuple[str, ...]
    windows: tuple[str, ...]
    factor_indices: tuple[frozenset[str], ...]
    cuttable: Mapping[str, frozenset[tuple[str, int]]]
    pure_gather: bool
    indexed: bool

    @property
    def contraction(self) -> bool:
        """A pure contraction: XLA's einsum, whatever the shapes and loop backend."""
        return "einsum" in self.forms


@functools.lru_cache(maxsize=1024)  # every plan of a kernel reads it: its rule, its race, its explanation
def analyse(spec: Spec) -> Analysis:
    """The one analysis of ``spec`` the planner makes."""
    from tullax.backends.xla import recognise

    terms = recognise.product_terms(spec) or ()
    return Analysis(
        forms=recognise.forms(spec),
        windows=recognise.window_indices(spec),
        factor_indices=tuple(recognise.factor_indices(f) for _, factors in terms for f in factors),
        cuttable=recognise.cuttable(spec),
        pure_gather=is_pure_gather(spec),
        indexed=spec.is_scatter or any(isinstance(i, Indirect) for a in accesses(spec.body) for i in a.idx))


def is_pure_gather(spec: Spec) -> bool:
    """Whether ``spec`` only copies one read through an index array into a new result: ``out[b,d] :=
    W[ix[b],d]`` (no arithmetic, reduction, finaliser, scatter or update of a given array)."""
    body = spec.body
    return (spec.assign == ":=" and not spec.is_scatter and not spec.reduced and spec.finalizer is None
            and isinstance(body, Access) and any(isinstance(i, Indirect) for i in body.idx))


@dataclass(frozen=True)
class Call:
    """One call of one kernel as every stage of the planner takes it. ``shapes`` and ``dtypes`` are by input
    name, normalised (tuples of ints, dtype names); ``loops`` is the loop backend (None: none is usable);
    ``zero_start``: a '+=' gradient step that starts from zeros; ``clock``: seconds, what a race times with."""

    spec: Spec
    shapes: Mapping[str, tuple[int, ...]]
    dtypes: Mapping[str, str]
    loops: str | None
    zero_start: bool = False
    clock: Callable[[], float] = field(default=time.perf_counter, compare=False)
    algebra: str = ""  # "expand": the caller opted in to the expanded form (``einsum_kernel(algebra=...)``)
    # a tiny call where no loop module can be compiled yet (``rules.nothing_compiled``): no loop backend looked up
    cold: bool = field(default=False, compare=False)

    @classmethod
    def of(cls, spec: Spec, shapes: Shapes, dtypes: Mapping[str, str], loops: str | None, zero_start: bool = False,
           clock: Callable[[], float] = time.perf_counter, algebra: str = "") -> "Call":
        return cls(spec, {name: tuple(int(e) for e in shapes[name]) for name in spec.input_names},
                   {name: str(dtypes[name]) for name in spec.input_names}, loops,
                   zero_start and spec.assign == "+=", clock, algebra if expand_applies(spec, algebra) else "")

    @property
    def analysis(self) -> Analysis:
        return analyse(self.spec)

    @property
    def key(self) -> tuple:
        """The key of this process's decision for the call."""
        return (self.spec, tuple(sorted(self.shapes.items())), tuple(sorted(self.dtypes.items())), self.loops,
                self.zero_start, self.algebra)

    @functools.cached_property
    def ranges(self) -> dict[str, tuple[int, int]]:
        from tullax.spec.shapes import eval_shapes

        return eval_shapes(self.spec, self.shapes)

    @functools.cached_property
    def iterations(self) -> int:
        """The points of the index space (``workload.iterations``)."""
        total = 1
        for lo, hi in self.ranges.values():
            total *= max(hi - lo, 0)
        return total

    @functools.cached_property
    def work(self) -> int:
        """Estimated operations (``workload.work``)."""
        from tullax.backends.workload import body_cost

        return max(self.iterations * body_cost(self.spec), 1)

    def on(self, shapes: Shapes) -> "Call":
        """The same call on other input shapes (a slice of it)."""
        return Call.of(self.spec, shapes, self.dtypes, self.loops, self.zero_start, self.clock, self.algebra)


def expand_applies(spec: Spec, algebra: str) -> bool:
    """Whether the opt-in ``algebra`` ("expand") changes anything for ``spec``: elsewhere a call keeps its plain
    key, so a kernel the expansion does not reach shares its decisions with calls that did not opt in."""
    if algebra != "expand":  # asked only with the opt-in: the expansion is not cheap to look for
        return False
    from tullax.backends.xla.expand import applies

    return applies(spec)


def call_shapes_and_dtypes(spec: Spec, values: Iterable[Any]) -> tuple[dict, dict]:
    """The shapes and dtype names of a call's ``values`` (arrays or Python scalars, in ``spec.inputs`` order), by
    input name: what ``plan`` and the gradient module's check read off a call."""
    import numpy as np

    values = list(values)
    shapes = {item.name: tuple(np.shape(v)) for item, v in zip(spec.inputs, values)}
    dtypes = {item.name: np.dtype(v.dtype if hasattr(v, "dtype") else np.result_type(type(v))).name
              for item, v in zip(spec.inputs, values)}
    return shapes, dtypes


def kernel_shapes(spec: Spec, shapes: Shapes) -> list[tuple[str, Spec, dict]]:
    """(label, kernel spec, its input shapes) for the forward kernel and every gradient step, from the
    forward call's input ``shapes``."""
    from tullax.backends.host import kernel_steps
    from tullax.errors import ShapeError, TullaxError
    from tullax.grad import gradients, seed_name
    from tullax.spec.shapes import eval_shapes

    missing = [i.name for i in spec.inputs if i.name not in shapes and i.kind != "scalar"]
    if missing:
        raise ShapeError(f"no shape given for {', '.join(missing)}: give one for every array input")
    shapes = {n: tuple(shapes.get(n, ())) for n in spec.input_names}
    found = [("forward", spec, shapes)]
    out_shape = tuple(int(s.eval(shapes)) for s in spec.out_shape)
    env = dict(shapes)
    env[seed_name(spec)] = out_shape
    if spec.assign == ":=":
        env[spec.out] = out_shape
    try:
        grads = gradients(spec)
    except TullaxError:
        grads = ()
    labels = {s.spec: s.label for s in kernel_steps(spec)[1:]}
    for grad in grads:
        local = dict(env)
        for step in grad.steps:
            if step.out not in local:
                local[step.out] = shapes[grad.wrt]
            step_shapes = {n: local[n] for n in step.input_names}
            found.append((labels.get(step, f"gradient wrt {grad.wrt}"), step, step_shapes))
            ranges = eval_shapes(step, step_shapes)
            local[step.out] = tuple(max(hi - lo, 0) for lo, hi in (ranges[n] for n in step.free)) \
                if step.assign == ":=" else local[step.out]
    return found
