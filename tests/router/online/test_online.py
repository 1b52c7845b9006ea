"""Online calibration: the live curves fitted from served requests, by the profile's rule."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from specroute.background import cancel_and_wait
from specroute.crossing import bands, crossing, crossings, log_margin
from specroute.online import estimator as online_module
from specroute.online.estimator import Online, OnlineMode, Sureness
from specroute.online.fit import LiveCrossing, LiveFit, fit
from specroute.online.samples import Sample, Samples
from specroute.policies.profile import Profile, parse_profile, up_to
from specroute.policies.registry import build_policy
from specroute.policies.view import BackendView, RequestInfo, View
from specroute.router.app import build_state
from specroute.router.online.rings import Rings
from specroute.router.processes import Workers, quota_of
from specroute.router.settings import RouterSettings
from specroute.router.state import RouterState
from specroute.router.tasks.online_fits import keep_fitting
from specroute.router.workers.board import Board

LEVELS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
Model = Callable[[str, float], float]


def dense(spec_slope: float = 1 / 8) -> Model:
    """Seconds per token: speculation cheaper at low load, dearer past about 5 (slope
    1/8), or past about 21 (slope 1/16)."""

    def tpot(pool: str, load: float) -> float:
        if pool == "spec":
            return 0.010 * (1 + load * spec_slope)
        return 0.014 * (1 + load / 32)

    return tpot


def true_crossover(model: Model) -> float:
    """The crossover of ``model``'s medians at ``LEVELS``, by the one crossing finder."""
    margin = log_margin([model("spec", c) for c in LEVELS], [model("base", c) for c in LEVELS])
    found = crossing(LEVELS, margin).at
    assert found is not None
    return found


def served(
    model: Model,
    per_level: int,
    start: float = 0.0,
    pools: tuple[str, ...] = ("spec", "base"),
    levels: tuple[float, ...] = LEVELS,
    seed: int = 1,
) -> list[Sample]:
    """``per_level`` requests of each pool at each level, 5% lognormal noise, one a ms."""
    rng = random.Random(seed)
    out, at = [], start
    for level in levels:
        for pool in pools:
            for _ in range(per_level):
                at += 0.001
                noisy = model(pool, level) * math.exp(rng.gauss(0, 0.05))
                out.append(Sample(at, pool, int(level), noisy, 1000))  # type: ignore[arg-type]
    return out


def profile_of(model: Model, ci: tuple[float, float]) -> dict[str, Any]:
    rows = [
        {"concurrency": c}
        | {p: {"tpot_ms": {"median": model(p, c) * 1000}} for p in ("spec", "base")}
        for c in LEVELS
    ]
    return {
        "schema": "specroute.profile/v1",
        "crossover": {"value": true_crossover(model), "ci": list(ci)},
        "levels": rows,
    }


def test_the_live_crossing_is_the_one_crossing_finder_s_and_its_interval_holds_it() -> None:
    model = dense()
    found = fit(served(model, 40), LEVELS, min_samples=10).crossing
    assert found is not None and found.at is not None
    assert found.at == pytest.approx(true_crossover(model), rel=0.05)
    assert found.low is not None and found.high is not None
    assert found.low <= true_crossover(model) <= found.high
    assert (found.low, found.high) == (4.0, 8.0)  # out to the levels around it, as a profile's
    assert found.near == 40 and found.levels == LEVELS


def test_a_level_with_too_few_samples_does_not_count() -> None:
    few = fit(served(dense(), 3), LEVELS, min_samples=10)
    assert few.crossing is None  # no level has ten of either pool
    assert few.curves["spec"][0].samples == 3 and few.curves["spec"][0].median is not None


def test_a_pool_not_seen_at_a_level_takes_the_profile_s_curve() -> None:
    """Under a crossover policy the plain server is seen only above the crossover: its
    profiled curve stands in below, and the speculative server's live one moves the
    crossing (here its TPOT grows twice as fast with load as the profile says)."""
    profiled, drifted = dense(1 / 16), dense(1 / 8)
    spec = served(drifted, 40, pools=("spec",), levels=LEVELS[:4])
    base = served(profiled, 40, pools=("base",), levels=LEVELS[4:], seed=2)
    known = parse_profile(profile_of(profiled, (8.0, 16.0)))
    online = Online(OnlineMode.OBSERVE, Samples(4096, 600.0), Sureness(30, 4.0))
    for s in spec + base:
        online.samples.add(s)
    online.refit(1.0, known, shared=True)
    found = online.fits[0].crossing
    assert found is not None and found.at is not None
    assert found.at == pytest.approx(true_crossover(drifted), rel=0.05)
    assert true_crossover(profiled) > 2 * found.at  # it moved by more than twice
    without = fit(spec + base, LEVELS, min_samples=7).crossing  # no profile: no common level
    assert without is None


def test_the_forgetting_window_follows_drift_by_age_and_by_count() -> None:
    before, after = dense(1 / 16), dense(1 / 8)
    samples = Samples(keep=100_000, max_age=10.0)
    for s in served(before, 40) + served(after, 40, start=20.0, seed=3):
        samples.add(s)
    now = 21.0  # the first run ended 20 s ago, past the window
    found = fit(samples.window(now), LEVELS, min_samples=10).crossing
    assert found is not None and found.at == pytest.approx(true_crossover(after), rel=0.05)
    assert len(samples) == 480  # the old ones are gone for good
    counted = Samples(keep=480, max_age=1e9)
    for s in served(before, 40) + served(after, 40, start=20.0, seed=3):
        counted.add(s)
    found = fit(counted.window(now), LEVELS, min_samples=10).crossing
    assert found is not None and found.at == pytest.approx(true_crossover(after), rel=0.05)


def observed(mode: OnlineMode, model: Model, per_level: int, profile: dict[str, Any]) -> Online:
    online = Online(mode, Samples(4096, 600.0), Sureness(30, 4.0))
    for s in served(model, per_level):
        online.samples.add(s)
    online.refit(1.0, parse_profile(profile), shared=True)
    return online


def test_drift_is_flagged_when_the_intervals_no_longer_meet() -> None:
    drifted, stale = dense(1 / 8), dense(1 / 16)
    assert observed(OnlineMode.OBSERVE, drifted, 40, profile_of(stale, (16.0, 32.0))).drift == (
        True,
    )
    assert observed(OnlineMode.OBSERVE, drifted, 40, profile_of(drifted, (4.0, 8.0))).drift == (
        False,
    )
    thin = observed(OnlineMode.OBSERVE, drifted, 12, profile_of(stale, (16.0, 32.0)))
    assert thin.drift == (False,)  # not sure enough to say


@pytest.mark.parametrize(
    ("mode", "per_level", "adopted"),
    [
        (OnlineMode.ADOPT, 40, True),
        (OnlineMode.OBSERVE, 40, False),  # observe never moves routing
        (OnlineMode.ADOPT, 12, False),  # not sure: fails closed
    ],
)
def test_adopt_routes_by_the_live_crossover_only_when_sure(
    mode: OnlineMode, per_level: int, adopted: bool
) -> None:
    drifted, stale = dense(1 / 8), dense(1 / 16)
    online = observed(mode, drifted, per_level, profile_of(stale, (16.0, 32.0)))
    assert (online.adopted is not None) is adopted
    if adopted:
        assert online.adopted == pytest.approx(true_crossover(drifted), rel=0.05)


def test_adopt_holds_on_with_hysteresis_and_falls_back_when_evidence_thins() -> None:
    drifted, stale = dense(1 / 8), dense(1 / 16)
    online = observed(OnlineMode.ADOPT, drifted, 40, profile_of(stale, (16.0, 32.0)))
    assert online.adopted is not None
    kept = Samples(4096, 600.0)
    for s in served(drifted, 20):  # half as many: not enough to adopt, enough to hold
        kept.add(s)
    online.samples = kept
    online.refit(2.0, parse_profile(profile_of(stale, (16.0, 32.0))), shared=True)
    assert online.adopted is not None
    online.samples = Samples(4096, 600.0)  # the evidence is gone
    online.refit(3.0, parse_profile(profile_of(stale, (16.0, 32.0))), shared=True)
    assert online.adopted is None


def test_a_fit_is_drawn_again_only_when_what_it_is_made_from_changed() -> None:
    """No sample in or out since the last fit, the same accept length, profile and
    crossover routed by: the same fit, kept (its replicates would draw the same); any of
    them changed, a new one."""
    drifted, stale = dense(1 / 8), dense(1 / 16)
    profile = parse_profile(profile_of(stale, (16.0, 32.0)))
    online = observed(OnlineMode.ADOPT, drifted, 40, profile_of(stale, (16.0, 32.0)))
    online.refit(1.0, profile, shared=True)
    kept, adopted = online.fits, online.adopted
    online.refit(2.0, profile, shared=True)
    assert online.fits is kept and online.adopted == adopted and online.fitted_at == 2.0
    online.samples.add(Sample(10.0, "spec", 4, drifted("spec", 4), 1000))
    online.refit(3.0, profile, shared=True)  # one sample more
    assert online.fits is not kept
    kept = online.fits
    online.refit(4.0, profile, shared=True, accept_length=2.0)  # acceptance read anew
    assert online.fits is not kept
    kept, adopted = online.fits, online.adopted
    assert adopted is not None
    online.adopted = None  # as a failed fit leaves it: the next one adopts again
    online.refit(5.0, profile, shared=True, accept_length=2.0)
    assert online.fits is not kept and online.adopted == adopted
    kept = online.fits
    online.refit(1e6, profile, shared=True, accept_length=2.0)  # every sample aged out
    assert online.fits is not kept and online.adopted is None


def around(point: float, low: float | None, high: float | None, near: int = 40) -> LiveCrossing:
    return LiveCrossing(point, low, high, None, None, LEVELS, near)


@pytest.mark.parametrize(
    ("low", "high", "sure"),
    [
        (4.0, 8.0, True),  # between two doubling levels
        (2.0, 8.0, False),  # two doublings: its point is one draw from the span
        (4.0, None, False),  # open
    ],
)
def test_a_live_crossover_is_sure_only_within_one_doubling_of_load(
    low: float, high: float | None, sure: bool
) -> None:
    assert Sureness(30).sure(around(5.0, low, high), holding=False) is sure


def test_a_held_crossover_stays_where_it_is_until_a_sure_fit_moves_it() -> None:
    online = Online(OnlineMode.ADOPT, Samples(16, 600.0), Sureness(30))

    def fitted(found: LiveCrossing) -> float | None:
        online._adopt((LiveFit(None, {}, found, 80),))
        return online.adopted

    assert fitted(around(2.4, 2.0, 4.0)) == 2.4
    assert fitted(around(6.2, 2.0, 8.0, near=20)) == 2.4  # not sure: it does not follow
    assert fitted(around(6.2, 4.0, 8.0)) == 6.2  # sure: it moves
    assert fitted(around(2.4, 1.0, 4.0, near=20)) is None  # no longer holds 6.2: the profile's


def live_at(crossover: float | None) -> tuple[tuple[tuple[float | None, float | None], ...], ...]:
    """The view's live bands of one live crossover, in one context (None: none)."""
    return () if crossover is None else (up_to(crossover),)


def view(load: int, live: float | None) -> View:
    spec = BackendView("s", "spec", True, load)
    return View((spec, BackendView("b", "base", True, 0)), live_bands=live_at(live))


def test_the_crossover_policy_sees_the_live_crossover_through_its_view() -> None:
    policy = build_policy("crossover", {"crossover": 16}, None)
    request = RequestInfo("/v1/chat/completions")
    assert policy.choose(request, view(8, None)).pool == "spec"
    assert policy.choose(request, view(8, 5.0)).pool == "base"  # the live one: lower
    assert policy.choose(request, view(3, 5.0)).pool == "spec"


def test_with_several_workers_each_records_in_its_ring_and_the_leader_alone_fits(
    tmp_path: Path,
) -> None:
    two: dict[str, Any] = {"spec": ["http://a:1"], "base": ["http://b:1"], "workers": 2, "port": 1}
    settings = RouterSettings(**two, crossover=8, online=OnlineMode.ADOPT)  # several workers
    board, rings = Board(2, settings.backends.columns()), Rings(2, settings.online.kept())
    shared = Workers(board, tmp_path, quota_of(settings), rings)
    leader = build_state(settings, shared).online
    board.become(1)  # the second worker, as its process would be
    rings.become(1)
    other = build_state(settings, shared).online
    assert leader.fitting and not other.fitting and leader.records and other.records
    sample = Sample(1.0, "spec", 1, 0.01, 100)
    other.record(sample)
    assert len(other.samples) == 0 and rings.written(1) == 1  # in its ring, for the leader
    leader.refit(2.0, None, shared=True)
    assert leader.samples.window(2.0) == [sample]


def test_live_bands_stand_for_the_profile_s_one_crossover_or_bands() -> None:
    """Adopted live, a crossover replaces a profile's bands and bands replace a profile's
    crossover: what the live evidence found, each edge of it sure, is routed by."""
    request = RequestInfo("/v1/chat/completions")
    one = {"value": 5.2, "ci": [5.2, 5.2], "bands": [[None, 5.2]]}
    banded = {"value": None, "bound": "below", "limit": 1, "bands": [[30, 120]]}
    middle: tuple[tuple[float | None, float | None], ...] = ((8.0, 24.0),)
    cases = (
        (one, 3, live_at(2.0), "base"),
        (banded, 40, live_at(2.0), "base"),
        (banded, 1, live_at(2.0), "spec"),
        (one, 3, (middle,), "base"),  # below the live band's start
        (one, 12, (middle,), "spec"),  # a profile's crossover of 5.2 would not
        (banded, 40, (None,), "spec"),  # None: the profile's stand
    )
    for crossover, load, live, pool in cases:
        profile = parse_profile({"schema": "specroute.profile/v1", "crossover": crossover})
        policy = build_policy("crossover", {}, profile)
        spec = BackendView("s", "spec", True, load)
        seen = View((spec, BackendView("b", "base", True, 0)), live_bands=live)
        assert policy.choose(request, seen).pool == pool, (crossover, load, live)


def test_the_crossover_gauge_says_the_live_one_while_it_is_routed_by() -> None:
    given: dict[str, Any] = {"spec": ["http://a:1"], "base": ["http://b:1"], "crossover": 8}
    settings = RouterSettings(**given, online=OnlineMode.ADOPT)
    state = build_state(settings)
    assert gauge(state, "specroute_crossover") == 8
    state.online.adopted = 3.0
    assert gauge(state, "specroute_crossover") == 3.0
    assert gauge(state, "specroute_online_adopted") == 1


def gauge(state: RouterState, name: str) -> float:
    text = generate_latest(state.metrics.exposed).decode()
    return next(
        float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")
    )


async def test_a_failing_fit_is_counted_and_routing_goes_back_to_the_profile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    given: dict[str, Any] = {"spec": ["http://a:1"], "base": ["http://b:1"], "crossover": 8}
    state = build_state(RouterSettings(**given, online=OnlineMode.ADOPT, online_interval=0.01))
    state.online.adopted = 3.0

    def broken(*args: Any, **kwargs: Any) -> None:
        raise ArithmeticError("a fit that fails")

    monkeypatch.setattr(online_module, "fit", broken)  # in the fit's thread
    fitting = asyncio.create_task(keep_fitting(state))
    await asyncio.sleep(0.05)
    await cancel_and_wait([fitting])
    assert state.online.adopted is None
    errors = 'specroute_background_errors_total{task="online"} '
    text = generate_latest(state.metrics.exposed).decode()
    assert float(next(ln for ln in text.splitlines() if ln.startswith(errors)).split()[-1]) >= 1


def two_buckets() -> Profile:
    """A ``v2`` profile of two context buckets: a crossover of 8 at 500 KV tokens, of 3 at
    4,000."""
    buckets = [
        {"context": c, "crossover": {"value": v, "ci": [v - 1, v + 1]}}
        for c, v in ((500, 8.0), (4000, 3.0))
    ]
    return parse_profile(
        {
            "schema": "specroute.profile/v2",
            "crossover": buckets[0]["crossover"],
            "context": {"tokens_per_byte": 0.25, "buckets": buckets},
        }
    )


def test_a_profile_with_context_buckets_gets_a_live_fit_per_bucket() -> None:
    profile = two_buckets()
    online = Online(OnlineMode.OBSERVE, Samples(4096, 600.0), Sureness(30, 4.0))
    short = served(dense(1 / 16), 40)  # crossover near 21, context 1000: the first bucket
    long = [s._replace(context=3000) for s in served(dense(1 / 8), 40, seed=5)]
    for s in short + long:
        online.samples.add(s)
    online.refit(1.0, profile, shared=True)
    assert [f.context for f in online.fits] == [500, 4000]
    assert [f.samples for f in online.fits] == [480, 480]
    near = [f.crossing.at for f in online.fits if f.crossing is not None]
    assert near == [
        pytest.approx(true_crossover(dense(1 / 16)), rel=0.15),  # a shallow margin
        pytest.approx(true_crossover(dense(1 / 8)), rel=0.05),
    ]
    assert online.drift == (True, False)  # 21 is far above the first bucket's 7 to 9


def moe(pool: str, load: float) -> float:
    """Seconds per token of a mixture-of-experts pair: a verify reads many more experts
    than a decode step at low load, so speculation pays only in a band, about 3 to 12."""
    if pool == "spec":
        return 0.009 * (1 + load / 12) + 0.012 / load
    return 0.014 * (1 + load / 32)


def true_bands(model: Model) -> list[tuple[float | None, float | None]]:
    margin = log_margin([model("spec", c) for c in LEVELS], [model("base", c) for c in LEVELS])
    return bands(LEVELS, margin)


MOE_ROUTED = (((6.0, 24.0),),)  # a mixture-of-experts profile's band, routed by before


def test_a_margin_that_turns_twice_gives_live_bands_adopted_once_each_edge_is_sure() -> None:
    """The live fit of a mixture-of-experts pair, routed by bands: an edge where speculation
    starts paying and one where it stops, each with its interval; adopted as bands while
    both are sure, and routed by; thin samples around one edge keep the profile's."""
    found = fit(served(moe, 40), LEVELS, min_samples=10, banded=True).crossing
    assert found is not None
    assert [e.direction for e in found.edges] == ["up", "down"]
    (start, end), truth = found.bands[0], true_bands(moe)[0]
    assert found.bands == ((start, end),)
    assert [(e.low, e.high) for e in found.edges] == [(2.0, 4.0), (8.0, 16.0)]  # each holds
    assert truth[0] is not None and truth[1] is not None and 2 < truth[0] < 4 < 8 < truth[1] < 16
    # a shallow margin (5% a side at 8 and 16): a point within a fifth of the truth
    assert start == pytest.approx(truth[0], rel=0.2) and end == pytest.approx(truth[1], rel=0.2)
    assert found.threshold == end  # the first band's top
    online = adopted(served(moe, 40))
    assert online.live_bands == (found.bands,) and online.adopted == end
    policy = build_policy("crossover", {"crossover": 64}, None)
    request = RequestInfo("/v1/chat/completions")
    for load, pool in ((1, "base"), (5, "spec"), (20, "base")):
        spec = BackendView("s", "spec", True, load)
        seen = View((spec, BackendView("b", "base", True, 0)), live_bands=online.live_bands)
        assert policy.choose(request, seen).pool == pool, load
    # too few samples past 8: the band that still pays there ends there, never past it
    short = adopted(served(moe, 40, levels=LEVELS[:4]) + served(moe, 12, levels=LEVELS[4:], seed=4))
    assert short.live_bands == (((start, 8.0),),)
    # too few at 2: the edge lies somewhere between 1 and 4, two doublings, not sure
    thin = adopted(
        served(moe, 12, levels=LEVELS[1:2])
        + served(moe, 40, levels=LEVELS[2:], seed=4)
        + served(moe, 40, levels=LEVELS[:1], seed=6)
    )
    edges = thin.fits[0].crossing.edges if thin.fits[0].crossing else ()
    assert [(e.low, e.high) for e in edges][:1] == [(1.0, 4.0)] and thin.live_bands == ()


def dense_rising(pool: str, load: float) -> float:
    """A dense pair whose margin falls past about 5 and turns up again past 16 (the plain
    server slower there)."""
    return dense(1 / 8)(pool, load) * (2.2 if pool == "base" and load >= 24 else 1.0)


def test_bands_are_taken_under_bands_and_from_no_profile_only_where_the_margin_rises_first() -> (
    None
):
    """Routed by one crossover (a dense profile's), a margin's first fall is the crossover
    and a turn up is not routed by (on a dense pair, noise). With no profile (speculation
    nowhere: no class known), a margin that surely loses at the lowest level and turns up (a
    mixture of experts') is bands, as under bands; a dense one that pays first and falls,
    then turns up again, is one crossover, its first fall."""
    one, nowhere = ((up_to(64.0)),), ((),)
    found = adopted(served(moe, 40), routed=one).fits[0].crossing
    assert found is not None and not found.edges and found.bound == "below"
    from_nothing = adopted(served(moe, 40), routed=nowhere)
    found = from_nothing.fits[0].crossing
    assert found is not None and [e.direction for e in found.edges] == ["up", "down"]
    assert from_nothing.live_bands == adopted(served(moe, 40)).live_bands
    rising = adopted(served(dense_rising, 40), routed=nowhere).fits[0].crossing
    assert rising is not None and not rising.edges and rising.at is not None
    turns = [t.direction for t in crossings(LEVELS, _margin(dense_rising))]
    assert rising.at < 8 and turns[:2] == ["down", "up"]


def _margin(model: Model) -> list[float]:
    return log_margin([model("spec", c) for c in LEVELS], [model("base", c) for c in LEVELS])


def adopted(samples: list[Sample], routed: Any = MOE_ROUTED) -> Online:
    """An ``adopt`` fit of ``samples`` without a profile, the router's routing ``routed``."""
    online = Online(OnlineMode.ADOPT, Samples(4096, 600.0), Sureness(30))
    for s in samples:
        online.samples.add(s)
    online.refit(1.0, None, shared=True, routed=routed)
    return online


def test_adopt_is_per_context_bucket_each_on_its_own_evidence() -> None:
    """A profile with context buckets: each bucket's live crossover is adopted once sure,
    the other's profile crossover stands meanwhile, and ``context-crossover`` routes each
    context by its own."""
    profile = two_buckets()
    online = Online(OnlineMode.ADOPT, Samples(4096, 600.0), Sureness(30, 4.0))
    short = served(dense(1 / 8), 40)  # crossover near 5: the first bucket (context 1000)
    long = [s._replace(context=3000) for s in served(dense(1 / 8), 12, seed=5)]  # too few
    for s in short + long:
        online.samples.add(s)
    online.refit(1.0, profile, shared=True)
    (first, second) = online.live_bands
    assert second is None and first is not None and online.adopted is None  # two contexts
    assert first[0][1] == pytest.approx(true_crossover(dense(1 / 8)), rel=0.05)
    status = online.describe(2.0)["fits"]
    assert [f["adopted_bands"] for f in status] == [[list(first[0])], None]
    policy = build_policy("context-crossover", {}, profile)
    spec = BackendView("s", "spec", True, 6)
    seen = View((spec, BackendView("b", "base", True, 0)), live_bands=online.live_bands)
    short_request = RequestInfo("/v1/chat/completions", prompt_bytes=1600, max_tokens=200)
    assert policy.choose(short_request, seen).pool == "base"  # live 5, not the profile's 8
    assert policy.choose(short_request, replace(seen, live_bands=())).pool == "spec"


def test_a_backend_s_load_lived_through_is_its_count_integrated_over_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The mean load a request decoded under is two readings' difference over its time:
    every worker's requests there counted, each for as long as it was in flight."""
    clock = [10.0]
    monkeypatch.setattr("specroute.router.workers.board.time.monotonic", lambda: clock[0])
    board = Board(2, 1)
    board.add_inflight(0, 1, 0)  # worker 0: one from 10 s
    first = board.lived(0, 10.0)
    clock[0] = 11.0
    board.become(1)
    board.add_inflight(0, 2, 0)  # worker 1: two more from 11 s
    clock[0] = 12.0
    board.add_inflight(0, -2, 0)  # gone at 12 s
    assert (board.lived(0, 14.0) - first) / 4.0 == pytest.approx((4 * 1 + 1 * 2) / 4.0)


def test_a_level_s_samples_are_read_at_the_level_along_the_profile_s_curve() -> None:
    """Samples at loads off a level (the plain server's at 3, counted at level 4) are read
    at the level along the profile's curve, so that they are not taken for faster there."""
    model = dense()
    off = [
        Sample(0.001 * i, pool, 3.0, model(pool, 3.0), 1000)  # type: ignore[arg-type]
        for i, pool in enumerate(["spec", "base"] * 20)
    ]

    def shape(pool: str, load: float) -> float:
        return model(pool, load)

    read = fit(off, LEVELS, min_samples=10, shape=shape)
    as_measured = fit(off, LEVELS, min_samples=10)
    for pool in ("spec", "base"):
        at_level = read.curves[pool][2]
        assert at_level.level == 4.0 and at_level.median == pytest.approx(model(pool, 4.0))
        assert as_measured.curves[pool][2].median == pytest.approx(model(pool, 3.0))
