"""The roster: which column of the board each backend takes, how the leader's set changes,
and how another worker takes it up; on a real board and a fake clock."""

from __future__ import annotations

import logging

import pytest

from specroute.router.backends.backend import Server
from specroute.router.backends.health import Ejection
from specroute.router.backends.roster import Roster
from specroute.router.workers.board import Board

S0, S1 = Server("http://s:1", "spec"), Server("http://b:2", "base")
NEW = Server("http://s:3", "spec", "g1")
RULES = Ejection()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def columns(roster: Roster) -> dict[str, int]:
    return {b.name: b.index for b in roster.backends}


def test_the_configured_servers_take_the_first_columns_in_order() -> None:
    roster = Roster(Board(1, 4), RULES, [S0, S1])
    assert columns(roster) == {S0.name: 0, S1.name: 1}
    assert roster.backend(S1.name) is roster.backends[1]
    with pytest.raises(KeyError):
        roster.backend(NEW.name)


# (case, columns on the board, seconds since S0 left its column 0, requests in flight
# there, the column NEW takes: None, it waits)
FREE_CASES: list[tuple[str, int, float, int, int | None]] = [
    ("a column never used first, over one left long ago", 3, 60.0, 0, 2),
    ("a column left just now is not given again", 2, 5.0, 0, None),
    ("one left long enough ago is", 2, 10.0, 0, 0),
    ("but not while a request is in flight there", 2, 60.0, 1, None),
]


@pytest.mark.parametrize(
    ("width", "after", "inflight", "column"),
    [c[1:] for c in FREE_CASES],
    ids=[c[0] for c in FREE_CASES],
)
def test_a_new_server_takes_a_free_column(
    width: int, after: float, inflight: int, column: int | None
) -> None:
    board, clock = Board(1, width), Clock()
    roster = Roster(board, RULES, [S0, S1], clock)
    roster.route_between([roster.backend(S1.name)])  # S0 left
    clock.now += after
    board.add_inflight(0, inflight, 0)
    for c in range(width):
        board.publish_verdict(c, False)  # what the last server of a column left there
    placed, new = roster.place([S1, NEW])
    assert [b.index for b in new] == ([] if column is None else [column])
    assert [b.name for b in placed] == [S1.name] + ([] if column is None else [NEW.name])
    if column is not None:
        assert board.verdict(column) == (0, False)  # the new one's column starts clean
        assert new[0].group == "g1" and new[0].breaker.rules is RULES


def test_a_server_placed_again_keeps_its_column_and_breaker() -> None:
    roster = Roster(Board(1, 2), RULES, [S0, S1])
    before = roster.backends
    placed, new = roster.place([S1, Server(S0.url, "spec", "g2")])
    assert new == [] and placed == [before[1], before[0]]
    assert before[0].group == "g2"  # a group moved: updated in place
    assert columns(roster) == {S0.name: 0, S1.name: 1}  # placed, not yet routed between


def test_a_server_past_max_backends_waits_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    roster = Roster(Board(1, 2), RULES, [S0, S1])
    with caplog.at_level(logging.WARNING, "specroute.router"):
        placed, new = roster.place([S0, S1, NEW])
    assert new == [] and [b.name for b in placed] == [S0.name, S1.name]
    assert f"No room for backend {NEW.name}: max_backends (2) are known." in caplog.text


def test_leaving_and_joining_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    board = Board(1, 3)
    roster = Roster(board, RULES, [S0, S1])
    board.add_inflight(0, 2, 0)
    placed, _ = roster.place([S1, NEW])
    with caplog.at_level(logging.WARNING, "specroute.router"):
        roster.route_between(placed)
    assert columns(roster) == {S1.name: 1, NEW.name: 2}
    assert f"Backend {S0.name} left (2 requests in flight there finish)." in caplog.text
    assert f"Backend {NEW.name} joined." in caplog.text
    assert S1.name not in caplog.text


def test_another_worker_takes_up_the_leader_s_set() -> None:
    """Each worker starts on the configured servers; the leader's set replaces them. One
    tracked in the same column keeps its breaker; one in another column is another."""
    board = Board(2, 3)
    leader, other = Roster(board, RULES, [S0, S1]), Roster(board, RULES, [S0, S1])
    kept = other.backend(S1.name)
    placed, _ = leader.place([S1, NEW])
    leader.route_between(placed)
    other.follow(leader.listed())
    seen = [(b.index, b.url, b.pool, b.group) for b in other.backends]
    assert seen == [(1, S1.url, "base", ""), (2, NEW.url, "spec", "g1")]
    assert other.backend(S1.name) is kept and other.backend(NEW.name) is not leader.backends[1]
    moved = [{"column": 0, "url": S1.url, "pool": "base", "group": "g9"}]
    other.follow(moved)
    assert other.backend(S1.name) is not kept and other.backend(S1.name).group == "g9"


def test_own_inflight_counts_this_worker_s_requests_only() -> None:
    board = Board(2, 2)
    roster = Roster(board, RULES, [S0, S1])
    board.add_inflight(0, 2, 100)
    board.become(1)
    board.add_inflight(1, 3, 100)
    board.become(0)
    assert roster.own_inflight() == 2
    assert [b.inflight for b in roster.backends] == [2, 3]
