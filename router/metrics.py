"""The router's Prometheus metrics; names are fixed so dashboards can rely on them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class RouterMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "specroute_requests",
            "Requests answered, by pool, backend and HTTP status.",
            ["pool", "backend", "status"],
            registry=r,
        )
        self.decisions = Counter(
            "specroute_route_decisions",
            "Routing decisions, by pool and reason.",
            ["pool", "reason"],
            registry=r,
        )
        self.inflight = Gauge(
            "specroute_inflight",
            "Requests in flight through the router.",
            ["pool", "backend"],
            registry=r,
        )
        self.live_concurrency = Gauge(
            "specroute_live_concurrency",
            "The live concurrency of the whole deployment as the policy counts it, now.",
            registry=r,
        )
        self.crossover = Gauge(
            "specroute_crossover", "The crossover the policy routes by.", registry=r
        )
        self.crossover_measured = Gauge(
            "specroute_crossover_measured",
            "1 when the profile's crossover was measured; 0 when speculation paid (or lost) at "
            "every level measured and the router routes by the edge of what was measured.",
            registry=r,
        )
        self.router_errors = Counter(
            "specroute_router_errors",
            "The router's own failures (out_of_fds, internal_error), charged to no backend.",
            ["kind"],
            registry=r,
        )
        self.healthy = Gauge(
            "specroute_backend_healthy",
            "1 when the backend may get traffic now: its breaker is closed, or half-open "
            "with no request in flight there.",
            ["backend"],
            registry=r,
        )
        self.breaker = Gauge(
            "specroute_backend_breaker_state",
            "The backend's circuit breaker: 0 closed (serving), 1 half-open (one trial at a "
            "time), 2 open (ejected, no traffic).",
            ["backend"],
            registry=r,
        )
        self.ejections = Counter(
            "specroute_backend_ejections",
            "Times the backend was ejected: failures in a row, or a failed trial half-open.",
            ["backend"],
            registry=r,
        )
        self.background_errors = Counter(
            "specroute_background_errors",
            "Unexpected exceptions in background work (task health or poll), each logged "
            "with its traceback; the work goes on.",
            ["task"],
            registry=r,
        )
        self.running = Gauge(
            "specroute_backend_running",
            "Running requests the backend reports.",
            ["backend"],
            registry=r,
        )
        self.queued = Gauge(
            "specroute_backend_queued",
            "Queued requests the backend reports.",
            ["backend"],
            registry=r,
        )
        self.accept_length = Gauge(
            "specroute_backend_accept_length",
            "Accept length over the last polling window, from counter deltas.",
            ["backend"],
            registry=r,
        )
        self.ttft = Histogram(
            "specroute_ttft_seconds",
            "Time from the request to the first byte of the backend's answer.",
            ["pool"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "specroute_request_duration_seconds",
            "Time from the request to the end of the answer.",
            ["pool"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.upstream_errors = Counter(
            "specroute_upstream_errors",
            "Upstream failures, by backend and kind.",
            ["backend", "kind"],
            registry=r,
        )
