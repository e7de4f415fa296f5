"""Which random specs the property suites check in this run: a slice of their seeds that moves on every UTC day,
so successive CI runs check new specs (over five days, five times as many distinct specs as one run) while one
run stays cheap and a day's runs check the same ones. ``PROPERTY_ROTATION=<n>`` pins the slice: a failure's
message names the rotation it ran, so the run is repeated exactly; a spec that fails goes into
tests/previously_failed.txt once fixed, which every run replays."""
from __future__ import annotations

import datetime
import os

ROTATION_ENV = "PROPERTY_ROTATION"  # a test setting, not a TULLAX_* library one


def rotation() -> int:
    """This run's rotation: ``PROPERTY_ROTATION``, else the UTC day's number."""
    pinned = os.environ.get(ROTATION_ENV, "").strip()
    return int(pinned) if pinned else datetime.datetime.now(datetime.timezone.utc).date().toordinal()


def seeds(count: int, shard: int = 0, shards: int = 1) -> list[int]:
    """``count`` seeds of shard ``shard`` of ``shards`` for this run: disjoint across shards and across
    rotations (rotation r takes the r-th block of ``count`` seeds of each shard)."""
    first = rotation() * count
    return [(first + k) * shards + shard for k in range(count)]


def label() -> str:
    """What a failure message adds so the run can be repeated."""
    return f"(rotation {rotation()}: {ROTATION_ENV}={rotation()} repeats this run)"
