"""``bench.wake_cost``: the same work timed back to back and after sleeps, on a core."""

from __future__ import annotations

import os

from specroute.bench.wake_cost import SLEEPS_MS, measure


def test_the_unit_is_timed_back_to_back_and_after_each_sleep_and_the_core_given_back() -> None:
    before = os.sched_getaffinity(0)
    core = min(before)
    cost = measure(core, seconds=0.05)
    assert os.sched_getaffinity(0) == before
    assert cost.core == core and 1 < cost.busy_us < 100_000
    assert list(cost.woken_us) == [f"{s:g}" for s in SLEEPS_MS]
    assert all(1 < us < 100_000 for us in cost.woken_us.values())
    assert cost.ratio(1.0) == cost.woken_us["1"] / cost.busy_us
    said = cost.note()
    assert f"on core {core}" in said and f"{cost.busy_us:.0f} µs" in said
    assert cost.as_json() == {"core": core, "busy_us": cost.busy_us, "woken_us": cost.woken_us}
