"""Samples taught by another drafter: each speculative sample carries its server's accept
length at its end, through the workers' rings and the peer replicas' answers, and a fit
leaves out those far from the speculative servers' accept length now, without forgetting
them."""

from __future__ import annotations

import math
from typing import Any

import pytest
from prometheus_client import generate_latest

from specroute.online.estimator import ACCEPT_TOLERANCE, Online, OnlineMode, Sureness
from specroute.online.samples import Sample, Samples, taught_elsewhere
from specroute.policies.view import BackendView, View
from specroute.router.app import build_state
from specroute.router.online.live_profile import Serving, live_profile
from specroute.router.online.peer_answer import answer, parse
from specroute.router.online.published import published, take
from specroute.router.online.rings import Rings
from specroute.router.settings import RouterSettings

MIN = 8  # live samples a level counts with


def taught(accept: float | None, per_level: int = MIN, start: float = 0.0) -> list[Sample]:
    """``per_level`` samples of each pool at loads 1, 2 and 4, the speculative ones at
    ``accept``: speculation pays at every load (a bound above)."""
    out: list[Sample] = []
    at = start
    for level in (1.0, 2.0, 4.0):
        for _ in range(per_level):
            at += 0.01
            out.append(Sample(at, "spec", level, 0.010, 100, accept))
            out.append(Sample(at, "base", level, 0.014, 100))
    return out


def online(tolerance: float = ACCEPT_TOLERANCE) -> Online:
    found = Online(OnlineMode.OBSERVE, Samples(4096, 600.0), Sureness(MIN), per_level=64)
    found.accept_tolerance = tolerance
    return found


def spec_counted(found: Online) -> int:
    return sum(level.samples for level in found.fits[0].curves["spec"])


@pytest.mark.parametrize(
    ("own", "now", "left_out"),
    [
        pytest.param(3.0, 1.6, True, id="taught-at-3.0-read-at-1.6"),
        pytest.param(3.0, 2.9, False, id="within-reading-noise"),
        pytest.param(3.0, 3.0 / (1 + ACCEPT_TOLERANCE) + 0.01, False, id="just-within"),
        pytest.param(1.6, 3.0, True, id="acceptance-rose"),
        pytest.param(None, 1.6, False, id="no-accept-length"),
        pytest.param(3.0, None, False, id="none-known-now"),
    ],
)
def test_a_speculative_sample_is_left_out_only_far_from_the_accept_length_now(
    own: float | None, now: float | None, left_out: bool
) -> None:
    sample = Sample(1.0, "spec", 2.0, 0.01, 100, own)
    assert taught_elsewhere(sample, now, ACCEPT_TOLERANCE) is left_out
    assert not taught_elsewhere(sample, now, 0.0)  # 0: the rule is off
    assert not taught_elsewhere(sample._replace(pool="base"), now, ACCEPT_TOLERANCE)


def test_samples_taught_at_3_are_left_out_at_1_6_and_count_again_when_acceptance_is_back() -> None:
    found = online()
    for s in taught(3.0) + taught(None, start=10.0):  # the second: no reading then
        found.record(s)
    everyone = 2 * 3 * MIN
    found.refit(20.0, None, True, accept_length=2.9)
    assert (found.left_out, spec_counted(found)) == (0, everyone)
    found.refit(25.0, None, True, accept_length=1.6)
    assert found.left_out == 3 * MIN and spec_counted(found) == 3 * MIN  # those without one
    assert found.accept_length == 1.6
    assert len(found.samples) == 4 * 3 * MIN  # left out of the fit, not forgotten
    drafter = found.describe(25.0)["drafter"]
    assert drafter == {"accept_length": 1.6, "tolerance": ACCEPT_TOLERANCE, "samples_left_out": 24}
    found.refit(30.0, None, True, accept_length=3.1)  # acceptance comes back
    assert (found.left_out, spec_counted(found)) == (0, everyone)
    found.refit(35.0, None, True)  # no accept length known: every sample counts
    shown = found.describe(35.0)["drafter"]
    assert (shown["samples_left_out"], shown["accept_length"]) == (0, None)


def test_a_tolerance_of_0_leaves_none_out() -> None:
    found = online(0.0)
    for s in taught(3.0):
        found.record(s)
    found.refit(20.0, None, True, accept_length=1.6)
    assert (found.left_out, spec_counted(found)) == (0, 3 * MIN)


def test_a_level_left_with_too_few_new_samples_takes_the_profile_s_value_not_the_old_ones() -> None:
    """After the drop, the old drafter's samples would hold a level's median; left out, the
    new ones count there from ``MIN`` on, wherever the old ones were more."""
    found = online()
    for s in taught(3.0, per_level=40):
        found.record(s)
    slow = [Sample(50.0 + i, "spec", 2.0, 0.020, 100, 1.6) for i in range(MIN)]
    for s in slow:
        found.record(s)
    found.refit(60.0, None, True, accept_length=1.6)
    at_2 = next(level for level in found.fits[0].curves["spec"] if level.level == 2.0)
    assert (at_2.samples, at_2.median) == (MIN, 0.020)  # the old 40 at 0.010 do not outvote


def test_the_fit_s_accept_length_and_the_samples_left_out_are_shown_everywhere() -> None:
    """The status page (every worker's, through the leader's published fit), the gauges and
    the live profile document say the same numbers."""
    given: dict[str, Any] = {"spec": ["http://a:1"], "base": ["http://b:1"], "crossover": 8}
    state = build_state(RouterSettings(**given, online_min_samples=MIN))
    leader = state.online
    for s in taught(3.0) + taught(1.6, start=10.0):
        leader.record(s)
    leader.refit(20.0, None, True, accept_length=1.6)
    assert leader.left_out == 3 * MIN
    follower = online()
    take(follower, None, published(leader))
    assert follower.describe(20.0)["drafter"]["samples_left_out"] == 3 * MIN
    assert follower.accept_length == 1.6
    text = generate_latest(state.metrics.exposed).decode()
    assert 'specroute_online_samples_left_out{reason="other_drafter"} 24.0' in text
    assert "specroute_online_fit_accept_length 1.6" in text
    serving = Serving({"spec": ("a",), "base": ("b",)}, {"spec": None, "base": None}, 1.6)
    document = live_profile(leader, None, serving, 20.0, "2026-12-02T00:00:00+00:00")
    drafter = document["measurement"]["drafter"]
    assert (drafter["accept_length"], drafter["samples_left_out"]) == (1.6, 3 * MIN)


def test_the_rings_and_a_peer_s_answer_carry_a_sample_s_accept_length() -> None:
    rings = Rings(1, 8)
    given = [Sample(1.0, "spec", 2.0, 0.01, 300, 2.75), Sample(2.0, "base", 3.0, 0.02, 40)]
    for s in given:
        rings.add(s)
    assert rings.fresh() == given  # unknown stays unknown: None, not NaN
    written = answer("e", "e:2", given, now=5.0)
    assert [row["accept_length"] for row in written["samples"]] == [2.75, None]
    read = parse(written, received=100.0, max_age=600.0)
    assert [s.accept_length for s in read.samples] == [2.75, None] and read.dropped == 0


def _row(**given: Any) -> dict[str, Any]:
    return {"age": 1.0, "pool": "spec", "load": 2.0, "tpot": 0.01, "context": 300} | given


def test_an_answer_without_accept_lengths_still_reads_and_a_bad_one_is_dropped() -> None:
    """A replica that sends no accept length (of a version before it) is read as unknown;
    one that sends a value not above 0, or not a number, loses that row, counted."""
    rows = [_row(), _row(accept_length=None), _row(accept_length=0.0), _row(accept_length="3")]
    rows.append(_row(accept_length=math.inf))
    read = parse({"epoch": "e", "next": "e:5", "samples": rows}, 100.0, 600.0)
    assert [s.accept_length for s in read.samples] == [None, None] and read.dropped == 3


def test_the_accept_length_now_is_the_healthy_speculative_servers_mean_within_an_age() -> None:
    view = View(
        (
            BackendView("s1", "spec", True, 0, accept_length=1.5, accept_length_age=1.0),
            BackendView("s2", "spec", True, 0, accept_length=1.7, accept_length_age=2.0),
            BackendView("s3", "spec", False, 0, accept_length=3.0),  # ejected
            BackendView("s4", "spec", True, 0, accept_length=3.0, accept_length_age=900.0),
            BackendView("s5", "spec", True, 0),  # no reading
            BackendView("b1", "base", True, 0, accept_length=1.0),
        )
    )
    assert view.accept_length(600.0) == pytest.approx(1.6)
    assert View(()).accept_length() is None


def test_the_tolerance_is_a_setting_that_refuses_a_negative_value() -> None:
    given: dict[str, Any] = {"spec": ["http://a:1"], "base": ["http://b:1"], "crossover": 8}
    assert RouterSettings(**given).online.accept_tolerance == ACCEPT_TOLERANCE
    wider = build_state(RouterSettings(**given, online_accept_tolerance=0.4))
    assert wider.online.accept_tolerance == 0.4
    with pytest.raises(ValueError, match="online_accept_tolerance"):
        RouterSettings(**given, online_accept_tolerance=-0.1)


def test_an_accept_length_read_at_another_depth_is_not_compared() -> None:
    """An adaptive server's accept length falls with its depth, not with its drafter: a
    sample read at depth 3 is not left out beside a pool at depth 1 whose accept length is
    far lower; one read at depth 1 is, and one of unknown depth is compared as before."""
    at_3 = Sample(0.0, "spec", 4.0, 0.02, 900, 2.6, 0.0, 3.0)
    at_1 = at_3._replace(accept_length=2.0, depth=1.0)
    unknown = at_3._replace(depth=None)
    now = 1.05  # the pool's accept length now, at depth 1
    assert not taught_elsewhere(at_3, now, ACCEPT_TOLERANCE, depth=1.0)
    assert taught_elsewhere(at_1, now, ACCEPT_TOLERANCE, depth=1.0)
    assert taught_elsewhere(unknown, now, ACCEPT_TOLERANCE, depth=1.0)
    assert taught_elsewhere(at_3, now, ACCEPT_TOLERANCE)  # the pool's depth unknown
    rings = Rings(1, 4)
    rings.add(at_3)
    assert rings.after(None)[0] == [at_3]  # the depth survives the shared ring
