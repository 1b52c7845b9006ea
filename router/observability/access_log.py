"""One line for each request, when it ends: its id, what was decided for it (pool,
server, policy, reason, the load it joined), how it ended (``Outcome``'s name and the
status answered), its time to the first byte and in all, and its tokens where the
answer's end says them. Never a key, a header or a body: each field is one the router
made or read as a number or a name."""

from __future__ import annotations

import logging
import time
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from specroute.policies.decision import Decision
from specroute.router.backends.flight import Flight, usage
from specroute.router.protocol.asked import Asked
from specroute.router.protocol.request_id import enter, given_or_made, leave

LOG = logging.getLogger("specroute.router.access")
_PATH_SHOWN = 200  # characters of the path a line shows at most


@dataclass
class Trail:
    """What the access line says of one request, filled in as it goes."""

    request_id: str
    header: str  # the header its id came in, and is answered in
    started: float = field(default_factory=time.monotonic)
    decision: Decision | None = None
    policy: str | None = None
    load: int | None = None
    attempts: int = 0
    flight: Flight | None = None
    rid_sent: bool = False  # its id went to the backend as SGLang's rid
    tokens: tuple[Token[str | None], Token[Trail | None]] | None = None  # undone by ``ended``

    def decided(self, decision: Decision, load: int, policy: str) -> None:
        self.decision, self.load, self.policy = decision, load, policy

    def flew(self, flight: Flight) -> None:
        self.flight = flight
        self.attempts += 1

    def fields(self, request: Asked, status: int | None) -> dict[str, Any]:
        flight, decision = self.flight, self.decision
        fields: dict[str, Any] = {
            "request_id": self.request_id,
            "method": request.method,
            "path": request.path[:_PATH_SHOWN],
            "status": status,
            "outcome": None if flight is None or flight.outcome is None else str(flight.outcome),
            "pool": None if decision is None else decision.pool,
            "backend": None if flight is None else flight.backend.name,
            "policy": self.policy,
            "reason": None if decision is None else decision.reason,
            "load": self.load,
            "attempts": self.attempts,
            "ttfb_s": None,
            "duration_s": round(time.monotonic() - self.started, 6),
        }
        if flight is not None:
            if flight.first_at is not None:
                fields["ttfb_s"] = round(flight.first_at - self.started, 6)
            fields.update(usage(flight.tail))
        return fields


_TRAIL: ContextVar[Trail | None] = ContextVar("specroute_trail", default=None)


def trail_of() -> Trail | None:
    """The trail of the request handled in this context (each request has a task of its own)."""
    return _TRAIL.get()


def opened(request: Asked, request_id_headers: list[str]) -> Trail:
    """A request begins: its id and its trail made the context's. The front (aiohttp's
    middleware, or the own front's connection) calls this first and ``ended`` last,
    whatever answered it (a refusal, a handler, a client gone)."""
    rid, header = given_or_made(request, request_id_headers)
    trail = Trail(rid, header)
    trail.tokens = (enter(rid), _TRAIL.set(trail))
    return trail


def ended(request: Asked, trail: Trail, status: int | None, enabled: bool, rids: set[str]) -> None:
    """The request ended with ``status`` (None: the client went away first): its line
    written, its id no longer the context's, nor in ``rids`` (those sent as SGLang's)."""
    if trail.rid_sent:
        rids.discard(trail.request_id)
    if enabled:
        _write(trail.fields(request, status))
    if trail.tokens is not None:
        leave(trail.tokens[0])
        _TRAIL.reset(trail.tokens[1])


TRAIL = web.RequestKey("trail", Trail)  # on aiohttp's request too: its answer may go out later


async def stamp(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: every answer aiohttp sends names its request's id."""
    trailed = request.get(TRAIL)
    if trailed is not None:
        response.headers[trailed.header] = trailed.request_id


def _write(fields: dict[str, Any]) -> None:
    if not LOG.isEnabledFor(logging.INFO):
        return
    shown = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None and k != "request_id")
    LOG.info("request %s %s", fields["request_id"], shown, extra={"fields": fields})
