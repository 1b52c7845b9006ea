"""The router's state shared by handlers and background tasks, owned by the app."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientResponse, ClientSession

from specroute.policies.decision import Decision
from specroute.policies.policy import Policy
from specroute.policies.profile import Profile
from specroute.policies.view import View
from specroute.router.backend import Backend
from specroute.router.health import BreakerState, verdict
from specroute.router.metrics import RouterMetrics
from specroute.router.outcome import Outcome
from specroute.router.settings import RouterSettings

_log = logging.getLogger("specroute.router")


@dataclass
class RouterState:
    settings: RouterSettings
    backends: list[Backend]
    policy: Policy
    profile: Profile | None
    metrics: RouterMetrics
    profile_source: str | None = None
    profile_loaded_at: float = field(default_factory=time.time)
    recent: deque[dict[str, Any]] = field(init=False)  # the last decisions, for /router/status
    session: ClientSession | None = None
    stopping: bool = False  # a signal came: /ready says 503, requests are still served
    draining: bool = False  # after the grace: new requests are refused
    background: set[asyncio.Task[None]] = field(default_factory=set)
    upstreams: set[ClientResponse] = field(default_factory=set)  # answers being relayed
    _by_name: dict[str, Backend] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.recent = deque(maxlen=self.settings.recent_decisions)
        self._by_name = {}
        for b in self.backends:  # a URL given twice in one pool is served by the first
            self._by_name.setdefault(b.name, b)
        # read at each scrape: the load the policy would see now, also after traffic stops
        self.metrics.live_concurrency.set_function(lambda: self.view().load())
        for b in self._by_name.values():
            self._show_health(b)

    def _show_health(self, backend: Backend) -> None:
        """Read at each scrape too: a cool-down ends with no event to set a gauge at."""
        m, name = self.metrics, backend.name
        m.healthy.labels(backend=name).set_function(lambda: backend.healthy)
        m.breaker.labels(backend=name).set_function(lambda: backend.breaker.state.level)
        m.ejections.labels(backend=name)  # at 0 from the start

    def adopt(self, policy: Policy, profile: Profile | None, source: str | None) -> None:
        """Route by a new policy from now on; requests in flight are not touched."""
        self.policy, self.profile, self.profile_source = policy, profile, source
        self.profile_loaded_at = time.time()
        self._show_crossover()
        note = None if profile is None else profile.crossover.note
        self.metrics.crossover_measured.set(0 if note else 1)
        if note:
            _log.warning("profile %s: %s", source, note)

    def _show_crossover(self) -> None:
        crossover = self.policy.crossover()
        if crossover is not None:
            self.metrics.crossover.set(crossover)

    def view(self) -> View:
        now = time.monotonic()
        return View(
            tuple(b.view(self.settings.stale_after, now) for b in self.backends),
            source=self.settings.concurrency_source,
            now=now,
        )

    def inflight(self) -> int:
        return sum(b.inflight for b in self.backends)

    def backend(self, name: str) -> Backend:
        return self._by_name[name]

    def request_ended(self, backend: Backend, outcome: Outcome) -> None:
        """What a request's end says of its backend, to the backend's breaker."""
        self._judge(backend, verdict(outcome), str(outcome))

    def health_checked(self, backend: Backend, ok: bool) -> None:
        self._judge(backend, ok, "health check")

    def _judge(self, backend: Backend, ok: bool | None, what: str) -> None:
        if ok is None:
            return
        moved = backend.breaker.record(ok)
        if moved is BreakerState.OPEN:
            self.metrics.ejections.labels(backend=backend.name).inc()
            _log.warning("Backend %s ejected for %g s (the last failure: %s).",
                        backend.name, backend.breaker.cool_down, what)  # fmt: skip
        elif moved is BreakerState.CLOSED:
            _log.warning("Backend %s readmitted (%s).", backend.name, what)

    def record(self, decision: Decision, load: int) -> None:
        self.metrics.decisions.labels(pool=decision.pool, reason=decision.reason).inc()
        self._show_crossover()  # it may move with live acceptance
        self.recent.append({"at": time.time(), "pool": decision.pool, "backend": decision.backend,
                            "reason": decision.reason, "live_concurrency": load})  # fmt: skip
