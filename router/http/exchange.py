"""One request as the own front carries it (``router.http.connection``): what the request path
reads of it (``asked.Proxied``), its body as it arrives, and its answer's bytes on the wire
(``FrontReply``): the head held back to go out with the first chunk, a body of unknown
length sent chunked, a write that waits while the client reads slower than the answer
comes."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Protocol

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_CONTENT_TYPE = "content-type"


class Wire(Protocol):
    """The connection a request came on, as its answer sees it."""

    def send(self, data: bytes) -> None:
        """Raises ``ConnectionResetError`` once the client has gone."""

    async def drained(self) -> None:
        """Returns when the client has read enough of what was sent."""

    def writable(self) -> bool:
        """Whether ``send`` may be called now without waiting: the client is there and has
        read enough of what was sent."""

    def cut(self) -> None: ...


class BodyRefused(Exception):
    """The body is not taken (past the size limit, or malformed): the request is answered
    what ``answer`` makes, and its connection ends. It is made where the request is
    answered, in its context, so that the error names the request's id as every other
    error of a request does."""

    def __init__(self, answer: Callable[[], web.Response]) -> None:
        super().__init__()
        self.answer = answer


class FrontRequest:
    """``asked.Proxied``, for a request the own front parsed."""

    def __init__(
        self, method: str, path: str, headers: CIMultiDict[str], keep_alive: bool, wire: Wire
    ) -> None:
        self.method, self.path = method, path
        self.headers = CIMultiDictProxy(headers)
        self.readable = True  # every header's value is UTF-8
        self.ahead = 0  # bytes of it read while another request of its connection was answered
        self.answer = FrontReply(keep_alive, wire)
        self._wire = wire
        self._body: list[bytes] = []
        self._whole: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    @property
    def content_type(self) -> str:
        """As aiohttp reads it: the media type, lower case, without parameters."""
        given = self.headers.get(_CONTENT_TYPE, "application/octet-stream")
        return given.partition(";")[0].strip().lower()

    def reply(self) -> FrontReply:
        return self.answer

    def take(self, data: bytes) -> None:
        self._body.append(data)

    def whole(self) -> None:
        if not self._whole.done():
            self._whole.set_result(b"".join(self._body))
            self._body = []

    def refuse(self, exc: BodyRefused) -> None:
        if not self._whole.done():
            self._whole.set_exception(exc)
            self._whole.exception()  # said by ``read``, if the request is served at all

    def wait_for_body(self) -> None:
        """Tells a client that waits for it (``Expect: 100-continue``) to send its body."""
        if self.headers.get("expect", "").lower() == "100-continue":
            self._wire.send(b"HTTP/1.1 100 Continue\r\n\r\n")

    @property
    def arrived(self) -> bool:
        """Nothing more of the body is waited for: it came whole, or it was refused."""
        return self._whole.done()

    @property
    def intact(self) -> bool:
        """The body came whole: the connection can carry the next request."""
        return self._whole.done() and self._whole.exception() is None

    async def read(self) -> bytes:
        if self._whole.done():  # as it mostly is: the body came with the head
            return self._whole.result()
        return await asyncio.shield(self._whole)  # a timeout on one read leaves it readable


class FrontReply:
    """``reply.Reply`` on the own front's connection. It holds nothing of its request: a
    request and its reply that held each other would be garbage only the cyclic collector
    frees, and its pauses, every second under load, are the tail of the first chunks."""

    def __init__(self, keep_alive: bool, wire: Wire) -> None:
        self.keep_alive = keep_alive  # the connection stays open after this answer
        self.request_id: tuple[str, str] | None = None  # its header and id, once known
        self._wire = wire
        self.status: int | None = None
        self._head = b""  # not yet sent: it goes with the first bytes of the body
        self._chunked = False
        self.ended = False

    async def begin(self, status: int, headers: Mapping[str, str], length: int | None) -> None:
        self.status, self._chunked = status, length is None and not bodiless(status)
        self._head = head(status, headers, length, self.request_id, self.keep_alive)

    async def write(self, data: bytes) -> None:
        if not data or bodiless(self.status):
            return
        sent = framed(data) if self._chunked else data
        self._wire.send(self._head + sent if self._head else sent)
        self._head = b""
        await self._wire.drained()

    def push(self, data: bytes) -> bool:
        if self._head or not self._wire.writable():
            return False
        self._wire.send(framed(data) if self._chunked else data)
        return True

    async def end(self) -> None:
        last = b"0\r\n\r\n" if self._chunked else b""
        if self._head or last:
            self._wire.send(self._head + last)
            self._head = b""
        self.ended = True

    def cut(self) -> None:
        self._wire.cut()

    def whole(self, response: web.Response) -> None:
        """A whole answer made by the router (a refusal, an error), sent at once."""
        self.status = response.status
        self._wire.send(whole_answer(response, self.request_id, self.keep_alive))
        self.ended = True


def whole_answer(
    response: web.Response, request_id: tuple[str, str] | None, keep_alive: bool
) -> bytes:
    """A response the router made, as bytes on the wire: its head, then its body."""
    body = response.body if isinstance(response.body, bytes) else b""
    headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
    return head(response.status, headers, len(body), request_id, keep_alive) + body


def framed(chunk: bytes) -> bytes:
    """One chunk of a chunked body; none for no bytes (a chunk of none ends the body)."""
    return b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunk else b""


def bodiless(status: int | None) -> bool:
    """An answer that has no body and no framing (RFC 9112 section 6.3): 1xx, 204, 304."""
    return status is not None and (status < 200 or status in (204, 304))


def head(
    status: int,
    headers: Mapping[str, str],
    length: int | None,
    request_id: tuple[str, str] | None,
    keep_alive: bool,
) -> bytes:
    """The answer's status line and headers: the request's id (its header, its value), its
    length or chunked (neither where it has no body), and ``Connection: close`` when the
    connection ends with it."""
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown"))]
    lines.extend(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in headers.items())
    if request_id is not None:
        lines.append(b"%s: %s\r\n" % (request_id[0].encode(), request_id[1].encode()))
    if bodiless(status):
        pass  # no framing at all
    elif length is None:
        lines.append(b"Transfer-Encoding: chunked\r\n")
    else:
        lines.append(b"Content-Length: %d\r\n" % length)
    lines.append(b"Date: %s\r\n" % _date())
    if not keep_alive:
        lines.append(b"Connection: close\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


def _date() -> bytes:
    return _date_at(int(time.time()))


@functools.lru_cache(maxsize=2)
def _date_at(second: int) -> bytes:
    """The Date header's value, made once a second."""
    return formatdate(second, usegmt=True).encode()
