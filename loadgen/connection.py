"""One kept-alive HTTP/1.1 client connection on a raw asyncio ``Protocol``, timing each SSE
event of an answer as its bytes arrive.

A proxy benchmark's load generator shares the machine with what it measures; aiohttp's
client costs several times more per chunk than this, and the ``openai`` client more again.
It speaks only what the benchmark needs: one request at a time, an answer framed by
``Content-Length``, chunked encoding or the end of the connection, never compressed.
"""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass, field
from typing import cast

_EVENT_END = b"\n\n"  # an SSE event is whole at its blank line
_MAX_HEAD = 64 * 1024


@dataclass
class Reply:
    """One request's answer as the client saw it; times on ``time.monotonic``."""

    start: float
    status: int = 0
    first: float | None = None  # the first whole event, or the whole body when not a stream
    end: float | None = None
    events: list[float] = field(default_factory=list)  # each event's arrival, [DONE] included
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.end is not None


def no_delay(transport: asyncio.BaseTransport) -> asyncio.Transport:
    """The transport with Nagle's algorithm off: what is written goes out at once."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return cast(asyncio.Transport, transport)  # uvloop's is no subclass of it


class ConnectionClosed(Exception):
    """The server closed the connection before the answer ended."""


class Connection(asyncio.Protocol):
    """Use ``await Connection.open(host, port)``, then ``await conn.post(...)`` again and
    again; a connection the server closed says so in ``closed`` and must be opened anew."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._reply: Reply | None = None
        self._done: asyncio.Future[None] | None = None
        self._buffer = b""
        self._head_done = False
        self._mode = ""  # "length", "chunked" or "close"
        self._left = 0  # bytes left in the body ("length") or in the current chunk
        self._tail = b""  # the body's last byte, for an event end split across reads
        self._stream = False
        self._keep_alive = True

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_connection(cls, host, port)
        return protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = no_delay(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._mode == "close" and self._reply is not None:
            self._finish()
        else:
            self._fail(ConnectionClosed(str(exc) if exc else "closed by the server"))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.closed = True

    async def post(self, request: bytes, stream: bool) -> Reply:
        """Send ``request`` (a whole HTTP request, head and body) and wait for the answer;
        failures are in ``Reply.error``, never raised."""
        reply = Reply(time.monotonic())
        if self.closed or self.transport is None:
            reply.error = "ConnectionClosed: the connection was closed"
            return reply
        self._reply, self._stream = reply, stream
        self._buffer, self._head_done, self._tail = b"", False, b""
        self._done = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        try:
            await self._done
        except (ConnectionClosed, ValueError) as exc:
            reply.error = f"{type(exc).__name__}: {exc}"
            self.close()
        finally:
            self._reply = self._done = None
        if not self._keep_alive:
            self.close()
        return reply

    def data_received(self, data: bytes) -> None:
        if self._reply is None:
            return  # nothing asked: a stray byte after an answer is ignored
        now = time.monotonic()
        try:
            if not self._head_done:
                self._buffer += data
                end = self._buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(self._buffer) > _MAX_HEAD:
                        raise ValueError("an answer head longer than 64 kB")
                    return
                self._head(self._buffer[:end])
                data, self._buffer = self._buffer[end + 4 :], b""
                if self._mode == "length" and self._left == 0:
                    self._finish()
                    return
            self._body(data, now)
        except ValueError as exc:
            self._fail(exc)

    def _head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise ValueError(f"not an HTTP answer: {lines[0][:80]!r}")
        assert self._reply is not None
        self._reply.status = int(parts[1])
        headers = dict(line.lower().split(":", 1) for line in lines[1:] if ":" in line)
        connection = headers.get("connection", "").strip()
        self._keep_alive = connection != "close" and lines[0].startswith("HTTP/1.1")
        if "chunked" in headers.get("transfer-encoding", ""):
            self._mode, self._left = "chunked", 0
        elif "content-length" in headers:
            self._mode, self._left = "length", int(headers["content-length"])
        else:
            self._mode, self._keep_alive = "close", False
        self._head_done = True

    def _body(self, data: bytes, now: float) -> None:
        if self._mode == "length":
            self._payload(data[: self._left], now)
            self._left -= min(len(data), self._left)
            if self._left == 0:
                self._finish()
        elif self._mode == "close":
            self._payload(data, now)
        else:
            self._chunks(data, now)

    def _chunks(self, data: bytes, now: float) -> None:
        """Unframe chunked encoding: ``_left`` counts what is left of the current chunk and
        its closing CRLF; a frame's size line may be split across reads."""
        data = self._buffer + data
        self._buffer = b""
        while data:
            if self._left > 0:
                take = data[: self._left]
                self._payload(take[: max(0, self._left - 2)], now)
                self._left -= len(take)
                data = data[len(take) :]
                continue
            line_end = data.find(b"\r\n")
            if line_end < 0:
                self._buffer = data
                return
            size = int(data[:line_end].split(b";", 1)[0], 16)
            data = data[line_end + 2 :]
            if size == 0:  # trailers are never sent here: the final CRLF ends the body
                self._finish()
                return
            self._left = size + 2

    def _payload(self, data: bytes, now: float) -> None:
        if not data:
            return
        reply = self._reply
        assert reply is not None
        if self._stream:
            events = (self._tail + data).count(_EVENT_END)
            self._tail = data[-1:]
            if events:
                reply.events.extend([now] * events)
                if reply.first is None:
                    reply.first = now

    def _finish(self) -> None:
        reply = self._reply
        if reply is not None and self._done is not None and not self._done.done():
            reply.end = time.monotonic()
            if reply.first is None and not self._stream:
                reply.first = reply.end
            self._done.set_result(None)

    def _fail(self, exc: Exception) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(exc)
