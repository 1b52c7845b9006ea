"""What the workers of one router tell each other through their folder: the leader's set
of backends and the profile posted last, each seen once by each worker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specroute.router.workers.board import Board
from specroute.router.workers.sync import POSTED_FILE, SERVERS_FILE, WorkerSync

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
    from specroute.router.processes import Workers, quota_of
    from specroute.router.settings import RouterSettings

    given: dict[str, Any] = {"spec": ["http://127.0.0.1:9"], "base": ["http://127.0.0.1:10"]}
    settings = RouterSettings(**given, crossover=4, workers=2)
    board = Board(2, settings.backends.columns())
    board.become(1)  # this process is the second worker; the leader publishes on the board
    state = build_state(settings, Workers(board, tmp_path, quota_of(settings)))
    spec = state.roster.backends[0]
    board.publish_verdict(spec.index, True)  # the leader's first round
    state.view()
    for _ in range(settings.health.eject_after_failures):
        assert spec.healthy
        board.publish_verdict(spec.index, False)
        state.view()
    assert not spec.healthy and not state.view().backends[0].healthy
    assert board.worst_level(spec.index) > 0  # shown for the gauges of every worker


def test_the_leader_s_online_fit_reaches_another_worker_whole(tmp_path: Path) -> None:
    """The same ``LiveFit``s, drift, crossover, topology and status: what another worker
    shows and routes by is the leader's fit, not one of its own."""
    from specroute.online.estimator import Online, OnlineMode, Sureness
    from specroute.online.samples import Samples
    from specroute.policies.profile import parse_profile
    from specroute.router.online.published import published, take
    from tests.router.online.test_online import dense, profile_of, served

    profile = parse_profile(profile_of(dense(1 / 16), (16.0, 32.0)))
    leader = Online(OnlineMode.ADOPT, Samples(4096, 600.0), Sureness(30, 4.0))
    for s in served(dense(), 40):
        leader.record(s)
    leader.refit(1.0, profile, shared=False)
    assert leader.adopted is not None and leader.drift == (True,)  # a fit worth sharing
    board = Board(2, 2)
    sync, other = WorkerSync(board, tmp_path), WorkerSync(board, tmp_path)
    assert not other.new_online() and other.online_fit() is None
    sync.publish_online(leader.live_bands, published(leader))
    assert not sync.new_online()  # its own
    assert other.new_online() and not other.new_online()
    follower = Online(OnlineMode.ADOPT, Samples(16, 600.0), Sureness(30, 4.0), leads=False)
    take(follower, board.live_crossover(), other.online_fit())
    assert follower.fits == leader.fits and follower.drift == leader.drift
    assert follower.adopted == leader.adopted and follower.shared is False
    assert follower.describe(2.0) == leader.describe(2.0)
    sync.publish_online(())  # a failed fit: the profile's crossover, the fit shown stands
    assert other.new_online() and board.live_crossover() is None
    take(follower, board.live_crossover(), other.online_fit())
    assert follower.adopted is None and follower.fits == leader.fits


def test_a_worker_routes_by_the_leader_s_crossover_even_when_its_fit_does_not_read(
    tmp_path: Path,
) -> None:
    from prometheus_client import generate_latest

    from specroute.online.estimator import OnlineMode
    from specroute.router.app import build_state
    from specroute.router.processes import Workers, quota_of
    from specroute.router.settings import RouterSettings
    from specroute.router.workers.sync import ONLINE_FILE

    given: dict[str, Any] = {"spec": ["http://127.0.0.1:9"], "base": ["http://127.0.0.1:10"]}
    settings = RouterSettings(**given, crossover=4, workers=2, online=OnlineMode.ADOPT)
    board = Board(2, settings.backends.columns())
    board.become(1)
    state = build_state(settings, Workers(board, tmp_path, quota_of(settings)))
    assert not state.online.fitting and state.online.records  # it records; the leader fits
    assert state.view().live_crossover is None
    (tmp_path / ONLINE_FILE).write_text("{not json")
    board.publish_online(2.5)  # as the leader's WorkerSync does, after writing the file
    assert state.view().live_crossover == 2.5 == state.online.adopted  # at the next decision
    (errors,) = state.metrics.background_errors.collect()
    counted = {s.labels["task"]: s.value for s in errors.samples if s.name.endswith("_total")}
    assert counted["online"] == 1
    assert "specroute_online_adopted 1.0" in generate_latest(state.metrics.exposed).decode()


def test_live_bands_reach_another_worker_through_the_fit_and_fail_closed_without_it(
    tmp_path: Path,
) -> None:
    """Bands (a mixture-of-experts pair's) are no crossover the board can hold: it points to
    the fit, the other worker routes by the bands written there, and when the fit does not
    read it routes by the profile's, never by what it does not have."""
    from specroute.online.estimator import Online, OnlineMode, Sureness
    from specroute.online.samples import Samples
    from specroute.router.online.published import published, take
    from specroute.router.workers.sync import IN_THE_FIT, ONLINE_FILE
    from tests.router.online.test_online import MOE_ROUTED, moe, served

    leader = Online(OnlineMode.ADOPT, Samples(4096, 600.0), Sureness(30))
    for s in served(moe, 40):
        leader.record(s)
    leader.refit(1.0, None, shared=True, routed=MOE_ROUTED)
    ((band,),) = leader.live_bands  # type: ignore[misc]
    assert band[0] is not None  # from some load up: no crossover
    board = Board(2, 2)
    sync, other = WorkerSync(board, tmp_path), WorkerSync(board, tmp_path)
    sync.publish_online(leader.live_bands, published(leader))
    assert other.new_online() and board.live_crossover() == IN_THE_FIT
    follower = Online(OnlineMode.ADOPT, Samples(16, 600.0), Sureness(30), leads=False)
    take(follower, board.live_crossover(), other.online_fit())
    assert follower.live_bands == leader.live_bands
    assert follower.describe(2.0)["fits"] == leader.describe(2.0)["fits"]
    (tmp_path / ONLINE_FILE).write_text("{not json")
    with pytest.raises(json.JSONDecodeError):
        take(follower, board.live_crossover(), other.online_fit())
    take(follower, board.live_crossover(), None)  # as a worker does when the fit is unread
    assert follower.live_bands == ()
    (tmp_path / ONLINE_FILE).unlink()
    tmp_path.joinpath(ONLINE_FILE).mkdir()  # the leader cannot write it: nothing points there
    with pytest.raises(IsADirectoryError):
        sync.publish_online(leader.live_bands, published(leader))
    assert board.live_crossover() is None
