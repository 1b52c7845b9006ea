"""Step 3 of a request: relay the answer, committed. A backend that fails from here ends
a stream with an SSE error event (whole: events pass only when whole) and a plain body
with a cut connection, never a silent truncation or a retry; a client that goes away is
told apart from a backend that failed."""

from __future__ import annotations

import logging
from collections.abc import Awaitable

import aiohttp

from specroute.router.backends.flight import Flight
from specroute.router.backends.relaying import Relaying
from specroute.router.protocol.errors import sse_error
from specroute.router.protocol.outcome import Outcome
from specroute.router.protocol.reply import Reply
from specroute.router.proxy.stream_usage import accept_length, has_added, without_added
from specroute.router.proxy.upstream_call import Failure, stopped
from specroute.router.proxy.whole_timing import read_whole
from specroute.router.upstream.answer import Answer

_RELAYED_HEADERS = ("Content-Type", "Cache-Control", "Content-Encoding")  # as the answer's
_DONE = b"data: [DONE]\n\n"
_DONES = (_DONE, _DONE.replace(b"\n", b"\r\n"))  # a stream's end, either way its lines end
_MAX_HELD = 1 << 20  # bytes of one unfinished event the relay holds back at the most
_log = logging.getLogger("specroute.router")


async def relay(
    reply: Reply, relaying: Relaying, flight: Flight, upstream: Answer, first: bytes
) -> None:
    headers = {k: v for k in _RELAYED_HEADERS if (v := upstream.headers.get(k.lower())) is not None}
    headers["x-specroute-backend"] = flight.backend.name
    encoded = upstream.headers.get("content-encoding", "identity") != "identity"
    events = upstream.content_type == "text/event-stream" and not encoded
    passing = _Passing(reply, flight, events, upstream.content_length)
    direct = passing.direct
    flight.status = upstream.status
    # events go chunked, whatever length the backend gave: an error event may have to follow
    length = None if events else upstream.content_length
    if flight.reads_meta and not events and not encoded:
        first = await _whole_read(relaying, flight, upstream, first)  # whole before it goes
        length = passing.length = len(first)
    elif flight.meta_added and upstream.status == 200:  # compressed, or events, unasked
        _unread(relaying, flight, "meta_info_kept", "a whole chat it could not read")
    chunk, held = first, b""  # held: the start of an event not yet whole
    try:
        await _to_client(reply.begin(upstream.status, headers, length))
        if chunk:
            flight.first_byte()
        while chunk:
            if held or not passing.as_came(chunk):
                chunk, held = _whole_events(held + chunk)
                if len(held) > _MAX_HELD:  # no blank line for long: not events after all
                    chunk, held = chunk + held, b""
            if chunk:
                sent = chunk
                if flight.usage_added or flight.reads_details:
                    sent = _read_and_taken_out(flight, chunk)
                try:  # inline, not through _to_client: this runs for every chunk
                    if sent:
                        await reply.write(sent)
                except ConnectionError as exc:
                    raise ClientGone() from exc
                passing.passed(sent, chunk)
            flight.reading = True
            chunk = await upstream.chunk(None if held else direct)  # the backend's side
            flight.reading = False
        if held:
            await _to_client(reply.write(held))  # ended without a blank line
    except (aiohttp.ClientError, TimeoutError) as exc:  # the backend's: the client's are apart
        if not flight.delivered:  # else only the end of a body already whole was lost
            failure = stopped(relaying, flight, exc)
            await _end_early(reply, flight, upstream, failure)
            return
    await _to_client(reply.end())
    flight.outcome = flight.verdict = Outcome.ANSWERED


class _Passing:
    """The body as it reaches the client: counted (``passed``), and passed on straight from
    the backend's socket (``direct``) while it can go as it came, with no task woken per
    chunk: most of what a stream costs the router is per chunk."""

    __slots__ = ("_events", "_flight", "_reply", "_sent", "length")

    def __init__(self, reply: Reply, flight: Flight, events: bool, length: int | None) -> None:
        self._reply, self._flight, self._events, self.length = reply, flight, events, length
        self._sent = 0

    def passed(self, chunk: bytes, came: bytes | None = None) -> None:
        """``chunk`` reached the client, from ``came`` (the backend's, where the relay took
        the usage event out of it): the tail, where the usage is read, is the backend's."""
        self._sent += len(chunk)
        flight = self._flight
        if chunk:
            flight.delivered = _whole(chunk, self._events, self._sent, self.length)
        flight.tail = (flight.tail[1], chunk if came is None else came)  # references: no copy

    def as_came(self, chunk: bytes) -> bool:
        """Whether ``chunk`` may go as it came: not events, or events that are whole and
        hold no usage event the relay must take out."""
        if not self._events:
            return True
        flight = self._flight
        return chunk.endswith(b"\n\n") and not has_added(
            chunk, flight.usage_added, flight.reads_details
        )

    def direct(self, chunk: bytes) -> bool:
        """Sends ``chunk`` now if it can go as it came and the client keeps up. Else False,
        and the relay's task takes it (held back, or written once the client has read
        enough)."""
        if not self.as_came(chunk) or not self._reply.push(chunk):
            return False
        self.passed(chunk)
        return True


async def _whole_read(relaying: Relaying, flight: Flight, upstream: Answer, first: bytes) -> bytes:
    """A whole body whose ``meta_info`` is read (``whole_timing``), held until whole: its
    decode time read, and the ``meta_info`` the router asked for taken out (its length then
    another). A backend that fails before it is whole failed before any byte reached the
    client, as one that fails before its first byte (retried)."""
    parts = [first]
    try:
        while chunk := await upstream.chunk():
            parts.append(chunk)
    except (aiohttp.ClientError, TimeoutError) as exc:
        if not upstream.complete:  # else what broke came after a body already whole
            raise stopped(relaying, flight, exc) from None
    came = b"".join(parts)
    if upstream.status != 200:
        return came
    read = read_whole(came, flight.meta_added)
    if read.sent is None:
        _unread(relaying, flight, "meta_info_kept", "a meta_info not of SGLang's shape")
        return came
    if (timing := read.timing) is not None:
        flight.tpot = timing.tpot
        if timing.accept_length is not None:
            flight.accept_length = timing.accept_length
    elif read.tokens is None or read.tokens > 1:  # one token has no decode to time
        _unread(relaying, flight, "no_decode_time", "no decode time in a whole answer")
    return read.sent


def _unread(relaying: Relaying, flight: Flight, reason: str, what: str) -> None:
    """A whole answer whose ``meta_info`` could not be used: counted each time, logged the
    first time for its backend and reason (a server that never gives it would say so on
    every request)."""
    name = flight.backend.name
    relaying.metrics.online_unread.labels(backend=name, reason=reason).inc()
    if (name, reason) not in relaying.unread_logged:
        relaying.unread_logged.add((name, reason))
        _log.warning(
            "%s answered %s (%s): no sample of it; counted in specroute_online_unread_total, "
            "said here once",
            name,
            what,
            reason,
        )


def _read_and_taken_out(flight: Flight, chunk: bytes) -> bytes:
    """``chunk``'s whole events as the client gets them, less what the router asked for
    (``stream_usage``); the request's own accept length read where its details pass."""
    if not has_added(chunk, flight.usage_added, flight.reads_details):
        return chunk  # the common case: one search, or two
    if flight.reads_details and (own := accept_length(chunk)) is not None:
        flight.accept_length = own
    return without_added(chunk, flight.usage_added, flight.details_added)


def _whole(chunk: bytes, events: bool, sent: int, length: int | None) -> bool:
    """Whether what reached the client is the whole answer: a stream up to its
    ``data: [DONE]``, a body to its length. A client that has it all may close at once,
    before the backend's end of the body arrives: that answer was delivered, not cancelled."""
    if events:
        return chunk.endswith(_DONES)
    return length is not None and sent >= length


class ClientGone(Exception):
    """Writing to the client failed: it went away. Not the backend's failure."""

    def __init__(self) -> None:
        super().__init__("the client went away")


async def _to_client(writing: Awaitable[object]) -> None:
    try:
        await writing
    except ConnectionError as exc:  # aiohttp's ClientConnectionResetError is one
        raise ClientGone() from exc


def _whole_events(data: bytes) -> tuple[bytes, bytes]:
    """``data`` cut after its last blank line: the events that are whole, and the rest. An
    event is relayed only when whole, so an error event never lands inside half of one."""
    lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
    end = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
    return data[:end], data[end:]


async def _end_early(reply: Reply, flight: Flight, upstream: Answer, failure: Failure) -> None:
    """A stream ends with an error event saying why; a plain body, cut short, with a cut
    connection, so that a truncated JSON body cannot look complete."""
    if upstream.content_type != "text/event-stream":
        flight.outcome = Outcome.TRUNCATED
        reply.cut()
        return
    if failure.outcome is Outcome.CUT_OFF:
        flight.outcome, message = Outcome.CUT_OFF, str(failure)
    else:
        flight.outcome = Outcome.BROKEN
        message = (
            f"The backend {flight.backend.name} failed mid-stream "
            f"({type(failure.cause).__name__}); the answer is incomplete."
        )
    await _to_client(reply.write(sse_error(message)))
    await _to_client(reply.end())
