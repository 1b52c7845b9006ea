"""The router's counters and histograms; names are fixed so dashboards can rely on them.

Events are counted here, by each worker; what is a state (in flight, health, the
crossover) is a gauge read from the shared board at each scrape (``gauges.py``). With
several workers, the counts live in prometheus_client's multiprocess files, one set a
worker, and a scrape of any worker sums them: the figures add up whichever answers.
"""

from __future__ import annotations

from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import MultiProcessCollector

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

M = TypeVar("M", bound=MetricWrapperBase)


class RouterMetrics:
    def __init__(self, shared_dir: str | None = None) -> None:
        """``shared_dir``: the workers' multiprocess folder, when there are several."""
        self._own = CollectorRegistry()  # this worker's counts
        self.exposed = self._own  # what /metrics writes out, the state's gauges added
        if shared_dir is not None:
            self.exposed = CollectorRegistry()
            MultiProcessCollector(self.exposed, path=shared_dir)  # type: ignore[no-untyped-call]
        self._children: dict[tuple[MetricWrapperBase, tuple[str, ...]], MetricWrapperBase] = {}
        self._routing()
        self._failures()
        self._online_peers()
        self._admission()

    def _routing(self) -> None:
        """Where requests went and how long they took."""
        self.requests = self._counter(
            "specroute_requests",
            "Requests answered, by pool, backend and HTTP status.",
            ("pool", "backend", "status"),
        )
        self.decisions = self._counter(
            "specroute_route_decisions",
            "Routing decisions, by pool and reason.",
            ("pool", "reason"),
        )
        self.explored = self._counter(
            "specroute_online_explored",
            "Requests sent to the pool the policy did not choose, near the crossover, so that "
            "the live curves are seen there (online exploration), by the pool sent to.",
            ("pool",),
        )
        self.placements = self._counter(
            "specroute_placements",
            "Where within the chosen pool requests ran, by pool and placement outcome: "
            "affinity (the server their prompt's prefix hashes to), balance (the "
            "least-loaded one, the hashed one being busier past both thresholds), full (the "
            "least-loaded one, the hashed one being at its cap or, speculative, at the "
            "crossover), no_prefix (no prompt to hash: the least-loaded one).",
            ("pool", "outcome"),
        )
        self.ttft = self._latency(
            "specroute_ttft_seconds",
            "Time from the request to the first byte of the backend's answer.",
        )
        self.duration = self._latency(
            "specroute_request_duration_seconds", "Time from the request to the end of the answer."
        )

    def _failures(self) -> None:
        """What failed, on either side of the router, and the bounds clients were held to."""
        self.router_errors = self._counter(
            "specroute_router_errors",
            "The router's own failures (out_of_fds, internal_error), charged to no backend.",
            ("kind",),
        )
        self.ejections = self._counter(
            "specroute_backend_ejections",
            "Times the backend was ejected: failures in a row, or a failed trial half-open.",
            ("backend",),
        )
        self.background_errors = self._counter(
            "specroute_background_errors",
            "Unexpected exceptions in background work (task health or poll), each logged "
            "with its traceback; the work goes on.",
            ("task",),
        )
        self.watch_failures = self._counter(
            "specroute_watch_failures",
            "A watched source that could not be read or was refused (source dns, "
            "backends_file or profile_file); the router kept what it had from it.",
            ("source",),
        )
        self.upstream_errors = self._counter(
            "specroute_upstream_errors",
            "Upstream failures, by backend and kind.",
            ("backend", "kind"),
        )
        self.upstream_dropped = self._counter(
            "specroute_upstream_dropped",
            "What the router dropped of a backend's bytes, by backend and reason: an interim "
            "answer (1xx) before the final one, the connection kept (interim); a connection "
            "closed because the backend broke HTTP/1.1: bytes after an answer's end "
            "(trailing_bytes), bytes while no request waited (unasked), a 101 "
            "(switched_protocols), a head past max_upstream_head_bytes (head_too_large), "
            "what is not HTTP (malformed).",
            ("backend", "reason"),
        )
        self.client_limits = self._counter(
            "specroute_client_limits",
            "Clients held to a bound, by limit: a connection no longer read while it had "
            "max_pipelined_requests (pipelined_requests) or max_pipelined_bytes "
            "(pipelined_bytes) sent ahead of its answers; a client cut off that read nothing "
            "for client_write_timeout (write_timeout).",
            ("limit",),
        )

    def _online_peers(self) -> None:
        """Online calibration's pulls of peer replicas' samples, and the answers it could
        not read."""
        self.online_unread = self._counter(
            "specroute_online_unread",
            "Answered whole chats whose meta_info the router asked for or read (an SGLang "
            "server) and could not use, by backend and reason: no_decode_time (no one "
            "decode_throughput in it, or one no decode runs at, in an answer of two tokens "
            "or more: no sample), meta_info_kept (not of SGLang's shape, or compressed: "
            "relayed as it came, the meta_info the router asked for left in it).",
            ("backend", "reason"),
        )
        self.online_peer_samples = self._counter(
            "specroute_online_peer_samples",
            "Online samples taken from a peer router replica (--online-peers) for the fit, by "
            "peer (its URL without credentials).",
            ("peer",),
        )
        self.online_peer_errors = self._counter(
            "specroute_online_peer_errors",
            "Pulls of a peer replica's online samples that took nothing, by peer and reason "
            "(unreachable, timeout, refused: 401 or 403, status: another one, not_json, "
            "bad_answer: not of the shape or too large, itself: a URL given as such is this "
            "router), rows of its answers dropped as invalid (bad_row, each row), and "
            "resolutions of a name of peers (dns+http://NAME:PORT, the peer label) that failed "
            "(resolve: its last peers kept).",
            ("peer", "reason"),
        )

    def _admission(self) -> None:
        """Requests refused or held before routing."""
        self.admission_refusals = self._counter(
            "specroute_admission_refusals",
            "Requests refused before routing, by reason: queue_full (429), queue_timeout (503), "
            "rate_limited (429), draining (503: it waited when the router began to drain).",
            ("reason",),
        )
        self.rate_limited = self._counter(
            "specroute_rate_limited",
            "Requests refused by the per-key rate limit, by key name (keyN: the N-th client key "
            "given; admin; anonymous: none), never by the key.",
            ("key",),
        )
        self.queue_wait = Histogram(
            "specroute_queue_wait_seconds",
            "Time a request waited in the admission queue, admitted or not (those admitted at "
            "once are not counted).",
            buckets=LATENCY_BUCKETS,
            registry=self._own,
        )

    def _counter(self, name: str, documentation: str, labels: tuple[str, ...]) -> Counter:
        return Counter(name, documentation, labels, registry=self._own)

    def _latency(self, name: str, documentation: str) -> Histogram:
        """A time by pool, in the buckets that every latency of the router shares."""
        return Histogram(name, documentation, ["pool"], buckets=LATENCY_BUCKETS, registry=self._own)

    def child(self, metric: M, *labels: str) -> M:
        """``metric.labels(*labels)``, looked up once: prometheus_client's own lookup takes
        a lock and checks every label, on every request."""
        key = (metric, labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found  # type: ignore[return-value]  # keyed by the metric it came from
