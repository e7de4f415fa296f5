"""The host C printer (tullax.printers.c) without a compiler: golden files of whole modules
(``tests/golden/c/<id>.c``; ``TULLAX_UPDATE_GOLDEN=1`` regenerates them), the OpenMP clauses it chooses, and
the helpers it shares with the CUDA printer (tullax.printers.clike)."""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import numpy as np
import pytest
from corpus import CASES_BY_ID, analysed

from tullax.backends.base import Signature
from tullax.compiler.lower import lower
from tullax.errors import TullaxError
from tullax.printers import c as cprinter
from tullax.printers import cuda
from tullax.printers.clike import helper_definitions

GOLDEN = Path(__file__).parent / "golden" / "c"
UPDATE = os.environ.get("TULLAX_UPDATE_GOLDEN") == "1"
GOLDEN_CASES = ("dist", "row_max", "row_logsumexp", "scatter_embedding_grad", "dot")


def module(case_id: str, dtype: str = "float32", streams: bool = False) -> str:
    """The c backend's module of a corpus case; with ``streams``, as ``$TULLAX_C_STREAMS=1`` prints it."""
    from tullax.backends.c.generate import lowered
    from tullax.backends.host import module_source

    spec = analysed(CASES_BY_ID[case_id].spec, CASES_BY_ID[case_id].ranges)
    lower = functools.partial(lowered, streams=streams)
    return module_source(spec, Signature.for_dtype(spec, dtype), lower, cprinter.print_module)


@pytest.mark.parametrize("case_id", GOLDEN_CASES)
def test_golden(case_id: str):
    source = module(case_id)
    path = GOLDEN / f"{case_id}.c"
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    assert path.exists(), f"missing golden file {path}: run with TULLAX_UPDATE_GOLDEN=1"
    assert source == path.read_text(), f"the generated C for {case_id} changed; review and regenerate with " \
                                       "TULLAX_UPDATE_GOLDEN=1"


def test_no_stale_golden_files():
    assert {p.stem for p in GOLDEN.glob("*.c")} == set(GOLDEN_CASES)


def test_parallel_nest_collapses_and_the_team_can_be_one_thread():
    source = module("dist")
    assert "#pragma omp parallel for collapse(2) schedule(static) num_threads(tx_threads) if(tx_threads > 1 && " \
        in source
    assert "restrict a0" in source and "const float* restrict a1" in source


def test_a_parallel_loop_of_one_iteration_starts_no_team():
    """The team's condition counts the parallel loop's iterations: a column sum over 64 lanes is one tile of
    64, and a team woken for it leaves its other threads spinning (a recurrence's gradient w.r.t. lam)."""
    spec = analysed("s[n] := g[b,t,n]*h[b,t,n]")
    source = cprinter.print_module([lower(spec, Signature.for_dtype(spec, "float32"), "forward", tile=True)])
    assert "if(tx_threads > 1 && (tx_floordiv_i64(n0 + 63, 64)) > 1)" in source, source


def test_a_scalar_reduction_is_split_with_nan_propagating_max():
    source = module("sum_all", "float64") + module("row_max", "float64")
    assert "reduction(+:acc)" in source
    scalar_max = cprinter.print_module([lower(analysed("(max) m := x[i]"), Signature(("float64",), "float64"),
                                              "forward", tile=True)])
    assert "reduction(tx_rmax_f64:acc)" in scalar_max
    assert "omp_out = tx_max_f64(omp_out, omp_in)" in scalar_max


def test_a_scratch_declared_in_a_branch_is_hoisted_to_its_region():
    """The tiled float32 sum declares its float64 totals in one ``if`` and reads them in a later one: C's block
    scope would lose them, so every local is declared at the top of its region."""
    source = module("dist")
    body = source[source.index("void forward("):]
    declared, zeroed = re.search(r"double tile_tot\[\d+\];", body).start(), body.index("memset(tile_tot, 0")
    assert declared < body.index("if (long_sum)") < zeroed


def test_non_rectangular_parallel_nests_collapse_only_their_rectangular_head():
    from tullax.compiler.loops import Loop, Var, const

    reduction = (Loop("i2", const(0), Var("n2", "int64"), False, ()),)  # a per-element loop
    inner = Loop("i1", const(0), Var("i0", "int64"), True, reduction)
    outer = Loop("i0", const(0), Var("n0", "int64"), True, (inner,))
    assert cprinter.collapsible((outer, inner), reduction) == 1
    assert cprinter.collapsible((outer, Loop("i1", const(0), Var("n1", "int64"), True, reduction)), reduction) == 2


def test_an_elementwise_nest_keeps_its_innermost_loop_out_of_the_collapse():
    """GCC vectorises no collapsed loop: the innermost parallel loop of an elementwise kernel stays a loop."""
    body = module("transpose")
    assert "collapse" not in body[body.index("void forward("):body.index("// grad")]
    assert "collapse(2)" in module("dist")


def test_complex_prints_as_c99_complex_but_not_for_the_fast_tier():
    """The optimising compiler's module has C99 complex types (``tullax.printers.c_complex``); tcc has no
    ``_Complex``, so the plain module refuses it (the backend then waits for the optimising build)."""
    kernel = lower(analysed("y[i] := x[i,j]"), Signature(("complex64",), "complex64"), "forward", tile=True)
    source = cprinter.print_module([kernel])
    assert "#include <complex.h>" in source and "const float _Complex* restrict a1" in source
    with pytest.raises(TullaxError, match="fast tier .tcc. has no complex numbers"):
        cprinter.print_module([kernel], plain=True)


def test_the_helpers_are_defined_once_for_both_c_printers():
    """CUDA gets templates, host C one function per type, from the same text."""
    assert "template <typename T> __device__ __forceinline__ T tx_max(T a, T b)" in cuda._PRELUDE
    host = helper_definitions("static inline", ("float32", "int64"))
    assert "static inline float tx_max_f32(float a, float b) { float m = a > b ? a : b; return a != a ? a : m; }" \
        in host
    assert "tx_floordiv_i64" in host and "tx_floordiv_f32" not in host  # floor division: integers only
    assert "tx_powi_f32(float x, int n)" in host


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
def test_reduction_lanes_are_vectors_of_one_avx2_register(dtype: str):
    """The max/min lanes are vectors of at most 32 bytes, one AVX2 register: one vector of 64 bytes compiled, on a
    CPU without AVX-512, into a compare and a branch per lane (GCC 12: a row max 10x slower than jnp.max, make
    bench at 203bf5e); two vectors of 32 bytes keep the two compare-select chains it was for."""
    source = module("row_max", dtype, streams=True)  # (max) m[i] := x[i,j]
    sizes = {int(n) for n in re.findall(r"vector_size\((\d+)\)", source)}
    assert sizes and max(sizes) <= 32
    kernel = source[source.index("void forward("):].split(cprinter.UNIT_MARK)[0]
    compute = "int64" if dtype == "int32" else dtype  # integers compute in int64
    vector = f"tx_v{32 // np.dtype(compute).itemsize}_"
    assert re.search(rf"{vector}\w+ acc_l0, acc_l1;", kernel)  # a row alone: two chains
    assert re.search(rf"{vector}\w+ acc_0_l0, acc_1_l0, acc_2_l0, acc_3_l0;", kernel)  # 4 rows at once: one each



def _forward_of(text: str, dtype: str = "float32") -> str:
    from tullax.backends.c.generate import lowered
    from tullax.backends.host import module_source

    spec = analysed(text)
    source = module_source(spec, Signature.for_dtype(spec, dtype), lowered, cprinter.print_module)
    return source[source.index("void forward("):].split(cprinter.UNIT_MARK)[0]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_lane_loops_prefetch_the_rows_they_stream_and_nothing_through_an_index_or_across_rows(dtype: str):
    """A row max reads 16 KiB ahead of each block (``PREFETCH_BYTES``: the hardware's prefetchers stop at every 4
    KiB page); a load through an index array would READ the index array out of bounds ahead of the row, and a
    column reduction does not stream a row: neither is prefetched."""
    ahead = cprinter.PREFETCH_BYTES // np.dtype(dtype).itemsize
    row = _forward_of("(max) m[i] := x[i,j]", dtype)
    assert f"i1 = i1_blk + {ahead};\n" in row and "__builtin_prefetch(&a1[i0 * a1_e1 + i1], 0, 3);" in row
    assert "__builtin_prefetch" not in _forward_of("(max) m[i] := x[i,ix[j]]", dtype)
    assert "__builtin_prefetch" not in _forward_of("(min) m[j] := x[i,j]", dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_lane_steps_are_one_max_or_min_instruction_on_x86_and_the_select_elsewhere(dtype: str):
    """maxps/minps compute the lane step's select exactly (``v > l ? v : l``); other targets keep the select."""
    prelude = module("row_max", dtype)
    width = {"float32": "ps", "float64": "pd"}[dtype]
    for op, cmp in (("max", ">"), ("min", "<")):
        helper = prelude[prelude.index(f"tx_v{op}_{'f32' if dtype == 'float32' else 'f64'}("):]
        helper = helper[:helper.index("\n}\n")]
        assert f"#ifdef __AVX__\n    return __builtin_ia32_{op}{width}256(v, l);\n#else" in helper
        assert f"m = v {cmp} l;" in helper
