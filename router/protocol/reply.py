"""Where the relay writes an answer, whichever server carries the request: aiohttp's
``StreamResponse`` (``AiohttpReply``) or the own front's connection
(``front_request.FrontReply``). Each write raises ``ConnectionError`` once the client has
gone."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Protocol

from aiohttp import web


class Reply(Protocol):
    status: int | None  # None until ``begin``

    async def begin(self, status: int, headers: Mapping[str, str], length: int | None) -> None:
        """The status and headers; ``length``: the body's, or None (sent chunked)."""

    async def write(self, data: bytes) -> None: ...

    def push(self, data: bytes) -> bool:
        """Writes ``data`` now if it can go without waiting (after ``begin``'s head went out
        with a first write, while the client keeps up); False if not, and nothing written."""

    async def end(self) -> None: ...

    def cut(self) -> None:
        """The connection closed at once: a body cut short must not look whole."""


class AiohttpReply:
    """A reply through aiohttp's server: ``response`` is what the handler returns. A write
    that may wait for the client (one that can take the transport's buffer past its high
    mark) waits ``write_seconds`` at most: then the client is cut off (``unread``) and the
    write raises ``ConnectionError``."""

    def __init__(
        self, request: web.Request, write_seconds: float, unread: Callable[[], None]
    ) -> None:
        self.request = request
        self.response: web.StreamResponse | None = None
        self.status: int | None = None
        self._write_seconds, self._unread = write_seconds, unread

    async def begin(self, status: int, headers: Mapping[str, str], length: int | None) -> None:
        self.status = status
        self.response = response = _Relayed(status=status, headers=headers)
        if length is not None:
            response.content_length = length
        await response.prepare(self.request)

    async def write(self, data: bytes) -> None:
        assert self.response is not None
        transport = self.request.transport
        if transport is None or (
            transport.get_write_buffer_size() + len(data) <= transport.get_write_buffer_limits()[1]
        ):
            await self.response.write(data)  # it cannot fill the buffer: it does not wait
            return
        try:
            async with asyncio.timeout(self._write_seconds):
                await self.response.write(data)
        except TimeoutError:
            self._unread()
            transport.abort()
            raise ConnectionResetError("the client read nothing of its answer") from None

    def push(self, data: bytes) -> bool:
        return False  # aiohttp's writes are awaited, each

    async def end(self) -> None:
        assert self.response is not None
        await self.response.write_eof()

    def cut(self) -> None:
        if self.request.transport is not None:
            self.request.transport.close()


class AiohttpProxied:
    """A proxied request as aiohttp carried it (``asked.Proxied``)."""

    def __init__(
        self, request: web.Request, write_seconds: float, unread: Callable[[], None]
    ) -> None:
        self.request = request
        self.method, self.path, self.headers = request.method, request.path, request.headers
        self.content_type = request.content_type
        self.answer = AiohttpReply(request, write_seconds, unread)

    async def read(self) -> bytes:
        return await self.request.read()

    def reply(self) -> AiohttpReply:
        return self.answer


class _Relayed(web.StreamResponse):
    """Its head goes out with its first chunk, in one write (aiohttp's ``Response`` does
    the same): a stream's first event reaches the client with one system call less."""

    _send_headers_immediately = False
