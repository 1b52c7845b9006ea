"""Verdicts: what requests' ends and the leader's health checks do to each worker's
breakers, counted once for the router and logged, on a real board and a fake clock."""

from __future__ import annotations

import logging

import pytest

from specroute.router.backends.backend import Backend, Server
from specroute.router.backends.health import Breaker, BreakerState, Ejection
from specroute.router.backends.verdicts import Verdicts
from specroute.router.metrics import RouterMetrics
from specroute.router.protocol.outcome import Outcome
from specroute.router.workers.board import Board

CLOSED, HALF_OPEN, OPEN = BreakerState.CLOSED, BreakerState.HALF_OPEN, BreakerState.OPEN
SERVERS = (Server("http://s:1", "spec"), Server("http://b:2", "base"))
RULES = Ejection(after_failures=2, seconds=5.0, max_seconds=30.0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def tracked(board: Board, clock: Clock) -> list[Backend]:
    """The backends as one worker tracks them: breakers of its own, on the shared board."""
    return [Backend(s, Breaker(RULES, clock), board, i) for i, s in enumerate(SERVERS)]


def ejections(metrics: RouterMetrics, backend: Backend) -> float | None:
    sample = metrics.exposed.get_sample_value
    return sample("specroute_backend_ejections_total", {"backend": backend.name})


OK, CONNECT, TIMEOUT = Outcome.ANSWERED, Outcome.CONNECT, Outcome.TIMEOUT
# (case, the outcomes of requests at one backend, its breaker after, ejections counted)
REQUEST_CASES: list[tuple[str, list[Outcome], BreakerState, int]] = [
    ("an answer keeps it serving", [OK, OK], CLOSED, 0),
    ("never seen working: a connect failure ejects", [CONNECT], OPEN, 1),
    ("one failure of a proven one does not", [OK, TIMEOUT], CLOSED, 0),
    ("failures in a row do", [OK, Outcome.MIDSTREAM, TIMEOUT], OPEN, 1),
    ("an answer between: the count again", [OK, Outcome.BROKEN, OK, Outcome.TRUNCATED], CLOSED, 0),
    ("a 503 is backpressure, not ill health", [Outcome.UNAVAILABLE] * 4, CLOSED, 0),
    ("the client leaving says nothing of the backend", [Outcome.CANCELLED] * 4, CLOSED, 0),
    ("nor do the router's own", [Outcome.OUT_OF_FDS, Outcome.INTERNAL, Outcome.CUT_OFF], CLOSED, 0),
    ("what comes in while ejected does not count", [CONNECT, CONNECT, OK], OPEN, 1),
]


@pytest.mark.parametrize(
    ("outcomes", "after", "ejected"),
    [c[1:] for c in REQUEST_CASES],
    ids=[c[0] for c in REQUEST_CASES],
)
def test_a_request_s_end_is_judged(
    outcomes: list[Outcome], after: BreakerState, ejected: int
) -> None:
    metrics, board = RouterMetrics(), Board(1, 2)
    spec, base = tracked(board, Clock())
    verdicts = Verdicts(metrics, board)
    verdicts.watch([spec, base])
    for outcome in outcomes:
        verdicts.request_ended(spec, outcome)
    assert spec.breaker.state is after and base.breaker.state is CLOSED
    assert ejections(metrics, spec) == ejected and ejections(metrics, base) == 0
    assert board.worst_level(spec.index) == after.level  # shown for the gauges at once


def test_ejections_are_counted_from_zero_from_the_start() -> None:
    metrics, board = RouterMetrics(), Board(1, 2)
    backends = tracked(board, Clock())
    assert [ejections(metrics, b) for b in backends] == [None, None]
    Verdicts(metrics, board).watch(backends)
    assert [ejections(metrics, b) for b in backends] == [0, 0]


def test_the_leader_s_health_verdict_reaches_every_worker_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Worker 0 checks and publishes; each worker, itself too, applies a verdict once, to
    breakers of its own. The ejection is counted once, by the leader: the workers' counts
    are summed on a scrape."""
    board, clock = Board(2, 2), Clock()
    leader_metrics, other_metrics = RouterMetrics(), RouterMetrics()
    leader, other = tracked(board, clock), tracked(board, clock)
    leading = Verdicts(leader_metrics, board)
    leading.request_ended(leader[0], Outcome.ANSWERED)  # proven: two failures eject it
    leading.publish(leader[0], False)
    leading.follow(leader)
    leading.follow(leader)  # nothing new: not applied twice
    assert leader[0].breaker.describe()["failures_in_a_row"] == 1
    leading.publish(leader[0], False)
    with caplog.at_level(logging.WARNING, "specroute.router"):
        leading.follow(leader)
        assert leader[0].breaker.state is OPEN and ejections(leader_metrics, leader[0]) == 1
        board.become(1)  # as the other worker, on the same board
        following = Verdicts(other_metrics, board)
        following.follow(other)  # the latest verdict: its breaker, never proven, ejects
    assert other[0].breaker.state is OPEN and other[0].breaker.ejections == 1
    assert ejections(other_metrics, other[0]) is None  # the leader counted it
    assert other[1].breaker.state is CLOSED  # no verdict on it yet
    assert board.worst_level(0) == OPEN.level
    assert caplog.text.count("ejected for 5 s (the last failure: health check)") == 2


def test_a_request_s_failure_is_counted_by_whichever_worker_saw_it() -> None:
    board, metrics = Board(2, 2, worker=1), RouterMetrics()
    spec, _ = tracked(board, Clock())
    Verdicts(metrics, board).request_ended(spec, Outcome.CONNECT)
    assert ejections(metrics, spec) == 1


def test_readmission_is_logged_with_what_readmitted(caplog: pytest.LogCaptureFixture) -> None:
    board, clock = Board(1, 2), Clock()
    spec, _ = tracked(board, clock)
    verdicts = Verdicts(RouterMetrics(), board)
    verdicts.request_ended(spec, Outcome.CONNECT)
    clock.now += 5.0
    assert spec.breaker.state is HALF_OPEN
    verdicts.publish(spec, True)
    with caplog.at_level(logging.WARNING, "specroute.router"):
        verdicts.follow([spec])
    assert spec.breaker.state is CLOSED
    assert f"Backend {spec.name} readmitted (health check)." in caplog.text
    assert "the last failure: connect" in caplog.text


def test_a_cool_down_that_ended_shows_at_the_next_follow() -> None:
    """No event ends a cool-down: following shows the breaker's level as it is now."""
    board, clock = Board(1, 2), Clock()
    spec, base = tracked(board, clock)
    verdicts = Verdicts(RouterMetrics(), board)
    verdicts.request_ended(spec, Outcome.CONNECT)
    assert board.worst_level(spec.index) == OPEN.level
    clock.now += 5.0
    verdicts.follow([spec, base])
    assert board.worst_level(spec.index) == HALF_OPEN.level
