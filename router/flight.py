"""One request at one backend, from dispatch to the end of its answer."""

from __future__ import annotations

import time

from specroute.router.backend import Backend
from specroute.router.metrics import RouterMetrics
from specroute.router.outcome import Outcome


class Flight:
    """One request at one backend, from dispatch to the end of its answer: in flight all
    along (in this worker's slot of the board, with its estimated context in KV tokens),
    then counted once by its outcome. One the backend failed before its first byte is not
    counted here (the backend's error is, by kind): another may still serve it."""

    def __init__(
        self, metrics: RouterMetrics, backend: Backend, stream: bool, context: int
    ) -> None:
        self.metrics, self.backend, self.stream, self.context = metrics, backend, stream, context
        self.started = time.monotonic()
        self.outcome: Outcome | None = None
        self.status = 0  # the backend's HTTP status: the label of an answered request
        # a stream's silence, as the watchdog (monitor.watch_silence) sees it
        self.reading = False  # the relay waits for the backend (not for a slow client)
        self.received = 0  # the answer's bytes at the watchdog's last look
        self.quiet_since = self.started
        self.first_at: float | None = None  # when the first byte of the answer came
        self.tail = self.before = b""  # the answer's last two chunks, for its usage
        backend.dispatched(1, context)

    def first_byte(self) -> None:
        m, self.first_at = self.metrics, time.monotonic()
        m.child(m.ttft, self.backend.pool).observe(self.first_at - self.started)

    def land(self) -> None:
        m, backend = self.metrics, self.backend
        backend.dispatched(-1, -self.context)  # what it added, whatever the profile now
        if self.outcome is None:
            return
        status = str(self.status) if self.outcome is Outcome.ANSWERED else self.outcome
        m.child(m.requests, backend.pool, backend.name, status).inc()
        m.child(m.duration, backend.pool).observe(time.monotonic() - self.started)
        if self.outcome in (Outcome.OUT_OF_FDS, Outcome.INTERNAL):
            m.child(m.router_errors, self.outcome).inc()
