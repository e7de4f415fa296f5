"""The work estimate (``tullax.backends.workload``) counts what a reduction takes per term: a logsumexp's exp.
Counted as one read per term, a 2048x1024 logsumexp (2M) sat below the one-thread threshold (the loops ran it on
one core on c and numba) and below the planner's untimed threshold (``auto`` never raced it against XLA), and lost
to jnp (benchmarks/auto_losses.py)."""
from __future__ import annotations

from tullax.backends import workload
from tullax.planner import decide, tuning
from tullax.planner.call import Call
from tullax.spec.frontend import compile_spec

LSE = "(logsumexp) l[i] := x[i,j]"


def test_a_logsumexp_counts_an_exp_per_term():
    _, lse = compile_spec(LSE)
    _, total = compile_spec("s[i] := x[i,j]")
    _, exp = compile_spec("s[i] := exp(x[i,j])")
    assert workload.body_cost(lse) > workload.body_cost(exp) > workload.body_cost(total)
    shapes = {"x": (2048, 1024)}
    assert not workload.runs_serially(lse, shapes)  # a thread team, on the c and numba loops alike
    assert workload.runs_serially(total, {"x": (1024, 1024)})  # a plain row sum of the same size stays serial


def test_auto_races_a_large_logsumexp(monkeypatch):
    monkeypatch.setenv(tuning.TIMING_ENV, "1")
    _, lse = compile_spec(LSE)
    call = Call.of(lse, {"x": (2048, 1024)}, {"x": "float32"}, "c")
    assert call.work >= tuning.UNTIMED_WORK
    settled = decide._settle(call, True, counted=False)
    assert isinstance(settled, decide._Race), settled
    assert set(settled.close) == {"loops", "xla:grid"}


def test_a_recurrence_that_sums_nothing_runs_on_one_thread_longer():
    """A lane-wise scan streams its arrays (memory-bound): 16x1024x64 float32 (5.2M estimated operations, above
    TEAM_WORK) stays on one thread; a mixing scan of that work (a sum inside each step) still gets a team."""
    lru = compile_spec("h[b,t,n] := lam[n]*h[b,t-1,n] + x[b,t,n]  (t scan from h0)")[1]
    shapes = {"lam": (64,), "x": (16, 1024, 64), "h0": (16, 64)}
    assert workload.work(lru, shapes) > workload.TEAM_WORK
    assert workload.runs_serially(lru, shapes)
    assert not workload.runs_serially(lru, {"lam": (64,), "x": (16, 8192, 64), "h0": (16, 64)})
    elman = compile_spec("h[b,t,n] := W[n,m]*h[b,t-1,m] |> tanh(_ + x[b,t,n])  (t scan)")[1]
    assert not workload.runs_serially(elman, {"W": (64, 64), "x": (16, 256, 64)})
