"""The listeners of every request, registered in one place (where the app is composed): the
proxy tells them when a request was decided, when an attempt at a server landed, and the
front when the request ended, each with the request's record. What each one does with it
(count the decision, take an online sample, tell the server's breaker, write the access
line, annotate the span) is its own; the request path knows none of them."""

from __future__ import annotations

from collections.abc import Iterable

from specroute.router.backends.flight import Flight
from specroute.router.observability.record import RequestRecord
from specroute.router.protocol.asked import Asked


class Listener:
    """What a listener may hear; each hears only what it overrides."""

    def decided(self, record: RequestRecord) -> None:
        """A decision was made for the request (``record.decision``, at ``record.load``):
        its first, or a retry's."""

    def landed(self, record: RequestRecord, flight: Flight) -> None:
        """An attempt at a server ended (``flight.outcome``: how; None when it failed before
        its first byte and another server may be tried)."""

    def ended(self, record: RequestRecord, request: Asked, status: int | None) -> None:
        """The request ended, answered with ``status`` (None: the client went away first)."""


class Lifecycle:
    def __init__(self, listeners: Iterable[Listener] = ()) -> None:
        self._decided: list[Listener] = []
        self._landed: list[Listener] = []
        self._ended: list[Listener] = []
        for listener in listeners:
            self.register(listener)

    def register(self, listener: Listener) -> None:
        """``listener`` hears every request from now on, after those registered before it,
        each event it overrides (the request path calls no listener for nothing)."""
        kind = type(listener)
        for name, hearing in (
            ("decided", self._decided),
            ("landed", self._landed),
            ("ended", self._ended),
        ):
            if getattr(kind, name) is not getattr(Listener, name):
                hearing.append(listener)

    def decided(self, record: RequestRecord) -> None:
        for listener in self._decided:
            listener.decided(record)

    def landed(self, record: RequestRecord, flight: Flight) -> None:
        for listener in self._landed:
            listener.landed(record, flight)

    def ended(self, record: RequestRecord, request: Asked, status: int | None) -> None:
        for listener in self._ended:
            listener.ended(record, request, status)
