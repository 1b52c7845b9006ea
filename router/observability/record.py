"""What the router knows of one request as it goes: its id, the decision made for it, its
attempts at the servers (each a ``Flight``), and its span when it is traced. The front that
took the request opens it (``opened``) and ends it (``ended``); the proxy fills it in and
tells the listeners of every request (``Lifecycle``) at each step, so that what the router
learns of a request is a parameter its readers see, not a context they must know of.

While the request is handled its id is also the context's (``request_id.current``): a log
line made then names it, and so does an error answer built then."""

from __future__ import annotations

import time
from contextvars import Token
from dataclasses import dataclass, field

from aiohttp import web

from specroute.policies.decision import Decision
from specroute.router.backends.flight import Flight
from specroute.router.observability.tracing import RequestSpan
from specroute.router.protocol.asked import Asked
from specroute.router.protocol.request_id import enter, given_or_made, leave


@dataclass
class RequestRecord:
    request_id: str
    header: str  # the header its id came in, and is answered in
    started: float = field(default_factory=time.monotonic)
    decision: Decision | None = None
    policy: str | None = None  # the name of the policy that decided
    load: int | None = None  # the live load the decision was made at
    attempts: int = 0  # the servers it was sent to
    flight: Flight | None = None  # its last attempt
    rid_sent: bool = False  # its id went to the server as SGLang's rid
    span: RequestSpan | None = None  # its span, when traced
    token: Token[str | None] | None = None  # its id the context's, until ``ended``

    def decided(self, decision: Decision, load: int, policy: str) -> None:
        self.decision, self.load, self.policy = decision, load, policy

    def flew(self, flight: Flight) -> None:
        self.flight = flight
        self.attempts += 1


def opened(request: Asked, request_id_headers: list[str]) -> RequestRecord:
    """A request begins: its record, its id the context's. The front (aiohttp's middleware,
    or the own front's connection) calls this first and ``ended`` last, whatever answered
    the request (a refusal, a handler, a client gone)."""
    rid, header = given_or_made(request, request_id_headers)
    record = RequestRecord(rid, header)
    record.token = enter(rid)
    return record


def ended(record: RequestRecord) -> None:
    """Its id no longer the context's."""
    if record.token is not None:
        leave(record.token)


RECORD = web.RequestKey("record", RequestRecord)  # on aiohttp's request: its answer goes out later
