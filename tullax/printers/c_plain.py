"""The prelude of a plain C module (``CPrinter.plain``: the c backend's fast tier, compiled by tcc): the C
printer's prelude without GCC's builtins, and the folds of the sum lanes on arrays of lanes instead of vectors."""
from __future__ import annotations

from typing import Mapping

from tullax.printers.clike import TYPE_SUFFIX, storage_type

# tcc has no __builtin_inf/nan: the same bits through a union (NaN: a positive quiet NaN, as GCC's)
_BITS = {"__builtin_inff()": "(union { unsigned u; float f; }){0x7f800000u}.f",
         '__builtin_nanf("")': "(union { unsigned u; float f; }){0x7fc00000u}.f",
         "__builtin_inf()": "(union { unsigned long long u; double f; }){0x7ff0000000000000ull}.f",
         '__builtin_nan("")': "(union { unsigned long long u; double f; }){0x7ff8000000000000ull}.f"}


def folds(dtype: str, lanes: int) -> str:
    """``tx_pfoldadd_f32`` and the others: ``tx_vfoldadd_f32`` on an array of ``lanes`` lanes, the same additions
    (lane k with lane k ^ h, halves first) in the same order, then the accumulator."""
    suffix, ctype = TYPE_SUFFIX[dtype], storage_type(dtype)
    lines = []
    for op, sign in (("add", "+"), ("mul", "*")):
        lines += [f"static inline {ctype} tx_pfold{op}_{suffix}({ctype}* l, {ctype} acc) {{",
                  f"    for (int h = {lanes // 2}; h; h /= 2) {{",
                  f"        {ctype} t[{lanes}];",
                  f"        for (int k = 0; k < {lanes}; ++k) t[k] = l[k] {sign} l[k ^ h];",
                  f"        for (int k = 0; k < {lanes}; ++k) l[k] = t[k];", "    }",
                  f"    return acc {sign} l[0];", "}"]
    return "\n".join(lines) + "\n"


def plain_prelude(prelude: str, lanes: Mapping[str, int]) -> str:
    """``prelude`` (without the lane helpers) for tcc, with the sum lanes' folds of every dtype of ``lanes``."""
    for builtin, bits in _BITS.items():
        prelude = prelude.replace(builtin, bits)
    return prelude + "".join(folds(dtype, count) for dtype, count in lanes.items())


__all__ = ["folds", "plain_prelude"]
