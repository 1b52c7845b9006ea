"""The background work that takes several parts of the router's state: the leader's
discovery of servers, every worker's watch of the profile file, and the following of what
the other workers publish (the leader's verdicts, servers, profile and fit). The leader's
health checks and metric polls take what they use (``router.backends.polls``). Each loop is
given what it uses of the state (``Monitored``; the state is one), not the state's class."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Protocol

from specroute.router.backends.backend import Backend
from specroute.router.backends.discovery import Discovery
from specroute.router.backends.polls import Polling, check_health, guarded
from specroute.router.tasks.held import Held
from specroute.router.workers.board import Board

_log = logging.getLogger("specroute.router")

FOLLOW_INTERVAL = 0.25  # seconds: how often a worker starting looks for the first verdicts
# A worker follows what the others publish before each decision (the state's ``view``);
# this loop is for one that serves nothing meanwhile, and for what shows with no event (a
# cool-down's end, on the breaker gauges; the CPU time): once a second, not four times,
# since each wake of an idle worker costs CPU that every worker would pay.
QUIET_FOLLOW_INTERVAL = 1.0


class Monitored(Held, Protocol):
    """What the loops use of the router's state: the servers and the board, the policy in
    force, the polls, the counters, and the state's steps that take several of them."""

    @property
    def board(self) -> Board: ...
    @property
    def polling(self) -> Polling: ...
    def follow(self) -> None: ...
    def route_between(self, backends: list[Backend]) -> None: ...


async def follow(state: Monitored) -> None:
    """One of several workers: what the others publish, applied here, until cancelled."""
    state.metrics.background_errors.labels(task="follow")  # 0 from the start
    while True:
        await asyncio.sleep(QUIET_FOLLOW_INTERVAL)
        try:
            state.follow()
        except Exception:  # a posted profile that no longer reads: a bug to see, not a stop
            state.metrics.background_errors.labels(task="follow").inc()
            _log.exception("Following the other workers failed; it goes on.")


async def discover(state: Monitored, discovery: Discovery, at_start: bool = False) -> None:
    """The leader: the servers as the sources give them now. One new to the router is
    checked before it is routed to, so that one not up yet joins ejected."""
    before = [(b.name, b.group) for b in state.roster.backends]
    placed, new = state.roster.place(await discovery.servers(at_start))
    await asyncio.gather(*(guarded("health", state.polling, check_health, b) for b in new))
    if at_start or [(b.name, b.group) for b in placed] != before:  # a group moved, too
        state.route_between(placed)  # (at start: published, for the workers waiting on it)


async def rediscover(state: Monitored, discovery: Discovery) -> None:
    """Discovery every ``watch_interval``, until cancelled."""
    state.metrics.background_errors.labels(task="discovery")  # 0 from the start
    while True:
        await asyncio.sleep(state.settings.backends.watch_interval)
        try:
            await discover(state, discovery)
        except Exception:
            state.metrics.background_errors.labels(task="discovery").inc()
            _log.exception("Discovery failed; it goes on.")


async def watch_profile(state: Monitored, path: Path) -> None:
    """Every worker: the profile file read every ``watch_interval``, adopted when it changes
    (a mounted ConfigMap: every replica changes together)."""
    failures = state.metrics.watch_failures.labels(source="profile_file")  # 0 from the start
    while True:
        await asyncio.sleep(state.settings.backends.watch_interval)
        if state.in_force.reread(path) and state.board.leader:  # counted once for the router
            failures.inc()


async def first_verdicts(state: Monitored) -> None:
    """A worker other than the leader starts serving once the leader's first health round
    is in (as the leader does), and its first set of backends if it discovers them, or
    after the time these may take."""
    board, settings = state.board, state.settings
    deadline = time.monotonic() + settings.health.timeout + 1.0
    if settings.backends.discovers():
        deadline += settings.health.timeout  # the discovered servers' checks come first
    while time.monotonic() < deadline:
        if settings.backends.discovers() and not board.servers_published():
            await asyncio.sleep(FOLLOW_INTERVAL)
            continue
        state.follow()
        if all(board.verdict(b.index)[0] for b in state.roster.backends):
            break
        await asyncio.sleep(FOLLOW_INTERVAL)
    state.follow()
