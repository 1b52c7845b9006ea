"""What a backend's requests and health checks say of it, applied to this worker's breaker
of it: an ejection is counted and logged, a readmission logged.

The leader (the only worker, or worker 0 of several) alone checks health; it publishes each
verdict on the board, and every worker, the leader too, applies the ones it has not yet
applied to its own breakers. A request's end is judged by the worker that served it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from specroute.router.backends.backend import Backend
from specroute.router.backends.health import BreakerState, verdict
from specroute.router.metrics import RouterMetrics
from specroute.router.protocol.outcome import Outcome
from specroute.router.workers.board import Board

_log = logging.getLogger("specroute.router")
HEALTH_CHECK = "health check"  # what a health verdict is said to be in the log


class Verdicts:
    def __init__(self, metrics: RouterMetrics, board: Board) -> None:
        self.metrics, self.board = metrics, board

    def watch(self, backends: Iterable[Backend]) -> None:
        """Count the ejections of ``backends`` from 0 on, so that each series exists from the
        start rather than from its first ejection."""
        for b in backends:
            self.metrics.ejections.labels(backend=b.name)

    def request_ended(self, backend: Backend, outcome: Outcome) -> None:
        """What a request's end says of its backend, to the backend's breaker."""
        self._judge(backend, verdict(outcome), str(outcome))

    def publish(self, backend: Backend, ok: bool) -> None:
        """The leader's health check of ``backend``, for every worker (``follow`` applies it)."""
        self.board.publish_verdict(backend.index, ok)

    def follow(self, backends: Iterable[Backend]) -> None:
        """The health verdicts this worker has not yet applied, to its breakers; and each
        breaker's level on the board, since a cool-down ends with no event to show it."""
        for backend in backends:
            ok = backend.new_verdict()
            if ok is not None:
                self._judge(backend, ok, HEALTH_CHECK)
            backend.show_level()

    def _judge(self, backend: Backend, ok: bool | None, what: str) -> None:
        if ok is None:
            return
        moved = backend.breaker.record(ok)
        backend.show_level()
        if moved is BreakerState.OPEN:
            if self.board.leader or what != HEALTH_CHECK:  # one verdict, every worker
                self.metrics.child(self.metrics.ejections, backend.name).inc()
            _log.warning(
                "Backend %s ejected for %g s (the last failure: %s).",
                backend.name,
                backend.breaker.cool_down,
                what,
            )
        elif moved is BreakerState.CLOSED:
            _log.warning("Backend %s readmitted (%s).", backend.name, what)
