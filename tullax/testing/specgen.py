"""Random specs for property tests: valid ones from the grammar of docs/design.md, section 1, and garbage.

``random_spec`` writes specs whose every range is inferable (or written, where a result index would not start at
0), covering shifts, constants, ``end``, mod/clamp/pad
(with a pad value), indirect indices (inside affine arithmetic too: ``A[ix[i]+j]``, ``A[2ix[i]+j]``,
``pad(ix[i]+j)``), scatters, diagonal writes, ``*=``, every reduction and finaliser (function names and
expressions of ``_``), the functions of the registry, ``size(A,d)`` values and ``(z in lo:hi)`` clauses;
``random_call`` adds what ``einsum_kernel`` takes beside the text: ``(&)``/``(|)`` reductions over comparisons,
``init=`` and ``nograd=``; ``random_garbage`` mutates them (and sometimes writes pure noise) to feed the
parser and the analysis; ``random_dtypes`` picks the inputs' dtypes (half precision, integers, bool and mixtures
of them).
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np

# =============================================================================================
_INDICES = ("i", "j", "k", "l", "m", "n")
_SCALARS = ("a", "b", "s")


def _as_rng(rng: Any) -> np.random.Generator:
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


class _SpecWriter:
    """Builds one random valid spec. Every index gets a plain occurrence in a 'binder' access, so ranges are
    always inferable; other accesses use shifts, constants, mod/clamp/pad and indirect indices freely."""

    def __init__(self, rng: np.random.Generator, indices: list[str], n_free: int, complex_values: bool = False):
        self.rng = rng
        # complex inputs: only what is defined on complex values (no orderings: comparisons, max/min, relu, ...)
        self.complex_values = complex_values
        self.indices = indices  # the first n_free are free, the others reduced
        self.n_free = n_free
        self.ranks: dict[str, int] = {}  # arrays written so far (an access may reuse one)
        self.index_arrays: list[str] = []

    def pick(self, items):
        return items[int(self.rng.integers(len(items)))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def new_array(self, rank: int) -> str:
        name = "ABCDEFGHPQRTUVWXYZ"[len(self.ranks)] if len(self.ranks) < 18 else f"Z{len(self.ranks)}"
        self.ranks[name] = rank
        return name

    # -- index expressions ------------------------------------------------------------------------
    def shifted_index(self) -> str:
        i = self.pick(self.indices)
        others = [n for n in self.indices if n != i]
        choices = [f"{i}+1", f"{i}-1", f"2{i}", f"2*{i}+1", f"{i}+2", f"-{i}+3", "0", "1",
                   f"mod({i}+1)", f"mod({i}-2)", f"clamp({i}-1)", f"clamp({i}+1)", f"pad({i}+1)", f"pad({i}-2)",
                   f"pad(2{i})", f"pad({i}-1, 0.5)", "indirect", "indirect", "indirect", "end", "end-1",
                   f"-{i}+end", "indirect+", "indirect+"]
        if others:
            choices += [f"{i}+{others[0]}", f"mod({i}+{others[0]})", f"pad({i}-{others[0]})"]
        choice = self.pick(choices)
        if choice.startswith("indirect"):
            name = self.pick(self.index_arrays) if self.index_arrays and self.chance(0.5) else \
                ("ix", "jx", "kx")[min(len(self.index_arrays), 2)]
            if name not in self.index_arrays:
                self.index_arrays.append(name)
            inner = self.pick([i, f"{i}+1", i])
            if choice == "indirect":
                return f"{name}[{inner}]"
            # an index array's value inside affine arithmetic (examples.index_intervals keeps it in range)
            other = self.pick(others) if others else "1"
            return self.pick([f"{name}[{inner}]+{other}", f"2{name}[{inner}]+{other}", f"{name}[{inner}]-1",
                              f"-{name}[{inner}]+{other}", f"pad({name}[{inner}]+{other})",
                              f"pad({name}[{inner}]-2)"])
        return choice

    def access(self) -> str:
        """An extra access: a new array or a repeated one, each axis plain or computed."""
        reuse = [a for a in self.ranks if self.chance(0.3)]
        if reuse:
            name = reuse[0]
            rank = self.ranks[name]
        else:
            rank = int(self.rng.integers(1, 3))
            name = self.new_array(rank)
        idx = [self.pick(self.indices) if self.chance(0.4) else self.shifted_index() for _ in range(rank)]
        return f"{name}[{','.join(idx)}]"

    def binders(self, names: list[str]) -> list[str]:
        """Accesses that give each of ``names`` a plain occurrence (groups of up to three indices)."""
        names = list(names)
        self.rng.shuffle(names)
        out = []
        while names:
            size = int(self.rng.integers(1, min(3, len(names)) + 1))
            group, names = names[:size], names[size:]
            if self.chance(0.3) and len(group) < 3:  # a diagonal or a constant position now and then
                group = group + [self.pick(group + ["0"])]
            name = self.new_array(len(group))
            out.append(f"{name}[{','.join(group)}]")
        return out

    # -- body expressions ----------------------------------------------------------------------
    def leaf(self) -> str:
        roll = self.rng.random()
        if roll < 0.55:
            return self.access()
        if roll < 0.7:
            return self.pick(_SCALARS)
        if roll < 0.85:
            return self.pick(["2", "3", "0.5", "1.5", "1"])
        if roll < 0.9 and self.ranks:  # an extent as a value (axes count from 0)
            name = self.pick(list(self.ranks))
            return f"size({name},{int(self.rng.integers(self.ranks[name]))})"
        return self.pick(self.indices)

    def combine(self, a: str, b: str) -> str:
        roll = self.rng.random()
        if self.complex_values:
            return [f"{a} + {b}", f"{a} - {b}", f"{a}*{b}", f"{a}*conj({b})", f"{a}/(1 + abs({b})^2)"][
                int(roll * 5)]
        if roll < 0.3:
            return f"{a} + {b}"
        if roll < 0.45:
            return f"{a} - {b}"
        if roll < 0.75:
            return f"{a}*{b}"
        if roll < 0.82:
            return f"{a}/(1 + ({b})^2)"
        if roll < 0.87:
            return f"{self.pick(['max', 'min'])}({a}, {b})"
        if roll < 0.92:
            return f"({a} {self.pick(['<', '<=', '>', '>=', '==', '!='])} {b})"
        return f"ifelse({a} > {b}, {a}, {b})"

    def wrap(self, e: str) -> str:
        """A function or a power of ``e``, with arguments kept in each function's domain."""
        choices = [
            f"exp(tanh({e}))", f"log(1 + ({e})^2)", f"log1p(({e})^2)", f"sqrt(({e})^2 + 1)", f"abs({e})",
            f"sin({e})", f"cos({e})", f"tan(tanh({e}))", f"tanh({e})", f"sinh(tanh({e}))", f"cosh(tanh({e}))",
            f"expm1(tanh({e}))", f"sigmoid({e})", f"softplus({e})", f"relu({e})", f"({e})^2", f"({e})^3",
            f"(1 + ({e})^2)^0.5", f"(1 + ({e})^2)^-1", f"-({e})", f"real({e})", f"conj({e})", f"imag({e}) + {e}",
            f"cbrt(1 + ({e})^2)", f"exp2(tanh({e}))", f"log2(1 + ({e})^2)", f"log10(1 + ({e})^2)", f"atan({e})",
            f"atan({e}, 2)", f"hypot({e}, 1)", f"erf({e})", f"max({e}, 0.1, -({e})^2)",
        ]
        if self.complex_values:
            choices = [f"exp(0.3*({e}))", f"abs({e})", f"abs({e})^2", f"({e})^2", f"real({e})", f"conj({e})",
                       f"imag({e}) + {e}", f"sin(0.3*({e}))", f"log(1 + abs({e})^2)", f"-({e})",
                       f"real({e})*imag({e})", f"sqrt(abs({e}) + 1)"]
        return self.pick(choices)

    def body(self, binders: list[str]) -> str:
        leaves = binders + [self.leaf() for _ in range(int(self.rng.integers(0, 3)))]
        self.rng.shuffle(leaves)
        leaves = [self.wrap(x) if self.chance(0.2) else x for x in leaves]
        while len(leaves) > 1:
            k = int(self.rng.integers(len(leaves) - 1))
            merged = self.combine(leaves[k], leaves[k + 1])
            if self.chance(0.15):
                merged = self.wrap(merged)
            leaves[k:k + 2] = [merged]
        return leaves[0]

    # -- the whole spec ------------------------------------------------------------------------
    def spec(self) -> str:
        free = self.indices[:self.n_free]
        kind = self.pick(["new"] * 7 + ["update"] * 2 + ["scatter"])
        if kind == "scatter" and not free:
            kind = "new"
        out = "O"
        binders = self.binders(self.indices)
        body = self.body(binders)
        if kind == "scatter":
            lhs = list(free)
            lhs[int(self.rng.integers(len(lhs)))] = self.scatter_position(free)
            return f"{out}[{','.join(lhs)}] += {body}"
        redop = self.pick(["+"] * 6 + ["*", "max", "min", "logsumexp"]) if not self.complex_values else "+"
        head = "" if redop == "+" and self.chance(0.8) else f"({redop}) "
        target = f"{out}[{','.join(free)}]" if free or self.chance(0.5) else out
        # *= multiplies terms in, and its gradient, like (*)'s, finds zero factors: not on complex values
        assign = ":=" if kind == "new" else self.pick(["=", "+="] + ([] if self.complex_values else ["*="]))
        if assign == "*=":  # multiplies with the (*) reduction
            head = self.pick(["", "(*) "])
        if assign != ":=" and self.chance(0.3):
            body = f"{body} + 0.5*{target}" if free else body
        if self.complex_values:  # finalisers defined on complex values, as functions of the reduced value
            tail = f" |> {self.pick(['abs', 'sin', 'cos', 'exp', 'conj', 'real', 'imag'])}" if self.chance(0.15) \
                else ""
        else:
            tail = f" |> {self.finalizer(free)}" if self.chance(0.2) else ""
            if self.chance(0.08):  # a reduction over an index the body never mentions: each term counted twice
                tail += "  (z in 0:2)"
            if assign == "*=":  # no finaliser with *=; a range clause is fine
                tail = "  (z in 0:2)" if tail.endswith("(z in 0:2)") else ""
            if assign == ":=" and free and self.chance(0.1):  # a diagonal write: it only sums what it reduces
                target = f"{out}[{','.join(free + [free[0]])}]"
                if len(self.indices) > len(free):
                    head, tail = "", ""
        return f"{head}{target} {assign} {body}{tail}"

    def finalizer(self, free: list[str]) -> str:
        """A function name, or an expression of _ reading scalars, extents and arrays at the free indices."""
        fn = self.pick(['tanh', 'sigmoid', 'softplus', 'relu', 'abs', 'sin', 'cos'])
        if self.chance(0.5):
            return fn
        term = self.pick(list(_SCALARS))
        if free and self.chance(0.6):
            axes = [i for i in free if self.chance(0.7)] or [free[0]]
            term = f"{self.new_array(len(axes))}[{','.join(axes)}]"
        extent = f"size({next(iter(self.ranks))},0)"
        return self.pick([f"{fn}(_ + {term})", f"_*{term}", f"_/{extent}", f"max(_, {term})",
                          f"{fn}(_)*{term} + _/{extent}", f"min({term}, _ - 1)"])

    def scatter_position(self, free: list[str]) -> str:
        i = self.pick(free)
        name = "ix"
        if name not in self.index_arrays:
            self.index_arrays.append(name)
        return self.pick([f"ix[{i}]", f"{i}+1", f"mod({i}+1)", f"clamp({i}-1)", f"pad({i}+1)", f"2{i}",
                          f"pad(2{i}+1)"])


def random_spec(rng: Any, complex_values: bool = False) -> str:
    """A random VALID spec covering the grammar of docs/design.md, section 1 (every range inferable). ``rng``: a NumPy
    Generator or a seed. ``complex_values``: valid on complex inputs too (sums; no comparisons, max/min, relu,
    sigmoid, softplus; conj, real, imag, abs and holomorphic functions)."""
    rng = _as_rng(rng)
    n_free = int(rng.choice([0, 1, 1, 2, 2, 3]))
    n_reduced = int(rng.choice([0, 1, 1, 2]))
    if n_free + n_reduced == 0:
        n_free = 1
    return _keep_offsets(_SpecWriter(rng, list(_INDICES[:n_free + n_reduced]), n_free, complex_values).spec())


def _keep_offsets(text: str) -> str:
    """``text`` with range clauses for the result's indices where one's inferred range does not start at 0 (``y[i]
    := A[i]*B[i-1]``): analysis refuses that unless the range is written. Clauses for every result index, with the
    inferred ranges, keep the result the inference describes (through the explicit-range path); no draw of the
    generator, so seeds keep their specs."""
    from tullax.spec.analyze import inferred_free_ranges
    from tullax.spec.parse import parse_spec
    from tullax.spec.ranges import format_clause

    free, refused = inferred_free_ranges(parse_spec(text))
    if not refused:
        return text
    return text + "".join(f"  {format_clause(name, rng.lo, rng.hi)}" for name, rng in free.items())


def random_call(rng: Any) -> tuple[str, dict[str, Any]]:
    """A random valid spec and the keyword options of ``einsum_kernel`` to call it with: sometimes a ``(&)``/``(|)``
    reduction over a comparison (or over any body: nonzero counts as true), ``init=`` where the spec reduces
    (':=' or '=', no finaliser; a bool for a boolean reduction) and ``nograd=`` naming some of its data inputs."""
    from tullax.spec.frontend import compile_spec

    rng = _as_rng(rng)
    if rng.random() < 0.3:
        n_free = int(rng.choice([0, 1, 1, 2]))
        writer = _SpecWriter(rng, list(_INDICES[:n_free + int(rng.choice([1, 1, 2]))]), n_free)
        body = writer.body(writer.binders(writer.indices))
        if rng.random() < 0.8:
            op = writer.pick(['<', '<=', '>', '>=', '==', '!='])
            body = f"{body} {op} {writer.pick(['0', '0.5', writer.leaf()])}"
        free = writer.indices[:n_free]
        text = _keep_offsets(f"({writer.pick(['&', '|'])}) O{'[' + ','.join(free) + ']' if free else ''} := {body}")
    else:
        text = random_spec(rng)
    spec = compile_spec(text)[1]
    options: dict[str, Any] = {}
    boolean = text.startswith(("(&)", "(|)"))
    if spec.reduced and spec.assign != "+=" and spec.finalizer is None and rng.random() < 0.5:
        options["init"] = bool(rng.random() < 0.5) if boolean else float(rng.choice([0.0, 1.5, -2.0, 0.25]))
    data = [i.name for i in spec.inputs if i.kind in ("array", "scalar")]
    if data and not boolean and rng.random() < 0.5:
        options["nograd"] = tuple(name for name in data if rng.random() < 0.5) or data[0]
    return text, options


_NOISE = list("[](),:=+-*/^<>|!._ 0123456789ijkxyzAB\t\n") + ["αβ", "∑", "√", "ñ", "€", "𝔸", "\x00", "ü", "ℵ",
                                                                 ":=", "+=", "|>", "[]", "()", "mod(", "pad(",
                                                                 "ix[", "(max)", "exp(", "1e400", "--", ".."]


def random_garbage(rng: Any) -> str:
    """An arbitrary string: usually a valid spec mutated by deletions, insertions (unicode included), swapped
    tokens, duplications and truncations; sometimes pure noise."""
    rng = _as_rng(rng)
    if rng.random() < 0.1:
        return "".join(_NOISE[int(rng.integers(len(_NOISE)))] for _ in range(int(rng.integers(0, 30))))
    text = random_spec(rng)
    for _ in range(int(rng.integers(1, 4))):
        text = _mutate(text, rng)
    return text


def _mutate(text: str, rng: np.random.Generator) -> str:
    if not text:
        return _NOISE[int(rng.integers(len(_NOISE)))]
    at = int(rng.integers(len(text) + 1))
    roll = rng.random()
    if roll < 0.25:
        return text[:at] + text[at + int(rng.integers(1, 4)):]
    if roll < 0.5:
        return text[:at] + _NOISE[int(rng.integers(len(_NOISE)))] + text[at:]
    if roll < 0.7:
        tokens = re.findall(r"\w+|\S", text)
        if len(tokens) > 1:
            a, b = (int(x) for x in rng.integers(len(tokens), size=2))
            tokens[a], tokens[b] = tokens[b], tokens[a]
        return " ".join(tokens)
    if roll < 0.85:
        return text[:at]
    end = min(len(text), at + int(rng.integers(1, 6)))
    return text[:end] + text[at:end] + text[end:]


__all__ = ["random_spec", "random_call", "random_garbage", "random_dtypes"]


# =============================================================================================
# Dtypes
# =============================================================================================
DATA_DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "int16", "uint8", "bool")


def random_dtypes(names: Any, rng: Any, choices: tuple[str, ...] = DATA_DTYPES) -> dict[str, str]:
    """A dtype for each data input in ``names``: usually one for all of them (a half-precision or integer
    spec), sometimes a mixture (promotion between them). ``rng``: a NumPy Generator or a seed."""
    rng = _as_rng(rng)
    names = list(names)
    if rng.random() < 0.7:
        one = choices[int(rng.integers(len(choices)))]
        return {name: one for name in names}
    return {name: choices[int(rng.integers(len(choices)))] for name in names}
