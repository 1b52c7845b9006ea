"""The router's state shared by handlers and background tasks, owned by the app."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import ClientResponse, ClientSession, ClientTimeout

from specroute.policies.decision import Decision
from specroute.policies.policy import Policy
from specroute.policies.profile import Profile, parse_profile
from specroute.policies.registry import build_policy
from specroute.policies.view import TOKENS_PER_BYTE, View
from specroute.router.backend import Backend, Server
from specroute.router.board import Board
from specroute.router.flight import Flight
from specroute.router.health import Breaker, BreakerState, verdict
from specroute.router.metrics import RouterMetrics
from specroute.router.outcome import Outcome
from specroute.router.settings import RouterSettings

_log = logging.getLogger("specroute.router")
POSTED = "POST /router/profile"
POSTED_FILE = "posted-profile.json"
SERVERS_FILE = "servers.json"  # the leader's set of backends, for the other workers
_REUSE_AFTER = 10.0  # seconds a column of a server gone stays unused (a worker may be late)


@dataclass
class RouterState:
    settings: RouterSettings
    backends: list[Backend]
    policy: Policy
    profile: Profile | None
    metrics: RouterMetrics
    board: Board
    shared: Path | None = None  # with several workers: their folder (a posted profile too)
    profile_source: str | None = None
    profile_loaded_at: float = field(default_factory=time.time)
    recent: deque[dict[str, Any]] = field(init=False)  # the last decisions, for /router/status
    session: ClientSession | None = None
    stopping: bool = False  # a signal came: /ready says 503, requests are still served
    draining: bool = False  # after the grace: new requests are refused
    background: set[asyncio.Task[None]] = field(default_factory=set)
    upstreams: dict[ClientResponse, Flight] = field(default_factory=dict)  # being relayed
    timeouts: tuple[ClientTimeout, ClientTimeout] = field(init=False)  # a stream's, a whole's
    profile_digest: bytes = b""  # of the profile file as last read
    tokens_per_byte: float = TOKENS_PER_BYTE  # the profile's, for the KV tokens in flight
    _by_name: dict[str, Backend] = field(init=False, repr=False)
    _profiles_seen: int = 0  # the board's count of posted profiles, when last followed
    _servers_seen: int = 0  # the board's count of published sets of backends, likewise
    _gone: dict[int, float] = field(default_factory=dict)  # the leader's: column, when freed

    def __post_init__(self) -> None:
        self.recent = deque(maxlen=self.settings.recent_decisions)
        self.timeouts = self.settings.upstream_timeouts()
        self._route_between(self.backends)

    def _route_between(self, backends: list[Backend]) -> None:
        self.backends = backends
        self._by_name = {b.name: b for b in backends}
        for b in backends:
            self.metrics.ejections.labels(backend=b.name)  # at 0 from the start

    def backend_at(self, column: int, server: Server) -> Backend:
        """``server`` as this worker tracks it, in ``column`` of the board, breaker new."""
        return Backend(server, Breaker(self.settings.ejection()), self.board, column)

    # discovery: the leader places servers in columns of the board, the others follow

    def place(self, servers: list[Server]) -> tuple[list[Backend], list[Backend]]:
        """The leader's backends for ``servers``: those it has, and new ones each in a free
        column (a server past ``max_backends`` waits, logged, for a column to free)."""
        have = {b.name: b for b in self.backends}
        taken = {b.index for b in self.backends}
        placed: list[Backend] = []
        new: list[Backend] = []
        for server in servers:
            backend = have.get(server.name)
            if backend is None:
                column = self._free_column(taken)
                if column is None:
                    _log.warning(
                        "No room for backend %s: max_backends (%d) are known.",
                        server.name,
                        self.board.backends,
                    )
                    continue
                taken.add(column)
                self.board.clear(column)
                backend = self.backend_at(column, server)
                new.append(backend)
            backend.group = server.group
            placed.append(backend)
        return placed, new

    def _free_column(self, taken: set[int]) -> int | None:
        """Never used first; then one a server left long enough ago, with nothing in flight."""
        now, board = time.monotonic(), self.board
        free = [
            c
            for c in range(board.backends)
            if c not in taken
            and board.inflight(c) == 0
            and now - self._gone.get(c, -_REUSE_AFTER) >= _REUSE_AFTER
        ]
        never = [c for c in free if c not in self._gone]
        return min(never or free, default=None)

    def route_between(self, backends: list[Backend]) -> None:
        """The leader: these backends from now on, for every worker. Requests in flight at
        one that left finish there; its column stays its own until they have."""
        now = time.monotonic()
        kept = {b.index for b in backends}
        for gone in self.backends:
            if gone.index not in kept:
                self._gone[gone.index] = now
                _log.warning(
                    "Backend %s left (%d requests in flight there finish).",
                    gone.name,
                    gone.inflight,
                )
        for b in backends:
            if b.name not in self._by_name:
                _log.warning("Backend %s joined.", b.name)
        self._route_between(backends)
        if self.shared is not None:
            listed = [
                {"column": b.index, "url": b.url, "pool": b.pool, "group": b.group}
                for b in backends
            ]
            _write_whole(self.shared / SERVERS_FILE, json.dumps(listed), self.board.worker)
            self.board.publish_servers()
            self._servers_seen = self.board.servers_published()
        self.follow()

    def _follow_servers(self) -> None:
        published = self.board.servers_published()
        if published == self._servers_seen or self.shared is None:
            return  # (a leader started again takes up the set it published before)
        self._servers_seen = published
        have = {(b.index, b.name): b for b in self.backends}
        backends = []
        for entry in json.loads((self.shared / SERVERS_FILE).read_text()):
            server = Server(entry["url"], entry["pool"], entry["group"])
            backend = have.get((entry["column"], server.name))
            if backend is None:
                backend = self.backend_at(entry["column"], server)
            backend.group = server.group
            backends.append(backend)
        self._route_between(backends)

    def post_profile(self, raw: Any) -> None:
        """Route by the profile ``raw`` from the next request on, in every worker; a
        ValueError (bad profile, or a policy that refuses it) reaches none of them."""
        policy, profile = self._policy_for(raw)
        if self.shared is None:
            self.adopt(policy, profile, POSTED)
            return
        _write_whole(self.shared / POSTED_FILE, json.dumps(raw), self.board.worker)
        self.board.post_profile()
        self.follow()  # this worker adopts what every worker reads: the last one posted

    def _policy_for(self, raw: Any) -> tuple[Policy, Profile]:
        """The policy in force, rebuilt with the profile's crossover (over a configured one)."""
        profile = parse_profile(raw)
        params = {k: v for k, v in self.settings.policy_params().items() if k != "crossover"}
        return build_policy(self.policy.name, params, profile), profile

    def adopt(self, policy: Policy, profile: Profile | None, source: str | None) -> None:
        """Route by a new policy from now on; requests in flight are not touched."""
        self.policy, self.profile, self.profile_source = policy, profile, source
        self.profile_loaded_at = time.time()
        axis = None if profile is None else profile.context
        self.tokens_per_byte = TOKENS_PER_BYTE if axis is None else axis.tokens_per_byte
        note = None if profile is None else profile.crossover.note
        if note:
            _log.warning("profile %s: %s", source, note)

    def reread_profile(self, path: Path) -> bool:
        """The profile file again: adopted if it changed and reads as a profile the policy
        takes; kept out (the one in force stays) if not. Whether it was refused."""
        try:
            data = path.read_bytes()
        except OSError as exc:  # a mounted ConfigMap is swapped by a rename: gone a moment
            _log.warning("The profile file was not read (%s); the profile in force stays.", exc)
            return True
        digest = digest_of(data)
        if digest == self.profile_digest:
            return False
        self.profile_digest = digest
        try:
            policy, profile = self._policy_for(json.loads(data))
        except ValueError as exc:  # bad JSON, ProfileError and PolicyError alike
            _log.warning(
                "The changed profile file was refused (%s); the profile in force stays.", exc
            )
            return True
        self.adopt(policy, profile, str(path))
        _log.warning("Profile file %s changed: crossover %g.", path, profile.crossover.threshold)
        return False

    def view(self) -> View:
        now = time.monotonic()
        return View(
            tuple([b.view(self.settings.stale_after, now) for b in self.backends]),
            source=self.settings.concurrency_source,
            now=now,
        )

    def inflight(self) -> int:
        """This worker's requests in flight: what its drain waits for."""
        return sum(b.own_inflight for b in self.backends)

    def backend(self, name: str) -> Backend:
        return self._by_name[name]

    def request_ended(self, backend: Backend, outcome: Outcome) -> None:
        """What a request's end says of its backend, to the backend's breaker."""
        self._judge(backend, verdict(outcome), str(outcome))

    def health_checked(self, backend: Backend, ok: bool) -> None:
        """The leader's health check: published for every worker's breaker, its own first."""
        self.board.publish_verdict(backend.index, ok)
        self.follow()

    def follow(self) -> None:
        """What the other workers published and this one has not applied: the leader's set
        of backends; its health verdicts, to this worker's breakers; the profile posted
        last, to its policy."""
        self._follow_servers()
        self.board.show_cpu(time.process_time())
        for backend in self.backends:
            ok = backend.new_verdict()
            if ok is not None:
                self._judge(backend, ok, "health check")
            backend.show_level()  # a cool-down ends with no event
        posted = self.board.profiles_posted()
        if posted != self._profiles_seen and self.shared is not None:
            self._profiles_seen = posted
            policy, profile = self._policy_for(json.loads((self.shared / POSTED_FILE).read_text()))
            self.adopt(policy, profile, POSTED)

    def _judge(self, backend: Backend, ok: bool | None, what: str) -> None:
        if ok is None:
            return
        moved = backend.breaker.record(ok)
        backend.show_level()
        if moved is BreakerState.OPEN:
            if self.board.leader or what != "health check":  # one verdict, every worker
                self.metrics.child(self.metrics.ejections, backend.name).inc()
            _log.warning(
                "Backend %s ejected for %g s (the last failure: %s).",
                backend.name,
                backend.breaker.cool_down,
                what,
            )
        elif moved is BreakerState.CLOSED:
            _log.warning("Backend %s readmitted (%s).", backend.name, what)

    def record(self, decision: Decision, load: int) -> None:
        self.metrics.child(self.metrics.decisions, decision.pool, decision.reason).inc()
        self.recent.append(
            {
                "at": time.time(),
                "pool": decision.pool,
                "backend": decision.backend,
                "reason": decision.reason,
                "live_concurrency": load,
            }
        )


def _write_whole(path: Path, text: str, worker: int) -> None:
    """Whole or not at all, for a worker reading it now."""
    written = path.with_suffix(f".{worker}")
    written.write_text(text)
    written.replace(path)


def digest_of(data: bytes) -> bytes:
    """What tells a file's new content from its old."""
    return hashlib.sha256(data).digest()
