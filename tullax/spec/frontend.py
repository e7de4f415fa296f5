"""Text to Spec, memoised: the first stage every public entry point goes through."""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Mapping

from tullax.errors import SpecError, TullaxError, with_spec_context
from tullax.spec.analyze import analyze
from tullax.spec.ir import BOOLEAN_REDUCTIONS, COMPARISONS, Binary, Num, ParsedSpec, Range, Spec
from tullax.spec.parse import parse_spec
from tullax.spec.text import format_spec

RangesKey = tuple[tuple[str, object], ...]


def ranges_key(ranges: Mapping | None) -> RangesKey:
    """A hashable, order-independent form of ``ranges=`` (it is part of the cache key)."""
    if ranges is None:
        return ()
    if not isinstance(ranges, Mapping):
        raise SpecError(f"ranges must be a dict like {{'i': 10}} or {{'i': (2, 12)}}, got {type(ranges).__name__}")
    items = []
    for name, value in ranges.items():
        if isinstance(value, list):
            value = tuple(value)
        if isinstance(value, range) and value.step == 1:  # a stepped range reaches analyze, which rejects it
            value = (value.start, value.stop)
        try:
            hash(value)
        except TypeError:
            raise SpecError(f"ranges[{name!r}] must be an int or a (start, stop) pair, got {value!r}") from None
        items.append((str(name), value))
    return tuple(sorted(items, key=lambda kv: kv[0]))


@lru_cache(maxsize=1024)
def _compile(text: str, key: RangesKey) -> tuple[str, Spec]:
    if isinstance(text, str) and " scan" in text:
        from tullax.spec.scan import split_scan

        blanked, clause = split_scan(text.strip())
        if clause is not None:
            return _compile_scan(blanked, clause, key)
    parsed = parse_spec(text)
    spec = analyze(_as_extremum(parsed), dict(key))
    return format_spec(parsed), spec


def _compile_scan(blanked: str, clause, key: RangesKey) -> tuple[str, Spec]:
    """A recurrence (``tullax.spec.scan``): its self-reads hidden from range inference, then restored."""
    from tullax.spec.scan import finish, prepare

    parsed, scan = prepare(parse_spec(blanked), clause)
    spec = finish(analyze(_as_extremum(parsed), dict(key)), scan, blanked.strip())
    return format_spec(spec), spec


def _as_extremum(parsed: ParsedSpec) -> ParsedSpec:
    """``(&)``/``(|)`` as ``(min)``/``(max)`` of the body as 0/1 (a comparison already is; any other body counts
    as true where nonzero, as ``jnp.all`` does); ``tullax.api.options`` turns the result into bools."""
    if parsed.redop not in BOOLEAN_REDUCTIONS:
        return parsed
    if parsed.finalizer is not None or parsed.assign == "+=":
        raise SpecError(f"a ({parsed.redop}) reduction gives true/false: it takes no finaliser and no '+=' (use "
                        f"':=' or '=')")
    body = parsed.body
    if not (isinstance(body, Binary) and body.op in COMPARISONS):
        body = Binary("!=", body, Num(0), span=getattr(body, "span", (0, 0)))
    return replace(parsed, redop=BOOLEAN_REDUCTIONS[parsed.redop], body=body)


def compile_spec(text: str, ranges: Mapping | None = None) -> tuple[str, Spec]:
    """(canonical text, analysed Spec) for a spec string; errors carry the spec text exactly once."""
    try:
        return _compile(text, ranges_key(ranges))
    except TullaxError as err:
        raise with_spec_context(err, text if isinstance(text, str) else repr(text)) from None


def describe_range(rng: Range) -> str:
    """``lo:hi -> k = lo, lo+1, ..., hi-1``: the half-open range with the values it gives spelled out, so nobody
    reads ``0:3`` as Julia's inclusive range (see ``tullax.spec.ranges``)."""
    return f"{rng.lo}:{rng.hi} -> {range_values(rng)}"


def range_values(rng: Range, name: str = "") -> str:
    """The values of a half-open range: ``0, 1, 2``; ``0, 1, ..., 9``; ``0, ..., size(x,0)-1``; ``(none)``."""
    lo, last = rng.lo, rng.hi + (-1)
    if lo.is_const and last.is_const:
        count = last.const - lo.const + 1
        if count <= 0:
            return "(no values)"
        if count <= 5:
            return ", ".join(str(v) for v in range(lo.const, last.const + 1))
        return f"{lo.const}, {lo.const + 1}, ..., {last.const}"
    return f"{lo}, ..., {last}"
