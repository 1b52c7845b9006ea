"""What the router asks its servers with outside a request's own path (the operator
endpoints: a flush, a profile, an abort, the model card, ``/server_info``; a stored
response looked for), and nothing else of its state: the roster, the client session opened
at its start, the counter of what failed upstream, and the keys that must never reach an
answer (hidden in what a server said)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import ClientSession
from prometheus_client import Counter

from specroute.router.backends.backend import Backend
from specroute.router.backends.roster import Roster


@dataclass
class Asking:
    roster: Roster
    upstream_errors: Counter  # specroute_upstream_errors_total, by backend and kind
    secrets: Callable[[], list[str]]  # every key the router holds
    session: ClientSession | None = None  # opened at the app's start, before any request

    @property
    def backends(self) -> list[Backend]:
        return self.roster.backends

    def client(self) -> ClientSession:
        """The router's client session: always open while requests are served."""
        assert self.session is not None, "asked before the app started"
        return self.session

    def failed(self, backend: Backend, kind: str) -> None:
        """One failure to ask ``backend``, counted by ``kind``."""
        self.upstream_errors.labels(backend=backend.name, kind=kind).inc()
