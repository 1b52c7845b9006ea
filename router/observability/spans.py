"""A traced request's span told what the router learns of it: the decision (pool, policy,
reason, load, server) and how each attempt at a server ended. Registered when traces are on
(``otlp_traces_endpoint``)."""

from __future__ import annotations

from specroute.router.backends.flight import Flight
from specroute.router.observability.lifecycle import Listener
from specroute.router.observability.record import RequestRecord


class Spans(Listener):
    def decided(self, record: RequestRecord) -> None:
        span, decision = record.span, record.decision
        if span is not None and decision is not None and record.load is not None:
            span.decided(decision, record.policy or "", record.load)

    def landed(self, record: RequestRecord, flight: Flight) -> None:
        if record.span is not None:
            record.span.landed(flight.outcome, flight.backend.name)
