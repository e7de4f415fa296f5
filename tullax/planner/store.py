"""Decisions kept in the compile cache (an entry of kind ``plan`` holding ``plan.json``), keyed by the call and
what decides a race on this machine, so they hold across processes."""
from __future__ import annotations

import json
import os

from tullax.backends.gpu_select import on_gpu
from tullax.planner import tuning
from tullax.planner.call import Call

PLAN_FILE = "plan.json"


def cache_key(call: Call, gradient: tuple = ()) -> str:
    """The key of the call's decision: spec, shapes, dtypes, loop backend, and what sets the speed of a race (the
    machine's cores and threads; on a GPU, its model). ``gradient``: the key of the decision how the call's
    gradient is computed (``planner.autodiff``: its result dtype and the inputs differentiated), kept apart."""
    from tullax.backends.threads import loop_threads
    from tullax.runtime.cache import cache_key as key_of
    from tullax.spec.text import format_spec

    start = {"zero_start": True} if call.zero_start else {}  # a '+=' step on zeros is raced apart from one on data
    if gradient:
        start["gradient"] = list(gradient)
    if call.algebra:  # a race with the opted-in expanded form is kept apart from one without it
        start["algebra"] = call.algebra
    model = gpu_model()
    if model is not None:  # a GPU's race is decided by the GPU, not by the host's cores
        start["gpu"] = model
    return key_of(kind="plan", spec=format_spec(call.spec), shapes=sorted(call.shapes.items()),
                  dtypes=sorted(call.dtypes.items()), loops=call.loops, cores=os.cpu_count(),
                  threads=loop_threads(call.loops), **start)


def gpu_model() -> str | None:
    """The model of the GPU jax computes on (``device_kind``, e.g. "NVIDIA H100 80GB HBM3"), None on the CPU:
    each model races its own schedules (tile sizes, cooperative reductions) against XLA's forms and keeps its
    own decisions."""
    if not on_gpu():
        return None
    import jax

    return jax.devices()[0].device_kind


def load(key: str) -> dict | None:
    """The decision kept under ``key``, or None (none kept, or unreadable)."""
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


def store(key: str, call: Call, decision: dict) -> None:
    """Keep ``decision`` under ``key``; a plan that cannot be stored is timed again by the next process."""
    from tullax.runtime.cache import get_cache
    from tullax.spec.text import format_spec

    cache = get_cache()
    try:
        if cache.write_text(key, PLAN_FILE, json.dumps(decision)) is not None:
            cache.record(key, spec=format_spec(call.spec), backend="auto", kind="plan")
    except OSError:
        pass


def to_confirm(stored: dict) -> tuple[tuple[tuple[str, float], ...], int] | None:
    """For a stored decision of a close call not yet confirmed by CONFIRMING_RACES races: the best ms per
    candidate over its races and how many there were; None for a settled decision (a clear race, enough races,
    or one stored before decisions counted their races)."""
    races = stored.get("races")
    if stored.get("settled", True) or not isinstance(races, int) or races >= tuning.CONFIRMING_RACES:
        return None
    try:
        return tuple((str(c), float(ms)) for c, ms in stored.get("bests", [])), races
    except (TypeError, ValueError):
        return None
