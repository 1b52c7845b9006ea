"""One request at one backend, from dispatch to the end of its answer."""

from __future__ import annotations

import time

from specroute.router.backend import Backend
from specroute.router.outcome import Outcome
from specroute.router.state import RouterState


class Flight:
    """One request at one backend, from dispatch to the end of its answer: in flight all
    along, then counted once by its outcome. One the backend failed before its first byte
    is not counted here (the backend's error is, by kind): another may still serve it."""

    def __init__(self, state: RouterState, backend: Backend) -> None:
        self.state, self.backend = state, backend
        self.started = time.monotonic()
        self.outcome: Outcome | None = None
        self.status = 0  # the backend's HTTP status: the label of an answered request
        self._inflight = state.metrics.inflight.labels(pool=backend.pool, backend=backend.name)
        backend.inflight += 1
        self._inflight.set(backend.inflight)

    def first_byte(self) -> None:
        ttft = self.state.metrics.ttft.labels(pool=self.backend.pool)
        ttft.observe(time.monotonic() - self.started)

    def land(self) -> None:
        m, backend = self.state.metrics, self.backend
        backend.inflight -= 1
        self._inflight.set(backend.inflight)
        if self.outcome is not None:
            status = str(self.status) if self.outcome is Outcome.ANSWERED else self.outcome
            m.requests.labels(pool=backend.pool, backend=backend.name, status=status).inc()
            m.duration.labels(pool=backend.pool).observe(time.monotonic() - self.started)
            if self.outcome in (Outcome.OUT_OF_FDS, Outcome.INTERNAL):
                m.router_errors.labels(kind=self.outcome).inc()
