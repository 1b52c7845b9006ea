"""One client connection on the own front (``router.http.server``): llhttp (``httptools``) parses
the requests to the proxied paths on a bare asyncio protocol, and each is served in a task
of its own by the same request path aiohttp's server runs (``front_gate.served``).

Everything else is aiohttp's. A connection whose first request is not a POST to a proxied
path is handed to aiohttp's server whole, before a byte of it is parsed here; one that asks
for something else later (``GET /v1/models`` after a completion, as the openai client does on
its pool) has that request, and every one after it, passed to aiohttp as it was sent, once
the requests before it are answered; when nothing of this connection is left half parsed,
aiohttp's protocol takes the socket over. So the router's other endpoints, its 404s and
405s, behave as they always did.

What aiohttp's server enforced for the router, this does too: the head's limits (431, 400),
the idle limit from the connection's start and each answer, the body's size and time (413,
408, in ``router.http.gate``), requests on one connection answered in the order they came, the
request's task cancelled when its client goes away, and a write that waits while the
client reads slower than the answer comes.

And what HTTP/1.1 asks of a server that aiohttp's did for it, or that it did not: a request
with no Host or two (RFC 9112 section 3.2) or a malformed one, a body included, is answered
400 at once, after the answers to the requests read before it, and nothing more is read; an
Upgrade is ignored (RFC 9110 section 7.8) and CONNECT refused; a client that sends requests
ahead of its answers is read no further past ``max_pipelined_requests`` or
``max_pipelined_bytes`` until the answers catch up; one that reads nothing of an answer for
``client_write_timeout`` is cut off. A connection that ends after an answer has its write
side shut first, and what the client still sends is read and dropped for a moment, so that
the answer is not lost to a reset (RFC 9112 section 9.6).

A request's task starts once the read that brought its head is parsed, its body with it
if it came in that read. From Python 3.12 it starts eagerly, as aiohttp's server starts its
handlers: it runs at once, up to its first wait, so that a request is on its way to the
backend in the turn of the event loop it arrived in, not behind every callback of the
next."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial
from typing import cast

import httptools
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from multidict import CIMultiDict

from specroute.router.http.context import Front
from specroute.router.http.exchange import BodyRefused, FrontRequest, whole_answer
from specroute.router.http.runner import parse_refusal
from specroute.router.protocol.errors import error_response

LOG = logging.getLogger("specroute.router.http")
_NOT_OWN = (b"content-length", b"transfer-encoding", b"upgrade")
# the fields RFC 9110 allows once in a request's head, as aiohttp's server holds them
_SINGLETONS = frozenset(
    {
        b"content-length",
        b"content-location",
        b"content-range",
        b"content-type",
        b"etag",
        b"host",
        b"max-forwards",
        b"server",
        b"transfer-encoding",
        b"user-agent",
    }
)
LINGER = 2.0  # seconds a connection ending after its answer reads and drops what still comes
# Once a connection's requests are aiohttp's, one that cannot be taken is told by aiohttp's
# server, in its turn: it is given a request line aiohttp refuses (400), then the socket.
_REFUSED_BY_AIOHTTP = b"\x00 / HTTP/1.1\r\n\r\n"


class _HeadRefused(Exception):
    """Raised in llhttp's callbacks: the request is answered ``refusal`` (a response, or the
    parse error it is made from) and the connection ends."""

    def __init__(self, refusal: web.Response | BadHttpMessage) -> None:
        super().__init__(refusal)
        self.refusal = refusal


@dataclass(slots=True)
class _Message:
    """The request being parsed."""

    url: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: list[bytes] = field(default_factory=list)  # a request for aiohttp: kept to pass on
    size: int = 0
    head_done: bool = False
    request: FrontRequest | None = None  # one the front serves, once its head is whole
    framing: bytes | None = None  # asked to upgrade: the lines that frame its body (below)


# What waits its turn on a connection: a request the front serves, one for aiohttp's server
# as it was sent, or the refusal that ends the connection.
_Pending = FrontRequest | bytes | web.Response


class FrontConnection(asyncio.Protocol):
    def __init__(self, front: Front) -> None:
        self._front = front
        self._transport: asyncio.Transport | None = None
        self._start = b""  # the first bytes, until the request line says who serves them
        self._parser: httptools.HttpRequestParser | None = None
        self._message: _Message | None = None
        self._head_bytes = 0
        self._task: asyncio.Task[None] | None = None  # the request being answered
        self._serving: FrontRequest | None = None  # its request
        self._pending: deque[_Pending] = deque()  # after it, in order
        self._ahead = 0  # bytes of the pending requests, read while another was answered
        self._held = False  # not read: too much was sent ahead of the answers
        self._aiohttp: asyncio.Protocol | None = None  # aiohttp's, once one of its requests came
        self._giving = False  # a request for aiohttp came: every later one is its too
        self._paused: asyncio.Future[None] | None = None  # writing, while the client reads slow
        self._timer: asyncio.TimerHandle | None = None  # the idle or linger limit
        self._write_timer: asyncio.TimerHandle | None = None  # while writing waits
        self._starting = False  # in ``_next``: a request answered at once does not recurse
        self._rejoining = False  # parsing a head of its own making, for an upgrade's body
        self.closing = False  # no more requests read: it ends with the answers to those read

    # the transport's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._front.connections.add(self)
        self._idle_from_now()

    def data_received(self, data: bytes) -> None:
        if self._parser is None:
            self._start += data
            if b"\n" not in self._start and len(self._start) <= self._front.max_head:
                return
            data, self._start = self._start, b""
            if not data.startswith(self._front.owned_lines):
                self._give_all(data)
                return
            self._parser = httptools.HttpRequestParser(self)
        if self.closing:
            return  # nothing more is read: what comes is dropped
        if self._message is None or not self._message.head_done:
            self._head_bytes += len(data)
            if self._head_bytes > self._front.max_head:
                self._refuse(LineTooLong("request head", str(self._front.max_head)))
                return
        self._parse(data)
        self._next()
        self._hold()
        self._take_over()

    def eof_received(self) -> bool | None:
        if self._aiohttp is not None:
            return self._aiohttp.eof_received()
        return None  # closed: a request in flight is cancelled, as aiohttp's server does

    def pause_writing(self) -> None:
        if self._aiohttp is not None:
            self._aiohttp.pause_writing()
        if self._paused is None:
            loop = asyncio.get_running_loop()
            self._paused = loop.create_future()
            self._write_timer = loop.call_later(self._front.write_seconds, self._unread)

    def resume_writing(self) -> None:
        if self._aiohttp is not None:
            self._aiohttp.resume_writing()
        self._resumed(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self._front.connections.discard(self)
        self._resumed(ConnectionResetError("the client went away"))
        self._limit(None, None)
        if self._task is not None:
            self._task.cancel()  # the client went away: its request is cancelled
        self._pending.clear()
        if self._aiohttp is not None:
            self._aiohttp.connection_lost(exc)

    # the wire the answers go out on (``front_request.Wire``)

    def send(self, data: bytes) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client went away")
        transport.write(data)

    async def drained(self) -> None:
        if self._paused is not None:
            await asyncio.shield(self._paused)

    def writable(self) -> bool:
        return self._paused is None and self._open()

    def cut(self) -> None:
        self.closing = True
        if self._transport is not None:
            self._transport.close()

    def close_idle(self) -> None:
        """The router stops: closed now if no request is being answered, else after it."""
        self.closing = True
        if self._task is None and self._transport is not None:
            self._transport.close()

    # llhttp's callbacks

    def on_message_begin(self) -> None:
        if not self._rejoining:
            self._message = _Message()

    def on_url(self, url: bytes) -> None:
        message = self._message
        assert message is not None
        if self._rejoining:
            return
        message.url += url
        if len(message.url) > self._front.max_line:
            raise _HeadRefused(
                parse_refusal(431, LineTooLong("request line", str(self._front.max_line)))
            )

    def on_header(self, name: bytes, value: bytes) -> None:
        message, front = self._message, self._front
        assert message is not None
        if self._rejoining:
            return
        if len(name) > front.max_line or len(value) > front.max_line:
            raise _HeadRefused(LineTooLong("header", str(front.max_line)))
        message.headers.append((name, value))
        if len(message.headers) > front.max_headers:
            raise _HeadRefused(BadHttpMessage("too many headers"))

    def on_headers_complete(self) -> None:
        message, parser = self._message, self._parser
        assert message is not None and parser is not None
        if self._rejoining:
            return
        head_bytes, self._head_bytes = self._head_bytes, 0
        if parser.should_upgrade() and parser.get_method() != b"CONNECT":
            message.framing = _framing(message.headers)
        message.head_done = True
        self._limit(None, None)  # the idle limit: a whole head came
        if (refusal := _refused(parser, message.headers)) is not None:
            raise _HeadRefused(refusal)
        own = (
            not self._giving
            and parser.get_method() == b"POST"
            and message.url in self._front.owned_paths
            and parser.get_http_version() == "1.1"
            and not any(_aiohttps(name, value) for name, value in message.headers)
        )
        if not own:
            self._giving = True  # passed on whole, at its end
            return
        headers = CIMultiDict[str]()
        readable = True
        for name, value in message.headers:
            if not value.isascii():
                try:
                    value.decode()
                except UnicodeDecodeError:
                    readable = False
            headers.add(name.decode("latin-1"), value.decode("utf-8", "surrogateescape"))
        request = FrontRequest(
            "POST", message.url.decode(), headers, parser.should_keep_alive(), self
        )
        request.readable = readable
        message.request = request
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self._front.max_body:
            request.refuse(BodyRefused(partial(self._front.too_large, int(length))))
            self.closing = True  # its body is not read, nor anything after it
        self._queue(request, head_bytes)  # started once this read is parsed

    def on_body(self, body: bytes) -> None:
        message = self._message
        assert message is not None
        message.size += len(body)
        request = message.request
        if request is None:
            message.body.append(body)
        else:
            request.take(body)
            if request is not self._serving:
                request.ahead += len(body)
                self._ahead += len(body)
        if message.size > self._front.max_body:
            answer = partial(self._front.too_large, message.size)
            if request is None:
                raise _HeadRefused(answer())
            request.refuse(BodyRefused(answer))
            self.closing = True  # what more comes of it is not read

    def on_message_complete(self) -> None:
        message, parser = self._message, self._parser
        assert message is not None and parser is not None
        if message.framing is not None:  # llhttp leaves the body of an upgrade unread
            return
        self._rejoining = False
        self._message = None
        if message.request is not None:
            message.request.whole()
            return
        self._queue(_as_sent(parser, message))
        if parser.get_method() == b"CONNECT":
            self.closing = True  # what follows is a tunnel's, not requests: aiohttp refuses it

    # serving, in order

    def _parse(self, data: bytes) -> None:
        """``data`` parsed. A request that asks to upgrade is taken as it is, its Upgrade
        ignored: llhttp stops at the end of its head, so a parser of its own goes on from
        there with a head made of the request's framing, to read its body and then the
        requests after it."""
        assert self._parser is not None
        while data:
            try:
                self._parser.feed_data(data)
                return
            except httptools.HttpParserUpgrade as exc:  # the request's head is whole
                if self.closing:
                    return
                data = data[exc.args[0] :]
                self._parser = httptools.HttpRequestParser(self)
                message = self._message
                if message is not None and message.framing is not None:
                    data = b"POST / HTTP/1.1\r\n%s\r\n%s" % (message.framing, data)
                    message.framing, self._rejoining = None, True
            except httptools.HttpParserCallbackError as exc:
                context = exc.__context__
                if not isinstance(context, _HeadRefused):
                    raise
                if isinstance(context.refusal, web.Response):
                    self._fail(partial(_as_made, context.refusal))
                else:
                    self._refuse(context.refusal)
                return
            except httptools.HttpParserError as exc:  # llhttp's reasons quote nothing sent
                LOG.warning("Error handling request: %s", exc)
                self._fail(partial(_malformed, str(exc)))
                return

    def _queue(self, item: FrontRequest | bytes, head: int = 0) -> None:
        """``item`` waits its turn; its bytes (a request's head, so far) count as read ahead
        until it is started or given."""
        if isinstance(item, FrontRequest):
            item.ahead += head
            self._ahead += head
        else:
            self._ahead += len(item)
        self._pending.append(item)

    def _next(self) -> None:
        if self._starting:
            return  # a request answered at once, in the loop below: it takes the next
        self._starting = True
        try:
            while self._task is None and self._pending and self._open():
                item = self._pending.popleft()
                if isinstance(item, web.Response):  # the refusal that ends the connection
                    self._last(item)
                    return
                if isinstance(item, bytes):
                    self._ahead -= len(item)
                    self._give(item)
                    continue
                self._ahead -= item.ahead
                item.ahead = 0
                self._serving = item
                task = _started(self._serve(item))
                if not task.done():
                    self._task = task
        finally:
            self._starting = False
        if self.closing and self._task is None and not self._pending and self._aiohttp is None:
            self._end()  # every request read is answered

    def _open(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    async def _serve(self, request: FrontRequest) -> None:
        try:
            await self._front.served(request)
        finally:
            self._task = self._serving = None
            self._answered(request)

    def _answered(self, request: FrontRequest) -> None:
        if not self._open():
            return
        answer = request.answer
        if not answer.ended:
            self.cut()  # an answer cut short: the connection ends here
            return
        if not answer.keep_alive:  # said so in its head: what was sent after it is dropped
            self.closing = True
            self._pending.clear()
            self._ahead = 0
        elif not self.closing:
            self._idle_from_now()
        self._next()
        self._hold()
        self._take_over()

    def _hold(self) -> None:
        """Reading paused while more than the bounds was sent ahead of the answers, and
        resumed once they caught up."""
        front, transport = self._front, self._transport
        if transport is None or self.closing:
            return
        over = None
        if len(self._pending) > front.max_ahead:
            over = "pipelined_requests"
        elif self._ahead > front.max_ahead_bytes:
            over = "pipelined_bytes"
        if over is not None and not self._held:
            self._held = True
            front.limited(over)
            transport.pause_reading()
        elif over is None:
            self._read_again()

    def _read_again(self) -> None:
        """Reading resumed, where the bounds had paused it."""
        if self._held and self._transport is not None:
            self._held = False
            self._transport.resume_reading()

    # what is aiohttp's

    def _give_all(self, data: bytes) -> None:
        """The whole connection to aiohttp's server, from its first byte."""
        assert self._transport is not None
        self._front.connections.discard(self)
        self._limit(None, None)
        handler = self._front.aiohttp()
        self._transport.set_protocol(handler)
        handler.connection_made(self._transport)
        handler.data_received(data)

    def _give(self, request: bytes) -> None:
        """One request to aiohttp's server, as it was sent."""
        if self._aiohttp is None:
            assert self._transport is not None
            self._limit(None, None)
            self._aiohttp = self._front.aiohttp()
            self._aiohttp.connection_made(self._transport)
        self._aiohttp.data_received(request)

    def _take_over(self) -> None:
        """Once aiohttp serves this connection and nothing of it is left here (no request
        half parsed, none waiting), aiohttp's protocol reads the socket itself."""
        if (
            self._aiohttp is not None
            and self._parser is not None
            and self._message is None
            and self._task is None
            and not self._pending
            and self._transport is not None
        ):
            self._parser = None
            self._front.connections.discard(self)
            self._read_again()
            self._transport.set_protocol(self._aiohttp)

    # refusals, limits and the end

    def _refuse(self, exc: BadHttpMessage) -> None:
        """A head past a limit: said as aiohttp's server says it."""
        status = 431 if isinstance(exc, LineTooLong) else 400
        LOG.warning("Error handling request: %s", type(exc).__name__)
        self._fail(partial(parse_refusal, status, exc))

    def _fail(self, answer: Callable[[], web.Response]) -> None:
        """Nothing more is read: the requests before this one are answered, then ``answer``
        (the answer of the request whose body it is, if its head was taken), and the
        connection ends."""
        self.closing = True
        message, self._message = self._message, None
        request = None if message is None else message.request
        if request is not None and not request.arrived:
            request.refuse(BodyRefused(answer))
        elif self._giving and self._aiohttps_turn():
            self._queue(_REFUSED_BY_AIOHTTP)
        else:
            self._pending.append(answer())
        self._next()
        self._take_over()

    def _aiohttps_turn(self) -> bool:
        """Whether aiohttp's server answers on this connection before the refusal could:
        it took a request of it, or one waits to go to it. Then the refusal is its own (a
        line it cannot read), so that the answers keep their order; else the front's."""
        return self._aiohttp is not None or any(isinstance(i, bytes) for i in self._pending)

    def _last(self, answer: web.Response) -> None:
        """The refusal that ends the connection, written."""
        try:
            self.send(whole_answer(answer, None, False))
        except ConnectionError:
            return
        self._pending.clear()
        self._end()

    def _end(self) -> None:
        """The connection ends after its last answer: its write side shut, so that the
        client reads that answer to its end, and what it still sends dropped for
        ``LINGER`` seconds at most: a socket closed with bytes unread would be reset, and
        the answer lost with it."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        self.closing = True
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self._read_again()
        self._limit(LINGER, transport.close)

    def _limit(self, seconds: float | None, then: Callable[[], object] | None) -> None:
        """The idle or linger timer: ``then`` in ``seconds``, or none."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if seconds is not None and then is not None:
            self._timer = asyncio.get_running_loop().call_later(seconds, then)

    def _idle_from_now(self) -> None:
        self._limit(self._front.idle_seconds, self._idled)

    def _idled(self) -> None:
        self._timer = None
        if self._task is None and not self._pending and self._transport is not None:
            self._transport.close()

    def _unread(self) -> None:
        """The client read nothing of its answer for ``client_write_timeout``: cut off, and
        its request cancelled (its backend's work aborted)."""
        self._write_timer = None
        self._front.limited("write_timeout")
        self.closing = True
        if self._transport is not None:
            self._transport.abort()

    def _resumed(self, exc: BaseException | None) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        paused, self._paused = self._paused, None
        if paused is not None and not paused.done():
            if exc is None:
                paused.set_result(None)
            else:
                paused.set_exception(exc)
                paused.exception()  # retrieved: none may be waiting


def _started(serving: Coroutine[None, None, None]) -> asyncio.Task[None]:
    loop = asyncio.get_running_loop()
    if sys.version_info >= (3, 12):
        return asyncio.Task(serving, loop=loop, eager_start=True)
    return loop.create_task(serving)


def _refused(
    parser: httptools.HttpRequestParser, headers: list[tuple[bytes, bytes]]
) -> web.Response | None:
    """A head that names no host (RFC 9112 section 3.2), that has a field HTTP allows once
    twice (RFC 9110: which one a server reads is anyone's guess, as aiohttp's server refuses
    it), of a version other than HTTP/1.x, or a CONNECT (the router is no tunnel): refused
    before anything of it is served."""
    if parser.get_method() == b"CONNECT":
        return error_response(405, "CONNECT is not served here: the router is no tunnel.")
    version = parser.get_http_version()
    if version not in ("1.0", "1.1"):
        return error_response(505, f"HTTP/{version} is not served here; HTTP/1.1 is.")
    seen: set[bytes] = set()
    for name, _ in headers:
        lower = name.lower()
        if lower in _SINGLETONS:
            if lower in seen:
                said = f"The request has two {name.decode('latin-1')} headers; HTTP allows one."
                return error_response(400, said)
            seen.add(lower)
    if b"host" not in seen and parser.get_http_version() == "1.1":
        return error_response(400, "The request has no Host header; HTTP/1.1 asks for one.")
    return None


def _framing(headers: list[tuple[bytes, bytes]]) -> bytes:
    """The header lines that say how a request's body is framed, as they were sent."""
    framing = (b"content-length", b"transfer-encoding")
    return b"".join(b"%s: %s\r\n" % h for h in headers if h[0].lower() in framing)


def _as_made(answer: web.Response) -> web.Response:
    """An answer made while its head was parsed, before any request it could name."""
    return answer


def _malformed(reason: str) -> web.Response:
    return error_response(400, f"The request could not be parsed: {reason}.")


def _aiohttps(name: bytes, value: bytes) -> bool:
    """A header that leaves its request to aiohttp's server, whose handling of it the router
    keeps: a compressed body (decoded, or refused, as aiohttp can), an expectation other than
    100-continue."""
    name = name.lower()
    if name == b"content-encoding":
        return value.strip().lower() not in (b"", b"identity")
    if name == b"expect":
        return value.strip().lower() != b"100-continue"
    return False


def _as_sent(parser: httptools.HttpRequestParser, message: _Message) -> bytes:
    """A request for aiohttp, as its client sent it: its body whole, with its length (an
    Upgrade left out: this front took the request as it is)."""
    body = b"".join(message.body)
    method, version = parser.get_method(), parser.get_http_version().encode()
    lines = [b"%s %s HTTP/%s\r\n" % (method, message.url, version)]
    lines.extend(b"%s: %s\r\n" % h for h in message.headers if h[0].lower() not in _NOT_OWN)
    if body or method in (b"POST", b"PUT", b"PATCH"):
        lines.append(b"Content-Length: %d\r\n" % len(body))
    return b"".join(lines) + b"\r\n" + body
