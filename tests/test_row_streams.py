"""Row streams: max/min reductions along long contiguous rows read ``STREAM_ROWS`` rows at once (a register tile
with a run-time length condition, ``schedule.register_tiles``), and the C printer's lanes fold into their
accumulator in vectors (``tx_vfoldmax_f32``). The c backend streams only with ``$TULLAX_C_STREAMS=1``.

The kernels are checked where each path runs: rows long enough for the jammed tile (whole tiles and the ragged
last one), rows just too short for it, and rows shorter than one vector of lanes; NaN and infinities in a lane,
in the remainder, in a whole tile's rows and in the ragged tile's; every helper type. References: the naive
evaluator (the IR interpreter of test_lower) and NumPy (exact: a max picks one of its values)."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from corpus import analysed
from loop_backends import c_param, c_unavailable
from test_lower import assert_close, run_kernel, signature

import tullax
from tullax.backends.c.generate import STREAMS_ENV, lowered
from tullax.compiler.guards import find_guards
from tullax.compiler.jam import RegisterTile, _long_enough
from tullax.compiler.loops import INDEX, Accum, If, Load, Loop, Var, binop, const, walk_stmts
from tullax.compiler.schedule import STREAM_MIN_BYTES, STREAM_ROWS, loop_order, schedule
from tullax.testing.oracle import naive_eval

ROW_MAX = "(max) m[i] := x[i,j]"
ITEMSIZE = {"float32": 4, "float64": 8, "int32": 8, "int64": 8}  # of what each computes in (int32: int64)


def _plan(text: str, dtype: str = "float32", streams: bool = True):
    spec = analysed(text)
    guards = find_guards(spec, loop_order(spec)[1])
    return schedule(spec, dtype, guards, tile=True, streams=streams)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_long_max_and_min_rows_are_streamed_when_asked(dtype: str):
    trips = STREAM_MIN_BYTES // ITEMSIZE[dtype]
    for text in (ROW_MAX, "(min) m[b,i] := x[b,i,j]", "(max) m[i] := x[i,j] |> abs(_)"):
        assert _plan(text, dtype).register == (RegisterTile("i", STREAM_ROWS, min_trips=trips),), text
        assert _plan(text, dtype, streams=False).register == ()
    # y[j], shared by the rows: tiled by the rule for shared loads, at any length (its lanes are the streams')
    for streams in (True, False):
        assert _plan("(max) m[i] := abs(x[i,j] - y[j])", dtype, streams).register == (RegisterTile("i", 4),)


def test_streams_leave_other_kernels_alone():
    assert _plan("s[i] := x[i,j]").register == ()  # a sum: no lanes to take several rows
    assert _plan("(max) m[j] := x[i,j]").register == ()  # strided rows: strip-mined instead
    assert _plan("(max) m[i] := x[j,i]").register == ()
    assert _plan("(max) m[i,k] := x[i,j]*w[j,k]").register == ()  # strip-mined over k


def _rows(kernel) -> list[If]:
    return [s for s in walk_stmts(kernel.body) if isinstance(s, If) and "_r0" in repr(s.cond)]


@pytest.mark.parametrize("rows, length", [(9, 1030), (4, 1024), (6, 1023), (3, 1500), (7, 5)])
def test_streamed_rows_match_naive(rows: int, length: int):
    """float64 (tiles of rows of 1024 or more): whole tiles, the ragged last tile, rows one short of the
    condition, fewer rows than a tile, rows shorter than a vector of lanes."""
    spec = analysed("(max) m[b,i] := abs(x[b,i,j]) * 2")
    kernel = lowered(spec, signature(spec, "float64"), "kernel", streams=True)
    (tile,) = _rows(kernel)
    assert "1024" in repr(tile.cond)
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((2, rows, length))
    out = np.full((2, rows), np.nan)
    run_kernel(kernel, spec, out, [x])
    assert_close(out, naive_eval(spec, {"x": x}))


def test_the_length_condition_is_known_where_it_can_be():
    """The condition stands before the body: an innermost loop whose bounds read a local of the body (an outer
    loop's index) or that runs a constant count too short gets no tile; a constant count long enough, no
    condition."""
    n, outer = Var("n", INDEX), Var("k", INDEX)
    access = Accum("acc", "max", Load("x", (outer,), "float64"))

    def body(stop) -> tuple:
        return (Loop("k", const(0), n, False, (Loop("j", const(0), stop, False, (access,)),)),)

    assert _long_enough(body(outer), 1024) is None
    assert _long_enough(body(const(3)), 1024) is None
    assert _long_enough(body(const(2048)), 1024) == []
    (condition,) = _long_enough(body(n), 1024)
    assert condition == binop(">=", n, const(1024))
    assert _long_enough(body(n), 0) == []
    spec = analysed("(max) m[i] := x[i, mod(j+k)]", {"k": 3})  # its innermost loop: k, 3 iterations
    assert not _rows(lowered(spec, signature(spec, "float64"), "kernel", streams=True))


def _values(dtype: str, rows: int, length: int) -> np.ndarray:
    rng = np.random.default_rng(length)
    at = [k % length for k in (3, 5, 7, 9, 10)]
    if dtype.startswith("int"):
        info = np.iinfo(dtype)
        x = rng.integers(-1000, 1000, (rows, length)).astype(dtype)
        x[1, at[1]], x[2, -1] = info.max, info.min  # the extremes, in a lane and in the remainder
        return x
    x = rng.standard_normal((rows, length)).astype(dtype)
    x[0, at[0]] = np.nan  # a whole tile's row: in a lane
    x[1, -1] = np.nan  # ... in the remainder
    x[2, :] = -np.inf
    x[3, at[2]] = np.inf
    x[4, max(length - 5, 0)] = np.nan  # in the last vector after the blocks of two (a row of 28: 16 + 8 + 4)
    x[-1, 0] = np.nan  # the ragged tile's last row
    x[-2, at[3]], x[-2, at[4]] = np.inf, -np.inf
    return x


@pytest.mark.parametrize("streamed", [False, True], ids=["rows", "streams"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("backend", [c_param()])
@pytest.mark.parametrize("op", ["max", "min"])
def test_c_rows_match_numpy_on_every_path(op: str, backend: str, dtype: str, streamed: bool, monkeypatch):
    """One row at a time (the default) and, with ``$TULLAX_C_STREAMS=1``, the streams: the module printed is
    the one asked for."""
    from tullax.backends import host
    from tullax.backends.c import backend as c

    if streamed:
        monkeypatch.setenv(STREAMS_ENV, "1")
    monkeypatch.setattr(c, "_BUILDER", host.HostBuilder())  # this process's kernels were built without it
    spec = analysed(f"({op}) m[i] := x[i,j]")
    assert ("_r0" in c.generate_part(spec, signature(spec, dtype).widened(), c.FORWARD)[1]) == streamed
    kernel = tullax.einsum_kernel(f"({op}) m[i] := x[i,j]", backend=backend)
    reference = np.max if op == "max" else np.min
    long = STREAM_MIN_BYTES // ITEMSIZE[dtype]
    for rows, length in ((11, long + 37), (6, long), (7, long - 1), (9, 28), (9, 12), (5, 3)):
        x = _values(dtype, rows, length)
        with np.errstate(invalid="ignore"):
            np.testing.assert_array_equal(np.asarray(kernel(x)), reference(x, axis=1), err_msg=f"{x.shape}")


@pytest.mark.skipif(bool(c_unavailable()), reason="no C compiler")
def test_the_lane_fold_compiles_and_runs_with_the_shuffle_of_older_gcc(tmp_path):
    """GCC before 12 has no ``__builtin_shufflevector``: the prelude falls back to ``__builtin_shuffle``; this
    compiler takes both, so the fallback is forced here and run."""
    from tullax.backends.c import compile as c_compile
    from tullax.printers.c import print_module

    spec = analysed(ROW_MAX)
    source = print_module([lowered(spec, signature(spec, "float32"), "forward", streams=True)])
    condition = "#if defined(__clang__) || __GNUC__ >= 12"
    assert source.count(condition) == 1
    path = tmp_path / "fallback.c"
    path.write_text(source.replace(condition, "#if 0"))
    library = tmp_path / "fallback.so"
    c_compile.compile_library(path, library)
    function = ctypes.CDLL(str(library)).forward
    function.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    for rows, length in ((9, 2100), (5, 40), (6, 3)):
        x = _values("float32", rows, length)
        out = np.zeros(rows, np.float32)
        function(out.ctypes.data, x.ctypes.data, length, rows, length, 1)
        np.testing.assert_array_equal(out, np.max(x, axis=1))
