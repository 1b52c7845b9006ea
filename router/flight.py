"""One request at one backend, from dispatch to the end of its answer."""

from __future__ import annotations

import time

from specroute.router.backend import Backend
from specroute.router.outcome import Outcome
from specroute.router.state import RouterState


class Flight:
    """One request at one backend, from dispatch to the end of its answer: in flight all
    along (in this worker's slot of the board), then counted once by its outcome. One the
    backend failed before its first byte is not counted here (the backend's error is, by
    kind): another may still serve it."""

    def __init__(self, state: RouterState, backend: Backend) -> None:
        self.state, self.backend = state, backend
        self.started = time.monotonic()
        self.outcome: Outcome | None = None
        self.status = 0  # the backend's HTTP status: the label of an answered request
        backend.dispatched(1)

    def first_byte(self) -> None:
        m = self.state.metrics
        m.child(m.ttft, self.backend.pool).observe(time.monotonic() - self.started)

    def land(self) -> None:
        m, backend = self.state.metrics, self.backend
        backend.dispatched(-1)
        if self.outcome is None:
            return
        status = str(self.status) if self.outcome is Outcome.ANSWERED else self.outcome
        m.child(m.requests, backend.pool, backend.name, status).inc()
        m.child(m.duration, backend.pool).observe(time.monotonic() - self.started)
        if self.outcome in (Outcome.OUT_OF_FDS, Outcome.INTERNAL):
            m.child(m.router_errors, self.outcome).inc()
