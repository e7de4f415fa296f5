"""What a compiled XLA program's collectives move: the bytes of each collective op's result, read off its HLO text
(``jax.jit(f).lower(...).compile().as_text()``), per op kind. Used by the sharding tests and benchmark to compare a
tullax kernel split across devices with its jnp formulation (the shapes are per device, static)."""
from __future__ import annotations

import re

COLLECTIVE = re.compile(r"=\s*(\w+)\[([\d,]*)\][^=]*?\b(all-gather|all-reduce|reduce-scatter|collective-permute|"
                        r"all-to-all)(?:-start)?\(")
ITEMSIZE = {"f64": 8, "f32": 4, "s64": 8, "s32": 4, "pred": 1, "u32": 4, "u64": 8, "f16": 2, "bf16": 2}


def collective_bytes(text: str) -> dict[str, int]:
    """Bytes per collective kind (``all-gather``, ``all-reduce``, ``reduce-scatter``, ``collective-permute``,
    ``all-to-all``) in the HLO ``text``: each op's result shape times its item size, summed per kind."""
    found: dict[str, int] = {}
    for dtype, dims, op in COLLECTIVE.findall(text):
        size = ITEMSIZE.get(dtype, 4)
        for n in filter(None, dims.split(",")):
            size *= int(n)
        found[op] = found.get(op, 0) + size
    return found


__all__ = ["collective_bytes"]
