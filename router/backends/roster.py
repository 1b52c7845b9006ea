"""The backends one worker routes between, each in its own column of the board.

The leader places the servers that discovery gives it: one it has keeps its column, a new
one takes a free column (one never used, else one that a server left a while ago and where
nothing is in flight, since a request there may still be counted in it). The other workers
take the set the leader published.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from specroute.router.backends.backend import Backend, Server
from specroute.router.backends.health import Breaker, Ejection
from specroute.router.workers.board import Board

_log = logging.getLogger("specroute.router")
_REUSE_AFTER = 10.0  # seconds a column of a server gone stays unused (a worker may be late)


class Roster:
    def __init__(
        self,
        board: Board,
        ejection: Ejection,
        servers: list[Server],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``servers`` in the first columns, in order; ``ejection``: each new breaker's rules."""
        self.board, self.ejection, self._clock = board, ejection, clock
        self._gone: dict[int, float] = {}  # the leader's: column, when its server left
        self._take([self.backend_at(i, s) for i, s in enumerate(servers)])

    def _take(self, backends: list[Backend]) -> None:
        self.backends = backends
        self._by_name = {b.name: b for b in backends}

    def backend(self, name: str) -> Backend:
        return self._by_name[name]

    def backend_at(self, column: int, server: Server) -> Backend:
        """``server`` as this worker tracks it, in ``column`` of the board, breaker new."""
        return Backend(server, Breaker(self.ejection), self.board, column)

    def own_inflight(self) -> int:
        """This worker's requests in flight: what its drain waits for."""
        return sum(b.own_inflight for b in self.backends)

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
        now, board = self._clock(), self.board
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
        """The leader: these backends from now on. Requests in flight at one that left
        finish there; its column stays its own until they have."""
        now = self._clock()
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
        self._take(backends)

    def listed(self) -> list[dict[str, Any]]:
        """The backends as the leader publishes them for the other workers (``follow``)."""
        return [
            {"column": b.index, "url": b.url, "pool": b.pool, "group": b.group}
            for b in self.backends
        ]

    def follow(self, listed: list[dict[str, Any]]) -> None:
        """Another worker: the backends the leader listed, from now on; one this worker
        tracks already in the same column keeps its breaker."""
        have = {(b.index, b.name): b for b in self.backends}
        backends = []
        for entry in listed:
            server = Server(entry["url"], entry["pool"], entry["group"])
            backend = have.get((entry["column"], server.name))
            if backend is None:
                backend = self.backend_at(entry["column"], server)
            backend.group = server.group
            backends.append(backend)
        self._take(backends)
