"""The router's state shared by handlers and background tasks, owned by the app: its parts,
each with one job, and the few steps that take several of them.

- ``roster``: the backends routed between, each in its column of the board;
- ``in_force``: the policy routed by, and the profile it was built from;
- ``sync``: what the workers of one router publish for each other;
- ``online``: the live curves learned from served requests, fitted by the leader;
- ``peers``: the other router replicas whose samples the leader takes before each fit;
- ``verdicts``: what requests and health checks say of backends, to their breakers;
- ``decisions``: the routing decisions, counted, the last few kept;
- ``exploration``: the share of decisions sent to the other pool near the crossover;
- ``admission``: which requests are served now and which wait; ``rate_limit``: each key's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientSession, web

from specroute.online.estimator import Online
from specroute.online.exploration import Exploration, policy_bands
from specroute.policies.decision import Decision
from specroute.policies.placement import Placement
from specroute.policies.view import RequestInfo, View
from specroute.router.admission.limits import Admission
from specroute.router.admission.rate_limit import RateLimit
from specroute.router.backends.asking import Asking
from specroute.router.backends.backend import Backend
from specroute.router.backends.discovery import Resolve, resolve_ipv4
from specroute.router.backends.polls import Polling
from specroute.router.backends.relaying import Relaying
from specroute.router.backends.response_owners import Owners
from specroute.router.backends.roster import Roster
from specroute.router.backends.verdicts import Verdicts
from specroute.router.components import placer, upstream_limits
from specroute.router.metrics import RouterMetrics
from specroute.router.observability.decision_log import DecisionLog
from specroute.router.observability.lifecycle import Lifecycle
from specroute.router.observability.tracing import Tracing
from specroute.router.online.peers import Peers
from specroute.router.online.published import published, take
from specroute.router.online.rings import Rings
from specroute.router.operator.watching import Watching
from specroute.router.policy_in_force import POSTED, PolicyInForce
from specroute.router.settings import RouterSettings
from specroute.router.workers.board import Board
from specroute.router.workers.sync import WorkerSync

_log = logging.getLogger("specroute.router")


@dataclass
class RouterState:
    settings: RouterSettings
    metrics: RouterMetrics
    board: Board
    roster: Roster
    in_force: PolicyInForce
    sync: WorkerSync
    verdicts: Verdicts
    decisions: DecisionLog
    admission: Admission
    online: Online
    exploration: Exploration | None = None  # None: off (online=off, or a share of 0)
    rate_limit: RateLimit | None = None
    tracing: Tracing | None = None  # OpenTelemetry, when otlp_traces_endpoint is set
    peers: Peers | None = None  # the leader's, when online_peers are given
    rings: Rings | None = None  # the samples each worker recorded (online on), for peers
    resolve: Resolve = resolve_ipv4  # the names of backends and peers: the system's, or a test's
    # what the router asks the servers with outside a request's path (its session, once
    # open), and what the leader's checks and polls use
    asking: Asking = field(init=False)
    polling: Polling = field(init=False)
    watching: Watching = field(init=False)  # what the read-only endpoints and gauges see
    fitter: Executor | None = None  # the online fit's thread, where the router fits
    stopping: bool = False  # a signal came: /ready says 503, requests are still served
    draining: bool = False  # after the grace: new requests are refused
    background: set[asyncio.Task[None]] = field(default_factory=set)
    rids: set[str] = field(default_factory=set)  # the ids sent as rid, of requests in flight
    lifecycle: Lifecycle = field(default_factory=Lifecycle)  # every request's listeners
    owners: Owners = field(default_factory=Owners)  # the servers of stored responses found
    relaying: Relaying = field(init=False)  # what the calls upstream use
    placement: Placement = field(init=False)
    _news: tuple[int, int, int, int] = (0, 0, 0, 0)  # the board's news, as last followed

    def __post_init__(self) -> None:
        settings = self.settings
        self.relaying = Relaying(
            self.metrics, upstream_limits(settings.upstream), settings.upstream.idle_timeout
        )
        self.placement = placer(settings.routing)
        self.verdicts.watch(self.roster.backends)
        self.asking = Asking(self.roster, self.metrics.upstream_errors, settings.secrets)
        health = settings.health
        self.polling = Polling(
            self.asking,
            self.metrics,
            self.health_checked,
            health.timeout,
            max(health.poll_interval, 1.0),
            health.stale_after,
        )
        self.watching = Watching(
            self.view,
            self.roster,
            self.board,
            self.admission.quota,
            self.in_force,
            self.online,
            health.stale_after,
            settings.online,
        )

    @property
    def session(self) -> ClientSession | None:
        """The client session of health checks, polls, discovery and the peers: the
        operator's (``asking``), open from the app's start."""
        return self.asking.session

    def view(self) -> View:
        if self._news != self.board.news():  # published since: applied before deciding
            self.follow()
        now, stale_after = time.monotonic(), self.settings.health.stale_after
        return View(
            tuple([b.view(stale_after, now) for b in self.roster.backends]),
            source=self.settings.routing.concurrency_source,
            now=now,
            live_bands=self.online.live_bands,
        )

    def place(self, decision: Decision, request: RequestInfo, view: View) -> Decision:
        """The policy's decision, explored (``exploration``) and placed within its pool;
        counted unless left to the policy. In the speculative pool no server at the
        crossover is chosen by its hash."""
        policy = self.in_force.policy
        crossover = view.live_crossover
        if crossover is None:
            crossover = policy.crossover()
        if (exploration := self.exploration) is not None:
            decision = exploration.after(decision, view, policy_bands(policy))
        ceiling = crossover if decision.pool == "spec" else None
        placed, outcome = self.placement.place(decision, request, view, ceiling)
        if outcome != "least_load":
            self.metrics.child(self.metrics.placements, placed.pool, outcome).inc()
        return placed

    def inflight(self) -> int:
        """This worker's requests in flight: what its drain waits for."""
        return self.roster.own_inflight()

    def route_between(self, backends: list[Backend]) -> None:
        """The leader: these backends from now on, for every worker."""
        self.roster.route_between(backends)
        self.verdicts.watch(backends)
        self.sync.publish_servers(self.roster.listed())
        self.follow()

    def post_profile(self, raw: Any) -> None:
        """Route by the profile ``raw`` from the next request on, in every worker; a
        ValueError (bad profile, or a policy that refuses it) reaches none of them."""
        policy, profile = self.in_force.built(raw)
        if self.sync.alone:
            self.in_force.adopt(policy, profile, POSTED)
            return
        self.sync.post_profile(profile.raw)
        self.follow()  # this worker adopts what every worker reads: the last one posted

    def publish_online(self, fitted: bool = True) -> None:
        """The leader, after a fit (``fitted``) or a failed one: the live crossover it
        routes by and the fit, for the other workers to route by and show."""
        self.sync.publish_online(self.online.live_bands, published(self.online) if fitted else None)

    def health_checked(self, backend: Backend, ok: bool) -> None:
        """The leader's health check: published for every worker's breaker, its own first."""
        self.verdicts.publish(backend, ok)
        self.follow()

    def follow(self) -> None:
        """What the other workers published and this one has not applied: the leader's set
        of backends; its health verdicts, to this worker's breakers; the profile posted
        last, to its policy; the leader's online fit and the crossover it routes by."""
        self._news = self.board.news()  # first: what is published meanwhile is news next time
        listed = self.sync.new_servers()
        if listed is not None:
            self.roster.follow(listed)
            self.verdicts.watch(self.roster.backends)
        self.board.show_cpu(time.process_time())
        self.verdicts.follow(self.roster.backends)
        raw = self.sync.new_profile()
        if raw is not None:
            self.in_force.adopt(*self.in_force.built(raw), POSTED)
        if self.sync.new_online():
            self._take_online()

    def _take_online(self) -> None:
        """The leader's crossover, from the board; its fit, from its file, unless that
        does not read (logged and counted; the fit shown before stands)."""
        adopted = self.board.live_crossover()
        try:
            take(self.online, adopted, self.sync.online_fit())
        except (OSError, ValueError, KeyError, TypeError):
            take(self.online, adopted, None)
            self.metrics.background_errors.labels(task="online").inc()
            _log.exception(
                "The leader's online fit did not read; its crossover on the board is routed "
                "by (bands and crossings per context are in the fit: the profile's instead)."
            )


STATE = web.AppKey("state", RouterState)  # where the aiohttp app keeps it
