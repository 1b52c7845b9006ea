"""The decision log: every decision counted by pool and reason, the last few kept."""

from __future__ import annotations

import pytest

from specroute.policies.decision import Decision
from specroute.router.metrics import RouterMetrics
from specroute.router.observability.decision_log import DecisionLog

BELOW = Decision("spec", "spec:s:1", "below_crossover")
ABOVE = Decision("base", "base:b:2", "above_crossover")
NONE = Decision("spec", None, "failover")


# (case, how many kept, decisions made, the reasons kept, oldest first)
KEPT_CASES: list[tuple[str, int, list[Decision], list[str]]] = [
    ("fewer than kept: all", 3, [BELOW, ABOVE], ["below_crossover", "above_crossover"]),
    ("more than kept: the last", 2, [BELOW, ABOVE, NONE], ["above_crossover", "failover"]),
    ("none kept: none", 0, [BELOW, ABOVE], []),
]


@pytest.mark.parametrize(
    ("keep", "made", "reasons"), [c[1:] for c in KEPT_CASES], ids=[c[0] for c in KEPT_CASES]
)
def test_the_last_decisions_are_kept(keep: int, made: list[Decision], reasons: list[str]) -> None:
    log = DecisionLog(RouterMetrics(), keep)
    for load, decision in enumerate(made):
        log.record(decision, load)
    assert [d["reason"] for d in log.recent] == reasons


def test_a_decision_is_kept_with_its_backend_and_load() -> None:
    log = DecisionLog(RouterMetrics(), 5)
    log.record(ABOVE, 7)
    log.record(NONE, 0)
    first, second = log.recent
    assert {k: v for k, v in first.items() if k != "at"} == {
        "pool": "base",
        "backend": "base:b:2",
        "reason": "above_crossover",
        "live_concurrency": 7,
    }
    assert second["backend"] is None and first["at"] <= second["at"]


def test_every_decision_is_counted_kept_or_not() -> None:
    metrics = RouterMetrics()
    log = DecisionLog(metrics, 1)
    for decision in (BELOW, BELOW, ABOVE):
        log.record(decision, 0)

    def counted(pool: str, reason: str) -> float | None:
        labels = {"pool": pool, "reason": reason}
        return metrics.exposed.get_sample_value("specroute_route_decisions_total", labels)

    assert counted("spec", "below_crossover") == 2
    assert counted("base", "above_crossover") == 1
    assert counted("spec", "failover") is None  # never made
