"""Every request's listeners, registered here and nowhere else (``listeners``), each told
by the request path what it hears (``Lifecycle``): the decision counted and kept
(``DecisionLog``), the server's breaker told how each attempt there went, an online sample
of each answered stream, the ids sent as SGLang's ``rid`` let go, the span annotated when
traced, and the access line written when it is on."""

from __future__ import annotations

import time

from specroute.online.estimator import Online
from specroute.router.backends.flight import Flight
from specroute.router.backends.verdicts import Verdicts
from specroute.router.observability.access_log import AccessLog
from specroute.router.observability.decision_log import DecisionLog
from specroute.router.observability.lifecycle import Listener
from specroute.router.observability.record import RequestRecord
from specroute.router.observability.spans import Spans
from specroute.router.online.served import sample_of
from specroute.router.protocol.asked import Asked


def listeners(
    decisions: DecisionLog,
    verdicts: Verdicts,
    online: Online,
    stale_after: float,
    rids: set[str],
    traced: bool,
    access_log: bool,
) -> list[Listener]:
    """What hears every request of one router, in the order each event reaches them: its
    decision log, its breakers' verdicts, its online samples (a server's readings older than
    ``stale_after`` unknown), the rids it sent, and the span and the access line where on."""
    found: list[Listener] = [
        decisions,
        Breakers(verdicts),
        OnlineSamples(online, stale_after),
        RidsSent(rids),
    ]
    if traced:
        found.append(Spans())
    if access_log:
        found.append(AccessLog())
    return found


class Breakers(Listener):
    """Each attempt's server told how it went (``Flight.verdict``): a failure by its kind,
    an answer, or nothing (a client that went away before its answer was whole)."""

    def __init__(self, verdicts: Verdicts) -> None:
        self.verdicts = verdicts

    def landed(self, record: RequestRecord, flight: Flight) -> None:
        if flight.verdict is not None:
            self.verdicts.request_ended(flight.backend, flight.verdict)


class OnlineSamples(Listener):
    """An answered stream's sample (``sample_of``), with its server's live accept length
    and draft depth at its end as the poll last read them (unknown past ``stale_after``)."""

    def __init__(self, online: Online, stale_after: float) -> None:
        self.online, self.stale_after = online, stale_after

    def landed(self, record: RequestRecord, flight: Flight) -> None:
        if self.online.records:
            reading = flight.backend.reading(self.stale_after, time.monotonic())
            accept, depth = (None, None) if reading is None else reading.drafting
            if (sample := sample_of(flight, accept, depth)) is not None:
                self.online.record(sample)


class RidsSent(Listener):
    """The ids sent as SGLang's ``rid`` (of requests in flight), each let go at its end:
    SGLang refuses a rid already in flight, so one client's id is sent once at a time."""

    def __init__(self, rids: set[str]) -> None:
        self.rids = rids

    def ended(self, record: RequestRecord, request: Asked, status: int | None) -> None:
        if record.rid_sent:
            self.rids.discard(record.request_id)
