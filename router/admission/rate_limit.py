"""A token bucket for each API key: ``rate_limit`` requests a second, ``rate_limit_burst``
at once. A request past it is refused with 429 and the seconds until its key may send
again in ``Retry-After``. The buckets are the router's, shared by its workers (``Quota``);
a metric names a key by ``Keys.names``, never by the key."""

from __future__ import annotations

import math

from aiohttp import web

from specroute.router.admission.auth import Keys
from specroute.router.admission.limits import Refusal, refused
from specroute.router.admission.quota import Quota
from specroute.router.metrics import RouterMetrics
from specroute.router.protocol.asked import Asked


class RateLimit:
    def __init__(
        self, keys: Keys, quota: Quota, metrics: RouterMetrics, rate: float, burst: int | None
    ) -> None:
        self.keys, self.quota, self.metrics, self.rate = keys, quota, metrics, rate
        self.burst = burst if burst is not None else max(1, math.ceil(rate))
        self.names = keys.names()
        for name in self.names:
            metrics.child(metrics.rate_limited, name)  # 0 from the start

    def refusal(self, request: Asked) -> web.Response | None:
        """None when the request's key may send it now (a token is taken)."""
        bucket = self.keys.holder(request)
        wait = self.quota.spend(bucket, self.rate, self.burst)
        if wait == 0:
            return None
        m = self.metrics
        m.child(m.rate_limited, self.names[bucket]).inc()
        m.child(m.admission_refusals, Refusal.RATE_LIMITED).inc()
        return refused(Refusal.RATE_LIMITED, math.ceil(wait))
