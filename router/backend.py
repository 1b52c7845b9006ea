"""One upstream server as the router tracks it: its own in-flight count, health, stats."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from specroute.policies.view import BackendView, Pool
from specroute.router.backend_stats import BackendStats, window_accept_length
from specroute.router.health import Breaker, Ejection


@dataclass
class Backend:
    url: str
    pool: Pool
    breaker: Breaker = field(default_factory=lambda: Breaker(Ejection()), repr=False)
    inflight: int = 0
    stats: BackendStats | None = None
    stats_at: float = 0.0  # monotonic time of the last successful scrape
    accept_length: float | None = None  # tokens per verify step, over the last window with any
    accept_length_at: float = 0.0  # monotonic time of that window's end: its age
    name: str = field(init=False)  # "{pool}:{host}:{port}", the label metrics and views use
    _previous: BackendStats | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        self.name = f"{self.pool}:{parts.hostname}:{parts.port}"

    @property
    def healthy(self) -> bool:
        """May get traffic now: what policies, ``/ready``, ``/router/status`` and
        ``specroute_backend_healthy`` all read. Half-open, only while nothing is in flight
        here, so that one request at a time is the trial."""
        return self.breaker.admits(busy=self.inflight > 0)

    def record_stats(self, stats: BackendStats, at: float) -> None:
        if self._previous is not None:
            window = window_accept_length(self._previous, stats)
            if window is not None and math.isfinite(window):
                self.accept_length, self.accept_length_at = window, at
        self._previous = stats
        self.stats, self.stats_at = stats, at

    def view(self, stale_after: float, now: float | None = None) -> BackendView:
        now = time.monotonic() if now is None else now
        fresh = self.stats is not None and now - self.stats_at <= stale_after
        stats = self.stats if fresh else None
        return BackendView(
            name=self.name,
            pool=self.pool,
            healthy=self.healthy,
            inflight=self.inflight,
            running=None if stats is None else _count(stats.running),
            queued=None if stats is None else _count(stats.queued),
            accept_length=self.accept_length if fresh else None,
            accept_length_age=now - self.accept_length_at if fresh else None,
        )


def _count(value: float | None) -> int | None:
    """A reported count as a whole number; NaN or infinity (a broken exporter) is none."""
    return None if value is None or not math.isfinite(value) else int(value)
