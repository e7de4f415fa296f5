"""Kernels under jax.jit on sharded inputs are split by JAX's SPMD partitioner along their indices
(``tullax.jaxop.partition``): no operand is gathered along a free index, each device holds its block of the
result, the result is sharded as jnp's formulation's is, and summed indices split across devices are combined by
the reduction's collective. Results and gradients are checked against the jnp formulation in the subprocess
(``tests/sharding_script.py``: 4 host devices, which must be set before jax starts)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from tests.loop_backends import c_unavailable

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("c", "numba", "xla", "auto")  # one subprocess runs them all
# Splits the kernel cannot run blockwise, where the partitioner gathers that one axis (none among the cases now: a
# table's rows read or written through an index array are split too)
GATHERED: set[str] = set()
# Gradients that gather (none now: the hand-written w gradient's x gradient, whose padded window ran over all of
# Δy and gathered it, runs over the 5-element cotangent and exchanges a halo of Δy, ``tullax.jaxop.swap_window``)
GRAD_GATHERED: set[str] = set()


@lru_cache(maxsize=None)
def report(*arguments: str) -> dict:
    if c_unavailable():
        pytest.skip(f"c backend: {c_unavailable()}")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TULLAX_PLAN_TIMING": "0"}
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "sharding_script.py"), *(arguments or BACKENDS)],
                          env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cases(backend: str) -> dict:
    found = {key.split("/", 1)[1]: value for key, value in report().items()
             if key.startswith(backend + "/") and "/conv2d/" not in key}
    assert len(found) >= 15, sorted(found)
    return found


@pytest.mark.parametrize("backend", BACKENDS)
def test_split_kernels_gather_nothing_and_shard_as_jnp(backend: str) -> None:
    for case, found in _cases(backend).items():
        if case in GATHERED or case.startswith("vmap/"):
            continue
        assert found["same_sharding"], f"{case}: result {found['sharding']}, jnp's {found['ref_sharding']}"
        assert "all-gather" not in found["collectives"], f"{case}: {found['collectives']}"
        assert "all-gather" not in found["grad_collectives"] or case in GRAD_GATHERED, \
            f"{case} gradient: {found['grad_collectives']}"
        assert set(found["collectives"]) <= set(found["ref_collectives"]), \
            f"{case}: {found['collectives']} where jnp needs {found['ref_collectives']}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_device_holds_its_block(backend: str) -> None:
    for case, found in _cases(backend).items():
        if case in GATHERED or found["sharding"] in ("P()", "PartitionSpec()"):
            continue
        assert found["local"] != found["shape"] and \
            [n // 4 if n != m else n for n, m in zip(found["shape"], found["local"])] == found["local"], case


@pytest.mark.parametrize("backend", BACKENDS)
def test_summed_index_split_is_combined_once(backend: str) -> None:
    """A split summed index: each device reduces its block, one all-reduce combines them (as jnp's)."""
    cases = _cases(backend)
    for case in ("dist/k", "linear/i", "logsumexp/j", "rowmax/j", "dot/i"):
        assert cases[case]["collectives"] == ["all-reduce"], (case, cases[case])
        assert cases[case]["sharding"] == "P()", (case, cases[case])


@pytest.mark.parametrize("backend", BACKENDS)
def test_vmap_and_its_gradient_split_along_the_batch(backend: str) -> None:
    """vmap of a partitioned kernel (Dist, row logsumexp, conv1d) split along the batch: each device its block,
    no collective forward; the gradient split too (an unbatched input's gradient summed over the batch: one
    all-reduce, as jnp's), never more bytes than the vmapped jnp formulation's."""
    cases = _cases(backend)
    for case in ("vmap/batch", "vmap/logsumexp", "vmap/conv1d"):
        found = cases[case]
        assert found["sharding"] == "P('x',)" and found["grad_sharding"] == "P('x',)", (case, found)
        assert found["collectives"] == [] and "all-gather" not in found["grad_collectives"], (case, found)
        assert found["local"][0] * 4 == found["shape"][0], (case, found)
        assert sum(found["grad_bytes"].values()) <= sum(found["ref_grad_bytes"].values()), (case, found)
    assert cases["vmap/logsumexp"]["grad_collectives"] == [], cases["vmap/logsumexp"]
    for case in ("vmap/batch", "vmap/conv1d"):  # the shared X's and w's gradients: one all-reduce, as jnp's
        assert cases[case]["grad_collectives"] == cases[case]["ref_grad_collectives"] == ["all-reduce"], cases[case]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_window_split_exchanges_its_halo_with_the_neighbour(backend: str) -> None:
    """conv1d split along i: each device gets the first k-1 elements of its right neighbour's block (a
    collective-permute), never the whole axis (an all-gather), and holds its block of the result, as jnp's."""
    found = _cases(backend)["conv1d/i"]
    assert found["collectives"] == ["collective-permute"] == found["ref_collectives"], found
    assert found["sharding"] == found["ref_sharding"] == "P('x',)" and found["local"] == [8], found


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_split_kernel_moves_more_bytes_than_jnp(backend: str) -> None:
    """The bytes the compiled program's collectives move (per device, from its HLO) are never more than the jnp
    formulation's: conv1d's halo exchange takes from each neighbour what the window needs of the input as it is
    split (a slice of it to the result's length was re-blocked by the partitioner first: 56 bytes to jnp's 48)."""
    for case, found in _cases(backend).items():
        if case.startswith("vmap/"):  # test_vmap_and_its_gradient_split_along_the_batch
            continue
        for kind in ("", "grad_"):
            ours, theirs = sum(found[kind + "bytes"].values()), sum(found[f"ref_{kind}bytes"].values())
            assert ours <= theirs, f"{case} {kind}: {found[kind + 'bytes']} where jnp moves {found[f'ref_{kind}bytes']}"
    assert _cases(backend)["conv1d/i"]["bytes"] == {"collective-permute": 48}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_hand_written_padded_window_splits_its_longer_index(backend: str) -> None:
    """``Δw[k] := Δy[i]*x[pad(i+k-2)]`` written by hand (k's range reads x's extent) split along i: the window is
    taken along the short k and i is split as the derived gradient's is: one halo exchange and one all-reduce
    (72 bytes, as jnp's w gradient; x was gathered before, 576 bytes). Its x gradient
    ``Δx[m] := ΔΔw[pad(m-i+2)]*Δy[i]`` runs over the 5-element cotangent instead, ``Δy[pad(m-k+2)]``: Δy's halo
    exchanged, no all-gather (136 bytes in all to jnp's 424; Δy was gathered before, 424)."""
    found = _cases(backend)["wgrad/i"]
    assert found["bytes"] == {"collective-permute": 32, "all-reduce": 40}, found
    assert found["grad_bytes"] == {"collective-permute": 96, "all-reduce": 40}, found
    assert sum(found["grad_bytes"].values()) <= sum(found["ref_grad_bytes"].values()), found


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_table_split_by_rows_is_looked_up_where_it_lies(backend: str) -> None:
    """An embedding with its table split by rows: each device looks up only the rows it holds (zero for the
    others), then one all-reduce of the result, as jnp's (the table was all-gathered: 1024 bytes to jnp's 768);
    its scatter (the gradient's form) with the table split by rows adds only into each device's rows, no
    collective at all (an all-gather of 1024 bytes before)."""
    found = _cases(backend)
    assert found["embedding/row"]["bytes"] == found["embedding/row"]["ref_bytes"] == {"all-reduce": 768}, found
    assert found["scatter/row"]["bytes"] == {} and found["scatter/row"]["local"] == [4, 8], found["scatter/row"]
    for case in ("embedding/row", "scatter/row"):
        assert "all-gather" not in found[case]["grad_collectives"], (case, found[case])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_padded_window_split_exchanges_a_halo_too(backend: str) -> None:
    """conv1d's input gradient (Δx[m] := Δy[pad(m-k)]*w[k]) split along m: each device reads Δy around its
    block (from both neighbours, zero outside the axis) instead of gathering Δy whole."""
    found = _cases(backend)["conv1d/i"]
    assert "all-gather" not in found["grad_collectives"], found
    assert found["grad_bytes"]["collective-permute"] <= found["ref_grad_bytes"]["collective-permute"], found


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["stencil/i", "conv_same/i"])
def test_padded_windows_over_the_arrays_own_extent_exchange_halos(backend: str, case: str) -> None:
    """Padded windows over the array's own extent (a stencil: ``x[pad(i-1)]``, ``x[i]`` and ``x[pad(i+1)]``, several
    on one index; a "same" convolution, ``x[pad(i+k-2)]``), split along i: each device runs the kernel over its
    block and the frame around it, from its neighbours' halos, and keeps its block; the gradient for w splits the
    summed i with its padded window the same way (each device's sum over its block, one all-reduce). No
    all-gather, forward or gradient, and no more bytes than jnp's (all-gathered before)."""
    found = _cases(backend)[case]
    assert found["collectives"] == ["collective-permute"] and found["sharding"] == "P('x',)", found
    assert found["local"] == [8], found
    assert "all-gather" not in found["grad_collectives"], found
    for kind in ("", "grad_"):
        assert sum(found[kind + "bytes"].values()) <= sum(found[f"ref_{kind}bytes"].values()), (kind, found)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_window_in_two_split_indices_exchanges_a_halo_along_each(backend: str) -> None:
    """conv2d on a 2x2 mesh, x split along both spatial axes: two halo exchanges (collective-permutes, the
    corner with the second), no all-gather, each device its (8, 8) block of the result, as lax's convolution."""
    found = report()[f"{backend}/conv2d/i+j"]
    assert found["sharding"] == "P('a', 'b')" and found["local"] == [8, 8], found
    assert found["collectives"] == ["collective-permute"] == found["ref_collectives"], found
    assert sum(found["bytes"].values()) <= sum(found["ref_bytes"].values()), found
    assert "all-gather" not in found["grad_collectives"], found  # the padded window of Δx exchanges a halo too
    assert sum(found["grad_bytes"].values()) <= sum(found["ref_grad_bytes"].values()), found


@pytest.mark.parametrize("backend", BACKENDS)
def test_explicit_sharding_types_the_result_by_the_rule_or_says_what_to_reshard(backend: str) -> None:
    """Under AxisType.Explicit the kernel's result type is its rule's (split along a free index, whole along a
    summed one, split with a halo along a window); what it cannot run split is a TullaxError at trace time."""
    found = {key.split("/", 2)[2]: value for key, value in report().items() if key.startswith(f"explicit/{backend}/")}
    assert found["dist/i"]["type"] == "float64[16@x,12]" and found["dist/i"]["collectives"] == [], found["dist/i"]
    assert found["dist/i"]["grad_type"] == "float64[8,16@x]", found["dist/i"]
    assert found["dist/k"]["type"] == "float64[16,12]" and found["dist/k"]["collectives"] == ["all-reduce"]
    assert found["conv1d/i"]["type"] == "float64[32@x]", found["conv1d/i"]
    assert found["conv1d/i"]["collectives"] == ["collective-permute"], found["conv1d/i"]
    assert found["embedding/b"]["type"] == "float64[12@x,8]", found["embedding/b"]
    assert "reshard" in found["dist/i+j"]["error"] and "splits both index i and index j" in found["dist/i+j"]["error"]
    assert found["embedding/row"]["type"] == "float64[12,8]", found["embedding/row"]  # rows summed: whole
    # a result axis the mesh does not divide was typed whole and gathered without a word
    assert "does not divide the result y's axis 0 (33 elements)" in found["conv1d/uneven"]["error"], found
    assert "Reshard" in found["conv1d/uneven"]["error"], found


def test_every_corpus_spec_split_along_each_axis_equals_the_unsplit_call() -> None:
    """... and for a handful of them (sharding_script.GRADED) the gradient split equals the unsplit one, and an
    input split along a free index leaves no all-gather in the compiled forward or gradient program."""
    found = report("corpus")["corpus"]
    assert found["checked"] > 100 and found["wrong"] == [], "\n".join(found["wrong"])
    assert found["graded"] >= 10, found


@pytest.mark.parametrize("text, rule, free, summed", [
    ("D[i,j] := (W[k,i] - X[k,j])^2", "f0 f1, f0 f2 -> f1 f2", ("f1", "f2"), ("f0",)),
    ("(logsumexp) r[i] := x[i,j]", "f0 f1 -> f0", ("f0",), ("f1",)),
    ("y[i] := x[i+k]*w[k]", "r0, f0 -> f1", ("f1",), ()),  # a window: i split with a halo of x, k whole
    ("Δw[k] := Δy[i]*x[i+k]", "f0, r0 -> f1", (), ("f0",)),  # the same window under a summed i
    ("y[i] := x[i+1]-x[i]", "r0 -> f0", (), ()),  # read plainly and shifted on one axis: kept whole
    ("Δx[m] := Δy[pad(m-k)]*w[k]", "r0, f0 -> f1", ("f1",), ()),  # a padded window over Δy's extent
    ("y[i] := x[pad(i-1)] - 2*x[i] + x[pad(i+1)]", "r0 -> f0", ("f0",), ()),  # three windows of i on one axis
    ("Δw[k] := Δy[i]*x[pad(i+k-2)]", "f0, r0 -> f1", ("f1",), ()),  # no shapes: k (its range reads x's)
    ("y[i] := x[pad(i+1)] + x[pad(j)]", "r0 -> f0", (), ()),  # one axis in windows of two indices: whole
    ("out[b,d] := W[ix[b],d]", "r0 f1, f0 -> f0 f1", ("f0", "f1"), ("r0",)),  # the table's rows: psum'd
    ("ΔW[ix[b],d] += Δout[b,d]", "r0 f1, f0 f1, f0 -> r0 f1", ("f1", "r0"), ("f0",)),  # a scatter sums over b
    ("out[b,d] := exp(W[ix[b],d])", "r0 f1, f0 -> f0 f1", ("f0", "f1"), ()),  # not linear in the read: whole
    ("out[b] := W[ix[b],d]*W[ix[b],d]", "r0 f1, f0 -> f0", ("f0",), ("f1",)),  # read twice: whole
    ("d[i] := A[i,i]", "f0 r0 -> f0", (), ()),  # one index on two axes of one array: a factor each, kept whole
    ("n[i] := x[i,j]^2 |> sqrt", "f0 f1 -> f0", ("f0",), ()),  # a finaliser needs the whole sum
    ("y[i] := i*x[i]", "f0 -> f0", (), ()),  # the body reads the index's value
])
def test_the_sharding_rule_is_read_off_the_notation(text: str, rule: str, free: tuple, summed: tuple) -> None:
    from tullax.jaxop.partition_rule import factors
    from tullax.spec.frontend import compile_spec

    found = factors(compile_spec(text)[1])
    assert (found.text(), found.free, found.summed) == (rule, free, summed)


def test_the_longer_index_of_a_padded_window_is_split() -> None:
    """``pad(i+k-2)``: given the shapes, the index split is the longer one, whichever arrays its range reads."""
    from tullax.jaxop.partition_rule import factors
    from tullax.spec.frontend import compile_spec

    found = factors(compile_spec("Δw[k] := Δy[i]*x[pad(i+k-2)]")[1], {"Δy": (32,), "x": (32,)})
    assert (found.text(), found.free, found.summed, found.halo) == \
        ("f0, r0 -> f1", (), ("f0",), (("r0", "f0", "k", -2, 1),)), found


def test_a_padded_window_over_a_shape_input_splits_its_index() -> None:
    """conv1d's input gradient, Δx[m] := Δy[pad(m-k)]*w[k] with m over x's extent (a shape input): m may be
    split, Δy's axis read around each block (a padded window); read plainly too (the gradient of
    ``x[i+k]*w[k] + x[i]``), Δy's axis is one window spanning both reads."""
    from tullax.grad import gradients
    from tullax.jaxop.partition_rule import factors
    from tullax.spec.frontend import compile_spec

    for text, halo in (("y[i] := x[i+k]*w[k]", (("r0", "f1", "k", 0, -1),)),
                       ("y[i] := x[i+k]*w[k] + x[i]", (("r0", "f1", "k", 0, -1), ("r0", "f1", None, 0, 1)))):
        step = next(g for g in gradients(compile_spec(text)[1]) if g.wrt == "x").steps[-1]
        found = factors(step)
        assert found.free == ("f1",) and found.halo == halo, (text, found)
        assert found.operands[0] == ("r0",) and found.result == ("f1",), found


def test_a_padded_window_over_a_long_summed_index_runs_over_its_own_axis() -> None:
    """The x gradient of the hand-written w gradient, ``Δx[m] := ΔΔw[pad(m-i+2)]*Δy[i]`` (i over Δy's 32, ΔΔw 5):
    read as ``ΔΔw[k]*Δy[pad(m-k+2)]``, k over ΔΔw's axis, m split with a halo of Δy (its window over i was all of
    Δy: gathered); conv1d's input gradient, whose window already runs over w's short axis, is left as it is."""
    from tullax.grad import gradients
    from tullax.jaxop.partition_rule import factors
    from tullax.jaxop.swap_window import swapped
    from tullax.spec.frontend import compile_spec

    step = next(g for g in gradients(compile_spec("Δw[k] := Δy[i]*x[pad(i+k-2)]")[1]) if g.wrt == "x").steps[-1]
    shapes = {item.name: {"x": (32,), "Δy": (32,)}.get(item.name, (5,)) for item in step.inputs}
    found = swapped(step, shapes)
    assert found is not step and factors(found, shapes).halo == (("r0", "f1", "k", 2, -1),), factors(found, shapes)
    assert factors(step, shapes).halo[0][2] == "i", factors(step, shapes)  # before: a window over all of Δy
    conv = next(g for g in gradients(compile_spec("y[i] := x[i+k]*w[k]")[1]) if g.wrt == "x").steps[-1]
    assert swapped(conv, {item.name: {"w": (5,)}.get(item.name, (32,)) for item in conv.inputs}) is conv


@pytest.mark.parametrize("platform, target", [("cpu", "xla_buffer_python_cpu_callback"),
                                              ("cuda", "xla_buffer_python_gpu_callback")])
def test_a_relayed_kernel_calls_the_whole_programs_callback_by_its_index(platform: str, target: str) -> None:
    """Inside a per-shard module a callback kernel (numba, julia, cuda on its GPU) is buffer_callback's custom call
    for the platform, naming the relay's index in the whole program's callbacks, not a slot of its own module
    (lowered here for cuda from this CPU host: no GPU is needed to read the call)."""
    import jax
    import jax.numpy as jnp

    from tullax.jaxop.relay import Relay

    relay = Relay(7)
    result = jax.ShapeDtypeStruct((4,), jnp.float32)
    lowered = jax.jit(lambda x: relay.emit(lambda ctx, out, x: None, result, None, [x])).trace(
        jnp.zeros(4, jnp.float32)).lower(lowering_platforms=(platform,)).as_text()
    assert f'stablehlo.custom_call @{target}' in lowered and "index = 7 : ui64" in lowered, lowered
