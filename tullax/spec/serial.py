"""An analysed Spec as JSON text and back: what a c kernel's custom call carries in an exported program, so a
process that never traced it can build the kernel (``tullax.backends.c.exported``). Derived gradient specs have
no source text (shape-only inputs, names like ``ΔW``), so the analysed tree itself is written.

Only the frozen dataclasses of ``tullax.spec`` are read back (``KINDS``), never arbitrary objects: the text comes
from an artefact, not from this process.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from tullax.errors import TullaxError
from tullax.spec import ir, scan, sizes


def _kinds() -> dict[str, type]:
    found = {}
    for module in (ir, sizes, scan):
        for name, value in vars(module).items():
            if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == module.__name__:
                found[name] = value
    return found


KINDS = _kinds()


def _encode(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        kind = type(value).__name__
        if KINDS.get(kind) is not type(value):
            raise TullaxError(f"internal: {kind} cannot be written into a spec's JSON")
        return {"@": kind, **{f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, tuple):
        return {"@t": [_encode(v) for v in value]}
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, complex):  # a derived gradient's literal (``-0.5im``): a complex spec's kernel payload
        return {"@c": [value.real, value.imag]}
    raise TullaxError(f"internal: a {type(value).__name__} cannot be written into a spec's JSON")


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if "@t" in value:
            return tuple(_decode(v) for v in value["@t"])
        if "@c" in value:
            return complex(*value["@c"])
        kind = KINDS.get(value.get("@"))
        if kind is None:
            raise TullaxError(f"a spec's JSON names an unknown kind {value.get('@')!r}")
        names = {f.name for f in dataclasses.fields(kind)}
        return kind(**{k: _decode(v) for k, v in value.items() if k in names})
    if isinstance(value, list):
        raise TullaxError("a spec's JSON holds a list where tullax writes tuples")
    return value


def to_json(spec: ir.Spec) -> str:
    return json.dumps(_encode(spec), separators=(",", ":"), ensure_ascii=True)


def from_json(text: str) -> ir.Spec:
    found = _decode(json.loads(text))
    if not isinstance(found, ir.Spec):
        raise TullaxError("a spec's JSON does not hold a Spec")
    return found


__all__ = ["from_json", "to_json"]
