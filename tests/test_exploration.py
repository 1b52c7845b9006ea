"""Exploration: which decisions it turns to the other pool, how many, and where it never
sends one; its settings, and its counts in the router's metrics."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest
from prometheus_client import generate_latest
from pydantic import ValidationError

from specroute.policies.decision import Decision
from specroute.policies.view import POOLS, BackendView, Pool, RequestInfo, View
from specroute.router.app import build_state
from specroute.router.exploration import EXPLORE, Exploration
from specroute.router.online import Online, OnlineMode, Sureness
from specroute.router.online_samples import Sample, Samples
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
        live_crossover=live,
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
CASES = [
    # partitioned: the load joined is the server's own, itself included
    Case("above the crossover, within the span: to spec", ABOVE, view(9, 3), 8, "spec"),
    Case("at the ceiling, crossover times span: to spec", ABOVE, view(15, 3), 8, "spec"),
    Case("past the ceiling: never", ABOVE, view(16, 3), 8, None),
    Case("below the crossover, within the span: to base", BELOW, view(2, 5), 8, "base"),
    Case("far below the crossover: not", BELOW, view(2, 1), 8, None),
    Case("at its max_running_requests: never", ABOVE, view(9, 3, spec_cap=9), 8, None),
    Case("ejected: never", ABOVE, view(9, 3, spec_healthy=False), 8, None),
    Case("the live crossover routed by, not the profile's", ABOVE, view(9, 3, live=4), 8, None),
    Case("the live crossover raises the ceiling", ABOVE, view(9, 3, live=8), 4, "spec"),
    Case("no crossover", ABOVE, view(9, 3), None, None),
    Case("a crossover of 0 (speculation never pays)", ABOVE, view(0, 3), 0, None),
    Case("failover is left alone", Decision("base", "base-a", "failover"), view(9, 3), 8, None),
    Case("a probe is left alone", Decision("spec", "spec-a", "probe"), view(9, 3), 8, None),
    Case(
        "a band's edge as a crossover's",
        Decision("base", "base-a", "outside_band"),
        view(9, 3),
        8,
        "spec",
    ),
    Case(
        "context bands are left alone",
        Decision("base", "base-a", "outside_band_at_context"),
        view(9, 3),
        8,
        None,
    ),
    # shared: the group's load, both pools
    Case("shared: the group's load is joined", ABOVE, view(0, 9), 8, "spec", shared=True),
    Case("shared: past the ceiling", ABOVE, view(0, 16), 8, None, shared=True),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_what_is_explored(case: Case) -> None:
    exploration = Exploration(online(case.shared), 1.0, 2.0)  # a share of 1: owed at once
    decision = exploration.after(case.chosen, case.view, case.crossover)
    if case.explored is None:
        assert decision == case.chosen
        assert exploration.explored == {"spec": 0, "base": 0}
    else:
        assert decision == Decision(case.explored, f"{case.explored}-a", EXPLORE)
        assert exploration.explored[case.explored] == 1


def test_the_share_is_of_every_decision_and_never_exceeded() -> None:
    """At 2%: not one request in 50 more, counted over every decision, those it cannot
    turn included (there it waits, and its credit does not pile up past one more)."""
    exploration = Exploration(online(), 0.02, 2.0)
    explored = 0
    for n in range(1, 5001):
        far = n % 3 == 0  # a third far below the crossover, where it never explores
        chosen = BELOW if far else ABOVE
        decision = exploration.after(chosen, view(1, 1) if far else view(9, 3), 8)
        explored += decision.reason == EXPLORE
        assert explored <= 0.02 * n + 1e-9, n
    assert explored == 100  # credit owed where it could not explore is spent later


def test_it_prefers_the_levels_the_other_pool_has_fewest_live_samples_at() -> None:
    """Spec seen 20 times at load 8 and never at 16: with a share of 1/2 a request at 8
    waits for one at 16, until it has waited for a whole share (1 / share requests)."""
    learnt = online(min_samples=12)
    for k in range(20):
        learnt.record(Sample(float(k), "spec", 8, 0.02, 100))
        learnt.record(Sample(float(k), "base", 8, 0.03, 100))
    learnt.refit(30.0, None, shared=False)
    exploration = Exploration(learnt, 0.5, 2.0)
    at_8, at_16 = view(7, 3), view(15, 3)
    assert exploration.after(ABOVE, at_8, 8) == ABOVE  # credit 0.5
    assert exploration.after(ABOVE, at_8, 8) == ABOVE  # 1: owed, but 8 has its samples
    assert exploration.after(ABOVE, at_16, 8).reason == EXPLORE  # 16 has none
    assert exploration.after(ABOVE, at_8, 8) == ABOVE
    assert exploration.after(ABOVE, at_8, 8) == ABOVE
    assert exploration.after(ABOVE, at_8, 8).reason == EXPLORE  # waited a whole share


def test_the_settings_turn_it_on_bound_it_and_refuse_what_cannot_be() -> None:
    state_online = online()
    assert RouterSettings(**SERVERS, online=OnlineMode.OFF).exploration(state_online) is None
    assert RouterSettings(**SERVERS).exploration(state_online) is None  # off by default
    found = RouterSettings(**SERVERS, online_explore_share=0.02).exploration(state_online)
    assert found is not None and (found.share, found.span) == (0.02, 2.0)
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
    decisions = [state.place(policy.choose(info, seen), info, seen) for _ in range(4)]
    for decision in decisions:
        state.decisions.record(decision, 12)
    assert [d.reason for d in decisions] == ["above_crossover", EXPLORE] * 2
    text = generate_latest(state.metrics.exposed).decode()
    assert 'specroute_route_decisions_total{pool="spec",reason="explore"} 2.0' in text
    assert 'specroute_route_decisions_total{pool="base",reason="above_crossover"} 2.0' in text
    assert 'specroute_online_explored_total{pool="spec"} 2.0' in text
