"""Exploration: which decisions it turns to the other pool, how many, and where it never
sends one; its settings, and its counts in the router's metrics."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

import pytest
from prometheus_client import generate_latest
from pydantic import ValidationError

from specroute.online.estimator import Online, OnlineMode, Sureness
from specroute.online.exploration import EXPLORE, Exploration
from specroute.online.samples import Sample, Samples
from specroute.policies.decision import Decision
from specroute.policies.profile import up_to
from specroute.policies.view import POOLS, BackendView, Pool, RequestInfo, View
from specroute.router.app import build_state
from specroute.router.components import exploration
from specroute.router.settings import RouterSettings

SERVERS: dict[str, Any] = {"spec": ["http://spec:1"], "base": ["http://base:2"]}


def online(shared: bool = False, min_samples: int = 12) -> Online:
    found = Online(OnlineMode.OBSERVE, Samples(4096, 600.0), Sureness(min_samples), per_level=24)
    found.shared = shared
    return found


def view(
    spec: int,
    base: int,
    live: float | None = None,
    spec_healthy: bool = True,
    spec_cap: int | None = None,
) -> View:
    """One speculative and one plain server with these requests in flight."""
    return View(
        (
            BackendView("spec-a", "spec", spec_healthy, spec, max_running_requests=spec_cap),
            BackendView("base-a", "base", True, base),
        ),
        live_bands=() if live is None else (up_to(live),),
    )


def one_group(spec: int, base: int) -> View:
    """One GPU group, ``g``, its speculative and plain server with these requests in flight."""
    return View(
        (
            BackendView("spec-a", "spec", True, spec, group="g"),
            BackendView("base-a", "base", True, base, group="g"),
        )
    )


class Case(NamedTuple):
    name: str
    chosen: Decision
    view: View
    crossover: float | None
    explored: Pool | None  # the pool it is sent to; None: the policy's decision stands
    shared: bool = False


ABOVE = Decision("base", "base-a", "above_crossover")
BELOW = Decision("spec", "spec-a", "below_crossover")
FAILOVER = Decision("base", "base-a", "failover")
CASES = [
    # partitioned: the level is the chosen server's load and the other's, the request too
    Case("above the crossover, within the span: to spec", ABOVE, view(9, 3), 8, "spec"),
    Case("at the ceiling, crossover times span: to spec", ABOVE, view(12, 3), 8, "spec"),
    Case("past the ceiling: never", ABOVE, view(13, 3), 8, None),
    Case("below the crossover, within the span: to base", BELOW, view(2, 5), 8, "base"),
    Case("far below the crossover: not", BELOW, view(1, 1), 8, None),
    Case("at its max_running_requests: never", ABOVE, view(9, 3, spec_cap=9), 8, None),
    Case("ejected: never", ABOVE, view(9, 3, spec_healthy=False), 8, None),
    Case("the live crossover routed by, not the profile's", ABOVE, view(9, 3, live=4), 8, None),
    Case("the live crossover raises the ceiling", ABOVE, view(9, 3, live=8), 4, "spec"),
    Case("no crossover", ABOVE, view(9, 3), None, None),
    Case("a crossover of 0: tested wherever the load is", ABOVE, view(0, 20), 0, "spec"),
    Case("failover is left alone", FAILOVER, view(9, 3), 8, None),
    Case("a probe is left alone", Decision("spec", "spec-a", "probe"), view(9, 3), 8, None),
    Case(
        "a band's edge as a crossover's",
        Decision("base", "base-a", "outside_band"),
        view(9, 3),
        8,
        "spec",
    ),
    Case(
        "context bands' edges as a crossover's",
        Decision("base", "base-a", "outside_band_at_context"),
        view(9, 3),
        8,
        "spec",
    ),
    Case(
        "a live band's start (speculation pays from 32 up): to spec below it",
        Decision("base", "base-a", "outside_band"),
        replace(view(0, 20), live_bands=(((32.0, None),),)),
        None,
        "spec",
    ),
    Case(
        "a live band's start: not past its span",
        Decision("base", "base-a", "outside_band"),
        replace(view(0, 6), live_bands=(((32.0, None),),)),
        None,
        None,
    ),
    # shared: the group's load, both pools
    Case("shared: the group's load is joined", ABOVE, view(0, 9), 8, "spec", shared=True),
    Case("shared: past the ceiling", ABOVE, view(0, 16), 8, None, shared=True),
]


def credited(exploration: Exploration, decisions: int) -> Exploration:
    """``exploration`` after ``decisions`` it leaves alone (a failover's), each earning its
    share of credit."""
    for _ in range(decisions):
        assert exploration.after(FAILOVER, view(0, 0), 8) == FAILOVER
    return exploration


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_what_is_explored(case: Case) -> None:
    exploration = credited(Exploration(online(case.shared), 1.0, 2.0), 100)  # a turn's credit
    decision = exploration.after(case.chosen, case.view, case.crossover)
    if case.explored is None:
        assert decision == case.chosen
        assert exploration.explored == {"spec": 0, "base": 0}
    else:
        assert decision == Decision(case.explored, f"{case.explored}-a", EXPLORE)
        assert exploration.explored[case.explored] == 1


def test_a_turn_sends_four_times_its_level_and_then_another_starts_only_anew() -> None:
    """Above a crossover of 8 at a level of 13 (spec 9, plain 3, the request): a turn of 52
    requests to spec, each a decision the policy sent to plain; one the policy sends to spec
    itself passes as it is and is not counted; the 53rd starts another turn, on credit."""
    exploration = credited(Exploration(online(), 1.0, 2.0), 200)
    turned = [exploration.after(ABOVE, view(9, 3), 8) for _ in range(20)]
    assert exploration.after(BELOW, view(9, 3), 8) == BELOW  # the policy's own spec: as is
    turned += [exploration.after(ABOVE, view(9, 3), 8) for _ in range(32)]
    assert all(d == Decision("spec", "spec-a", EXPLORE) for d in turned)
    assert exploration.explored == {"spec": 52, "base": 0} and exploration.turns["spec"] == 1
    assert exploration.after(ABOVE, view(9, 3), 8).reason == EXPLORE
    assert exploration.turns["spec"] == 2
    none_owed = Exploration(online(), 0.02, 2.0)
    assert none_owed.after(ABOVE, view(9, 3), 8) == ABOVE


def test_a_turn_ends_where_the_load_leaves_the_span_or_the_server_is_full() -> None:
    exploration = credited(Exploration(online(), 1.0, 2.0), 200)
    assert exploration.after(ABOVE, view(9, 3), 8).reason == EXPLORE
    assert exploration.after(ABOVE, view(13, 3), 8) == ABOVE  # 17: past 16, the turn ends
    assert exploration.after(ABOVE, view(9, 3), 8).reason == EXPLORE  # a new one, on credit
    assert exploration.after(ABOVE, view(9, 3, spec_cap=9), 8) == ABOVE  # full: ends
    assert exploration.turns["spec"] == 2


def test_on_shared_gpus_a_turn_is_its_group_s() -> None:
    """Two GPU groups: a turn on one leaves the other's decisions to the policy."""
    found = Exploration(online(shared=True), 1.0, 2.0)
    credited(found, 100)
    groups = View(
        (
            BackendView("spec-a", "spec", True, 0, group="a"),
            BackendView("base-a", "base", True, 9, group="a"),
            BackendView("spec-b", "spec", True, 0, group="b"),
            BackendView("base-b", "base", True, 2, group="b"),
        )
    )
    assert found.after(ABOVE, groups, 8) == Decision("spec", "spec-a", EXPLORE)  # a: 10
    in_b = Decision("base", "base-b", "above_crossover")
    assert found.after(in_b, groups, 8) == in_b  # b: 3, below 4, and not a's turn
    assert found.after(ABOVE, groups, 8) == Decision("spec", "spec-a", EXPLORE)


def test_a_turn_that_never_drained_the_pool_it_left_backs_off_the_next() -> None:
    """Shared GPUs, a crossover of 8, at half a request of credit a decision: a turn at a
    level of 10 sends 40 requests to spec. While the plain server holds 9 of the group's
    requests all along, every sample the turn buys decodes beside them and is left out, so
    the next turn waits for twice the credit (80: the 100th decision after, not the 20th),
    spends what it waited for past its own, and the one after that four times (160); so
    does a turn cut short by a burst before the plain server drained. A turn during which
    the plain server once held none resets it; on partitioned GPUs, where nothing is
    beside a sample, turns never back off."""

    held, drained = one_group(0, 9), one_group(9, 0)
    above = Decision("base", "base-a", "above_crossover")
    found = Exploration(online(shared=True), 0.5, 2.0)
    for _ in range(100):  # credit 50: one turn's, 40
        found.after(FAILOVER, held, 8)

    def turn(during: View) -> int:
        """The decisions left to the policy before the next turn starts, and that turn."""
        waited = 0
        while found.after(above, during, 8).reason != EXPLORE:
            waited += 1
        for _ in range(39):
            assert found.after(above, during, 8).reason == EXPLORE
        return waited

    assert turn(held) == 0 and found.backoff == {"g": 2}  # 30 owed after it
    # 30 + 0.5 * 100 = 80; 40 past its own spent
    assert turn(held) == 99 and found.backoff == {"g": 4}
    assert found.describe()["backoff"] == {"g": 4}
    assert turn(drained) == 280 and found.backoff == {}  # 19.5 + 0.5 * 281 >= 160; 120 spent
    assert turn(drained) == 40  # 19.5 + 0.5 * 41 >= 40: its own credit again
    assert found.explored["spec"] == 160
    cut = credited(Exploration(online(shared=True), 1.0, 2.0), 100)
    assert cut.after(above, held, 8).reason == EXPLORE
    assert cut.after(above, one_group(0, 16), 8) == above  # a burst: 17, past 16, cut short
    assert cut.backoff == {"g": 2} and cut.turns["spec"] == 1
    partitioned = credited(Exploration(online(shared=False), 0.5, 2.0), 200)
    for _ in range(52):
        assert partitioned.after(ABOVE, view(9, 3), 8).reason == EXPLORE
    assert partitioned.backoff == {}


def test_each_gpu_group_backs_off_on_its_own() -> None:
    """Two GPU groups at a level of 10, a crossover of 8, half a request of credit a
    decision: a turn on group a that never drains its plain server backs a off, and a turn
    on group b then waits only for its own credit (40), not twice it."""
    groups = View(
        tuple(
            BackendView(f"{pool}-{g}", pool, True, 0 if pool == "spec" else 9, group=g)
            for g in "ab"
            for pool in POOLS
        )
    )
    found = credited(Exploration(online(shared=True), 0.5, 2.0), 100)  # credit 50
    for _ in range(40):
        assert found.after(ABOVE, groups, 8) == Decision("spec", "spec-a", EXPLORE)
    assert found.backoff == {"a": 2}  # 30 owed
    in_b = Decision("base", "base-b", "above_crossover")
    waited = 0
    while found.after(in_b, groups, 8).reason != EXPLORE:
        waited += 1
    assert waited == 19  # 30 + 0.5 * 20 = 40: b's own credit, where a's next needs 80
    assert found.backoff == {"a": 2}


def test_a_turn_cut_short_by_a_fall_below_its_span_leaves_the_backoff_as_it_is() -> None:
    """Shared GPUs, a crossover of 8, a span of 2 (4 to 16): a turn at 10 cut short as the
    load falls to 3, the plain server still holding 2, showed neither that the plain pool
    drains nor that it does not: the backoff stays at 1, and after a turn cut short by a
    burst past 16 (doubled, 2) at 2. A fall cuts a turn as before."""

    found = credited(Exploration(online(shared=True), 1.0, 2.0), 400)
    above = Decision("base", "base-a", "above_crossover")
    for burst, backoff in ((False, {}), (True, {"g": 2}), (False, {"g": 2})):
        assert found.after(above, one_group(0, 9), 8).reason == EXPLORE
        assert found.after(above, one_group(0, 16 if burst else 2), 8) == above  # 17 or 3: cut
        assert found.backoff == backoff and not found.describe()["open_turns"]
    assert found.turns["spec"] == 3 and found.explored["spec"] == 3


def test_a_fall_is_below_the_span_of_the_edge_the_turn_explores() -> None:
    """Shared GPUs, a band from 4 to 64, a span of 2 (2 to 8 around its start, 32 to 128
    around its top): a turn to the plain pool at 48 cut short as the load falls to 16,
    between the two spans, fell below its own edge's span (not above the start's): the
    backoff stays at 1. A burst past 128 after it doubles it."""

    found = credited(Exploration(online(shared=True), 1.0, 2.0), 800)
    inside = Decision("spec", "spec-a", "inside_band")
    band = ((4.0, 64.0),)
    for load, backoff in ((15, {}), (200, {"g": 2})):
        assert found.after(inside, one_group(47, 0), band).pool == "base"
        assert found.after(inside, one_group(load, 0), band) == inside  # 16 or 201: cut
        assert found.backoff == backoff and not found.describe()["open_turns"]


def test_the_share_is_of_every_decision_and_never_exceeded() -> None:
    """At 2%: never more than one request in 50 from the start, counted over every
    decision, those it cannot turn included (there it waits, and its credit does not pile
    up past four turns at the top of the span); the credit owed is spent later."""
    exploration = Exploration(online(), 0.02, 2.0)
    explored = 0
    for n in range(1, 5001):
        far = n % 3 == 0  # a third far below the crossover, where it never explores
        chosen = BELOW if far else ABOVE
        decision = exploration.after(chosen, view(1, 1) if far else view(9, 3), 8)
        explored += decision.reason == EXPLORE
        assert explored <= 0.02 * n + 1e-9, n
    assert 0.02 * 5000 - 52 <= explored <= 0.02 * 5000  # turns of 52: the last one waiting


def test_it_explores_the_levels_the_crossover_needs_nearest_it_first() -> None:
    """Around a crossover of 8 (span 4), the speculative pool is wanted at 8 and 16, the
    levels above it: seen 20 times at 8 (16 count), a turn at 8 waits until the credit is
    four turns' at the top of the span (128); at 16 it starts once paid for (64); with no
    sample at 8 one there starts once paid for (32)."""

    def started(seen: bool, at: int) -> int:
        learnt = online(min_samples=16)
        for k in range(20 if seen else 0):
            learnt.record(Sample(float(k), "spec", 8, 0.02, 100))
            learnt.record(Sample(float(k), "base", 8, 0.03, 100))
        learnt.refit(30.0, None, shared=False)
        exploration = Exploration(learnt, 1.0, 4.0)
        for n in range(1, 200):
            if exploration.after(ABOVE, view(at - 1, 0), 8).reason == EXPLORE:
                return n
        raise AssertionError("no turn")

    assert started(seen=False, at=8) == 32
    assert started(seen=True, at=8) == 128 and started(seen=True, at=16) == 64


def test_an_edge_with_its_evidence_waits_while_another_edge_lacks_some() -> None:
    """A live band from 2.8 (the margin turns up between 2 and 4) to 16, the last level both
    pools were seen at, every level to 16 seen 20 times (12 count): around its start
    neither pool needs a sample, and past its top the speculative pool is wanted at 32. A
    turn at the start, a refresh, waits for four turns' credit at the top of the span
    (256); one at 28, near 32, starts once paid for (112)."""
    learnt = online()
    for level in (1, 2, 4, 8, 16):
        faster, slower = (0.03, 0.02) if level <= 2 else (0.02, 0.03)
        for k in range(20):
            learnt.record(Sample(float(k), "spec", level, faster, 100))
            learnt.record(Sample(float(k), "base", level, slower, 100))
    learnt.refit(30.0, None, shared=False)

    def started(chosen: Decision, seated: View) -> int:
        exploration = Exploration(learnt, 1.0, 4.0)
        for n in range(1, 400):
            if exploration.after(chosen, seated, None).reason == EXPLORE:
                return n
        raise AssertionError("no turn")

    assert started(Decision("spec", "spec-a", "inside_band"), view(3, 0)) == 256  # at 4
    assert started(Decision("base", "base-a", "outside_band"), view(0, 27)) == 112  # at 28


def test_the_settings_turn_it_on_bound_it_and_refuse_what_cannot_be() -> None:
    state_online = online()
    off = RouterSettings(**SERVERS, online=OnlineMode.OFF)
    assert exploration(off.online, state_online) is None
    found = exploration(RouterSettings(**SERVERS).online, state_online)  # on by default
    assert found is not None and (found.share, found.span) == (0.02, 4.0)
    none = RouterSettings(**SERVERS, online_explore_share=0)
    assert exploration(none.online, state_online) is None
    bad: dict[str, Any]
    for bad in ({"online_explore_share": 1.5}, {"online_explore_span": 1.0}):
        with pytest.raises(ValidationError, match=next(iter(bad))):
            RouterSettings(**SERVERS | bad)


def test_the_router_explores_after_its_policy_and_counts_it_by_reason_and_pool() -> None:
    settings = RouterSettings(
        **SERVERS,
        policy="crossover",
        given_params={"crossover": 8, "topology": "partitioned"},
        online_explore_share=0.5,
    )
    state = build_state(settings)
    assert state.exploration is not None and not state.online.shared  # partitioned, at once
    spec, base = (next(b.name for b in state.roster.backends if b.pool == p) for p in POOLS)
    seen = View(
        (BackendView(spec, "spec", True, 9), BackendView(base, "base", True, 3)),
    )
    info = RequestInfo("/v1/chat/completions", stream=True)
    policy = state.in_force.policy
    decisions = [state.place(policy.choose(info, seen), info, seen) for _ in range(150)]
    for decision in decisions:
        state.decisions.record(decision, 12)
    # a turn at level 13 (52 requests) once half a request a decision has paid for it
    reasons = [d.reason for d in decisions]
    assert reasons == ["above_crossover"] * 103 + [EXPLORE] * 47
    text = generate_latest(state.metrics.exposed).decode()
    assert 'specroute_route_decisions_total{pool="spec",reason="explore"} 47.0' in text
    assert 'specroute_route_decisions_total{pool="base",reason="above_crossover"} 103.0' in text
    assert 'specroute_online_explored_total{pool="spec"} 47.0' in text


def test_adopt_without_a_profile_starts_at_a_crossover_of_0_and_explores_wherever_the_load_is() -> (
    None
):
    """No profile and no crossover: refused unless online adopt, which starts at 0 (no
    speculation) and whose exploration tests it at any load."""
    settings = RouterSettings(**SERVERS, online=OnlineMode.ADOPT)
    state = build_state(settings)
    assert state.in_force.policy.crossover() == 0.0 and state.exploration is not None
    with pytest.raises(ValueError, match="give crossover=N or a profile"):
        build_state(RouterSettings(**SERVERS))  # observe, the default: nothing to learn from
    explores = credited(state.exploration, 0)
    decided = [explores.after(ABOVE, view(0, 20), 0.0) for _ in range(5000)]
    assert any(d.reason == EXPLORE for d in decided)
