"""Names the gradient specs introduce: the cotangent, the results, prelude arrays and new indices, each
chosen to avoid every name the forward spec already uses."""
from __future__ import annotations

from itertools import count
from typing import Iterable

from tullax.spec.ir import Spec

# New index names, in order of preference: m, n, p, ... read as "a position in the input".
_INDEX_NAMES = ("m", "n", "p", "q", "r", "s", "t", "u", "v", "w", "a", "b", "c", "d", "e", "f", "g", "h")


def spec_names(spec: Spec) -> set[str]:
    """Every name ``spec`` uses: inputs, result and indices."""
    return set(spec.input_names) | {spec.out} | set(spec.indices)


def seed_name(spec: Spec) -> str:
    """The environment name of the cotangent of ``spec``'s result: 'Δ' + out, unless that name is taken."""
    return fresh("Δ" + spec.out, spec_names(spec))


def fresh(base: str, taken: Iterable[str]) -> str:
    """``base``, or ``base`` with the smallest number appended that is not ``taken``."""
    taken = set(taken)
    if base not in taken:
        return base
    return next(f"{base}{n}" for n in count(1) if f"{base}{n}" not in taken)


def fresh_index(taken: Iterable[str]) -> str:
    taken = set(taken)
    for name in _INDEX_NAMES:
        if name not in taken:
            return name
    return fresh("m", taken)


def fresh_indices(taken: Iterable[str], n: int) -> tuple[str, ...]:
    """``n`` distinct new index names."""
    names: list[str] = []
    for _ in range(n):
        names.append(fresh_index(set(taken) | set(names)))
    return tuple(names)


def fresh_sequence(bases: Iterable[str], taken: Iterable[str]) -> tuple[str, ...]:
    """A fresh name per base, in order, each also avoiding the ones chosen before it."""
    chosen: list[str] = []
    for base in bases:
        chosen.append(fresh(base, set(taken) | set(chosen)))
    return tuple(chosen)
