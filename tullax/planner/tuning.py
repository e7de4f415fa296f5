"""Every threshold, ratio and budget of the planner: each with one line of why and the benchmark (script, and
result file where one is kept) that sets it. The planner reads them as ``tuning.NAME`` when it runs, so a test
may set one for its own race."""
from __future__ import annotations

from tullax import settings

TIMING_ENV = "TULLAX_PLAN_TIMING"  # "0" (or false, no, off): close calls take their rule's default, untimed

# A close call of more estimated work is timed on a slice of this much: tens of ms of loops per run, so a race
# costs well under a second; not smaller, or XLA's temporaries fit in cache on the slice and not in full
# (benchmarks/planner_check.py, benchmarks/ttfk_breakdown.py).
SLICE_WORK = 1 << 30
# A contraction's race (einsum against its broadcast product) is sliced only beyond this: BLAS runs 2^30
# operations in milliseconds and an odd slice extent changes which kernel wins (benchmarks/planner_check.py).
CONTRACTION_SLICE_WORK = 1 << 34
# Below this estimated work a close call is not timed: every candidate runs in a fraction of a millisecond and
# the race's compiles cost far more (benchmarks/ttfk_breakdown.py).
UNTIMED_WORK = 1 << 22
TIMING_RUNS = 5  # interleaved rounds at most: enough to outvote one busy round (benchmarks/race_stretch.py)
TIMING_BUDGET_S = 0.3  # no new round after this long (at least 2 rounds), bounding a first call's race
CONFIRM_RATIO = 4.0  # an XLA form that won on a slice by less is confirmed on the full call (planner_check.py)
# After two rounds a candidate this much slower than the fastest is dropped: two interleaved rounds agreeing on
# a lead this wide are a decision (benchmarks/ttfk_timeline.py, the race's share of a first call).
DROP_RATIO = 1.5
# After the first round (one timed run each) only one this much slower is dropped: one run may fall in a busy
# spell, and the decision is kept for every later process (benchmarks/planner_check.py).
FIRST_DROP_RATIO = 10.0
# A candidate faster than this runs once untimed per round: that run pays for the switch from the candidate
# before it (threads still spinning), which a program calling one kernel again and again does not
# (benchmarks/race_stretch.py, benchmarks/results/race_stretch.json).
SETTLE_MS = 5.0
# ... then is timed on up to SAMPLES runs in a row within SAMPLE_MS (a contender, within CLOSE_RATIO of the
# fastest) or SCOUT_SAMPLE_MS (one further behind), keeping the best: shorter stretches let the slowdown after
# a switch decide races (benchmarks/race_stretch.py, benchmarks/results/race_stretch.json).
SAMPLES = 64
SAMPLE_MS = 10.0
SCOUT_SAMPLE_MS = 3.0
# An XLA candidate whose compiled program needs more temporary memory than this is neither run nor chosen: a
# contraction's 'product' form is one fused kernel where XLA fuses it and every index point where it does not.
MAX_TEMP_BYTES = 256 << 20
# A race makes its candidates ready (compiles them) within this multiple of what the loops alone took to compile,
# and at least RACE_COMPILE_FLOOR_S; past it the plan is the rule's default: a first call's race once took 16-81 s
# under load where the loops compiled in 0.1-5 s (benchmarks/race_budget.py, benchmarks/results/race_budget.json).
RACE_COMPILE_RATIO = 3.0
RACE_COMPILE_FLOOR_S = 2.0
RACE_POLL_S = 0.02  # how often a race waiting for a compile looks at its budget
# XLA's broadcast lowering is a candidate only up to this many index-space points: it may materialise them
# (1 GiB of float32 at the limit; the suite's Dist is beyond it: benchmarks/run.py, benchmarks/results/latest.json).
GRID_ITERATIONS = 1 << 28
# A differentiated forward and its gradient steps run as one XLA program when each runs on XLA or its loops won
# by less than this: one program has no callback between them and XLA fuses across (benchmarks/auto_vs_xla.py).
JOINT_MARGIN = 1.15
# The loops win a race only when faster than the fastest XLA form by this factor: XLA needs no host callback
# and fuses with the program around it, and one race cannot tell a few percent apart (benchmarks/auto_vs_xla.py).
LOOP_MARGIN = 1.05
# A race whose runner-up came within this factor of the winner is a close call, raced again by the next
# processes (each keeping the best time per candidate) until CONFIRMING_RACES races stand behind it: a spell
# in which the host slows a kernel 2x can decide one race (benchmarks/race_stretch.py).
CLOSE_RATIO = 2.0
CONFIRMING_RACES = 3


def timing_enabled() -> bool:
    """Whether close calls are timed (``TULLAX_PLAN_TIMING``, on unless 0, false, no or off)."""
    return settings.value(TIMING_ENV)
