"""What a policy sees: a snapshot of the backends that the router fills in.

Policies never touch the network; the router hands them this frozen picture, stamped
with the time each backend's numbers were read so a policy can tell stale data.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, NamedTuple

Pool = Literal["spec", "base"]
POOLS: tuple[Pool, ...] = ("spec", "base")


class ConcurrencySource(StrEnum):
    """Where live concurrency comes from: the router's own count of in-flight requests,
    the backends' reported running + queued, or the larger of the two (several router
    replicas sharing backends each see only their own share)."""

    ROUTER = "router"
    BACKEND = "backend"
    MAX = "max"


class BackendView(NamedTuple):  # built for every backend at every request: a tuple is cheapest
    name: str
    pool: Pool
    healthy: bool
    inflight: int  # the router's own count
    running: int | None = None  # the backend's report, None when stale or missing
    queued: int | None = None
    accept_length: float | None = None  # over the last window with verify steps (counters)
    accept_length_age: float | None = None  # seconds since that window: no traffic, no news
    max_running_requests: int | None = None

    def load(self, source: ConcurrencySource) -> int:
        if source is ConcurrencySource.ROUTER or self.running is None:  # at every request
            return self.inflight
        reported = self.running + (self.queued or 0)
        if source is ConcurrencySource.BACKEND:
            return reported
        return max(self.inflight, reported)


@dataclass(frozen=True)
class View:
    backends: tuple[BackendView, ...]
    source: ConcurrencySource = ConcurrencySource.ROUTER
    now: float = 0.0

    def healthy(self, pool: Pool) -> tuple[BackendView, ...]:
        return tuple([b for b in self.backends if b.pool == pool and b.healthy])

    def load(self, pool: Pool | None = None) -> int:
        """Live concurrency of one pool, or of the whole deployment."""
        source = self.source
        return sum([b.load(source) for b in self.backends if pool is None or b.pool == pool])

    def least_loaded(self, pool: Pool) -> BackendView | None:
        candidates = self.healthy(pool)
        if len(candidates) < 2:
            return candidates[0] if candidates else None
        return min(candidates, key=lambda b: (b.load(self.source), b.inflight, b.name))


@dataclass(frozen=True)
class RequestInfo:
    """What a policy may know of a request without reading the network."""

    path: str
    stream: bool = False
    max_tokens: int | None = None
