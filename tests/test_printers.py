"""The printers' shared base (tullax/printers/base.py): every printer reads function spellings from the
registry, covers every IR operator, and a new target is a table plus a few hooks."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import pytest

from tullax.compiler.loops import (
    COMPARE,
    FLOATS,
    INDEX,
    Accum,
    ArrayArg,
    BinOp,
    Call,
    Const,
    If,
    Let,
    Load,
    Loop,
    LoopKernel,
    ScalarArg,
    SizeArg,
    Store,
    UnOp,
    Var,
    statement_expressions,
)
from tullax.errors import SpecError
from tullax.printers.base import (
    LoopPrinter,
    Place,
    Precedence,
    Prefix,
    arithmetic_operators,
    left_associative,
    non_chaining,
)
from tullax.printers.cuda import CudaPrinter
from tullax.printers.julia import CPU_FLAVOUR, JuliaPrinter, helper_name, print_module
from tullax.printers.numba import REPLACEMENTS, NumbaPrinter
from tullax.printers.pseudo import PseudoPrinter
from tullax.spec import functions
from tullax.spec.functions import Function
from tullax.spec.sizes import Sym


def _kernel(body=(), dtype: str = "float64") -> LoopKernel:
    arrays = (ArrayArg("a0", "y", 1, dtype, "out"), ArrayArg("a1", "x", 1, dtype, "in"))
    return LoopKernel("k", "y[i] := f(x[i])", arrays, (ScalarArg("s0", "c", dtype),),
                      (SizeArg("n0", Sym.extent("x", 0)),), tuple(body), dtype)


def _julia_spelling(fn: Function, dtype: str) -> str:
    return helper_name(fn.julia, dtype) if fn.julia_domain is not None else fn.julia


# Every printer of the loop IR: how to make one for a kernel, and the spelling it must print for a registry
# function on arguments of a dtype. A new target (CUDA C) is one more row.
PRINTERS: dict[str, tuple[Callable[[LoopKernel], LoopPrinter], Callable[[Function, str], str]]] = {
    "pseudo": (lambda kernel: PseudoPrinter(), lambda fn, dtype: fn.name),
    "numba": (NumbaPrinter, lambda fn, dtype: REPLACEMENTS.get((fn.name, dtype), fn.numba)),
    "julia": (JuliaPrinter, _julia_spelling),
    "cuda": (lambda kernel: CudaPrinter(64), lambda fn, dtype: fn.c[FLOATS.index(dtype)]),
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", functions.CALLS)
@pytest.mark.parametrize("target", sorted(PRINTERS))
def test_calls_use_the_registry_spelling(target: str, name: str, dtype: str, monkeypatch):
    make, spelling = PRINTERS[target]
    call = Call(name, (Var("x", dtype),), dtype)
    if target == "julia" and functions.get(name).julia is None:  # erf: a SpecError that says what to use instead
        with pytest.raises(SpecError, match=f"{name} is not supported on the Julia backends.*'numba' or 'xla'"):
            make(_kernel()).expr(call)
        return
    assert make(_kernel()).expr(call) == f"{spelling(functions.get(name), dtype)}(x)"
    # The spelling comes from the registry, not from the IR's name: rename every target's spelling there.
    entry = functions.get(name)
    renamed = replace(entry, numba=f"np.renamed_{name}", julia=f"renamed_{name}", c=(f"{name}_f", f"{name}_d"))
    monkeypatch.setitem(functions.FUNCTIONS, name, renamed)
    assert make(_kernel()).expr(call) == f"{spelling(renamed, dtype)}(x)"


@pytest.mark.parametrize("name", [f.name for f in functions.FUNCTIONS.values() if f.julia_domain is not None])
def test_julia_helpers_call_the_registry_spelling(name: str):
    kernel = _kernel([Loop("i0", Const(0, INDEX), Var("n0", INDEX), True, (
        Store("a0", (Var("i0", INDEX),), Call(name, (Load("a1", (Var("i0", INDEX),), "float64"),), "float64")),))])
    source = print_module([kernel], flavour=CPU_FLAVOUR)
    fn = functions.get(name)
    assert f"@inline {helper_name(fn.julia, 'float64')}(x::Float64) = " in source
    assert source.count(f" : {fn.julia}(x)\n") == 1


BINARY_OPS = ("+", "-", "*", "/", "^", "//", "mod", "max", "min", "and", "or", *COMPARE)


@pytest.mark.parametrize("op", BINARY_OPS)
@pytest.mark.parametrize("target", sorted(PRINTERS))
def test_every_printer_prints_every_ir_operator(target: str, op: str):
    make, _ = PRINTERS[target]
    dtype = "bool" if op in ("and", "or") else INDEX if op in ("//", "mod") else "float64"
    printer = make(_kernel())
    text = printer.expr(BinOp(op, Var("a", dtype), Var("b", dtype), "bool" if op in COMPARE else dtype))
    assert "a" in text and "b" in text
    for op in ("neg", "not"):
        assert printer.expr(UnOp(op, Var("a", "bool"), "bool")).endswith("a")


def test_statement_expressions_cover_every_statement():
    x, i = Var("x", "float64"), Var("i", INDEX)
    assert statement_expressions(Let("t", x)) == (x,)
    assert statement_expressions(Accum("t", "+", x)) == (x,)
    assert statement_expressions(Store("a0", (i,), x)) == (i, x)
    assert statement_expressions(If(Const(True, "bool"), ())) == (Const(True, "bool"),)
    assert statement_expressions(Loop("i", Const(0, INDEX), i, False, ())) == (Const(0, INDEX), i)


class _CLike(LoopPrinter):
    """A sketch of a C target: tables and four small hooks, nothing else (what a CUDA printer builds on)."""

    infix = {**arithmetic_operators(non_chaining), "and": left_associative("&&", Precedence.AND),
             "or": left_associative("||", Precedence.OR)}
    prefix = {"neg": Prefix("-", Precedence.UNARY, Precedence.UNARY), "not": Prefix("!", Precedence.UNARY,
                                                                                     Precedence.UNARY)}
    called = {"max": "fmax", "min": "fmin", "^": "pow"}
    if_head = "if ({cond}) {{"
    else_line = "} else {"
    block_end = "}"
    statement_end = ";"
    store_forms = {"set": "{target} = {value}", "add": "{target} += {value}",
                   "atomic_add": "atomicAdd(&{target}, {value})"}

    def constant(self, node: Const) -> str:
        return repr(node.value)

    def type_name(self, dtype: str) -> str:
        return {"float32": "float", "float64": "double", INDEX: "long long"}[dtype]

    def call_name(self, fn: Function, dtype: str) -> str:
        return fn.c[FLOATS.index(dtype)]

    def loop_header(self, loop: Loop, place: Place) -> str:
        v = loop.var
        return f"for (long long {v} = {self.expr(loop.start)}; {v} < {self.expr(loop.stop)}; ++{v}) {{"

    def let(self, stmt: Let) -> str:
        return f"{self.type_name(stmt.value.dtype)} {super().let(stmt)}"


def test_a_c_like_target_is_mostly_a_table():
    i, x = Var("i0", INDEX), Load("a1", (Var("i0", INDEX),), "float32")
    body = (Loop("i0", Const(0, INDEX), Var("n0", INDEX), False, (
        Let("t0", Call("exp", (BinOp("-", x, Var("s0", "float32"), "float32"),), "float32")),
        If(BinOp(">", Var("t0", "float32"), Const(1.0, "float32"), "bool"),
           (Store("a0", (i,), Var("t0", "float32"), "atomic_add"),),
           (Accum("acc", "max", Var("t0", "float32")),)),
    )),)
    assert _CLike().block(body, Place(0)) == [
        "for (long long i0 = 0; i0 < n0; ++i0) {",
        "    float t0 = expf(a1[i0] - s0);",
        "    if (t0 > 1.0) {",
        "        atomicAdd(&a0[i0], t0);",
        "    } else {",
        "        acc = fmax(acc, t0);",
        "    }",
        "}",
    ]

