"""The planner behind ``backend="auto"``: for ONE kernel (the forward spec, or one gradient step) and the shapes and
dtypes of a call, choose the loop backend (host C, Numba, or Julia where it is the loop backend) or one of XLA's
forms (``tullax.backends.xla.forms``). Where jax computes on a GPU, the loop backend is the GPU's (``cuda`` or
``julia-cuda``: kernels on XLA's own device buffers), raced against XLA's forms on the GPU (cuBLAS for a
contraction, cuDNN for a convolution), and decisions are kept per GPU model.

The rules, in order (``rule_for``; ``tiny`` needs the shapes and is applied by ``plan`` after ``contraction``):

0. ``contraction``: a pure contraction (a product of plain accesses summed, no function, guard or offset) is
   BLAS's job: XLA ``einsum`` (``dot_general``), at any size. Its plan does not look for a loop backend
   (``loops_for``), so its first call neither probes the C compiler nor imports a loop backend;
1. ``tiny``: a call whose estimated work is below the serial threshold (``tullax.backends.workload``) is not
   timed (a race this small decides microseconds, its compiles cost a good part of a second). Where the loop
   backend compiles the forward kernel and every gradient step together and later processes load them
   from the compile cache (``Capabilities.whole_module_cached``: host C), the rule's default: the loops (XLA
   compiles its form again in every process, a few hundred milliseconds per kernel and gradient); a pure
   gather too takes the loops here (tiny, XLA's gather cost the embedding's warm TTFK 150 ms of compiling in
   every process). Otherwise XLA in its best form, traced into the jitted program: no host callback per call
   and no loop kernel to compile (Numba's take about a second each);
2. no loop backend is usable here: XLA, in its best form;
3. ``gather``: a pure gather (``out[b,d] := W[ix[b],d]``: one read through an index array, copied, nothing
   computed or reduced): XLA's gather, untimed. The copy is memory-bound on any candidate; the loops never beat
   it by more than one process's noise (the planner's race handed them the embedding forward in a process where
   XLA's output buffer page-faulted, which cost every other process 5-25%; on the H200 XLA's gather won the race),
   and XLA fuses the copy into whatever the program does with it (a tiny call: rule 1);
4. ``scatter/gather``: a spec that scatters (``ΔW[ix[b],d] += ...``) or reads through an index array: loops
   (XLA's scatter and gather are usually slower than the loop nest), timed against XLA when small enough;
5. ``convolution``: a convolution-shaped spec: a close call between ``lax.conv_general_dilated``, the sum of
   shifted slices (a small window along one axis only) and the loops, settled by timing;
6. ``window``: a small reduced index that shifts an access: the sum of shifted slices or the loops, timed;
7. ``loops``: everything else (functions, guards, comparisons, broadcast reductions like Dist): loops, which
   fuse the whole body into one pass where XLA materialises or re-reads the broadcast; timed against XLA's
   factored form (a sum of products, each an einsum of its factors: ``xla_forms``) where it applies and XLA's
   broadcast lowering when its index space has at most ``GRID_ITERATIONS`` points (a larger one could
   need gigabytes for XLA's temporary, and the loops win there). Not always the loops: XLA fuses an
   ``exp(...)`` of the (i,j) pairs times ``b[j,d]`` into a vectorised exp and a matmul (the Gaussian kernel sum,
   6x faster than the loops, whose exp stays scalar: ``y[j,c]`` is read with stride 3, and the 4-wide ``d``
   loop accumulates through memory), so this is timed, large kernels included.

A close call of less estimated work than ``UNTIMED_WORK`` is not timed either: the rule's default runs it. Such
a call takes a fraction of a millisecond on any candidate, while timing compiles every candidate (XLA's forms
again in every process that runs them); the difference it could find is repaid only after thousands of calls.

A close call is timed on its first use (``TULLAX_PLAN_TIMING=0`` turns timing off): each candidate runs on random
inputs of the call's shapes as a planned kernel runs (jitted; a loop kernel through the host callback, whose cost
the bare kernel does not show), best of a few interleaved runs after a warm-up, and the fastest wins (the rule's
default on a tie), but the loops only when they beat the fastest XLA form by ``LOOP_MARGIN``. A call of more
estimated work (``tullax.backends.workload``) than ``SLICE_WORK`` is timed on a slice of it instead, so timing
stays bounded whatever the size: the largest free index that only ever indexes input axes plainly is cut to the
extent that leaves ``SLICE_WORK`` (the loops and XLA scale alike in a free index: each output element is the same
work); a kernel with no such index is not timed. An XLA form that wins on the slice by less than ``CONFIRM_RATIO``
is confirmed on the full call (one run of it and of the rule's default): XLA's temporaries of a slice may fit in
the cache where the full call's do not.
Differentiated, the forward and the gradient steps it is differentiated through run as one XLA program when each
of them runs on XLA or its loops won by less than ``JOINT_MARGIN`` (``joint_plans``, from the JVP rule and the
gradient's transpose): no callback between the forward and the steps, and XLA fuses across them.
Timed decisions are kept in the compile cache (an entry of kind ``plan`` holding ``plan.json``), keyed by the
spec, shapes, dtypes, the loop backend and the machine's core count, so they hold across processes; every
decision is also kept for the life of the process.
"""
from __future__ import annotations

import functools
import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable, Mapping

from tullax.backends.gpu_select import on_gpu
from tullax.spec.ir import Access, Indirect, Spec, accesses

TIMING_ENV = "TULLAX_PLAN_TIMING"
# A close call with more estimated work than this is timed on a slice of this much work: 40-50 ms of loops on
# this 2-core machine (Gaussian kernel sum forward, conv2d), so with TIMING_BUDGET_S a decision costs well
# under a second beside the compiles. Not much smaller: on a thin slice XLA's temporaries fit in the cache
# where at full size they do not, and lax.conv with few output features is not the GEMM it is at full size.
SLICE_WORK = 1 << 30
# ... but a contraction's race (XLA's einsum against its broadcast product) on a slice of this much: BLAS runs
# 2^30 estimated operations in a few ms, and a slice's odd extent changes which kernel wins (Linear's forward:
# einsum 1.71 ms against the product's 2.21 on a 784x892 slice, 2.6 against 2.45 ms at its full 784x1024)
CONTRACTION_SLICE_WORK = 1 << 34
# A close call with less estimated work than this is not timed: about 0.2 ms of loops here (the Gaussian
# kernel sum's gradient at 32 points, 1.2M: 0.06 ms bare, 0.2 ms through the callback, XLA's forms alike),
# while timing it compiled XLA's factored and broadcast forms for 0.7 s (benchmarks/ttfk_breakdown.py).
UNTIMED_WORK = 1 << 22
TIMING_RUNS = 5  # interleaved rounds at most
TIMING_BUDGET_S = 0.3  # ... and no new round after this long (at least 2 rounds)
CONFIRM_RATIO = 4.0  # an XLA form that beat the loops by less than this on a slice is confirmed in full
# A candidate this much slower than the fastest after two rounds is not timed again (if it is under SETTLE_MS,
# only once it was timed after a settling run): two interleaved rounds that agree on a lead this wide are a
# decision (conv2d's forward race at its TTFK inputs, the loops 2x faster,
# spent three more rounds, ~50 ms of its first call, confirming it) ...
DROP_RATIO = 1.5
# ... and after the first round, with one timed run each, only one this much slower: one run can fall in a busy
# spell of the machine (the embedding gradient's loops once read 54 ms against XLA's 14 ms and were dropped,
# where every other process timed them at 4.4-4.9 ms), and the race's decision is kept for every later process
FIRST_DROP_RATIO = 10.0
# A candidate faster than this runs twice per round and only the second run is timed: the first pays for the
# switch from the candidate before it (the C loops' OpenMP threads still spinning, XLA's pool waking), which a
# program calling one kernel again and again does not. Interleaved without it, conv1d's shifted slices timed
# 1.2 ms against 0.6 ms back to back, and the planner kept the loops (0.7 ms) over them.
SETTLE_MS = 5.0
# ... and after its untimed run, is timed on up to SAMPLES runs in a row within SAMPLE_MS, keeping the best: one
# timed run per round let a process in which XLA ran slow for five rounds in a row hand a race to the loops
# (conv1d's shifted slices best 1.13 ms in one process of five, 0.63 ms in the others, where single calls
# ranged 0.59-1.8 ms; the loops 0.70 ms), and the decision is kept for every later process. Not much shorter:
# after a switch, a kernel on two threads can run 2-3x slower for several ms, once for 20 ms (conv1d's slices
# 0.9 against 0.47 ms, its loops 1.6 against 0.53 ms), and a stretch of 3 ms let the transient decide the race:
# conv1d's forward went to the loops in 6 races of 67 with 3 ms stretches, 1 of 55 with 10 ms (4 runs
# of benchmarks/race_stretch.py or its first drafts); the rest is left to CLOSE_RATIO. Only a contender (within
# CLOSE_RATIO of the fastest) gets the long stretch; a candidate further behind gets SCOUT_SAMPLE_MS, so a race
# of a clear call costs no more first-call time than it did (conv2d's at its time-to-first-kernel sizes)
SAMPLES = 64
SAMPLE_MS = 10.0
SCOUT_SAMPLE_MS = 3.0
# An XLA candidate whose compiled program needs more temporary memory than this is not run (nor chosen): the
# 'product' form of a contraction is one fused kernel where XLA's CPU backend fuses it, and a materialised
# product of every index point where it does not
MAX_TEMP_BYTES = 256 << 20
# XLA's broadcast lowering is a candidate only up to this many index-space points: it may materialise them
# (1 GiB of float32 at the limit); Dist at the suite's size (411M points, 1.6 GB) is beyond it
GRID_ITERATIONS = 1 << 28
# A differentiated forward and its gradient steps run as one XLA program when each of them runs on XLA or its
# loops won by less than this (``joint_plans``)
JOINT_MARGIN = 1.15
JOINED = "differentiated with kernels that all run on XLA: joins them"  # in the reason of a plan moved so
# The loops win a race only when faster than the fastest XLA form by this factor. Within it, XLA: it needs no
# host callback around the kernel and fuses with the program around it, and one race cannot tell a few percent
# apart (the row norm forward: the loops 2.59 ms against XLA's 2.65 ms in the race, and 0.93x of XLA's best
# in the benchmark's processes).
LOOP_MARGIN = 1.05
_WITHIN_MARGIN = f" (the loops were faster by less than {round((LOOP_MARGIN - 1) * 100)}%: XLA, with no host callback)"
# A race whose runner-up came within this factor of the winner is a close call: a spell of seconds in which the
# host slows a two-thread kernel 2x (both of conv1d's candidates read 0.85-0.9 ms for five races in a row, then
# 0.45-0.53 again; benchmarks/race_stretch.py) can decide it, so the next processes race it again, each keeping
# the best time per candidate over every race so far, until CONFIRMING_RACES races (in different processes,
# minutes apart in a program run again and again) stand behind it
CLOSE_RATIO = 2.0
CONFIRMING_RACES = 3
FULL = " (full)"  # marks a candidate's timing on the full call, where a slice's race was confirmed
AGAIN = " (again)"  # marks a candidate's timing in the second race that confirms a contraction's non-default win
PLAN_FILE = "plan.json"
LOOPS = "loops"  # the form of a plan on the loop backend; as a candidate: the loop backend ``auto`` uses

Shapes = Mapping[str, tuple[int, ...]]


@dataclass(frozen=True)
class Plan:
    """Where one kernel runs: ``backend`` ("xla" or the loop backend's name) in ``form`` (an XLA form, or
    "loops"), decided by ``rule`` for ``reason``; ``timings_ms`` holds (candidate, best ms) when it was timed;
    ``source`` says whether this process decided it by rule, by timing, or found it in the compile cache."""

    backend: str
    form: str
    rule: str
    reason: str
    timings_ms: tuple[tuple[str, float], ...] = ()
    source: str = "rules"

    @property
    def label(self) -> str:
        return f"{self.backend} ({self.form})" if self.backend == "xla" else self.backend

    def describe(self) -> str:
        timed = ""
        if self.timings_ms:
            timed = "; timed: " + ", ".join(f"{c} {ms:.3g} ms" for c, ms in self.timings_ms)
        where = {"cache": " (decision from the compile cache)", "timed": " (timed on first use)"}.get(self.source, "")
        return f"{self.label}: {self.rule}: {self.reason}{timed}{where}"


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
# The rules
# ---------------------------------------------------------------------------------------------
def loop_backend(dtypes: Iterable[str] = ()) -> str | None:
    """The loop backend ``auto`` uses here for a call with these ``dtypes`` (the first usable of Julia, host C
    and Numba that takes them, as ``backends.resolve``), or None when none is. Where jax computes on a GPU: the
    GPU's own loop backend (``gpu_select``: julia-cuda or cuda), whose kernels run on XLA's buffers; None
    without one (a host backend would copy every input to the host and back: XLA's forms run instead)."""
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
            if backends.takes(found, dtypes) and found.availability()[0]:
                return name
        except BackendUnavailableError:
            continue
    return None


def always_einsum(spec: Spec) -> bool:
    """Whether ``spec`` is a pure contraction, which runs XLA's einsum whatever the shapes and loop backend."""
    from tullax.backends.xla import forms as xla_forms

    return "einsum" in xla_forms.forms(spec)


def loops_for(spec: Spec, dtypes: Iterable[str] = ()) -> str | None:
    """``loop_backend(dtypes)`` for a kernel whose plan may run on the loops; None for a pure contraction
    (``always_einsum``): its first call then neither probes the C compiler (60-190 ms in a new process with an
    empty cache) nor imports a loop backend."""
    return None if always_einsum(spec) else loop_backend(dtypes)


def rule_for(spec: Spec, loops: str | None = "numba") -> Rule:
    """The rule that applies to ``spec`` (see the module docstring); ``loops`` is the loop backend (None: none)."""
    from tullax.backends.xla import forms as xla_forms

    forms = xla_forms.forms(spec)
    if "einsum" in forms:  # first: whether loops are usable does not matter (``always_einsum``, ``loops_for``)
        # on the CPU, XLA runs some layouts of a dot on Eigen but the same contraction written as a broadcast
        # product on YNNPACK (``xla_forms``: 'product'); a GPU's dot is cuBLAS's
        close = ("xla:einsum", "xla:product") if "product" in forms and not on_gpu() else ()
        also = "; on the CPU, or as a broadcast product that XLA may fuse into one YNNPACK kernel" if close else ""
        return Rule("contraction", f"a pure contraction is BLAS's job (jnp.einsum / dot_general{also})",
                    "xla:einsum", close)
    if loops is None:
        return Rule("no loop backend", "no loop backend is usable here", f"xla:{forms[0]}")
    if is_pure_gather(spec):
        return Rule("gather", "a pure gather: one read through an index array, copied; memory-bound either way, "
                    "and XLA's gather fuses into the program around it", "xla:grid", tiny=LOOPS)
    if spec.is_scatter or any(isinstance(i, Indirect) for a in accesses(spec.body) for i in a.idx):
        return Rule("scatter/gather", "an index array: the loop nest reads or scatters in place, XLA's "
                    "gather/scatter is usually slower", LOOPS, (LOOPS, "xla:grid"))
    if "conv" in forms:
        # shifted slices only for one window index (conv1d): with two (conv2d) the form unrolls one and
        # gathers the other, 10-20x slower than lax.conv, and its compile took seconds of the first call
        one_window = "slices" in forms and len(xla_forms.window_indices(spec)) == 1
        # padded: the CPU's convolution without padding is several times slower at some shapes, faster at
        # others (``benchmarks/conv_padding.py``); not on a GPU, which has no such path
        padded = ("xla:conv-padded",) if "conv-padded" in forms and not on_gpu() else ()
        close = ("xla:conv",) + padded + (("xla:slices",) if one_window else ()) + (LOOPS,)
        return Rule("convolution", "convolution-shaped: lax.conv_general_dilated (as it is, or with one "
                    "element of padding), shifted slices or loops, whichever is fastest", LOOPS, close)
    if "slices" in forms:
        return Rule("window", "a small window: XLA's sum of shifted slices or the loops, whichever is fastest",
                    LOOPS, ("xla:slices", LOOPS))
    factored = ("xla:factored",) if "factored" in forms else ()
    return Rule("loops", "functions, guards or a broadcast reduction: the loop nest evaluates the body in one "
                "pass, XLA materialises or re-reads the broadcast", LOOPS, (LOOPS,) + factored + ("xla:grid",))


def is_pure_gather(spec: Spec) -> bool:
    """Whether ``spec`` only copies one read through an index array into a new result: ``out[b,d] :=
    W[ix[b],d]`` (no arithmetic, reduction, finaliser, scatter or update of a given array)."""
    body = spec.body
    return (spec.assign == ":=" and not spec.is_scatter and not spec.reduced and spec.finalizer is None
            and isinstance(body, Access) and any(isinstance(i, Indirect) for i in body.idx))


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


def build_gradient_module(spec: Spec, args: Iterable[Any], out_dtype: str) -> None:
    """Before ``auto`` runs the gradient steps of ``spec`` on ``args`` (its forward inputs): where the loop backend
    compiles the forward kernel and every gradient step together (``whole_module_cached``) and some step may run
    on the loops (its rule's default or a timed candidate), build them now. Each step (and its timing) then finds
    its kernel there, instead of compiling a module of its own that would also hold
    the step's own (second-order) gradients: one compiler run instead of one per step. A module that fails
    to build is left to the steps, which build their own kernels and report their own errors."""
    from tullax import backends
    from tullax.backends.base import Signature
    from tullax.backends.host import kernel_steps
    from tullax.errors import TullaxError

    args = list(args)
    try:
        if all(always_einsum(step.spec) for step in kernel_steps(spec, out_dtype)[1:]):
            return  # pure contractions never run on the loops
    except TullaxError:
        pass  # the steps report it
    loops = loop_backend(str(getattr(a, "dtype", "")) for a in args if hasattr(a, "dtype"))
    if not whole_module_cached(loops) or not _steps_may_run_on(loops, spec, args, out_dtype):
        return
    try:
        backends.resolve(loops).build(spec, Signature.of_values(args, out_dtype))
    except TullaxError:
        return


def call_shapes_and_dtypes(spec: Spec, values: Iterable[Any]) -> tuple[dict, dict]:
    """The shapes and dtype names of a call's ``values`` (arrays or Python scalars, in ``spec.inputs`` order), by
    input name: what ``plan`` and the gradient module's check read off a call."""
    import numpy as np

    values = list(values)
    shapes = {item.name: tuple(np.shape(v)) for item, v in zip(spec.inputs, values)}
    dtypes = {item.name: np.dtype(v.dtype if hasattr(v, "dtype") else np.result_type(type(v))).name
              for item, v in zip(spec.inputs, values)}
    return shapes, dtypes


def _steps_may_run_on(loops: str, spec: Spec, args: list, out_dtype: str) -> bool:
    """Whether some gradient step of ``spec`` called on ``args`` may run on the loop backend ``loops``: its plan
    without timing (a decision kept in the compile cache, or a rule that times nothing) is the loops, or a race
    that includes them is still to be timed. A warm process whose kept decisions are all XLA's thus loads no
    loop module (conv2d's: unpickling its kernels imported the lowering's modules, 0.1 s of the first call)."""
    import numpy as np

    from tullax.backends.host import kernel_steps
    from tullax.errors import TullaxError

    shapes, dtypes = call_shapes_and_dtypes(spec, args)
    if any(np.dtype(d).kind == "c" for d in dtypes.values()):  # complex inputs derive steps of their own
        return any(rule.default == LOOPS or LOOPS in rule.close
                   for rule in (rule_for(step.spec, loops) for step in kernel_steps(spec, out_dtype)[1:]))
    from tullax.grad.run import zero_start_steps

    try:
        steps = kernel_shapes(spec, shapes)[1:]
    except TullaxError:
        return True  # the steps will report it; building the module costs only time
    from_zeros = zero_start_steps(spec)
    for _, step, shapes in steps:
        step_dtypes = {name: dtypes.get(name, out_dtype) for name in step.input_names}
        if _peek(step, shapes, step_dtypes, loops, step in from_zeros).backend != "xla":
            return True
    return False


def joint_plans(spec: Spec, shapes: Shapes, dtypes: Mapping[str, str], out_dtype: str, wrt: Iterable[str], *,
                timing: bool | None = None) -> dict[Spec, Plan]:
    """In a call differentiated w.r.t. the inputs ``wrt``: XLA plans for the forward kernel and every gradient
    step of those inputs, when they should run as one XLA program: each of them runs on XLA already, or the
    loops won its timed race by less than ``JOINT_MARGIN`` (it then runs in its fastest timed XLA form), and
    at least one moves. Else empty: each kernel keeps its own plan. One program has no host callback between
    the forward and the steps, and XLA fuses across them: the row norm's VJP ran 10-25% faster that way than as
    a C forward and a C (or XLA) gradient step, each of which had won its own race by 5-12%. A race confirmed on
    the full call (timed on a slice first) is read from the full call's timings: the Gaussian kernel sum's
    gradients at 20000 points are 4x faster on XLA on a slice and slower in full."""
    if any("complex" in str(d) for d in dtypes.values()):
        return {}  # complex inputs have gradient specs of their own: not the ones planned here
    from tullax.grad import gradients
    from tullax.grad.run import zero_start_steps

    wanted = set(wrt)
    forward_dtypes = {name: str(dtypes[name]) for name in spec.input_names}
    steps = {step for grad in gradients(spec) if grad.wrt in wanted for step in grad.steps}
    kernels = [(kernel, its_shapes, {name: forward_dtypes.get(name, out_dtype) for name in kernel.input_names})
               for _, kernel, its_shapes in kernel_shapes(spec, shapes) if kernel is spec or kernel in steps]
    from_zeros = zero_start_steps(spec)
    compile_ahead(kernels, timing=timing, from_zeros=from_zeros)
    found: dict[Spec, Plan] = {}
    moved = False
    for kernel, its_shapes, kernel_dtypes in kernels:
        own = plan(kernel, its_shapes, kernel_dtypes, timing=timing, zero_start=kernel in from_zeros)
        if own.backend != "xla":
            timed = dict(own.timings_ms)
            full = {c.removesuffix(FULL): ms for c, ms in timed.items() if c.endswith(FULL)}
            race = full or {c: ms for c, ms in timed.items() if " " not in c}
            xla = [(ms, c) for c, ms in race.items() if c.startswith("xla:")]
            if LOOPS not in race or not xla or min(xla)[0] > JOINT_MARGIN * race[LOOPS]:
                return {}
            ms, best = min(xla)
            own = replace(own, backend="xla", form=best[4:], reason=own.reason + (
                f"; {JOINED} on {best} ({ms:.3g} ms, within {JOINT_MARGIN}x of the loops)"))
            moved = True
        found[kernel] = own
    return found if moved else {}


def _as_plan(candidate: str, loops: str | None, rule: Rule, **extra: Any) -> Plan:
    if candidate.startswith("xla:"):
        return Plan("xla", candidate[4:], rule.name, rule.reason, **extra)
    assert loops is not None
    return Plan(loops, LOOPS, rule.name, rule.reason, **extra)


def _usable(spec: Spec, candidate: str, shapes: Shapes) -> bool:
    """Whether a candidate can run these shapes well: the slices form only for a window it can unroll, the
    broadcast lowering only for an index space small enough to materialise."""
    from tullax.backends import workload
    from tullax.backends.xla import forms as xla_forms
    from tullax.spec.shapes import eval_shapes

    if candidate == "xla:grid":
        return workload.iterations(spec, shapes) <= GRID_ITERATIONS
    if candidate == "xla:factored":  # it materialises each factor on its own indices, and their products
        ranges = eval_shapes(spec, shapes)
        return all(xla_forms.points(ranges, xla_forms.factor_indices(f)) <= GRID_ITERATIONS
                   for _, factors in xla_forms.product_terms(spec) or () for f in factors)
    if candidate != "xla:slices":
        return True

    lo, hi = eval_shapes(spec, shapes)[xla_forms.window_index(spec)]
    return 0 < hi - lo <= xla_forms.MAX_UNROLL


# ---------------------------------------------------------------------------------------------
# Planning one call
# ---------------------------------------------------------------------------------------------
_MEMO: dict[tuple, Plan] = {}
_LOCK = threading.Lock()
STATS = {"timed": 0, "from_cache": 0}  # what this process did, for tests and `tullax explain`


def timing_enabled() -> bool:
    return os.environ.get(TIMING_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def plan(spec: Spec, shapes: Shapes, dtypes: Mapping[str, str], *, timing: bool | None = None,
         zero_start: bool = False) -> Plan:
    """The plan for one call of ``spec`` with inputs of these ``shapes`` and ``dtypes`` (by input name).
    ``timing=False``: never time a close call (the rule's default, unless the compile cache holds a decision);
    such a plan is not remembered, so a later call may still time it. ``zero_start``: ``spec`` is a '+=' gradient
    step that starts from zeros (``tullax.grad.run.zero_start_steps``); its race runs both candidates so (XLA
    fuses the zeros into its scatter, the loops clear their own output), and its decision is kept apart."""
    shapes, dtypes = _normalised(spec, shapes, dtypes)
    loops = loops_for(spec, dtypes.values())
    zero_start = zero_start and spec.assign == "+="
    if timing is False:
        return _decide(spec, shapes, dtypes, loops, False,
                       "the first call times " + ", ".join(rule_for(spec, loops).close), zero_start=zero_start)
    memo_key = _memo_key(spec, shapes, dtypes, loops, zero_start)
    found = _MEMO.get(memo_key)
    if found is not None:
        return found
    with _LOCK:
        found = _MEMO.get(memo_key)
        if found is None:
            found = _MEMO[memo_key] = _decide(spec, shapes, dtypes, loops, timing_enabled() if timing is None
                                              else timing, zero_start=zero_start)
    return found


def _normalised(spec: Spec, shapes: Shapes, dtypes: Mapping[str, str]) -> tuple[dict, dict]:
    """The shapes (tuples of ints) and dtypes (names) of ``spec``'s inputs, as every decision is keyed."""
    return ({name: tuple(int(e) for e in shapes[name]) for name in spec.input_names},
            {name: str(dtypes[name]) for name in spec.input_names})


def _memo_key(spec: Spec, shapes: dict, dtypes: dict, loops: str | None, zero_start: bool = False) -> tuple:
    """The key of this process's decision for a call (``_normalised`` shapes and dtypes)."""
    return spec, tuple(sorted(shapes.items())), tuple(sorted(dtypes.items())), loops, zero_start


def _peek(spec: Spec, shapes: Shapes, dtypes: Mapping[str, str], loops: str | None, zero_start: bool = False) -> Plan:
    """The plan of a call as far as it is known without timing, and without counting in ``STATS``: this
    process's decision, else the compile cache's, else the rule's default (a close call not yet timed).
    ``zero_start`` as ``plan`` takes it, for a step of ``zero_start_steps`` (always a '+=' step)."""
    shapes, dtypes = _normalised(spec, shapes, dtypes)
    found = _MEMO.get(_memo_key(spec, shapes, dtypes, loops, zero_start))
    return found if found is not None else _decide(spec, shapes, dtypes, loops, False, counted=False,
                                                   zero_start=zero_start)


@dataclass(frozen=True)
class _Race:
    """A close call that timing will settle: its rule, the candidates, the shapes to time them on and the key of
    the decision in the compile cache."""

    rule: Rule
    close: tuple[str, ...]
    timed_shapes: dict
    key: str
    prior: tuple[tuple[str, float], ...] = ()  # best ms per candidate in the earlier races of a close call
    races: int = 0  # how many earlier processes raced it


def _settle(spec: Spec, shapes: dict, dtypes: dict, loops: str | None, timing: bool,
            untimed: str = "timing is off", *, counted: bool = True, zero_start: bool = False) -> "Plan | _Race":
    """The plan of a call decided without timing (by rule, or kept in the compile cache), else the race that
    decides it."""
    from tullax.backends import workload

    rule = rule_for(spec, loops)
    if loops is not None and workload.runs_serially(spec, shapes):
        from tullax.backends.xla.forms import forms

        if rule.for_tiny == LOOPS and whole_module_cached(loops):
            return _as_plan(LOOPS, loops, Rule(
                "tiny", "below the serial work threshold, not timed: the loop kernel, compiled once with every "
                "gradient step and loaded from the compile cache by later processes (XLA would compile its form "
                "again in each)", LOOPS))
        return _as_plan(f"xla:{forms(spec)[0]}", loops, Rule(
            "tiny", "below the serial work threshold: XLA inside the jitted program costs no host callback per "
            "call and compiles no loop kernel", "xla"))
    close = tuple(c for c in rule.close if _usable(spec, c, shapes))
    if len(close) < 2:
        return _as_plan(rule.default, loops, rule)
    key = _cache_key(spec, shapes, dtypes, loops, zero_start)
    stored = _load(key)
    if stored is not None and stored.get("candidate") not in close:
        stored = None  # a decision for a candidate that cannot run on these shapes here
    again = _to_confirm(stored) if timing and stored is not None else None
    if stored is not None and again is None:
        STATS["from_cache"] += counted
        timings = tuple((c, float(ms)) for c, ms in stored.get("timings_ms", []))
        why = Rule(rule.name, str(stored.get("reason", rule.reason)), rule.default)
        return _as_plan(stored["candidate"], loops, why, timings_ms=timings, source="cache")
    work = workload.work(spec, shapes)
    most = CONTRACTION_SLICE_WORK if rule.name == "contraction" else SLICE_WORK
    timed_shapes = shapes if work <= most else slice_shapes(spec, shapes, most)
    if timing and work < UNTIMED_WORK:
        timing, untimed = False, (f"below {UNTIMED_WORK} estimated operations every candidate runs in a fraction "
                                  "of a millisecond: timing would cost more compiles than it can win back")
    if not timing or timed_shapes is None:
        return _as_plan(rule.default, loops, Rule(rule.name, rule.reason + " (not timed: " + (
            untimed if not timing else "too much work to time, and no free index to time a slice of") + ")",
            rule.default))
    return _Race(rule, close, timed_shapes, key, *(again or ((), 0)))


def _to_confirm(stored: dict) -> tuple[tuple[tuple[str, float], ...], int] | None:
    """For a stored decision of a close call not yet confirmed by CONFIRMING_RACES races: the best ms per
    candidate over its races and how many there were; None for a settled decision (a clear race, enough races,
    or one stored before decisions counted their races)."""
    races = stored.get("races")
    if stored.get("settled", True) or not isinstance(races, int) or races >= CONFIRMING_RACES:
        return None
    try:
        return tuple((str(c), float(ms)) for c, ms in stored.get("bests", [])), races
    except (TypeError, ValueError):
        return None


def _decide(spec: Spec, shapes: dict, dtypes: dict, loops: str | None, timing: bool,
            untimed: str = "timing is off", *, counted: bool = True, zero_start: bool = False) -> Plan:
    race = _settle(spec, shapes, dtypes, loops, timing, untimed, counted=counted, zero_start=zero_start)
    if isinstance(race, Plan):
        return race
    rule, close, timed_shapes, key = race.rule, race.close, race.timed_shapes, race.key
    timings = _time_candidates(spec, timed_shapes, dtypes, close, loops, zero_start=zero_start)
    STATS["timed"] += 1
    valid = {c: ms for c, ms in timings if ms is not None}
    if not valid:
        return _as_plan(rule.default, loops, rule)
    for candidate, ms in race.prior:  # a close call raced again: the best of every race so far
        if candidate in valid:
            valid[candidate] = min(valid[candidate], ms)
    races = race.races + 1
    best, by_margin = _fastest(valid, rule.default)
    listed = tuple((c, ms) for c, ms in valid.items())
    bests = [[c, ms] for c, ms in listed]
    runner_up = min((ms for c, ms in valid.items() if c != best), default=float("inf"))
    settled = runner_up >= CLOSE_RATIO * valid[best] or races >= CONFIRMING_RACES
    reason = rule.reason + (_WITHIN_MARGIN if by_margin else "")
    if races > 1:
        reason += f" (the best times of {races} races, each in its own process)"
    if not settled:
        reason += f" (a close call: raced again by the next process, up to {CONFIRMING_RACES} races)"
    if timed_shapes != shapes:
        cut = [f"{n} {'x'.join(map(str, shapes[n]))} -> {'x'.join(map(str, s))}"
               for n, s in timed_shapes.items() if s != shapes[n]]
        reason += " (timed on a slice: " + ", ".join(cut) + ")"
        if best != rule.default and rule.default in valid and valid[rule.default] < CONFIRM_RATIO * valid[best]:
            # XLA's temporaries of a slice may fit in the cache where the full call's do not (the Gaussian
            # gradients: 4x faster than the loops on a slice, no faster in full): a close win of an XLA form
            # on a slice is confirmed against the default on the full call, one run each after a warm-up
            best, more, said = _rerace(spec, shapes, dtypes, loops, best, rule.default, FULL, (
                "; confirmed on the full call", "; slower on the full call"), rounds=1, zero_start=zero_start)
            listed, reason = listed + more, reason + said
    elif best != rule.default and rule.name == "contraction" and rule.default in valid:
        # two XLA programs a few percent apart: a busy spell during one's turns decides the race (attention's
        # einsum read 0.84 ms against the product's 0.74 in one bench process, 0.63-0.66 against 0.69-0.75 in
        # every other, and the product ran 0.91x of it): the win is confirmed by a second race of the two
        best, more, said = _rerace(spec, shapes, dtypes, loops, best, rule.default, AGAIN, (
            "; confirmed by a second race", "; slower in a second race"), rounds=TIMING_RUNS, zero_start=zero_start)
        listed, reason = listed + more, reason + said
    _store(key, spec, {"candidate": best, "timings_ms": [list(t) for t in listed], "reason": reason,
                       "bests": bests, "races": races, "settled": settled})
    return _as_plan(best, loops, Rule(rule.name, reason, rule.default), timings_ms=listed, source="timed")


def _rerace(spec: Spec, shapes: dict, dtypes: dict, loops: str | None, best: str, default: str, mark: str,
            verdicts: tuple[str, str], *, rounds: int, zero_start: bool) -> tuple[str, tuple, str]:
    """A second race of a race's winner ``best`` against the rule's ``default`` on ``shapes``: the candidate it
    keeps (``_fastest``), the timings it took (each marked ``mark``) and what the reason says of it (``verdicts``:
    kept, lost); ``best`` with nothing added where either could not run."""
    again = dict(_time_candidates(spec, shapes, dtypes, (default, best), loops, rounds=rounds, zero_start=zero_start))
    if again.get(best) is None or again.get(default) is None:
        return best, (), ""
    won = _fastest({best: again[best], default: again[default]}, default)[0] == best
    return (best if won else default), tuple((f"{c}{mark}", ms) for c, ms in again.items()), verdicts[not won]


def _fastest(times: Mapping[str, float], default: str) -> tuple[str, bool]:
    """The winner of a race with these best ``times`` (ms by candidate): the fastest, the rule's ``default`` on
    an exact tie; but the loops only when they beat the fastest XLA form by ``LOOP_MARGIN``. With it, whether
    that margin moved the win from the loops to XLA."""
    best = min(times, key=lambda c: (times[c], c != default))
    rivals = [c for c in times if c.startswith("xla:")]
    if best == LOOPS and rivals:
        rival = min(rivals, key=lambda c: times[c])
        if times[LOOPS] * LOOP_MARGIN > times[rival]:
            return rival, True
    return best, False


def slice_shapes(spec: Spec, shapes: dict, target: int) -> dict | None:
    """Input shapes for a slice of about ``target`` estimated work of a call with these ``shapes``: the free
    index of largest extent that ``xla_forms.cuttable`` allows, cut on every axis it indexes. None when no
    index can be cut (a scatter, an accumulating ``+=``, every free index inside index arithmetic or an index
    array)."""
    from tullax.backends import workload
    from tullax.backends.xla import forms as xla_forms
    from tullax.spec.shapes import eval_shapes

    axes = xla_forms.cuttable(spec)
    ranges = eval_shapes(spec, shapes)
    total = workload.work(spec, shapes)
    for name in sorted(axes, key=lambda n: -(ranges[n][1] - ranges[n][0])):
        extent = max(1, -(-ranges[name][1] * target // total))
        sliced = xla_forms.cut_shapes(spec, shapes, name, extent) if extent < ranges[name][1] else None
        if sliced is not None:
            return sliced
    return None


# ---------------------------------------------------------------------------------------------
# Timing the candidates
# ---------------------------------------------------------------------------------------------
def _time_candidates(spec: Spec, shapes: dict, dtypes: dict, candidates: tuple[str, ...],
                     loops: str | None, rounds: int = TIMING_RUNS,
                     zero_start: bool = False) -> list[tuple[str, float | None]]:
    """Best time per candidate over TIMING_RUNS rounds, the candidates interleaved within each round, so a
    burst of load from other processes slows every candidate alike instead of deciding the race. A candidate
    FIRST_DROP_RATIO slower than the fastest is not timed again, and from the third round one DROP_RATIO slower
    that was timed after a settling run or takes SETTLE_MS or more (a fast one timed only on its first runs after
    a switch may just have paid for the switch); the race ends early once every candidate but one was dropped.
    A candidate under SETTLE_MS is timed on a few runs in a row per round (SAMPLES, SAMPLE_MS; SCOUT_SAMPLE_MS
    when it is more than CLOSE_RATIO behind), after one untimed run. ``zero_start``: each candidate starts from
    zeros of its own (``plan``)."""
    import numpy as np

    from tullax.benchmarking.case import make_inputs
    from tullax.spec.shapes import result_dtype

    data = np.dtype(result_dtype(spec, {n: np.dtype(d) for n, d in dtypes.items()})).name
    values = make_inputs(spec, shapes, data, seed=0)
    values = [v.astype(dtypes[item.name]) if hasattr(v, "astype") else v for item, v in zip(spec.inputs, values)]
    # the loop module compiles (a C compiler in subprocesses) while XLA compiles its forms in this thread
    building = _start_module_build(spec, values, data, loops) if LOOPS in candidates else None
    prepared = {c: _prepared_call(spec, c, values, loops, zero_start) for c in candidates if c != LOOPS}
    if building is not None:
        building.join()
    calls = {c: prepared[c] if c != LOOPS else _prepared_call(spec, c, values, loops, zero_start)
             for c in candidates}
    best: dict[str, float | None] = {c: (None if call is None else float("inf")) for c, call in calls.items()}
    settled: set[str] = set()  # the fast candidates timed after a run that took the switch (not judged before)
    began = time.perf_counter()
    for round_ in range(rounds):
        if round_ >= 2 and time.perf_counter() - began > TIMING_BUDGET_S:
            break
        fastest = min((ms for ms in best.values() if ms is not None), default=float("inf"))
        running = [c for c, call in calls.items() if call is not None and best[c] <= fastest * (
            DROP_RATIO if round_ >= 2 and (c in settled or best[c] >= SETTLE_MS) else FIRST_DROP_RATIO)]
        if round_ > 0 and len(running) < 2:
            break  # every other candidate is a clear loser: nothing is left to decide
        for candidate in running:
            call = calls[candidate]
            fast = best[candidate] < SETTLE_MS
            if fast:
                call()  # not timed: it takes the switch from the previous candidate (see SETTLE_MS)
                settled.add(candidate)
            stretch = SAMPLE_MS if best[candidate] <= CLOSE_RATIO * fastest else SCOUT_SAMPLE_MS
            sampling = time.perf_counter()
            for _ in range(SAMPLES if fast else 1):
                start = time.perf_counter()
                call()
                end = time.perf_counter()
                best[candidate] = min(best[candidate], (end - start) * 1e3)
                if (end - sampling) * 1e3 >= stretch:
                    break
    return list(best.items())


_AHEAD: dict[tuple, Any] = {}  # (spec, form, shapes, dtypes) -> a Future of the compiled XLA candidate
_AHEAD_LOCK = threading.Lock()


def _ahead_key(spec: Spec, form: str, shapes: Shapes, dtypes: Mapping[str, str], zero_start: bool) -> tuple:
    return (spec, form, tuple(sorted((n, tuple(s)) for n, s in shapes.items())), tuple(sorted(dtypes.items())),
            zero_start)


def compile_ahead(kernels: Iterable[tuple[Spec, Shapes, Mapping[str, str]]], *, timing: bool | None = None,
                  from_zeros: frozenset[Spec] = frozenset()) -> None:
    """Before several kernels are planned one after the other (the gradient steps of a differentiated call):
    every XLA candidate of the races still to run is lowered now and compiled in threads, all at once, and the
    race of each kernel finds its candidates compiled. XLA compiles without the GIL: conv2d's two gradient
    races compiled lax.conv for 74 and 102 ms one after the other. Nothing is timed here: timing stays one
    candidate at a time. The kernels in ``from_zeros`` (``zero_start_steps``: '+=' steps) are planned with
    ``zero_start``."""
    import jax

    timing = timing_enabled() if timing is None else timing
    if not timing:
        return
    for spec, shapes, dtypes in kernels:
        shapes, dtypes = _normalised(spec, shapes, dtypes)
        loops = loops_for(spec, dtypes.values())
        zero_start = spec in from_zeros
        if _memo_key(spec, shapes, dtypes, loops, zero_start) in _MEMO:
            continue
        race = _settle(spec, shapes, dtypes, loops, timing, counted=False, zero_start=zero_start)
        if isinstance(race, Plan):
            continue
        env = {name: jax.ShapeDtypeStruct(race.timed_shapes[name], jax.dtypes.canonicalize_dtype(dtypes[name]))
               for name in spec.input_names}
        for candidate in race.close:
            key = _ahead_key(spec, candidate, race.timed_shapes, dtypes, zero_start)
            if not candidate.startswith("xla:") or key in _AHEAD:
                continue
            try:
                lowered = jax.jit(_xla_function(spec, candidate, zero_start)).lower(env)
            except Exception:  # noqa: BLE001 - the race prepares it again, and reports nothing either
                continue
            with _AHEAD_LOCK:
                _AHEAD[key] = _compile_pool().submit(lowered.compile)


@functools.cache
def _compile_pool():
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2), thread_name_prefix="tullax-compile")


def _compiled_ahead(spec: Spec, form: str, shapes: Shapes, dtypes: Mapping[str, str], zero_start: bool) -> Any:
    """The compiled executable ``compile_ahead`` made for this candidate, or None (none was made, or it failed:
    the race then compiles the candidate itself)."""
    with _AHEAD_LOCK:
        future = _AHEAD.pop(_ahead_key(spec, form, shapes, dtypes, zero_start), None)
    if future is None:
        return None
    try:
        return future.result()
    except Exception:  # noqa: BLE001
        return None


def _start_module_build(spec: Spec, values: list, out_dtype: str, loops: str | None) -> threading.Thread | None:
    """A thread that builds the loop backend's kernel of ``spec`` for ``values``, where the backend builds the
    forward kernel and every gradient step together (``whole_module_cached``); the loop candidate then finds its
    kernel built (host C: the forward module, while the steps module goes on compiling beside it). Its compiler
    runs in subprocesses, so XLA's compiles of the other candidates (which release the GIL) go on meanwhile. A
    failed build is left to the loop candidate, which then fails the same way and is not chosen."""
    if not whole_module_cached(loops):
        return None
    import jax
    import numpy as np

    from tullax import backends
    from tullax.backends.base import Signature

    def canonical(dtype: Any) -> str:  # as the loop candidate's jax arrays have it (``_loop_call``)
        return np.dtype(jax.dtypes.canonicalize_dtype(dtype)).name

    signature = Signature(tuple(canonical(v.dtype) for v in values), canonical(out_dtype))

    def build() -> None:
        try:
            backends.resolve(loops).build(spec, signature)
        except Exception:  # noqa: BLE001 - a bug too: the loop candidate builds again under _prepared_call,
            pass  # which is not chosen when it fails; uncaught, the thread would print its traceback to stderr

    thread = threading.Thread(target=build, name="tullax-module-build", daemon=True)
    thread.start()
    return thread


def _prepared_call(spec: Spec, candidate: str, values: list, loops: str | None, zero_start: bool = False):
    """A call of one candidate on NumPy ``values``, already compiled and run once; None when it cannot run
    (it is then never chosen)."""
    try:
        if candidate.startswith("xla:"):
            call = _xla_call(spec, candidate, values, zero_start)
        else:
            call = _loop_call(spec, loops, values, zero_start)
        call()  # compile, first run
        return call
    except Exception:  # noqa: BLE001 - a candidate that cannot run here is simply not chosen
        return None


def _xla_call(spec: Spec, candidate: str, values: list, zero_start: bool = False):
    """A call of the XLA form ``candidate`` on NumPy ``values``: the executable ``compile_ahead`` compiled for it
    where that runs on them, else jitted here."""
    import jax

    env = dict(zip(spec.input_names, _on_device(values)))
    fn = None
    ahead = _compiled_ahead(spec, candidate, *call_shapes_and_dtypes(spec, values), zero_start)
    if ahead is not None:
        _check_temporaries(candidate, ahead)
        try:
            with jax.ensure_compile_time_eval():
                jax.block_until_ready(ahead(env))
            fn = ahead
        except Exception:  # noqa: BLE001 - it does not take these arguments: the jitted form compiles them
            pass
    if fn is None:
        with jax.ensure_compile_time_eval():
            fn = jax.jit(_xla_function(spec, candidate, zero_start)).lower(env).compile()
        _check_temporaries(candidate, fn)

    def call() -> None:
        with jax.ensure_compile_time_eval():
            jax.block_until_ready(fn(env))

    return call


class _TooMuchMemory(Exception):
    """A candidate's compiled program needs more than MAX_TEMP_BYTES of temporaries: not run."""


def _check_temporaries(candidate: str, compiled: Any) -> None:
    try:
        temp = compiled.memory_analysis().temp_size_in_bytes
    except Exception:  # noqa: BLE001 - a runtime that reports nothing: only 'product' relies on the check
        temp = None
    if (temp is None and candidate == "xla:product") or (temp is not None and temp > MAX_TEMP_BYTES):
        raise _TooMuchMemory(f"{candidate}: {temp} bytes of temporaries")


def _xla_function(spec: Spec, candidate: str, zero_start: bool):
    """The function of the XLA form ``candidate`` on an environment of inputs; with ``zero_start``, it starts
    from zeros of its own, as in a gradient (XLA writes them into the scatter's output; the given array is
    not read)."""
    from tullax.backends.xla.forms import lower_form

    form = lower_form(spec, candidate[4:])
    if not zero_start:
        return form

    def from_zeros(env: dict) -> Any:
        import jax.numpy as jnp

        given = env[spec.out]
        return form({**env, spec.out: jnp.zeros(given.shape, given.dtype)})

    return from_zeros


def _on_device(values: list) -> list:
    """``values`` (NumPy) as concrete JAX arrays, even while jax traces (planning runs then). Not
    ``jnp.asarray`` under ``ensure_compile_time_eval``: that stages each value through a jitted identity, an
    XLA compile per shape (10-30 ms each, 5 of them in conv2d's first forward and gradient call)."""
    import jax
    import numpy as np

    with jax.ensure_compile_time_eval():
        return [jax.device_put(np.asarray(v)) for v in values]


def _loop_call(spec: Spec, loops: str | None, values: list, zero_start: bool = False):
    """A call of the loop backend's kernel on ``values`` (NumPy, in ``spec.inputs`` order) as a planned kernel
    runs it: jitted, on the path the tullax primitive's lowering takes (``tullax.calls.path``: the host
    callback, or a GPU backend's device kernel). Not the bare kernel: the callback costs what the bare kernel
    does not see (an elementwise 4096x4096 step: 13 ms bare, 48 ms through the callback, CPU time on a loaded
    machine; XLA 44 ms), and the row norm gradient went to the loops on the bare timing, 0.8x of XLA's."""
    import jax

    from tullax.calls.path import backend_path, run_loops
    from tullax.spec.shapes import result_dtype

    args = _on_device(values)
    dtype = jax.dtypes.canonicalize_dtype(result_dtype(spec, {i.name: a.dtype for i, a in zip(spec.inputs, args)}))
    path = backend_path(loops)  # the choice the primitive's lowering makes: the host callback or the device kernel
    fn = jax.jit(lambda *given: run_loops(spec, loops, given, dtype, path, zero_start))

    def call() -> None:
        with jax.ensure_compile_time_eval():
            jax.block_until_ready(fn(*args))

    return call


# ---------------------------------------------------------------------------------------------
# The compile cache
# ---------------------------------------------------------------------------------------------
def _cache_key(spec: Spec, shapes: dict, dtypes: dict, loops: str | None, zero_start: bool = False) -> str:
    from tullax.runtime.cache import cache_key
    from tullax.spec.text import format_spec

    start = {"zero_start": True} if zero_start else {}  # a '+=' step on zeros is raced apart from one on data
    if on_gpu():  # a GPU's race is decided by the GPU, not by the host's cores
        import jax

        start["gpu"] = jax.devices()[0].device_kind
    return cache_key(kind="plan", spec=format_spec(spec), shapes=sorted(shapes.items()),
                     dtypes=sorted(dtypes.items()), loops=loops, cores=os.cpu_count(),
                     threads=os.environ.get("NUMBA_NUM_THREADS"), **start)


def _load(key: str) -> dict | None:
    from tullax.runtime.cache import get_cache

    try:
        text = get_cache().read_text(key, PLAN_FILE)
        found = json.loads(text) if text else None
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict):
        return None
    get_cache().hit_later(key)  # a reused plan counts in `tullax cache stats`, as a reused module does
    return found


def _store(key: str, spec: Spec, decision: dict) -> None:
    from tullax.runtime.cache import get_cache
    from tullax.spec.text import format_spec

    cache = get_cache()
    try:
        if cache.write_text(key, PLAN_FILE, json.dumps(decision)) is not None:
            cache.record(key, spec=format_spec(spec), backend="auto", kind="plan")
    except OSError:
        pass  # a plan that cannot be stored is timed again by the next process


# ---------------------------------------------------------------------------------------------
# Explaining
# ---------------------------------------------------------------------------------------------
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


def explain_lines(spec: Spec, shapes: Shapes | None = None, dtype: str = "float32") -> list[str]:
    """What ``auto`` runs each kernel of ``spec`` on, and why: by rule without ``shapes``; with them, the
    decision for those shapes when the compile cache holds one (close calls are not timed here)."""
    from tullax.backends.host import kernel_steps

    loops = loop_backend((dtype,))
    where = "a GPU" if on_gpu() else "the CPU"
    lines = [f"plan (backend='auto' on {where}; loop backend: {loops or 'none'}):"]
    from tullax.backends.workload import serial_threshold

    tiny_on = "its rule's default, untimed" if whole_module_cached(loops) else "XLA"
    lines.append(f"  (a call below {serial_threshold()} estimated operations runs on {tiny_on}: rule 'tiny')")
    if shapes is None:
        for step in kernel_steps(spec):
            rule = rule_for(step.spec, loops)
            chosen = _as_plan(rule.default, loops, rule)
            close = f"; close call, timed on first use where cheap: {', '.join(rule.close)}" if rule.close else ""
            lines.append(f"  {step.label}: {_text(step.spec)}")
            lines.append(f"    -> {chosen.label}: {rule.name}: {rule.reason}{close}")
        return lines
    # the dtype jax gives an integer index array (int32 unless x64 is on): the key a real call's decision is
    # stored under (with int64 here, the embedding's stored decisions were never shown)
    import jax
    import numpy as np

    from tullax.grad.run import zero_start_steps

    index_dtype = np.dtype(jax.dtypes.canonicalize_dtype(np.int64)).name
    from_zeros = zero_start_steps(spec)
    for label, step, step_shapes in kernel_shapes(spec, shapes):
        dtypes = {item.name: (index_dtype if item.kind == "index" else dtype) for item in step.inputs}
        listed = ", ".join(f"{n} {'x'.join(map(str, s)) or 'scalar'}" for n, s in step_shapes.items())
        zeros = ", from zeros" if step in from_zeros else ""
        lines.append(f"  {label}: {_text(step)}  [{listed}{zeros}]")
        found = plan(step, step_shapes, dtypes, timing=False, zero_start=step in from_zeros)
        lines.append(f"    -> {found.describe()}")
    forward_dtypes = {item.name: (index_dtype if item.kind == "index" else dtype) for item in spec.inputs}
    wrt = [item.name for item in spec.inputs if item.kind in ("array", "scalar")]
    joined = joint_plans(spec, shapes, forward_dtypes, dtype, wrt, timing=False)
    if joined:
        moved = ", ".join(_text(k) for k, p in joined.items() if JOINED in p.reason)
        lines.append(f"  differentiated w.r.t. every input: one XLA program (each kernel runs on XLA or its loops won "
                     f"by less than {JOINT_MARGIN}x); moved to XLA: {moved}")
    return lines


def _text(spec: Spec) -> str:
    from tullax.spec.text import format_spec

    return format_spec(spec)


def forget() -> None:
    """Drop this process's decisions (tests: a new process in all but name)."""
    with _LOCK:
        _MEMO.clear()
        STATS.update(timed=0, from_cache=0)
    with _AHEAD_LOCK:
        _AHEAD.clear()


def as_dict(found: Plan) -> dict:
    return asdict(found)


__all__ = ["Plan", "Rule", "plan", "rule_for", "loop_backend", "forget", "explain_lines", "kernel_shapes",
           "build_gradient_module", "call_shapes_and_dtypes", "whole_module_cached", "joint_plans", "JOINT_MARGIN",
           "TIMING_ENV", "LOOPS"]
