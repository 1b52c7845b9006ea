"""Step 2 of a request: open the upstream and wait for the first byte of its answer.

Until that byte nothing has reached the client, so a failure here that provably left no
work running at the backend (no connection, a 503, an answer that broke or was not HTTP)
may be retried elsewhere; a backend gone silent may not. Every backend failure is counted
once, here, by its kind; the router's own (no file descriptor left) is told apart.
"""

from __future__ import annotations

from contextlib import suppress

import aiohttp

from specroute.router.backends.flight import Flight
from specroute.router.backends.relaying import Relaying
from specroute.router.observability.record import RequestRecord
from specroute.router.protocol.asked import Asked
from specroute.router.protocol.outcome import Outcome, out_of_fds
from specroute.router.protocol.request_id import HEADER
from specroute.router.upstream.answer import Answer

_FORWARDED_HEADERS = ("Content-Type", "Accept", "User-Agent")  # never the client's key
_SHUTTING_DOWN = "The router is shutting down; its drain timeout cut this off."


class Failure(Exception):
    """The backend's answer failed, or the drain timeout cut it off: ``outcome`` says which."""

    def __init__(self, outcome: Outcome, message: str, cause: BaseException | None = None):
        super().__init__(message)
        self.outcome, self.cause = outcome, cause


async def open_upstream(
    request: Asked, relaying: Relaying, record: RequestRecord, flight: Flight, raw: bytes
) -> tuple[Answer, bytes]:
    """The backend's answer and its first chunk (empty if it has no body), or a Failure.
    The caller owns the answer from here: ``closed`` lets it go. Until its first byte a
    stream's silence is the answer's own limit; from then on the watchdog's (``Relaying``),
    which costs nothing per chunk."""
    backend, stream, pool = flight.backend, flight.stream, relaying.pool
    assert pool is not None  # set at startup, before any request is served
    headers = _forwarded(request, stream or flight.meta_added, record)
    limits = relaying.timeouts[0 if stream else 1]
    try:
        upstream = await pool.send(backend.url, request.path, raw, headers, limits)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise _unanswered(relaying, flight, exc) from None
    try:
        try:
            await upstream.head()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unanswered(relaying, flight, exc) from None
        if upstream.status == 503:
            with suppress(aiohttp.ClientError, TimeoutError):  # read for its connection's sake
                await upstream.read()
            raise upstream_failed(relaying, flight, Outcome.UNAVAILABLE)
        relaying.hold(upstream, flight)  # from here the drain may cut it off
        try:
            first = await upstream.chunk()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise stopped(relaying, flight, exc) from None
        if stream:
            upstream.no_limit()  # the watchdog's from here
        return upstream, first
    except BaseException:
        relaying.let_go(upstream)
        raise


def _forwarded(request: Asked, identity: bool, record: RequestRecord) -> dict[str, str]:
    """The client's headers that the backend needs. A whole body is relayed as it comes, so
    the backend may compress only what the client can read: the client's
    ``Accept-Encoding``, or none (identity). A stream is never compressed (``identity``): the
    relay passes it event by event and may have to end it with an error event of its own;
    nor a whole body the relay takes a ``meta_info`` out of (``whole_timing``)."""
    given = request.headers
    headers = {k: v for k in _FORWARDED_HEADERS if (v := given.get(k)) is not None}
    headers[HEADER] = record.request_id
    accepted = "identity" if identity else request.headers.get("Accept-Encoding", "identity")
    headers["Accept-Encoding"] = accepted
    if record.span is not None:  # traced: the upstream request is its child
        headers.update(record.span.upstream_headers())
    return headers


def _unanswered(relaying: Relaying, flight: Flight, exc: BaseException) -> Failure:
    """No answer came: the router could not open a socket, the backend could not be reached
    or dropped the request, or answered what is not HTTP (nothing of it runs there:
    retryable), or it went silent."""
    if out_of_fds(exc):
        message = (
            "The router has run out of file descriptors (its open-files limit): "
            "its own failure, not the backend's."
        )
        return Failure(Outcome.OUT_OF_FDS, message, exc)
    if isinstance(exc, TimeoutError) and not isinstance(exc, aiohttp.ConnectionTimeoutError):
        return _silent(relaying, flight, exc)
    if isinstance(exc, aiohttp.ClientConnectionError):
        return upstream_failed(relaying, flight, Outcome.CONNECT, exc)
    return upstream_failed(relaying, flight, Outcome.MIDSTREAM, exc)  # a malformed answer


def _silent(relaying: Relaying, flight: Flight, exc: BaseException) -> Failure:
    return upstream_failed(
        relaying,
        flight,
        Outcome.TIMEOUT,
        exc,
        f"The backend {flight.backend.name} did not answer in time; not retried, since it may "
        "still be working on this request.",
    )


def upstream_failed(
    relaying: Relaying,
    flight: Flight,
    kind: Outcome,
    cause: BaseException | None = None,
    message: str | None = None,
) -> Failure:
    """The backend's failure, counted once, here, by its kind, and its breaker's verdict of
    the attempt (told when it lands: a stream that then ends broken is told once)."""
    backend = flight.backend
    relaying.metrics.upstream_errors.labels(backend=backend.name, kind=kind).inc()
    flight.verdict = kind
    if message is None:
        # never the cause's repr: aiohttp's carries the request's headers, the backend key too
        said = "answered 503" if cause is None else f"{type(cause).__name__}: {cause}"
        message = f"{backend.name}: {said}"
    return Failure(kind, message, cause)


def stopped(relaying: Relaying, flight: Flight, exc: BaseException) -> Failure:
    """The answer stopped: the drain timeout closed it, the backend went silent, or it
    failed."""
    if relaying.cut_off:
        return Failure(Outcome.CUT_OFF, _SHUTTING_DOWN)
    if isinstance(exc, TimeoutError):
        return _silent(relaying, flight, exc)
    return upstream_failed(relaying, flight, Outcome.MIDSTREAM, exc)
