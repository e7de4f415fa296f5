"""``plan`` and ``joint_plans``: the one entry of ``backend="auto"``. For ONE kernel (the forward spec, or one
gradient step) and the shapes and dtypes of a call, choose the loop backend (host C, Numba, or Julia where it is
the loop backend; on a GPU its own: cuda or julia-cuda) or one of XLA's forms (``tullax.backends.xla.recognise``).

A call becomes one ``Call`` record, and its spec one ``Analysis`` (``tullax.planner.call``); then, in order:
this process's decision (``_MEMO``), the rule (``rules.RULES``; ``tiny`` by the call's work), a decision kept in
the compile cache (``store``), else a race (``race``) of the rule's close call, whose decision is kept there.

A close call is timed on its first use (``TULLAX_PLAN_TIMING=0`` turns timing off): each candidate runs on random
inputs of the call's shapes as a planned kernel runs it, best of a few interleaved rounds, and the fastest wins
(the rule's default on a tie), the loops only when they beat the fastest XLA form by ``LOOP_MARGIN``. A call of
less work than ``UNTIMED_WORK`` is not timed; one of more than ``SLICE_WORK`` is timed on a slice (its largest
free index that only indexes input axes plainly, cut), and an XLA form that wins a slice by less than
``CONFIRM_RATIO`` is confirmed on the full call. Differentiated, the forward and its gradient steps run as one XLA
program when each runs on XLA or its loops won by less than ``JOINT_MARGIN`` (``joint_plans``). The numbers and
why they are what they are: ``tullax.planner.tuning``.
"""
from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Iterable, Mapping

from tullax.planner import autodiff, candidates, rules, store, tuning
from tullax.planner import race as racing
from tullax.planner.call import Call, Shapes, call_shapes_and_dtypes, kernel_shapes
from tullax.planner.rules import (
    LOOPS,
    TINY_COLD,
    TINY_LOOPS,
    TINY_XLA,
    Plan,
    Rule,
    always_einsum,
    as_plan,
    loop_backend,
    loops_for,
    rule_for,
    usable,
)
from tullax.spec.ir import Spec

JOINED = "differentiated with kernels that all run on XLA: joins them"  # in the reason of a plan moved so
FULL = " (full)"  # marks a candidate's timing on the full call, where a slice's race was confirmed
AGAIN = " (again)"  # marks a candidate's timing in the second race that confirms a contraction's non-default win

# This process's decisions (a cache of the planner, guarded by _LOCK: jax may trace in several threads) and what
# it did, for tests and ``tullax explain``
_MEMO: dict[tuple, Plan] = {}
_LOCK = threading.Lock()
STATS = {"timed": 0, "from_cache": 0}


def plan(spec: Spec, shapes: Shapes, dtypes: Mapping[str, str], *, timing: bool | None = None,
         zero_start: bool = False, clock: Callable[[], float] | None = None, algebra: str = "") -> Plan:
    """The plan for one call of ``spec`` with inputs of these ``shapes`` and ``dtypes`` (by input name).
    ``timing=False``: never time a close call (the rule's default, unless the compile cache holds a decision);
    such a plan is not remembered, so a later call may still time it. ``zero_start``: ``spec`` is a '+=' gradient
    step that starts from zeros (``tullax.grad.run.zero_start_steps``); its race runs both candidates so, and its
    decision is kept apart. ``clock``: what a race times with (seconds; ``time.perf_counter``). ``algebra="expand"``
(the caller's opt-in): the expanded form of a polynomial body (``xla.expand``) joins the race where it applies."""
    call = call_for(spec, shapes, dtypes, zero_start, clock, algebra)
    if timing is False:
        return _decide(call, False, "the first call times " + ", ".join(_close(call, rule_for(spec, call.loops))))
    found = _MEMO.get(call.key)
    if found is not None:
        return found
    with _LOCK:
        found = _MEMO.get(call.key)
        if found is None:
            found = _MEMO[call.key] = _decide(call, tuning.timing_enabled() if timing is None else timing)
    return found


def known_plan(spec: Spec, shapes: Shapes, dtypes: Mapping[str, str], *, zero_start: bool = False,
               algebra: str = "") -> tuple[Plan, bool]:
    """The plan of a call known without timing (this process's decision, else the compile cache's, else the
    rule's default), and whether ``plan`` may still time a race for it (a close call not decided yet). What a
    kernel is traced with: the race waits for its lowering, which knows whether it runs here (never for an
    export or another platform's lowering: ``tullax.jaxop.primitives``)."""
    call = call_for(spec, shapes, dtypes, zero_start, algebra=algebra)
    found = _MEMO.get(call.key)
    if found is not None:
        return found, False
    return _decide(call, False, "not timed: lowered for another platform or exported", counted=False), \
        tuning.timing_enabled()


def call_for(spec: Spec, shapes: Shapes, dtypes: Mapping[str, str], zero_start: bool = False,
             clock: Callable[[], float] | None = None, algebra: str = "") -> Call:
    """The call record of a call of ``spec``; its loop backend is the one ``auto`` uses for these dtypes. A tiny
    call does not wait for the C compiler's probe to name it: it runs on the loops only where their module is
    compiled already (``_settle``), which needs no probe."""
    import time

    names = [str(dtypes[n]) for n in spec.input_names]
    call = Call.of(spec, shapes, dtypes, None, zero_start, clock or time.perf_counter, algebra)
    if rules.runs_cold(call):
        return replace(call, cold=True)  # no loop backend named: nothing of them is imported or started
    call = replace(call, loops=loops_for(spec, names, wait=False))
    if call.loops is None or rules.tiny(call):
        return call
    from tullax import backends

    backends.warm_up("auto")  # the c backend's imports beside the probe this call may wait for (once per process)
    return replace(call, loops=loops_for(spec, names))


def _close(call: Call, rule: Rule) -> tuple[str, ...]:
    """The candidates a race of ``call`` times: the rule's close call, and the expanded form where the caller
    opted in (``Call.algebra``) and it applies (with the rule's default where the rule times nothing)."""
    if not call.algebra:
        return rule.close
    return tuple(dict.fromkeys(rule.close or (rule.default,))) + (rules.EXPANDED,)


def _peek(call: Call) -> Plan:
    """The plan of a call as far as it is known without timing, and without counting in ``STATS``: this
    process's decision, else the compile cache's, else the rule's default (a close call not yet timed)."""
    found = _MEMO.get(call.key)
    return found if found is not None else _decide(call, False, counted=False)


@dataclass(frozen=True)
class _Race:
    """A close call that timing will settle: its rule, the candidates, the call to time them on (a slice of it,
    where it is large) and the key of the decision in the compile cache."""

    rule: Rule
    close: tuple[str, ...]
    timed: Call
    key: str
    prior: tuple[tuple[str, float], ...] = ()  # best ms per candidate in the earlier races of a close call
    races: int = 0  # how many earlier processes raced it


def _settle(call: Call, timing: bool, untimed: str = "timing is off", *, counted: bool = True) -> "Plan | _Race":
    """The plan of a call decided without timing (by rule, or kept in the compile cache), else the race that
    decides it."""
    loops = call.loops
    rule = rule_for(call.spec, loops)
    if call.cold:
        return as_plan(f"xla:{call.analysis.forms[0]}", loops, TINY_COLD)
    if loops is not None and rules.tiny(call):
        if rule.for_tiny != LOOPS or not rules.whole_module_cached(loops):
            return as_plan(f"xla:{call.analysis.forms[0]}", loops, TINY_XLA)
        if rules.loops_ready(loops, call.spec, call.dtypes):
            return as_plan(LOOPS, loops, TINY_LOOPS)
        return as_plan(f"xla:{call.analysis.forms[0]}", loops, TINY_COLD)
    close = tuple(c for c in _close(call, rule) if usable(call, c))
    if len(close) < 2:
        return as_plan(rule.default, loops, rule)
    key = store.cache_key(call)
    stored = store.load(key)
    if stored is not None and stored.get("candidate") not in close:
        stored = None  # a decision for a candidate that cannot run on these shapes here
    again = store.to_confirm(stored) if timing and stored is not None else None
    if stored is not None and again is None:
        STATS["from_cache"] += counted
        timings = tuple((c, float(ms)) for c, ms in stored.get("timings_ms", []))
        why = Rule(rule.name, str(stored.get("reason", rule.reason)), rule.default)
        return as_plan(stored["candidate"], loops, why, timings_ms=timings, source="cache")
    most = tuning.CONTRACTION_SLICE_WORK if rule.name == "contraction" else tuning.SLICE_WORK
    timed_shapes = call.shapes if call.work <= most else slice_shapes(call, most)
    if timing and call.work < tuning.UNTIMED_WORK:
        timing, untimed = False, (f"below {tuning.UNTIMED_WORK} estimated operations every candidate runs in a "
                                  "fraction of a millisecond: timing would cost more compiles than it can win back")
    if not timing or timed_shapes is None:
        return as_plan(rule.default, loops, Rule(rule.name, rule.reason + " (not timed: " + (
            untimed if not timing else "too much work to time, and no free index to time a slice of") + ")",
            rule.default))
    return _Race(rule, close, call.on(timed_shapes), key, *(again or ((), 0)))


def _decide(call: Call, timing: bool, untimed: str = "timing is off", *, counted: bool = True) -> Plan:
    race = _settle(call, timing, untimed, counted=counted)
    if isinstance(race, Plan):
        return race
    rule, loops = race.rule, call.loops
    timings = racing.race(race.timed, race.close)
    STATS["timed"] += 1
    if getattr(timings, "over_budget", False):
        # kept as a close call: the next processes race it again (each within its budget) until
        # CONFIRMING_RACES races stand behind the default
        races = race.races + 1
        reason = rule.reason + (f" (the race ran out of its compile budget, {tuning.RACE_COMPILE_RATIO:g}x what the "
                                f"loops took to compile: the rule's default)")
        store.store(race.key, call, {"candidate": rule.default, "timings_ms": [], "reason": reason, "bests": [],
                                     "races": races, "settled": races >= tuning.CONFIRMING_RACES})
        return as_plan(rule.default, loops, Rule(rule.name, reason, rule.default), source="timed")
    valid = {c: ms for c, ms in timings if ms is not None}
    if not valid:
        return as_plan(rule.default, loops, rule)
    for candidate, ms in race.prior:  # a close call raced again: the best of every race so far
        if candidate in valid:
            valid[candidate] = min(valid[candidate], ms)
    races = race.races + 1
    best, by_margin = fastest(valid, rule.default)
    listed = tuple((c, ms) for c, ms in valid.items())
    bests = [[c, ms] for c, ms in listed]
    runner_up = min((ms for c, ms in valid.items() if c != best), default=float("inf"))
    beside = getattr(timings, "beside_compiles", False)
    settled = (runner_up >= tuning.CLOSE_RATIO * valid[best] and not beside) or races >= tuning.CONFIRMING_RACES
    reason = rule.reason + (_within_margin() if by_margin else "")
    if beside:
        reason += " (timed while this process's own compiles still ran)"
    if races > 1:
        reason += f" (the best times of {races} races, each in its own process)"
    if not settled:
        reason += f" (a close call: raced again by the next process, up to {tuning.CONFIRMING_RACES} races)"
    if race.timed.shapes != call.shapes:
        cut = [f"{n} {'x'.join(map(str, call.shapes[n]))} -> {'x'.join(map(str, s))}"
               for n, s in race.timed.shapes.items() if s != call.shapes[n]]
        reason += " (timed on a slice: " + ", ".join(cut) + ")"
        if best != rule.default and rule.default in valid and valid[rule.default] < tuning.CONFIRM_RATIO * valid[best]:
            # XLA's temporaries of a slice may fit in the cache where the full call's do not: a close win of an
            # XLA form on a slice is confirmed against the default on the full call, one run each after a warm-up
            best, more, said = _rerace(call, best, rule.default, FULL, (
                "; confirmed on the full call", "; slower on the full call"), rounds=1)
            listed, reason = listed + more, reason + said
    elif best != rule.default and rule.name == "contraction" and rule.default in valid:
        # two XLA programs a few percent apart: a busy spell during one's turns can decide the race, so the win
        # is confirmed by a second race of the two
        best, more, said = _rerace(call, best, rule.default, AGAIN, (
            "; confirmed by a second race", "; slower in a second race"), rounds=tuning.TIMING_RUNS)
        listed, reason = listed + more, reason + said
    store.store(race.key, call, {"candidate": best, "timings_ms": [list(t) for t in listed], "reason": reason,
                                 "bests": bests, "races": races, "settled": settled})
    return as_plan(best, loops, Rule(rule.name, reason, rule.default), timings_ms=listed, source="timed")


def _within_margin() -> str:
    return (f" (the loops were faster by less than {round((tuning.LOOP_MARGIN - 1) * 100)}%: XLA, with no host "
            "callback)")


def _rerace(call: Call, best: str, default: str, mark: str, verdicts: tuple[str, str], *,
            rounds: int) -> tuple[str, tuple, str]:
    """A second race of a race's winner ``best`` against the rule's ``default`` on the full call: the candidate it
    keeps (``fastest``), the timings it took (each marked ``mark``) and what the reason says of it (``verdicts``:
    kept, lost); ``best`` with nothing added where either could not run."""
    again = dict(racing.race(call, (default, best), rounds=rounds))
    if again.get(best) is None or again.get(default) is None:
        return best, (), ""
    won = fastest({best: again[best], default: again[default]}, default)[0] == best
    return (best if won else default), tuple((f"{c}{mark}", ms) for c, ms in again.items()), verdicts[not won]


def fastest(times: Mapping[str, float], default: str) -> tuple[str, bool]:
    """The winner of a race with these best ``times`` (ms by candidate): the fastest, the rule's ``default`` on
    an exact tie; but the loops only when they beat the fastest XLA form by ``LOOP_MARGIN``. With it, whether
    that margin moved the win from the loops to XLA."""
    best = min(times, key=lambda c: (times[c], c != default))
    rivals = [c for c in times if c.startswith("xla:")]
    if best == LOOPS and rivals:
        rival = min(rivals, key=lambda c: times[c])
        if times[LOOPS] * tuning.LOOP_MARGIN > times[rival]:
            return rival, True
    return best, False


def slice_shapes(call: Call, target: int) -> dict | None:
    """Input shapes for a slice of about ``target`` estimated work of ``call``: the free index of largest extent
    that ``Analysis.cuttable`` allows, cut on every axis it indexes. None when no index can be cut (a scatter, an
    accumulating ``+=``, every free index inside index arithmetic or an index array)."""
    from tullax.backends.xla.recognise import cut_shapes

    ranges = call.ranges
    for name in sorted(call.analysis.cuttable, key=lambda n: -(ranges[n][1] - ranges[n][0])):
        extent = max(1, -(-ranges[name][1] * target // call.work))
        sliced = cut_shapes(call.spec, call.shapes, name, extent) if extent < ranges[name][1] else None
        if sliced is not None:
            return sliced
    return None


# ---------------------------------------------------------------------------------------------
# A differentiated call: every kernel of it
# ---------------------------------------------------------------------------------------------
def joint_plans(spec: Spec, shapes: Shapes, dtypes: Mapping[str, str], out_dtype: str, wrt: Iterable[str], *,
                timing: bool | None = None, algebra: str = "", known: bool = False) -> dict[Spec, Plan]:
    """In a call differentiated w.r.t. the inputs ``wrt``: XLA plans for the forward kernel and every gradient
    step of those inputs, when they should run as one XLA program: each of them runs on XLA already, or the
    loops won its timed race by less than ``JOINT_MARGIN`` (it then runs in its fastest timed XLA form), and
    at least one moves. Else empty: each kernel keeps its own plan. One program has no host callback between
    the forward and the steps, and XLA fuses across them. A race confirmed on the full call (timed on a slice
    first) is read from the full call's timings. ``known``: from the plans known without timing only (this
    process's races, the compile cache's): nothing is raced (what tracing asks)."""
    if any("complex" in str(d) for d in dtypes.values()):
        return {}  # complex inputs have gradient specs of their own: not the ones planned here
    from tullax.grad import gradients
    from tullax.grad.run import zero_start_steps

    wanted = set(wrt)
    forward_dtypes = {name: str(dtypes[name]) for name in spec.input_names}
    steps = {step for grad in gradients(spec) if grad.wrt in wanted for step in grad.steps}
    from_zeros = zero_start_steps(spec)
    calls = [call_for(kernel, its_shapes, {name: forward_dtypes.get(name, out_dtype) for name in kernel.input_names},
                      kernel in from_zeros, algebra=algebra)
             for _, kernel, its_shapes in kernel_shapes(spec, shapes) if kernel is spec or kernel in steps]
    if not known:
        compile_ahead(calls, timing=timing)
    found: dict[Spec, Plan] = {}
    moved = False
    for call in calls:
        own = _peek(call) if known else plan(call.spec, call.shapes, call.dtypes, timing=timing,
                                             zero_start=call.zero_start, algebra=call.algebra)
        if own.backend != "xla":
            timed = dict(own.timings_ms)
            full = {c.removesuffix(FULL): ms for c, ms in timed.items() if c.endswith(FULL)}
            race = full or {c: ms for c, ms in timed.items() if " " not in c}
            xla = [(ms, c) for c, ms in race.items() if c.startswith("xla:")]
            if LOOPS not in race or not xla or min(xla)[0] > tuning.JOINT_MARGIN * race[LOOPS]:
                return {}
            ms, best = min(xla)
            own = replace(own, backend="xla", form=best[4:], reason=own.reason + (
                f"; {JOINED} on {best} ({ms:.3g} ms, within {tuning.JOINT_MARGIN}x of the loops)"))
            moved = True
        found[call.spec] = own
    return found if moved else {}


def compile_ahead(calls: Iterable[Call], *, timing: bool | None = None) -> None:
    """Before several kernels are planned one after the other (the gradient steps of a differentiated call):
    every XLA candidate of the races still to run is lowered now and compiled in threads, all at once, and the
    race of each kernel finds its candidates compiled. Nothing is timed here."""
    timing = tuning.timing_enabled() if timing is None else timing
    if not timing:
        return
    for call in calls:
        if call.key in _MEMO:
            continue
        race = _settle(call, timing, counted=False)
        if not isinstance(race, Plan):
            candidates.compile_ahead(race.timed, race.close)


def build_gradient_module(spec: Spec, args: Iterable[Any], out_dtype: str) -> None:
    """Before ``auto`` runs the gradient steps of ``spec`` on ``args`` (its forward inputs): where the loop backend
    compiles the forward kernel and every gradient step together (``whole_module_cached``) and some step may run
    on the loops (its rule's default or a timed candidate), build them now: one compiler run instead of one per
    step. A module that fails to build is left to the steps, which report their own errors."""
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
    loops = _steps_loops(spec, args, out_dtype)
    if not rules.whole_module_cached(loops):
        return
    try:
        backends.resolve(loops).build(spec, Signature.of_values(args, out_dtype))
    except TullaxError:
        return


def _steps_loops(spec: Spec, args: list, out_dtype: str) -> str | None:
    """The loop backend some gradient step of ``spec`` called on ``args`` may run on, else None: its plan without
    timing (a decision kept in the compile cache, or a rule that times nothing) is the loops, or a race that
    includes them is still to be timed, or it is tiny and the module of ``spec`` with its steps is compiled
    already. A warm process whose kept decisions are all XLA's thus loads no loop module, and a tiny call on a
    new compile cache names no loop backend."""
    import numpy as np

    from tullax.backends.host import kernel_steps
    from tullax.errors import TullaxError
    from tullax.grad.run import zero_start_steps

    shapes, dtypes = call_shapes_and_dtypes(spec, args)
    if any(np.dtype(d).kind == "c" for d in dtypes.values()):  # complex inputs derive steps of their own
        loops = loop_backend(dtypes.values(), wait=False)
        may = any(rule.default == LOOPS or LOOPS in rule.close
                  for rule in (rule_for(step.spec, loops) for step in kernel_steps(spec, out_dtype)[1:]))
        return loops if may else None
    try:
        steps = kernel_shapes(spec, shapes)[1:]
    except TullaxError:  # the steps will report it; building the module costs only time
        return loop_backend(dtypes.values(), wait=False)
    from_zeros = zero_start_steps(spec)
    whole = None  # whether the module of spec and its steps is compiled already (asked once, where it matters)
    for _, step, step_shapes in steps:
        step_dtypes = {name: dtypes.get(name, out_dtype) for name in step.input_names}
        call = call_for(step, step_shapes, step_dtypes, step in from_zeros)  # as the step's own plan is made
        found = _peek(call)
        if found.backend != "xla":
            return found.backend
        if found.reason == TINY_COLD.reason and call.loops is not None:  # named: something is compiled somewhere
            whole = rules.loops_ready(call.loops, spec, dtypes, whole=True) if whole is None else whole
            if whole:
                return call.loops
    return None


def forget() -> None:
    """Drop this process's decisions (tests: a new process in all but name)."""
    with _LOCK:
        _MEMO.clear()
        STATS.update(timed=0, from_cache=0)
    candidates.forget_ahead()
    autodiff.forget()


def as_dict(found: Plan) -> dict:
    return asdict(found)


__all__ = ["Plan", "Rule", "plan", "known_plan", "joint_plans", "forget", "build_gradient_module", "compile_ahead",
           "STATS"]
