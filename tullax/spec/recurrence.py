"""Reads of the result on the right-hand side (issue 44): only at the position being written.

``h[t] = lam*h[t-1] + x[t]`` looks like a recurrence, but '=' and '+=' compute every position at once from the
array passed in: on ``h = 0, lam = 0.5, x = 1`` it gives ``[0, 1, 1, ...]``, one step of a map, where the loop
it reads as gives ``[0, 1, 1.5, 1.75, ...]``. So a read of the result at any other position than the one written
is a SpecError that names the trap and points to the recurrence notation, a ``(t scan)`` clause. A read at
the written position (``y[i] = y[i]*x[i] + 1``, ``C[i,j] += A[i,k]*B[k,j]``) is an update and stays.
"""
from __future__ import annotations

from typing import Any

from tullax.spec.ir import Access, ParsedSpec, spec_accesses
from tullax.spec.text import format_access, format_spec

Context = Any  # analyze's error context (not imported: analyze imports this module)

SCAN_HINT = ("a recurrence is written with ':=' and a scan clause naming its sequential index, as "
             "h[b,t] := lam*h[b,t-1] + x[b,t]  (t scan) (docs/recurrences.md)")


def _scan_clause(parsed: ParsedSpec, acc: Access) -> str:
    """The scan clause the read suggests: the result's indices at the axes where the read differs."""
    moved = [w.plain for w, r in zip(parsed.lhs or (), acc.idx) if w != r and getattr(w, "plain", None)]
    return f"  ({moved[0]} scan)" if len(moved) == 1 else ""


def check_self_reads(parsed: ParsedSpec, ctx: Context) -> None:
    """Raise a SpecError for a read of the result on the right other than at the position the spec writes."""
    for acc in spec_accesses(parsed):
        if acc.array != parsed.out:
            continue
        if parsed.assign == ":=":
            raise ctx.error(_new_result_message(parsed, acc), acc.span)
        if acc.idx != tuple(parsed.lhs or ()):
            raise ctx.error(_shifted_read_message(parsed, acc), acc.span)


def _new_result_message(parsed: ParsedSpec, acc: Access) -> str:
    written = format_access(parsed.out, parsed.lhs)
    read = format_access(acc.array, acc.idx)
    example = f", as {read} beside {written}," if read != written else ""
    return (f"{parsed.out} is the result being defined with ':=', it cannot appear on the right. To update an "
            f"existing array from its value at the same position, write {written} = ... {written} ... (or +=); "
            f"a read at another position{example} is a recurrence: add its scan clause "
            f"({format_spec(parsed)}{_scan_clause(parsed, acc)}); {SCAN_HINT}")


def _shifted_read_message(parsed: ParsedSpec, acc: Access) -> str:
    written = format_access(parsed.out, parsed.lhs)
    read = format_access(acc.array, acc.idx)
    return (f"{read} reads the result {parsed.out} at another position than the one written ({written}): a loop "
            f"reading it so would be a recurrence, each {written} from a value just computed. '{parsed.assign}' "
            f"computes every position at once from the {parsed.out} passed in, so this would be one step of a "
            f"map, {format_spec(parsed)} with {read} read from the input, not the "
            f"recurrence: refused ({SCAN_HINT}). For that one step, pass the old array as another input (e.g. "
            f"{parsed.out}0) and read it there; a read at the written position ({written}) is an update and is "
            f"allowed")


__all__ = ["check_self_reads", "SCAN_HINT"]
