"""The gradient of a differentiated ``auto`` call as a whole (``gradient_plan``): tullax's derived gradient steps
(``derived``: each step planned on its own, or with the forward as one XLA program by ``decide.joint_plans``), or
JAX's own autodiff of the forward kernel's XLA form (``autodiff:<form>``).

Why a candidate of its own: a derived step reads only the forward's inputs and result, so it computes again what
the forward computed per element (a logsumexp's ``exp(x - l)``: ``Δx[i,j] := Δl[i]*exp(x[i,j] - l[i])``). JAX's
autodiff of the forward's XLA form keeps such values from the forward as residuals, and its backward reads them.
Neither wins everywhere (a residual is memory written and read again; a recomputed body may be cheaper than
that), so the two whole gradients (forward and backward, jitted) are raced, as a close call's candidates are.

The rule: specs that the derivation rules alone may differentiate stay ``derived`` without a race (a recurrence,
an index array or scatter, an update of a given array, a max/min/product reduction whose ties and zeros the
derived gradient treats as tullax defines them, a pure contraction whose steps are contractions with nothing to
keep, complex or integer inputs). The race runs when the differentiated call is traced, since the program's
structure depends on it (a kernel's own race waits for a lowering on this host instead), on this process's
platform P (``race_platform``), and its decision holds for P alone: where it is autodiff, the JVP rule emits
``lax.platform_dependent`` with autodiff for P and the derived steps for every other platform, so a lowering for
another platform (an export traced on a CPU host for cuda) keeps the derived steps, planned as before and timed on
nothing here, and JAX drops the branch a lowering does not run. Tracing cannot tell which platforms the program will
be lowered for, so an export for another platform alone still pays for the race (``TULLAX_PLAN_TIMING=0`` skips
it). Not timed below ``UNTIMED_WORK``, above ``SLICE_WORK`` or with timing off (``derived``, today's plan); but a
call that rule ``tiny`` runs on XLA on a new compile cache (``rules.runs_cold``: the forward and every step on XLA,
on any platform) whose body calls a function takes autodiff by rule, with no ``platform_dependent``: the program
the XLA reference compiles, where each derived step would evaluate those functions again and cost a cold first call
its tracing, planning and compile (a polynomial body keeps its steps, which factor into contractions). The
decision is kept in the compile cache by platform; a close one (the runner-up within ``CLOSE_RATIO``) is raced
again by the next processes, the best per candidate kept, until ``CONFIRMING_RACES`` races stand behind it, as a
kernel's close call. The ``xla`` backend never takes this path: its derived gradient is the oracle of the
derivation rules."""
from __future__ import annotations

import threading
from typing import Callable, Iterable, Mapping

from tullax.planner import rules, store, tuning
from tullax.planner.call import Call, Shapes
from tullax.planner.rules import Plan, loops_for
from tullax.spec.ir import Indirect, Spec, accesses

DERIVED = "derived"
AUTODIFF = "autodiff:"  # + the forward's XLA form
RULE = "gradient"
_REASON = ("the derived gradient steps recompute from the forward's inputs and result what JAX's autodiff of the "
           "forward's XLA form keeps from the forward (its residuals): the two whole gradients are raced")

# rule ``tiny`` on a new compile cache (``rules.TINY_COLD``): the forward and every derived step would run on XLA,
# each step evaluating the functions of the forward's body again over its whole index space (a Gaussian distance's
# three steps, three more exponentials of (x-y)^2), traced, planned and compiled; JAX's autodiff of the forward's
# form is the program the XLA reference compiles, and the same on every platform (``lax.platform_dependent`` would
# trace the derived steps all the same). A polynomial body's derived steps factor into contractions (Dist's: a
# smaller program than JAX's autodiff of the broadcast form, compiled faster: benchmarks/ttfk_phases.py): kept.
COLD = "tiny"
_COLD_REASON = ("below the serial work threshold on a new compile cache, where the forward and its derived steps "
                "would all run on XLA (rule tiny), each step evaluating the body's functions again: JAX's autodiff "
                "of the forward's XLA form, one program that keeps them from the forward, on every platform "
                "(not timed)")

# the race: a whole gradient takes milliseconds and a shared host's busy spells tens of them, so each candidate's
# best over many interleaved runs (benchmarks/lse_grad_reuse.py: races of TIMING_RUNS rounds chose either way)
RACE_ROUNDS = 24
MIN_ROUNDS = 6
RACE_BUDGET_S = 1.0

# this process's decisions, by (spec, shapes, dtypes, out dtype, inputs differentiated, loop backend)
_MEMO: dict[tuple, Plan] = {}
_LOCK = threading.RLock()  # reentrant: a race traces kernels that may plan their own gradients
STATS = {"timed": 0}

# what a race times, given by the caller that can run the candidates (``tullax.jaxop.autodiff``): the candidates'
# runs on inputs of these shapes and dtypes (None: it cannot run)
MakeRuns = Callable[[Shapes, Mapping[str, str], tuple[str, ...]], Mapping[str, Callable[[], None] | None]]


def refusal(spec: Spec, dtypes: Mapping[str, str]) -> str | None:
    """Why the gradient of ``spec`` is the derived steps without a race, or None where JAX's autodiff of its
    forward's XLA form is a candidate."""
    from tullax.planner.call import analyse

    if spec.scan is not None:
        return "a recurrence: its adjoint runs as a kernel of its own"
    if spec.assign != ":=" or spec.is_scatter:
        return "it updates or scatters into an array"
    if any(isinstance(i, Indirect) for a in accesses(spec.body) for i in a.idx):
        return "it reads through an index array: its derived gradient drops out-of-range elements"
    if spec.redop in ("max", "min", "*"):
        return f"a ({spec.redop}) reduction: the derived gradient defines its ties and zeros"
    if any(not str(dtypes[name]).startswith(("float", "bfloat")) for name in spec.input_names):
        return "an input is not real floating point"
    found = analyse(spec)
    if found.contraction or not found.forms:
        return "a pure contraction: its gradient steps are contractions, with nothing for a forward to keep"
    return None


def recomputes_functions(spec: Spec) -> bool:
    """Whether the body of ``spec`` (not its finaliser, whose derivative reads the result) calls a function
    (``exp``, ``abs``, ...): its derived gradient steps evaluate it again over the whole index space, where JAX's
    autodiff of the forward's form keeps it; a polynomial body's steps factor into contractions instead."""
    from tullax.spec.ir import Call as FunctionCall
    from tullax.spec.ir import walk

    return any(isinstance(node, FunctionCall) for node in walk(spec.body))


def race_platform() -> str:
    """The platform a race here runs on (the default device's), as ``lax.platform_dependent`` names it."""
    import jax

    device = jax.devices()[0]
    if device.platform != "gpu":
        return device.platform
    for name in ("cuda", "rocm"):  # jax names a GPU's devices "gpu"; platform_dependent wants the concrete name
        try:
            if device in jax.devices(name):
                return name
        except RuntimeError:  # no such backend here
            continue
    return "cuda"


def _call(spec: Spec, shapes: Shapes, dtypes: Mapping[str, str]) -> Call:
    return Call.of(spec, shapes, dtypes, loops_for(spec, (str(dtypes[n]) for n in spec.input_names)))


def gradient_plan(spec: Spec, shapes: Shapes, dtypes: Mapping[str, str], out_dtype: str, wrt: Iterable[str],
                  make_runs: MakeRuns | None = None, *, timing: bool | None = None, platform: str | None = None
                  ) -> Plan:
    """How a call of ``spec`` differentiated w.r.t. the inputs ``wrt`` computes its gradient: ``Plan(form=DERIVED)``
    or ``Plan("xla", "autodiff:<form>")``, for ``platform`` (the one ``make_runs``' candidates run on; default
    ``race_platform()``). This process's decision, else the compile cache's, else a race of the candidates run by
    ``make_runs`` (None, or ``timing`` False: no race, ``derived``; such a plan is not kept)."""
    # the rule first; and a call too small to race on a new compile cache (which holds no decision either)
    # names no loop backend: its first run imports, probes and starts nothing of the c backend (decide.call_of)
    bare = Call.of(spec, shapes, dtypes, None)
    why = refusal(spec, bare.dtypes)
    if why is not None:
        return Plan(DERIVED, DERIVED, RULE, f"the derived gradient steps: {why}")
    if rules.runs_cold(bare) and recomputes_functions(spec):
        return Plan("xla", AUTODIFF + bare.analysis.forms[0], COLD, _COLD_REASON)
    if bare.work < tuning.UNTIMED_WORK and rules.nothing_compiled():
        return _as_plan(DERIVED, f"{_REASON} (not timed: below {tuning.UNTIMED_WORK} estimated operations: the "
                        "derived steps)", (), "rules")
    call = _call(spec, shapes, dtypes)
    wrt = tuple(sorted(wrt))
    platform = platform or race_platform()
    memo_key = (call.key, out_dtype, wrt, platform)
    found = _MEMO.get(memo_key)
    if found is not None:
        return found
    key = decision_key(call, out_dtype, wrt, platform)
    stored = store.load(key)
    close = (DERIVED, AUTODIFF + call.analysis.forms[0])
    timing = tuning.timing_enabled() if timing is None else timing
    if stored is not None and stored.get("candidate") not in close:
        stored = None
    # a close call (the runner-up within CLOSE_RATIO) is raced again by the next processes with timing on, each
    # keeping the best per candidate, until CONFIRMING_RACES races stand behind it: as a kernel's close call
    again = store.to_confirm(stored) if stored is not None and timing and make_runs is not None else None
    if stored is not None and again is None:
        return _MEMO.setdefault(memo_key, _as_plan(stored["candidate"], str(stored.get("reason", _REASON)), tuple(
            (c, float(ms)) for c, ms in stored.get("timings_ms", [])), "cache"))
    untimed = ("timing is off" if not timing or make_runs is None else
               f"below {tuning.UNTIMED_WORK} estimated operations" if call.work < tuning.UNTIMED_WORK else "")
    if not untimed and call.work > tuning.SLICE_WORK:
        untimed = "too much work to time two whole gradients"
    if untimed:
        return _as_plan(DERIVED, f"{_REASON} (not timed: {untimed}: the derived steps)", (), "rules")
    with _LOCK:
        found = _MEMO.get(memo_key)
        if found is None:
            found = _MEMO[memo_key] = _race(key, call, close, make_runs, *(again or ((), 0)))
    return found


def decision_key(call: Call, out_dtype: str, wrt: Iterable[str], platform: str) -> str:
    """The compile cache's key of the decision for ``call``'s gradient w.r.t. ``wrt`` timed on ``platform``."""
    return store.cache_key(call, gradient=(out_dtype, tuple(sorted(wrt)), platform))


def _race(key: str, call: Call, close: tuple[str, ...], make_runs: MakeRuns, prior: tuple = (),
          races: int = 0) -> Plan:
    """The best time of each candidate over ``RACE_ROUNDS`` interleaved rounds of one run each (fewer past
    ``RACE_BUDGET_S``, at least ``MIN_ROUNDS``), after this process's compiles in flight ended: the derived
    candidate's loop kernels may still run their fast tier while the optimised build compiles. ``prior``: the best
    times of the ``races`` earlier races of a close call (``store.to_confirm``), kept where better."""
    from tullax.runtime import own_compiles

    runs = {c: run for c, run in make_runs(call.shapes, call.dtypes, close).items() if run is not None}
    own_compiles.wait()
    best = {c: float("inf") for c in runs}
    began = call.clock()
    for round_ in range(RACE_ROUNDS):
        if round_ >= MIN_ROUNDS and call.clock() - began > RACE_BUDGET_S:
            break
        for candidate in (runs if round_ % 2 == 0 else reversed(list(runs))):  # neither always runs after the other
            start = call.clock()
            runs[candidate]()
            best[candidate] = min(best[candidate], (call.clock() - start) * 1e3)
    STATS["timed"] += 1
    if not best:
        return _as_plan(DERIVED, _REASON, (), "timed")
    for candidate, ms in prior:
        if candidate in best:
            best[candidate] = min(best[candidate], ms)
    races += 1
    chosen = min(best, key=lambda c: (best[c], c != DERIVED))
    runner_up = min((ms for c, ms in best.items() if c != chosen), default=float("inf"))
    settled = runner_up >= tuning.CLOSE_RATIO * best[chosen] or races >= tuning.CONFIRMING_RACES
    reason = _REASON + (f" (the best times of {races} races, each in its own process)" if races > 1 else "")
    if not settled:
        reason += f" (a close call: raced again by the next process, up to {tuning.CONFIRMING_RACES} races)"
    listed = tuple(best.items())
    bests = [list(t) for t in listed]
    store.store(key, call, {"candidate": chosen, "timings_ms": bests, "reason": reason, "bests": bests,
                            "races": races, "settled": settled})
    return _as_plan(chosen, reason, listed, "timed")


def _as_plan(candidate: str, reason: str, timings: tuple, source: str) -> Plan:
    if candidate.startswith(AUTODIFF):
        return Plan("xla", candidate, RULE, reason, timings, source)
    return Plan(DERIVED, DERIVED, RULE, reason, timings, source)


def known_gradient_plan(spec: Spec, shapes: Shapes, dtypes: Mapping[str, str], out_dtype: str,
                        wrt: Iterable[str], platform: str | None = None) -> Plan:
    """The plan ``gradient_plan`` would follow without timing (this process's decision, the compile cache's, or
    the rule) on ``platform`` (default: this process's): what ``tullax explain`` shows."""
    return gradient_plan(spec, shapes, dtypes, out_dtype, wrt, None, timing=False, platform=platform)


def forget() -> None:
    """Drop this process's decisions (tests: a new process in all but name)."""
    with _LOCK:
        _MEMO.clear()
        STATS.update(timed=0)


__all__ = ["DERIVED", "AUTODIFF", "COLD", "gradient_plan", "decision_key", "race_platform", "known_gradient_plan",
           "refusal", "recomputes_functions", "forget"]
