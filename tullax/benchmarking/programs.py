"""Whether two rows of a benchmark case run the very same XLA program.

``auto`` often runs a kernel on XLA in the form a comparator row uses too (Linear's einsum, the attention
scores'), and then both rows run one compiled program. Their measured ratio is the noise between processes
(the README's benchmark reading gives its size on the bench machine). The report marks such rows, and the
targets count them as 1x.

A program is named by a fingerprint of its optimised HLO (``jax.jit(f).lower(*args).compile().as_text()``)
without what does not change the computation: the source locations (the stack-frame tables and every op's
``metadata``), the module's name, and the names of instructions, parameters and computations (``dot.2`` in
one program is ``dot_general.0`` in the other when the two were traced from different Python functions).
"""
from __future__ import annotations

import hashlib
import re
from typing import Any, Callable

_FRAME_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
_METADATA = ", metadata={"
_HEADER_PARAM = re.compile(r"(?<=[(\s])([A-Za-z_][\w.\-]*)(?=: )")
_NAME = re.compile(r"%[A-Za-z_][\w.\-]*")
_MODULE = re.compile(r"^HloModule \S+?(?=,|\s|$)", re.MULTILINE)


def normalised_hlo(text: str) -> str:
    """The HLO text with source locations dropped and every name replaced by its order of first appearance."""
    lines = []
    in_table = False
    for line in text.splitlines():
        if line.strip() in _FRAME_TABLES:
            in_table = True
        elif in_table and not line.strip():
            in_table = False
        elif not in_table:
            lines.append(_without_metadata(line))
    body = _MODULE.sub("HloModule m", "\n".join(lines))
    # a computation's header names its parameters without the % they carry where they are used
    body = "\n".join(_HEADER_PARAM.sub(r"%\1", line) if _is_header(line) else line for line in body.splitlines())
    canonical: dict[str, str] = {}
    return _NAME.sub(lambda m: canonical.setdefault(m.group(0), f"%v{len(canonical)}"), body)


def _is_header(line: str) -> bool:
    stripped = line.strip()
    return stripped.endswith("{") and (stripped.startswith("%") or stripped.startswith("ENTRY "))


def _without_metadata(line: str) -> str:
    """``line`` without its ``, metadata={...}`` (braces matched, quoted strings skipped)."""
    start = line.find(_METADATA)
    while start >= 0:
        depth, quoted, pos = 0, False, start + len(_METADATA) - 1
        while pos < len(line):
            char = line[pos]
            if char == '"' and line[pos - 1] != "\\":
                quoted = not quoted
            elif not quoted and char == "{":
                depth += 1
            elif not quoted and char == "}":
                depth -= 1
                if depth == 0:
                    break
            pos += 1
        line = line[:start] + line[pos + 1:]
        start = line.find(_METADATA)
    return line


def fingerprint_hlo(text: str) -> str:
    return hashlib.sha256(normalised_hlo(text).encode()).hexdigest()[:16]


def fingerprint(jitted: Callable[..., Any], *args: Any) -> str | None:
    """The fingerprint of the program ``jitted`` (a ``jax.jit`` function) compiles for ``args``; None when it
    has no XLA program to show (a torch function)."""
    lower = getattr(jitted, "lower", None)
    if lower is None:
        return None
    return fingerprint_hlo(lower(*args).compile().as_text())
