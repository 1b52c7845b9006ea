"""One upstream server as a router worker tracks it: its breaker, and its column of the
board that the workers share (in flight, health verdicts, the leader's readings)."""

from __future__ import annotations

import math
from typing import Literal, NamedTuple
from urllib.parse import urlsplit

from specroute.policies.view import BackendView, Pool
from specroute.router.backends.health import Breaker, BreakerState
from specroute.router.workers.board import Board, Reading
from specroute.server_metrics import BackendStats, live_accept_length


def backend_name(url: str, pool: Pool) -> str:
    """``{pool}:{host}:{port}``: the label that metrics, views and decisions use."""
    parts = urlsplit(url)
    return f"{pool}:{parts.hostname}:{parts.port}"


class Server(NamedTuple):
    """A backend as configured or discovered: where, which pool, which GPU group."""

    url: str
    pool: Pool
    group: str = ""  # "": the deployment's one group

    @property
    def name(self) -> str:
        return backend_name(self.url, self.pool)


LOADS_PATHS = ("/v1/loads", "/get_loads")  # SGLang's, and SMG's name for it
SPECROUTE_VERSION = "specroute-"  # the prefix of a router's version in its loads answer
Front = Literal["smg", "specroute"]  # a gateway in front of servers, as a backend
READY_PATHS: dict[Front, str] = {"smg": "/readiness", "specroute": "/ready"}


class Backend:
    def __init__(self, server: Server, breaker: Breaker, board: Board, index: int) -> None:
        self.url, self.pool, self.group = server
        self.server, self.name, self.breaker = server, server.name, breaker
        self.board, self.index = board, index
        self._verdicts_seen = 0  # the sequence number of the last health verdict applied
        self._previous: BackendStats | None = None  # the leader's last scrape
        self._accept: tuple[float, float] | None = None  # the leader's: (accept length, at)
        # the leader's: where it reads its load, SGLang's /v1/loads, or SMG's /get_loads
        # (the pool is an SMG in front of servers) once that answers 404; None after both
        self.loads_path: str | None = LOADS_PATHS[0]
        # the leader's: what stands there in front of servers, by its loads' answer (SMG's
        # /get_loads answered; a specroute's version), None while it is taken for a server
        self.front: Front | None = None
        self.poll_problem: str | None = None  # the leader's: why its last poll read nothing
        # the leader's: whether the server adapts its own draft depth (SGLang's
        # speculative_adaptive in its /server_info), None until its /server_info was read
        self.adaptive: bool | None = None

    @property
    def health_path(self) -> str:
        """A gateway's ``/health`` says only that it runs; SMG's ``/readiness`` and
        specroute's ``/ready`` that it has a healthy server to send a request to."""
        return "/health" if self.front is None else READY_PATHS[self.front]

    @property
    def serves_loads(self) -> bool:
        return self.loads_path is not None

    def loads_missing(self) -> None:
        """Its load path answered 404: the next one from now on, or none."""
        at = LOADS_PATHS.index(self.loads_path) if self.loads_path in LOADS_PATHS else -1
        self.loads_path = LOADS_PATHS[at + 1] if 0 <= at < len(LOADS_PATHS) - 1 else None

    @property
    def inflight(self) -> int:
        """Requests in flight here through every worker of the router."""
        return self.board.inflight(self.index)

    @property
    def own_inflight(self) -> int:
        return self.board.own_inflight(self.index)

    @property
    def kv_tokens(self) -> int:
        """The estimated context (KV tokens) of the requests in flight here, every worker's."""
        return self.board.kv_tokens(self.index)

    def lived(self, now: float) -> float:
        """Its requests in flight through every worker integrated over time up to ``now``
        (only differences mean anything: the mean load between two readings)."""
        return self.board.lived(self.index, now)

    def others(self, now: float) -> float:
        """The other router replicas' requests here now, from the leader's last reading
        (its running and queued less this router's own then; 0 once it is not believed)."""
        return self.board.others(self.index, now)

    def others_lived(self, now: float) -> float:
        """Those integrated over time up to ``now``, as ``lived``'s own requests."""
        return self.board.others_lived(self.index, now)

    def prompted(self) -> float:
        """The prompt tokens (estimated) sent here so far through every worker (only
        differences mean anything)."""
        return self.board.prompted(self.index)

    def dispatched(self, n: int, kv_tokens: int, prompt_tokens: int = 0) -> None:
        """``n`` more (or, negative, fewer) of this worker's requests in flight here, of
        ``kv_tokens`` estimated context between them; ``prompt_tokens``: the estimated
        prompts of those sent (none for those that left)."""
        self.board.add_inflight(self.index, n, kv_tokens, prompt_tokens)

    @property
    def healthy(self) -> bool:
        """May get traffic now: what policies, ``/ready``, ``/router/status`` and
        ``specroute_backend_healthy`` all read. Half-open, only while nothing is in flight
        here through any worker, so that one request at a time is the trial."""
        state = self.breaker.state
        return state is BreakerState.CLOSED or (
            state is BreakerState.HALF_OPEN and self.inflight == 0
        )

    def show_level(self) -> None:
        """This worker's breaker level, on the board for the gauges of every worker."""
        self.board.show_level(self.index, self.breaker.state.level)

    def new_verdict(self) -> bool | None:
        """The leader's latest health verdict, if this worker has not applied it yet."""
        seq, ok = self.board.verdict(self.index)
        if seq == self._verdicts_seen:
            return None
        self._verdicts_seen = seq
        return ok

    def record_stats(self, stats: BackendStats, at: float, believed_for: float = math.inf) -> None:
        """The leader's reading, published with the counts for every worker: the live
        accept length (``live_accept_length``), stamped when it has news; the other
        routers' requests it implies held for ``believed_for`` seconds (``stale_after``)."""
        if (accept := live_accept_length(self._previous, stats)) is not None:
            self._accept = (accept, at)
        self._previous = stats
        counts = stats.running, stats.queued, stats.max_running, stats.used_tokens, stats.max_tokens
        drafting = (stats.spec_depth, self.adaptive)
        self.board.publish_reading(
            self.index, counts, self._accept, stats.engine, at, believed_for, drafting
        )

    @property
    def aborts_by_rid(self) -> bool:
        """Whether a request left by its client is also aborted by its ``rid``: SGLang's
        ``/abort_request``. vLLM has no such endpoint; closing the connection frees the
        request there (as it does on SGLang too, which is asked by name as well)."""
        reading = self.board.reading(self.index)
        return reading is None or reading.engine != "vllm"

    @property
    def offers_spec_details(self) -> bool:
        """Whether it answers a request's own speculation details (``sglext``): a
        speculative SGLang server, once read."""
        reading = self.board.reading(self.index)
        return self.pool == "spec" and reading is not None and reading.engine == "sglang"

    @property
    def gives_meta_info(self) -> bool:
        """Whether a whole chat's answer can carry its ``meta_info`` with its decode time
        (``return_meta_info``): an SGLang server, read (its ``/metrics`` are on), either pool."""
        reading = self.board.reading(self.index)
        return reading is not None and reading.engine == "sglang"

    def reading(self, stale_after: float, now: float) -> Reading | None:
        """The leader's last reading, if not older than ``stale_after`` seconds."""
        reading = self.board.reading(self.index)
        return reading if reading is not None and now - reading.at <= stale_after else None

    def view(self, stale_after: float, now: float) -> BackendView:
        r = self.reading(stale_after, now)
        if r is None:
            return BackendView(
                self.name,
                self.pool,
                self.healthy,
                self.inflight,
                group=self.group,
                kv_tokens=self.kv_tokens,
            )
        age = None if r.accept_length is None else now - r.accept_length_at
        return BackendView(
            self.name,
            self.pool,
            self.healthy,
            self.inflight,
            r.running,
            r.queued,
            r.accept_length,
            age,
            r.max_running,
            r.inflight,
            self.group,
            self.kv_tokens,
        )
