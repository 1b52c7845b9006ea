"""One backend answer as it arrives, on one pooled HTTP/1.1 connection (``router.upstream.pool``).

The connection is an asyncio protocol: llhttp (``httptools``) parses the bytes as they come,
and the answer keeps its head and the body not yet read. The relay takes the body as it
comes (``chunk``: all there is, or the next bytes to arrive); reading stops while more than
``_PAUSE_AT`` bytes wait unread, so a slow client holds the backend back, as a socket would.
Its failures are aiohttp's exception classes, so that ``upstream`` tells them apart as it
did (no connection, no answer, a malformed one, one cut short, silence), and the outcomes,
counters and error answers are the ones the router had with aiohttp's client.

A connection carries one answer and nothing else (RFC 9110 section 15.2, RFC 9112 section
9.3): an interim answer (1xx) before it is read and dropped, a 101 is a broken answer (the
router asked for no new protocol), a head past its limit is a broken answer, and a byte
that comes after the answer's end, or while the connection is idle, is a backend that
cannot be trusted with another request: the connection is closed, never pooled, and what
the answer was stays whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from enum import StrEnum
from typing import cast

import aiohttp
import httptools

_PAUSE_AT = 256 * 1024  # unread bytes of one answer before the socket is no longer read


class Answer:
    """An answer from its request's sending to its last byte. ``head`` waits for its status
    and headers, ``chunk`` for its body; ``release`` gives its connection back (kept only
    if the answer was read to its end), ``fail`` ends it with an error (the watchdog's
    silence), ``close`` cuts it (the drain timeout)."""

    __slots__ = (
        "_body",
        "_connection",
        "_direct",
        "_error",
        "_head_done",
        "_last",
        "_loop",
        "_silence",
        "_timer",
        "_unread",
        "_waiter",
        "complete",
        "content_length",
        "headers",
        "received",
        "status",
    )

    def __init__(self, connection: UpstreamConnection, loop: asyncio.AbstractEventLoop) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}  # names in lower case, as sent on the wire once
        self.content_length: int | None = None
        self.received = 0  # the body's bytes so far: what the watchdog of streams watches
        self.complete = False  # the body arrived to its end
        self._connection: UpstreamConnection | None = connection
        self._body: list[bytes] = []
        self._unread = 0
        self._direct: Callable[[bytes], bool] | None = None
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._head_done = False
        self._timer: asyncio.TimerHandle | None = None  # the deadline or the silence limit
        self._silence: float | None = None
        self._last = 0.0  # when bytes last came, for the silence limit
        self._loop = loop

    @property
    def content_type(self) -> str:
        """The media type, without its parameters, in lower case."""
        return self.headers.get("content-type", "").partition(";")[0].strip().lower()

    def limit(self, silence: float | None, total: float | None) -> None:
        """A deadline for the whole answer (``total``), or a limit on the silence between
        its bytes until ``no_limit`` (``silence``), whichever is given."""
        if total is not None:
            self._timer = self._loop.call_later(total, self._timed_out, TimeoutError())
        elif silence is not None:
            self._silence, self._last = silence, self._loop.time()
            self._timer = self._loop.call_later(silence, self._quiet)

    def no_limit(self) -> None:
        """From here on another watches this answer's silence (``Relaying``)."""
        self._silence = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def head(self) -> None:
        """Until the status and headers have come."""
        while not self._head_done:
            if self._error is not None:
                raise self._error
            await self._wait()

    async def chunk(self, direct: Callable[[bytes], bool] | None = None) -> bytes:
        """All of the body that has come and not been read, waiting for some if none has;
        ``b""`` at its end. While it waits, what comes in one read of the socket is offered
        to ``direct`` first, in that read's callback: what ``direct`` takes (True) is passed
        on with no task woken, and not returned."""
        while not self._body:
            if self._error is not None:
                raise self._error
            if self.complete:
                return b""
            self._direct = direct
            await self._wait()
        return self._taken()

    def _taken(self) -> bytes:
        """What came and was not read, now read: the socket read again if it was paused."""
        data = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body.clear()
        self._unread = 0
        if self._connection is not None:
            self._connection.resume()
        return data

    async def read(self) -> bytes:
        """The rest of the body."""
        parts = []
        while chunk := await self.chunk():
            parts.append(chunk)
        return b"".join(parts)

    def fail(self, exc: BaseException) -> None:
        """Ends the answer with ``exc``, raised to whoever reads it (its connection is not
        kept: the rest of the answer may still come on it)."""
        if self._error is None and not self.complete:
            self._error = exc
            self._wake()

    def close(self) -> None:
        """Cuts the answer and closes its connection."""
        self.fail(aiohttp.ClientConnectionError("the answer was closed"))
        self.release()

    def release(self) -> None:
        """Gives the connection back: to its pool if the answer came whole and the backend
        keeps it open, else closed."""
        self.no_limit()
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.done(self, reusable=self.complete and self._error is None)

    # from the connection

    def _headed(self, status: int, headers: dict[str, str]) -> None:
        self.status, self.headers, self._head_done = status, headers, True
        length = headers.get("content-length")
        if length is not None and length.isdigit():
            self.content_length = int(length)
        self._arrived()
        self._wake()

    def _data(self, data: bytes) -> bool:
        """Keeps ``data``; whether the connection should stop reading for now."""
        self._body.append(data)
        self.received += len(data)
        self._unread += len(data)
        self._arrived()
        if self._direct is None:
            self._wake()  # else it is offered to ``direct`` once the read is parsed
        return self._unread >= _PAUSE_AT

    def _read(self) -> None:
        """One read of the socket parsed: its body, if ``chunk`` waits with a ``direct``,
        is offered to it, and the reader woken only if it was not taken."""
        direct = self._direct
        if direct is None or not self._body:
            return
        if len(self._body) > 1:
            self._body[:] = [b"".join(self._body)]
        if direct(self._body[0]):
            self._taken()
        else:
            self._wake()

    def _ended(self) -> None:
        self.complete = True
        if self._timer is not None and self._silence is None:  # the deadline is met
            self._timer.cancel()
            self._timer = None
        self._wake()

    def _arrived(self) -> None:
        """Bytes came: the silence limit counts from now."""
        if self._silence is not None:
            self._last = self._loop.time()

    def _quiet(self) -> None:
        """The silence timer fired: re-armed from the last bytes if some came since."""
        if self._silence is None:
            return
        due = self._last + self._silence
        if self._loop.time() < due:
            self._timer = self._loop.call_at(due, self._quiet)
            return
        self._timed_out(aiohttp.SocketTimeoutError("Timeout on reading data from socket"))

    def _timed_out(self, exc: BaseException) -> None:
        self._timer = None
        self.fail(exc)
        if self._connection is not None:
            self._connection.abandon()

    async def _wait(self) -> None:
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter, self._direct = None, None

    def _wake(self) -> None:
        self._direct = None  # from here the reader takes what comes, in order
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class Dropped(StrEnum):
    """What the router dropped of a backend's bytes (``specroute_upstream_dropped_total``):
    an interim answer, or, every other reason, the connection, closed because the backend
    broke HTTP/1.1."""

    INTERIM = "interim"  # a 1xx before the answer: dropped, the connection kept
    SWITCHED = "switched_protocols"  # a 101: the router asked for no other protocol
    HEAD_TOO_LARGE = "head_too_large"  # an answer's head past its limit
    MALFORMED = "malformed"  # not HTTP/1.1 this router can parse
    TRAILING = "trailing_bytes"  # bytes after the answer's end
    UNASKED = "unasked"  # bytes while no request was waiting for an answer


class _Unwanted(Exception):
    """Raised in llhttp's callbacks: the backend sent what ends the connection."""

    def __init__(self, dropped: Dropped, said: str) -> None:
        super().__init__(said)
        self.dropped = dropped


Told = Callable[["UpstreamConnection", Dropped], None]


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection to a backend, carrying one answer at a time. ``returned``
    is told when an answer let it go: reusable, or to be forgotten (it closes); ``told``
    when the backend sent what the router drops or what ends the connection."""

    def __init__(
        self, returned: Callable[[UpstreamConnection, bool], None], told: Told, max_head: int
    ) -> None:
        self._returned, self._told, self._max_head = returned, told, max_head
        self.transport: asyncio.Transport | None = None
        self.answer: Answer | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._headers: dict[str, str] = {}
        self._head = 0  # bytes read before the answer's final head was whole
        self._fields = 0  # bytes of its headers, interim answers' too
        self._paused = False
        self._keep = False  # the backend keeps the connection open after this answer
        self._interim = False  # the message being parsed is a 1xx, dropped
        self._finished = False  # the current answer's body ended (its length was known)

    # asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        answer = self.answer
        if answer is None or self._finished:  # bytes nobody asked for: not to be trusted
            self._told(self, Dropped.TRAILING if answer is not None else Dropped.UNASKED)
            self.abandon()
            return
        if not answer._head_done:
            self._head += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            unwanted = exc.__context__
            if not isinstance(unwanted, _Unwanted):
                raise
            self._broken(unwanted.dropped, aiohttp.ClientPayloadError(str(unwanted)))
        except httptools.HttpParserUpgrade:
            self._broken(
                Dropped.SWITCHED, aiohttp.ClientPayloadError("the backend switched protocols")
            )
        except httptools.HttpParserError as exc:
            self._broken(
                Dropped.MALFORMED, aiohttp.ClientPayloadError(f"a malformed answer: {exc}")
            )
        else:
            if not answer._head_done and self._head > self._max_head:  # one header, growing
                said = self._too_long()
                self._broken(Dropped.HEAD_TOO_LARGE, aiohttp.ClientPayloadError(said))
            elif self.answer is not None:
                self.answer._read()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        answer = self.answer
        if answer is None:
            self._returned(self, False)  # idle: the pool forgets it
            return
        if answer.complete:
            return
        if answer._head_done and not self._finished and not self._length_known():
            answer._ended()  # a body without a length ends with its connection
        elif answer._head_done:
            answer.fail(aiohttp.ClientPayloadError("Response payload is not completed"))
        else:
            answer.fail(aiohttp.ServerDisconnectedError())

    # llhttp's callbacks

    def on_message_begin(self) -> None:
        if self._finished:  # a second message after the answer, in the same read
            raise _Unwanted(Dropped.TRAILING, "bytes after the answer's end")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields += len(name) + len(value)
        if self._fields > self._max_head:
            raise _Unwanted(Dropped.HEAD_TOO_LARGE, self._too_long())
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        headers, self._headers = self._headers, {}
        if status == 101:
            raise _Unwanted(Dropped.SWITCHED, "the backend switched protocols")
        self._interim = status < 200
        if self._interim or self.answer is None:
            return  # an interim answer: read and dropped
        self._keep = self._parser.should_keep_alive()
        self.answer._headed(status, headers)

    def on_body(self, body: bytes) -> None:
        if self.answer is not None and self.answer._data(body) and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            self._told(self, Dropped.INTERIM)
            return
        self._finished = True
        if self.answer is not None:
            self.answer._ended()

    # the answer's side

    def start(self, answer: Answer, request: bytes) -> None:
        self.answer, self._finished, self._headers = answer, False, {}
        self._head = self._fields = 0
        if self.transport is None:  # the backend closed it as it was taken
            answer.fail(aiohttp.ServerDisconnectedError())
            return
        self.transport.write(request)

    def resume(self) -> None:
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    def done(self, answer: Answer, reusable: bool) -> None:
        """The answer let go: the connection kept for the next if the answer came whole
        and the backend keeps it open."""
        if answer is not self.answer:
            return
        self.answer = None
        keep = reusable and self._keep and self._finished and self.transport is not None
        if not keep:
            self.abandon()
        self.resume()
        self._returned(self, keep)

    def abandon(self) -> None:
        """Closed at once, whatever is left of its answer."""
        if self.transport is not None:
            self.transport.abort()
            self.transport = None

    def _length_known(self) -> bool:
        answer = self.answer
        return answer is not None and (
            answer.content_length is not None
            or "chunked" in answer.headers.get("transfer-encoding", "").lower()
        )

    def _too_long(self) -> str:
        return f"the answer's head is longer than {self._max_head} bytes"

    def _broken(self, dropped: Dropped, exc: BaseException) -> None:
        """The backend broke HTTP/1.1: its answer fails if it is not whole (a whole one stays
        as it came), and the connection is closed."""
        self._told(self, dropped)
        if self.answer is not None:
            self.answer.fail(exc)
        self.abandon()
