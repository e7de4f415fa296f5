"""The C prelude's declarations of glibc's vector math (libmvec): with them a loop calling exp, tanh, ... vectorises
through the library's SIMD clones (the c backend links libmvec where it exists)."""
from __future__ import annotations

from tullax.printers.clike import POWER
from tullax.spec.functions import FUNCTIONS

# glibc's libmvec (registry field ``libmvec``): its functions for every x86-64 vector width, declared ``simd`` where
# the headers are as new as the glibc that added them (an older libmvec has not their symbols); ``pow`` for `^`
_MVEC = sorted({f.libmvec for f in FUNCTIONS.values() if f.libmvec})


def _simd_declarations(since: tuple[int, int]) -> str:
    table = [(f.c, f.arity) for f in FUNCTIONS.values() if f.libmvec == since and f.c]
    if since == _MVEC[0]:
        table.append(((POWER["float32"], POWER["float64"]), 2))
    lines = [f"#if defined(__GLIBC__) && __GLIBC_PREREQ({since[0]}, {since[1]})"]
    for names, arity in table:
        for name, ctype in zip(names, ("float", "double")):
            lines += ["#pragma omp declare simd notinbranch", f"{ctype} {name}({', '.join([ctype] * arity)});"]
    return "\n".join(lines) + "\n#endif\n"


MVEC_DECLARATIONS = "".join(_simd_declarations(since) for since in _MVEC)

__all__ = ["MVEC_DECLARATIONS"]
