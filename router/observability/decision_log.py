"""The routing decisions this worker made: each counted by pool and reason (those explored
also by pool alone), and the last few kept for ``/router/status``."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from specroute.online.exploration import EXPLORE
from specroute.policies.decision import Decision
from specroute.router.metrics import RouterMetrics
from specroute.router.observability.lifecycle import Listener
from specroute.router.observability.record import RequestRecord


class DecisionLog(Listener):
    def __init__(self, metrics: RouterMetrics, keep: int) -> None:
        """``keep``: how many of the last decisions ``recent`` holds (``recent_decisions``)."""
        self.metrics = metrics
        self.recent: deque[dict[str, Any]] = deque(maxlen=keep)  # the oldest first

    def decided(self, record: RequestRecord) -> None:
        if record.decision is not None and record.load is not None:
            self.record(record.decision, record.load)

    def record(self, decision: Decision, load: int) -> None:
        """``decision``, made at live concurrency ``load``."""
        m = self.metrics
        m.child(m.decisions, decision.pool, decision.reason).inc()
        if decision.reason == EXPLORE:
            m.child(m.explored, decision.pool).inc()
        self.recent.append(
            {
                "at": time.time(),
                "pool": decision.pool,
                "backend": decision.backend,
                "reason": decision.reason,
                "live_concurrency": load,
            }
        )
