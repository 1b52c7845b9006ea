"""The router's state shared by handlers and background tasks, owned by the app."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import ClientResponse, ClientSession, ClientTimeout

from specroute.policies.decision import Decision
from specroute.policies.policy import Policy
from specroute.policies.profile import Profile, parse_profile
from specroute.policies.registry import build_policy
from specroute.policies.view import View
from specroute.router.backend import Backend
from specroute.router.board import Board
from specroute.router.health import BreakerState, verdict
from specroute.router.metrics import RouterMetrics
from specroute.router.outcome import Outcome
from specroute.router.settings import RouterSettings

if TYPE_CHECKING:
    from specroute.router.flight import Flight

_log = logging.getLogger("specroute.router")
POSTED = "POST /router/profile"
POSTED_FILE = "posted-profile.json"


@dataclass
class RouterState:
    settings: RouterSettings
    backends: list[Backend]
    policy: Policy
    profile: Profile | None
    metrics: RouterMetrics
    board: Board
    shared: Path | None = None  # with several workers: their folder (a posted profile too)
    profile_source: str | None = None
    profile_loaded_at: float = field(default_factory=time.time)
    recent: deque[dict[str, Any]] = field(init=False)  # the last decisions, for /router/status
    session: ClientSession | None = None
    stopping: bool = False  # a signal came: /ready says 503, requests are still served
    draining: bool = False  # after the grace: new requests are refused
    background: set[asyncio.Task[None]] = field(default_factory=set)
    upstreams: dict[ClientResponse, Flight] = field(default_factory=dict)  # being relayed
    timeouts: tuple[ClientTimeout, ClientTimeout] = field(init=False)  # a stream's, a whole's
    _by_name: dict[str, Backend] = field(init=False, repr=False)
    _profiles_seen: int = 0  # the board's count of posted profiles, when last followed

    def __post_init__(self) -> None:
        self.recent = deque(maxlen=self.settings.recent_decisions)
        self.timeouts = self.settings.upstream_timeouts()
        self._by_name = {b.name: b for b in self.backends}
        for b in self.backends:
            self.metrics.ejections.labels(backend=b.name)  # at 0 from the start

    def post_profile(self, raw: Any) -> None:
        """Route by the profile ``raw`` from the next request on, in every worker; a
        ValueError (bad profile, or a policy that refuses it) reaches none of them."""
        policy, profile = self._policy_for(raw)
        if self.shared is None:
            self.adopt(policy, profile, POSTED)
            return
        posted = self.shared / POSTED_FILE
        written = posted.with_suffix(f".{self.board.worker}")
        written.write_text(json.dumps(raw))
        written.replace(posted)  # whole or not at all, for a worker reading it now
        self.board.post_profile()
        self.follow()  # this worker adopts what every worker reads: the last one posted

    def _policy_for(self, raw: Any) -> tuple[Policy, Profile]:
        """The policy in force, rebuilt with the profile's crossover (over a configured one)."""
        profile = parse_profile(raw)
        params = {k: v for k, v in self.settings.policy_params().items() if k != "crossover"}
        return build_policy(self.policy.name, params, profile), profile

    def adopt(self, policy: Policy, profile: Profile | None, source: str | None) -> None:
        """Route by a new policy from now on; requests in flight are not touched."""
        self.policy, self.profile, self.profile_source = policy, profile, source
        self.profile_loaded_at = time.time()
        note = None if profile is None else profile.crossover.note
        if note:
            _log.warning("profile %s: %s", source, note)

    def view(self) -> View:
        now = time.monotonic()
        return View(
            tuple([b.view(self.settings.stale_after, now) for b in self.backends]),
            source=self.settings.concurrency_source,
            now=now,
        )

    def inflight(self) -> int:
        """This worker's requests in flight: what its drain waits for."""
        return sum(b.own_inflight for b in self.backends)

    def backend(self, name: str) -> Backend:
        return self._by_name[name]

    def request_ended(self, backend: Backend, outcome: Outcome) -> None:
        """What a request's end says of its backend, to the backend's breaker."""
        self._judge(backend, verdict(outcome), str(outcome))

    def health_checked(self, backend: Backend, ok: bool) -> None:
        """The leader's health check: published for every worker's breaker, its own first."""
        self.board.publish_verdict(backend.index, ok)
        self.follow()

    def follow(self) -> None:
        """What the other workers published and this one has not applied: the leader's
        health verdicts, to this worker's breakers; the profile posted last, to its policy."""
        for backend in self.backends:
            ok = backend.new_verdict()
            if ok is not None:
                self._judge(backend, ok, "health check")
            backend.show_level()  # a cool-down ends with no event
        posted = self.board.profiles_posted()
        if posted != self._profiles_seen and self.shared is not None:
            self._profiles_seen = posted
            policy, profile = self._policy_for(json.loads((self.shared / POSTED_FILE).read_text()))
            self.adopt(policy, profile, POSTED)

    def _judge(self, backend: Backend, ok: bool | None, what: str) -> None:
        if ok is None:
            return
        moved = backend.breaker.record(ok)
        backend.show_level()
        if moved is BreakerState.OPEN:
            if self.board.leader or what != "health check":  # one verdict, every worker
                self.metrics.child(self.metrics.ejections, backend.name).inc()
            _log.warning("Backend %s ejected for %g s (the last failure: %s).",
                        backend.name, backend.breaker.cool_down, what)  # fmt: skip
        elif moved is BreakerState.CLOSED:
            _log.warning("Backend %s readmitted (%s).", backend.name, what)

    def record(self, decision: Decision, load: int) -> None:
        self.metrics.child(self.metrics.decisions, decision.pool, decision.reason).inc()
        self.recent.append({"at": time.time(), "pool": decision.pool, "backend": decision.backend,
                            "reason": decision.reason, "live_concurrency": load})  # fmt: skip
