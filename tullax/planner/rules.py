"""What the rules say before any timing. ``RULES`` is the table ``backend="auto"`` reads, in order: each a named
function of a spec's ``Analysis``, the loop backend and whether jax computes on a GPU, giving a ``Rule`` (a default
and, for a close call, the candidates a race times) or None where it does not apply. ``tiny`` needs the shapes:
``decide`` applies it after ``contraction``.

0. ``contraction``: a product of plain accesses summed is BLAS's job: XLA's einsum, at any size; its plan does not
   look for a loop backend, so its first call neither probes the C compiler nor imports a loop backend.
1. ``tiny``: a call below the serial work threshold (``tullax.backends.workload``) is not timed: the loops where
   their module is compiled once with every gradient step and loaded from the compile cache by later processes
   (``Capabilities.whole_module_cached``) and is compiled already (``loops_ready``), else XLA in its best form,
   traced into the jitted program. On a new compile cache (``nothing_compiled``) no loop backend is looked up.
2. ``no loop backend``: XLA, in its best form.
3. ``gather``: a pure gather (one read through an index array, copied): XLA's gather, untimed; memory-bound on
   any candidate, and XLA fuses the copy into the program around it.
3b. ``rearrangement``: every result element is one input element (a patchify and its gradient): XLA's reshape
   and transpose (``xla.rearrange``), raced against the loops.
4. ``scatter/gather``: an index array read or scattered through: the loops, raced against XLA's gather/scatter.
5. ``convolution``: lax.conv (as it is or padded by one element), shifted slices (one window index only) and the
   loops, raced.
5b. ``strided windows``: a sum over window indices each read through ``pad((m-p)/s)``, windows no longer than
   their stride (a strided pool's input gradient): one term per element, as XLA's reshapes (``xla.strided``),
   raced against the loops, which test every term's divisibility. A convolution races the form too.
6. ``window``: a small reduced index that shifts an access: the shifted slices or the loops, raced.
7. ``linear recurrence``: ``h[t] = a*h[t-1] + b`` lane by lane: the loops (one kernel walking ``t``), raced
   against ``lax.scan`` and ``lax.associative_scan`` (log T parallel rounds; what a GPU's many lanes want).
8. ``loops``: everything else (functions, guards, broadcast reductions): the loops, which fuse the body into one
   pass, raced against XLA's factored form and its broadcast lowering where those can run the shapes.

With the caller's opt-in (``einsum_kernel(algebra="expand")``), a kernel whose polynomial body multiplies out into
contractions (``tullax.backends.xla.expand``) also races ``xla:expanded`` (``decide._close``); never without it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from tullax.backends.gpu_select import on_gpu
from tullax.planner import tuning
from tullax.planner.call import Analysis, Call, analyse
from tullax.spec.ir import Spec

LOOPS = "loops"  # the form of a plan on the loop backend; as a candidate: the loop backend ``auto`` uses
EXPANDED = "xla:expanded"  # the opt-in candidate of ``einsum_kernel(algebra="expand")`` (``xla.expand``)


@dataclass(frozen=True)
class Plan:
    """Where one kernel runs: ``backend`` ("xla" or the loop backend's name) in ``form`` (an XLA form, or
    "loops"), decided by ``rule`` for ``reason``; ``timings_ms`` holds (candidate, best ms) when it was timed;
    ``source`` says whether this process decided it by rule, by timing, or found it in the compile cache.
    ``tullax.planner.explain.describe`` puts it in words."""

    backend: str
    form: str
    rule: str
    reason: str
    timings_ms: tuple[tuple[str, float], ...] = ()
    source: str = "rules"

    @property
    def label(self) -> str:
        return f"{self.backend} ({self.form})" if self.backend == "xla" else self.backend


@dataclass(frozen=True)
class Rule:
    """What the rules say about a spec before any shape is known: a default and, for a close call, the
    candidates to time ("xla:<form>" or "loops")."""

    name: str
    reason: str
    default: str  # a candidate
    close: tuple[str, ...] = field(default=())
    tiny: str | None = None  # what a tiny call runs where the loops' modules are cached whole; None: ``default``

    @property
    def for_tiny(self) -> str:
        return self.default if self.tiny is None else self.tiny


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------
def _contraction(found: Analysis, loops: str | None, gpu: bool) -> Rule | None:
    if not found.contraction:
        return None
    # on the CPU, XLA runs some layouts of a dot on Eigen but the same contraction as a broadcast product on
    # YNNPACK ('product'); a GPU's dot is cuBLAS's
    close = ("xla:einsum", "xla:product") if "product" in found.forms and not gpu else ()
    also = "; on the CPU, or as a broadcast product that XLA may fuse into one YNNPACK kernel" if close else ""
    return Rule("contraction", f"a pure contraction is BLAS's job (jnp.einsum / dot_general{also})",
                "xla:einsum", close)


def _no_loop_backend(found: Analysis, loops: str | None, gpu: bool) -> Rule | None:
    return Rule("no loop backend", "no loop backend is usable here", f"xla:{found.forms[0]}") if loops is None else None


def _gather(found: Analysis, loops: str | None, gpu: bool) -> Rule | None:
    if not found.pure_gather:
        return None
    return Rule("gather", "a pure gather: one read through an index array, copied; memory-bound either way, "
                "and XLA's gather fuses into the program around it", "xla:grid", tiny=LOOPS)


def _rearrangement(found: Analysis, loops: str | None, gpu: bool) -> Rule | None:
    if "rearrange" not in found.forms:
        return None
    # a tiny one too: XLA's transpose fuses into the program around it (a patchify's sin), a loop call cannot
    return Rule("rearrangement", "every result element is one input element: XLA's reshape and transpose (which "
                "fuse into the program around it, as jnp code's do) or the loops, whichever is fastest",
                "xla:rearrange", ("xla:rearrange", LOOPS))


def _strided(found: Analysis, loops: str | None, gpu: bool) -> Rule | None:
    if "strided" not in found.forms:
        return None
    # a tiny one too: the reshapes fuse into the program around it, as jnp's gradient of a pool does
    return Rule("strided windows", "windows no longer than their stride: each element is one term of the sum; "
                "XLA's reshapes (which fuse into the program around them) or the loops (which test every "
                "term's divisibility), whichever is fastest", "xla:strided", ("xla:strided", LOOPS))


def _scatter_gather(found: Analysis, loops: str | None, gpu: bool) -> Rule | None:
    if not found.indexed:
        return None
    return Rule("scatter/gather", "an index array: the loop nest reads or scatters in place, XLA's "
                "gather/scatter is usually slower", LOOPS, (LOOPS, "xla:grid"))


def _convolution(found: Analysis, loops: str | None, gpu: bool) -> Rule | None:
    if "conv" not in found.forms:
        return None
    # shifted slices only for one window index (conv1d): with two the form unrolls one and gathers the other,
    # far slower than lax.conv
    one_window = "slices" in found.forms and len(found.windows) == 1
    # padded: the CPU's convolution without padding takes a slower path at some shapes (benchmarks/conv_padding.py)
    padded = ("xla:conv-padded",) if "conv-padded" in found.forms and not gpu else ()
    strided = ("xla:strided",) if "strided" in found.forms else ()  # a patch convolution's input gradient
    close = ("xla:conv",) + padded + (("xla:slices",) if one_window else ()) + strided + (LOOPS,)
    return Rule("convolution", "convolution-shaped: lax.conv_general_dilated (as it is, or with one "
                "element of padding), shifted slices or loops, whichever is fastest", LOOPS, close)


def _window(found: Analysis, loops: str | None, gpu: bool) -> Rule | None:
    if "slices" not in found.forms:
        return None
    return Rule("window", "a small window: XLA's sum of shifted slices or the loops, whichever is fastest",
                LOOPS, ("xla:slices", LOOPS))


def _linear_recurrence(found: Analysis, loops: str | None, gpu: bool) -> Rule | None:
    if "associative" not in found.forms:
        return None
    return Rule("linear recurrence", "a linear recurrence h = a*h[t-1] + b: the loops walk t in one kernel; "
                "lax.scan steps it; lax.associative_scan combines it in log T parallel rounds", LOOPS,
                (LOOPS, "xla:grid", "xla:associative"))


def _loops(found: Analysis, loops: str | None, gpu: bool) -> Rule:
    factored = ("xla:factored",) if "factored" in found.forms else ()
    return Rule("loops", "functions, guards or a broadcast reduction: the loop nest evaluates the body in one "
                "pass, XLA materialises or re-reads the broadcast", LOOPS, (LOOPS,) + factored + ("xla:grid",))


RuleFunction = Callable[[Analysis, "str | None", bool], "Rule | None"]
RULES: tuple[tuple[str, RuleFunction], ...] = (
    ("contraction", _contraction), ("no loop backend", _no_loop_backend), ("gather", _gather),
    ("rearrangement", _rearrangement), ("scatter/gather", _scatter_gather), ("convolution", _convolution),
    ("strided windows", _strided), ("window", _window), ("linear recurrence", _linear_recurrence), ("loops", _loops))


def rule_for(spec: Spec, loops: str | None = "numba") -> Rule:
    """The first rule of ``RULES`` that applies to ``spec``; ``loops`` is the loop backend (None: none)."""
    found, gpu = analyse(spec), on_gpu()
    for _, rule in RULES:
        chosen = rule(found, loops, gpu)
        if chosen is not None:
            return chosen
    raise AssertionError("the last rule applies to every spec")


TINY_LOOPS = Rule("tiny", "below the serial work threshold, not timed: the loop kernel, its module (with every "
                  "gradient step) compiled already, here or in the compile cache (XLA would compile its form again)",
                  LOOPS)
TINY_XLA = Rule("tiny", "below the serial work threshold: XLA inside the jitted program costs no host callback per "
                "call and compiles no loop kernel", "xla")
# the loops' module is not compiled yet: compiling it (the C compiler's probe, lowering, a compile) would cost the
# first call several times XLA's compile of its form, and a call this small gains nothing on the loops
TINY_COLD = Rule("tiny", "below the serial work threshold, not timed: XLA inside the jitted program; the loops' "
                 "module is not compiled here or in the compile cache, and compiling it would cost this call more "
                 "than XLA compiling its form", "xla")


def usable(call: Call, candidate: str) -> bool:
    """Whether a candidate can run the call's shapes well: the slices form only for a window it can unroll, the
    broadcast lowering only for an index space small enough to materialise."""
    from tullax.backends.xla.recognise import MAX_UNROLL, points

    if candidate == "xla:grid":
        return call.iterations <= tuning.GRID_ITERATIONS
    if candidate == "xla:factored":  # it materialises each factor on its own indices, and their products
        return all(points(call.ranges, names) <= tuning.GRID_ITERATIONS for names in call.analysis.factor_indices)
    if candidate == EXPANDED:  # the same, on the expanded body's factors; only where the caller opted in
        from tullax.backends.xla.expand import expansion
        from tullax.backends.xla.recognise import factor_indices, product_terms

        found = expansion(call.spec) if call.algebra == "expand" else None
        return found is not None and all(points(call.ranges, factor_indices(f)) <= tuning.GRID_ITERATIONS
                                         for _, fs in product_terms(found.body) or () for f in fs)
    if candidate == "xla:rearrange":  # where the extents keep the radix; else it would run the grid
        from tullax.backends.xla.rearrange import layout, rearrangement

        read = rearrangement(call.spec)
        return read is not None and layout(read, call.ranges, call.shapes[read.array]) is not None
    if candidate == "xla:strided":  # ranges from 0, windows no longer than their strides; else it runs the grid
        from tullax.backends.xla.strided import strided

        found = strided(call.spec)
        return found is not None and all(lo == 0 for lo, _ in call.ranges.values()) \
            and all(call.ranges[p][1] <= s for p, (_, s) in found.pairs.items())
    if candidate != "xla:slices":
        return True
    lo, hi = call.ranges[call.analysis.windows[0]]
    return 0 < hi - lo <= MAX_UNROLL


def as_plan(candidate: str, loops: str | None, rule: Rule, **extra: Any) -> Plan:
    """The plan that runs ``candidate`` ("xla:<form>" or the loops) for ``rule``."""
    if candidate.startswith("xla:"):
        return Plan("xla", candidate[4:], rule.name, rule.reason, **extra)
    assert loops is not None
    return Plan(loops, LOOPS, rule.name, rule.reason, **extra)


# ---------------------------------------------------------------------------------------------
# The loop backend
# ---------------------------------------------------------------------------------------------
def loop_backend(dtypes: Iterable[str] = (), wait: bool = True) -> str | None:
    """The loop backend ``auto`` uses here for a call with these ``dtypes`` (the first usable of Julia, host C
    and Numba that takes them, as ``backends.resolve``), or None when none is. Where jax computes on a GPU: the
    GPU's own loop backend (``gpu_select``: julia-cuda or cuda), whose kernels run on XLA's buffers; None
    without one (a host backend would copy every input to the host and back: XLA's forms run instead).
    ``wait=False``: a backend that answers only after a slow check (``availability_now``: the C compiler's probe)
    is named without asking it, nor starting the check: a caller that runs it only where its ``ready`` says so
    (a tiny call) compiles nothing."""
    from tullax import backends
    from tullax.errors import BackendUnavailableError

    if on_gpu():
        from tullax.backends.gpu_select import gpu_choice

        name = gpu_choice()[0]
        try:
            found = backends.get(name)
        except BackendUnavailableError:
            return None
        return name if getattr(found, "platform", None) and backends.takes(found, dtypes) else None
    for name in backends._auto_candidates():
        if name == "xla":
            continue
        try:
            found = backends.get(name)
            if not backends.takes(found, dtypes):
                continue
            if (not wait and backends.capabilities(found).availability_now) or found.availability()[0]:
                return name
        except BackendUnavailableError:
            continue
    return None


def always_einsum(spec: Spec) -> bool:
    """Whether ``spec`` is a pure contraction, which runs XLA's einsum whatever the shapes and loop backend."""
    return analyse(spec).contraction


def loops_for(spec: Spec, dtypes: Iterable[str] = (), wait: bool = True) -> str | None:
    """``loop_backend(dtypes, wait)`` for a kernel whose plan may run on the loops; None for a pure contraction
    (``always_einsum``): its first call then neither probes the C compiler nor imports a loop backend."""
    return None if always_einsum(spec) else loop_backend(dtypes, wait)


def whole_module_cached(loops: str | None) -> bool:
    """Whether the loop backend ``loops`` compiles a spec's forward kernel and every gradient step together,
    which later processes load compiled (``Capabilities.whole_module_cached``)."""
    if loops is None:
        return False
    from tullax import backends
    from tullax.errors import BackendUnavailableError

    try:
        return backends.capabilities(backends.get(loops)).whole_module_cached
    except BackendUnavailableError:
        return False


def loops_ready(loops: str | None, spec: Spec, dtypes: Mapping[str, str], whole: bool = False) -> bool:
    """Whether the loop backend ``loops`` runs ``spec`` on inputs of these ``dtypes`` (by name) without compiling
    anything (``whole``: its gradient steps too): only a backend that builds whole modules and keeps them
    compiled (``whole_module_cached``) says so, where its module is built in this process or held compiled in
    the compile cache (its ``ready``)."""
    if not whole_module_cached(loops):
        return False
    import jax
    import numpy as np

    from tullax import backends
    from tullax.backends.base import Signature
    from tullax.spec.shapes import result_dtype

    def canonical(dtype: Any) -> str:  # as the kernel's jax arrays have it
        return np.dtype(jax.dtypes.canonicalize_dtype(dtype)).name

    in_dtypes = tuple(canonical(dtypes[name]) for name in spec.input_names)
    signature = Signature(in_dtypes, canonical(result_dtype(spec, in_dtypes)))
    return bool(backends.get(loops).ready(spec, signature, whole))


def runs_cold(call: Call) -> bool:
    """Whether rule ``tiny`` runs ``call`` on XLA without looking a loop backend up (``TINY_COLD``): below the
    serial work threshold, not a pure contraction (its own rule's), and no loop module can run without a compile
    (``nothing_compiled``). Nothing here depends on the platform: differentiated, such a call's gradient is JAX's
    autodiff of the same XLA form on every platform (``planner.autodiff.gradient_plan``)."""
    return tiny(call) and not always_einsum(call.spec) and nothing_compiled()


def tiny(call: Call) -> bool:
    """Whether ``call`` is below the serial work threshold (rule ``tiny``: it is never timed)."""
    from tullax.backends.workload import serial_threshold

    return call.work < serial_threshold()


def nothing_compiled() -> bool:
    """Whether no loop module can run without a compile, known without naming a loop backend: this process has
    loaded no backend that builds whole modules, and the compile cache holds no entry (a new cache). A tiny
    call then runs on XLA, and nothing of the loop backends is imported, probed or started for it."""
    from tullax import backends
    from tullax.runtime.cache_root import holds_entries

    return not any(backends.capabilities(b).whole_module_cached for b in backends.loaded()) and not holds_entries()
