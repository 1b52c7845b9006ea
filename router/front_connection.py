"""One client connection on the own front (``front_server``): llhttp (``httptools``) parses
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
408, in ``front_gate``), requests on one connection answered in the order they came, the
request's task cancelled when its client goes away, and a write that waits while the
client reads slower than the answer comes.

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
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import cast

import httptools
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from multidict import CIMultiDict

from specroute.router.errors import error_response
from specroute.router.front_context import Front
from specroute.router.front_request import BodyRefused, FrontRequest, whole_answer
from specroute.router.runner import parse_refusal

LOG = logging.getLogger("specroute.router.http")
_NOT_OWN = (b"content-length", b"transfer-encoding")


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


class FrontConnection(asyncio.Protocol):
    def __init__(self, front: Front) -> None:
        self._front = front
        self._transport: asyncio.Transport | None = None
        self._start = b""  # the first bytes, until the request line says who serves them
        self._parser: httptools.HttpRequestParser | None = None
        self._message: _Message | None = None
        self._head_bytes = 0
        self._task: asyncio.Task[None] | None = None  # the request being answered
        self._pending: deque[FrontRequest | bytes] = deque()  # after it, in order
        self._aiohttp: asyncio.Protocol | None = None  # aiohttp's, once one of its requests came
        self._giving = False  # a request for aiohttp came: every later one is its too
        self._paused: asyncio.Future[None] | None = None  # writing, while the client reads slow
        self._idle: asyncio.TimerHandle | None = None
        self._starting = False  # in ``_next``: a request answered at once does not recurse
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
            return
        if self._message is None or not self._message.head_done:
            self._head_bytes += len(data)
            if self._head_bytes > self._front.max_head:
                self._refuse(LineTooLong("request head", str(self._front.max_head)))
                return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            context = exc.__context__
            if not isinstance(context, _HeadRefused):
                raise
            if isinstance(context.refusal, web.Response):
                self._fail(context.refusal)
            else:
                self._refuse(context.refusal)
        except httptools.HttpParserError as exc:
            self._refuse(BadHttpMessage(type(exc).__name__))
        self._next()
        self._take_over()

    def eof_received(self) -> bool | None:
        if self._aiohttp is not None:
            return self._aiohttp.eof_received()
        return None  # closed: a request in flight is cancelled, as aiohttp's server does

    def pause_writing(self) -> None:
        if self._aiohttp is not None:
            self._aiohttp.pause_writing()
        if self._paused is None:
            self._paused = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._aiohttp is not None:
            self._aiohttp.resume_writing()
        self._resumed(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self._front.connections.discard(self)
        self._resumed(ConnectionResetError("the client went away"))
        if self._idle is not None:
            self._idle.cancel()
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
        self._message = _Message()

    def on_url(self, url: bytes) -> None:
        message = self._message
        assert message is not None
        message.url += url
        if len(message.url) > self._front.max_line:
            raise _HeadRefused(
                parse_refusal(431, LineTooLong("request line", str(self._front.max_line)))
            )

    def on_header(self, name: bytes, value: bytes) -> None:
        message, front = self._message, self._front
        assert message is not None
        if len(name) > front.max_line or len(value) > front.max_line:
            raise _HeadRefused(LineTooLong("header", str(front.max_line)))
        message.headers.append((name, value))
        if len(message.headers) > front.max_headers:
            raise _HeadRefused(BadHttpMessage("too many headers"))

    def on_headers_complete(self) -> None:
        message, parser = self._message, self._parser
        assert message is not None and parser is not None
        message.head_done, self._head_bytes = True, 0
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
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
            request.refuse(BodyRefused(self._front.too_large(int(length))))
        self._pending.append(request)  # started once this read is parsed

    def on_body(self, body: bytes) -> None:
        message = self._message
        assert message is not None
        message.size += len(body)
        request = message.request
        if request is None:
            message.body.append(body)
        else:
            request.take(body)
        if message.size > self._front.max_body:
            said = self._front.too_large(message.size)
            if request is None:
                raise _HeadRefused(error_response(413, said))
            request.refuse(BodyRefused(said))
            self.closing = True  # what more comes of it is not read

    def on_message_complete(self) -> None:
        message, parser = self._message, self._parser
        assert message is not None and parser is not None
        self._message = None
        if message.request is not None:
            message.request.whole()
            return
        self._pending.append(_as_sent(parser, message))

    # serving, in order

    def _next(self) -> None:
        if self._starting:
            return  # a request answered at once, in the loop below: it takes the next
        self._starting = True
        try:
            while self._task is None and self._pending and self._open():
                item = self._pending.popleft()
                if isinstance(item, bytes):
                    self._give(item)
                    continue
                task = _started(self._serve(item))
                if not task.done():
                    self._task = task
        finally:
            self._starting = False

    def _open(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    async def _serve(self, request: FrontRequest) -> None:
        try:
            await self._front.served(request)
        finally:
            self._task = None
            self._answered(request)

    def _answered(self, request: FrontRequest) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        if (
            self.closing
            or not request.answer.keep_alive
            or not request.answer.ended
            or not request.arrived
        ):
            self.cut()  # a body not read, an answer cut short: the connection ends here
            return
        self._idle_from_now()
        self._next()
        self._take_over()

    # what is aiohttp's

    def _give_all(self, data: bytes) -> None:
        """The whole connection to aiohttp's server, from its first byte."""
        assert self._transport is not None
        self._front.connections.discard(self)
        if self._idle is not None:
            self._idle.cancel()
        handler = self._front.aiohttp()
        self._transport.set_protocol(handler)
        handler.connection_made(self._transport)
        handler.data_received(data)

    def _give(self, request: bytes) -> None:
        """One request to aiohttp's server, as it was sent."""
        if self._aiohttp is None:
            assert self._transport is not None
            if self._idle is not None:
                self._idle.cancel()
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
            self._transport.set_protocol(self._aiohttp)

    # refusals and limits

    def _refuse(self, exc: BadHttpMessage) -> None:
        """A head that cannot be parsed or is past a limit: said as aiohttp's server says it."""
        status = 431 if isinstance(exc, LineTooLong) else 400
        LOG.warning("Error handling request: %s", type(exc).__name__)
        self._fail(parse_refusal(status, exc))

    def _fail(self, answer: web.Response) -> None:
        """The connection ends: with ``answer`` if nothing else is being answered on it."""
        self.closing = True
        self._next()  # the requests before this one first: it is answered only if none is
        if self._task is not None or self._transport is None:
            return
        try:
            self.send(whole_answer(answer, None, False))
        except ConnectionError:
            return
        self._transport.close()

    def _idle_from_now(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        loop = asyncio.get_running_loop()
        self._idle = loop.call_later(self._front.idle_seconds, self._idled)

    def _idled(self) -> None:
        self._idle = None
        if self._task is None and not self._pending and self._transport is not None:
            self._transport.close()

    def _resumed(self, exc: BaseException | None) -> None:
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


def _aiohttps(name: bytes, value: bytes) -> bool:
    """A header that leaves its request to aiohttp's server, whose handling of it the router
    keeps: a compressed body (decoded, or refused, as aiohttp can), an upgrade, an
    expectation other than 100-continue."""
    name = name.lower()
    if name == b"content-encoding":
        return value.strip().lower() not in (b"", b"identity")
    if name == b"expect":
        return value.strip().lower() != b"100-continue"
    return name == b"upgrade"


def _as_sent(parser: httptools.HttpRequestParser, message: _Message) -> bytes:
    """A request for aiohttp, as its client sent it: its body whole, with its length."""
    body = b"".join(message.body)
    method, version = parser.get_method(), parser.get_http_version().encode()
    lines = [b"%s %s HTTP/%s\r\n" % (method, message.url, version)]
    lines.extend(b"%s: %s\r\n" % h for h in message.headers if h[0].lower() not in _NOT_OWN)
    if body or method in (b"POST", b"PUT", b"PATCH"):
        lines.append(b"Content-Length: %d\r\n" % len(body))
    return b"".join(lines) + b"\r\n" + body
