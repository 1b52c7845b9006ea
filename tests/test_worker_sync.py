"""What the workers of one router tell each other through their folder: the leader's set
of backends and the profile posted last, each seen once by each worker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specroute.router.board import Board
from specroute.router.worker_sync import POSTED_FILE, SERVERS_FILE, WorkerSync

LISTED = [{"column": 0, "url": "http://s:1", "pool": "spec", "group": ""}]
PROFILE: dict[str, Any] = {"schema": "specroute.profile/v1", "crossover": {"value": 3}}


def test_a_router_of_one_worker_has_nothing_to_tell() -> None:
    sync = WorkerSync(Board(1, 2), None)
    assert sync.alone
    sync.publish_servers(LISTED)
    assert sync.new_servers() is None and sync.new_profile() is None
    with pytest.raises(RuntimeError, match="one worker"):
        sync.post_profile(PROFILE)


def test_the_leader_s_set_reaches_another_worker_once(tmp_path: Path) -> None:
    board = Board(2, 2)
    leader, other = WorkerSync(board, tmp_path), WorkerSync(board, tmp_path)
    assert not leader.alone and other.new_servers() is None  # none published yet
    leader.publish_servers(LISTED)
    assert leader.new_servers() is None  # its own
    assert other.new_servers() == LISTED
    assert other.new_servers() is None
    again = [*LISTED, {"column": 1, "url": "http://b:2", "pool": "base", "group": ""}]
    leader.publish_servers(again)
    assert other.new_servers() == again
    assert sorted(p.name for p in tmp_path.iterdir()) == [SERVERS_FILE]  # written whole


def test_a_leader_started_again_takes_up_the_set_it_published(tmp_path: Path) -> None:
    """The board outlives a worker that died; its successor reads what it had published."""
    board = Board(2, 2)
    WorkerSync(board, tmp_path).publish_servers(LISTED)
    assert WorkerSync(board, tmp_path).new_servers() == LISTED


def test_a_posted_profile_reaches_every_worker_the_poster_too(tmp_path: Path) -> None:
    board = Board(2, 2)
    poster, other = WorkerSync(board, tmp_path), WorkerSync(board, tmp_path)
    assert poster.new_profile() is None
    poster.post_profile(PROFILE)
    board.become(1)  # posted to the other worker now: its own count on the board
    later = PROFILE | {"crossover": {"value": 5}}
    other.post_profile(later)
    assert board.profiles_posted() == 2  # neither post lost to the other
    assert poster.new_profile() == later and other.new_profile() == later  # the last one
    assert poster.new_profile() is None and other.new_profile() is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [POSTED_FILE]  # written whole


def test_a_worker_applies_the_leader_s_verdicts_at_its_next_decision(tmp_path: Path) -> None:
    """Before each decision, not at its next timer: a follower routes by the verdicts the
    leader published a moment ago."""
    from specroute.router.app import build_state
    from specroute.router.quota import quota_of
    from specroute.router.settings import RouterSettings
    from specroute.router.workers import Workers

    given: dict[str, Any] = {"spec": ["http://127.0.0.1:9"], "base": ["http://127.0.0.1:10"]}
    settings = RouterSettings(**given, crossover=4, workers=2)
    board = Board(2, settings.columns())
    board.become(1)  # this process is the second worker; the leader publishes on the board
    state = build_state(settings, Workers(board, tmp_path, quota_of(settings)))
    spec = state.roster.backends[0]
    board.publish_verdict(spec.index, True)  # the leader's first round
    state.view()
    for _ in range(settings.eject_after_failures):
        assert spec.healthy
        board.publish_verdict(spec.index, False)
        state.view()
    assert not spec.healthy and not state.view().backends[0].healthy
    assert board.worst_level(spec.index) > 0  # shown for the gauges of every worker
