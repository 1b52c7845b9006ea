"""The request path's own HTTP/1.1 client: keep-alive connections to each backend, the
request written in one piece, the answer parsed by llhttp as it comes (``router.upstream.answer``).

aiohttp's client cost the router more CPU per request than all of its routing (a
``ClientResponse``, a ``StreamReader``, a timer re-armed at every chunk, tracing hooks,
cookie and redirect handling); this one does what a proxy needs and no more. Health checks,
metric polls, aborts and the model card keep aiohttp's session: they are not per request.

A connection idle for ``KEEPALIVE`` seconds is closed by the router, before the backend
closes it (SGLang's uvicorn does at 5 s): a request is never written on a connection the
backend may be closing at that moment. The most recently used idle connection is taken
first, so the pool shrinks to what the load needs.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from specroute.router.upstream.answer import Answer, Dropped, UpstreamConnection

KEEPALIVE = 4.0  # seconds: below uvicorn's 5 s (SGLANG_TIMEOUT_KEEP_ALIVE)
MAX_HEAD = 64 * 1024  # bytes of an answer's head; SGLang's are a few hundred

Told = Callable[[str, Dropped], None]  # a backend's base URL, what was dropped of it


@dataclass(frozen=True)
class Limits:
    """How long an answer may take, in seconds (None: no limit): ``connect`` to open a
    connection, ``silence`` between its bytes until the watchdog takes over (a stream's),
    ``total`` for all of it from its sending (a whole answer's)."""

    connect: float | None
    silence: float | None
    total: float | None


class UpstreamPool:
    """One per router process. ``headers`` go with every request (the backends' key);
    ``max_head``: the bytes of an answer's head; ``told``: what the backend at a base URL
    sent that was dropped (``upstream_answer.Dropped``)."""

    def __init__(
        self, headers: Mapping[str, str], max_head: int = MAX_HEAD, told: Told | None = None
    ) -> None:
        self._common = _head_lines(headers)
        self._origins: dict[str, _Origin] = {}
        self._tls: ssl.SSLContext | None = None
        self._max_head, self._told = max_head, told

    async def send(
        self, base: str, path: str, body: bytes, headers: Mapping[str, str], limits: Limits
    ) -> Answer:
        """Writes ``POST base+path`` with ``body`` and returns its answer, not yet read
        (``Answer.head``). ``path``: one of the router's own, as it serves it. Raises what
        aiohttp would when no connection opens."""
        origin = self._origins.get(base)
        if origin is None:
            origin = self._origins[base] = _Origin(base, self._context, self._max_head, self._told)
        loop = asyncio.get_running_loop()
        sent = loop.time()
        connection = origin.idle_one() or await origin.connect(limits.connect)
        head = b"POST %s%s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n" % (
            origin.prefix,
            path.encode(),
            origin.host_header,
            len(body),
        )
        answer = Answer(connection, loop)
        total = None if limits.total is None else max(0.0, limits.total - (loop.time() - sent))
        answer.limit(limits.silence, total)
        connection.start(
            answer, b"".join((head, self._common, _head_lines(headers), b"\r\n", body))
        )
        return answer

    def idle(self) -> int:
        """Connections kept for the next request, to every backend."""
        return sum(len(origin.idle) for origin in self._origins.values())

    def close(self) -> None:
        for origin in self._origins.values():
            origin.close()
        self._origins.clear()

    def _context(self) -> ssl.SSLContext:
        if self._tls is None:  # made once, when an https backend is first sent to
            self._tls = ssl.create_default_context()
        return self._tls


class _Origin:
    """The connections to one backend: the idle ones by when they went idle, oldest first."""

    def __init__(
        self, base: str, tls: Callable[[], ssl.SSLContext], max_head: int, told: Told | None
    ) -> None:
        url = urlsplit(base)
        self.base, self._max_head, self._told_pool = base, max_head, told
        self.host, self.port = (
            url.hostname or "",
            url.port or (443 if url.scheme == "https" else 80),
        )
        self.host_header = url.netloc.rpartition("@")[2].encode("idna")
        self.prefix = url.path.rstrip("/").encode()
        self.https = url.scheme == "https"
        self._tls = tls
        self.idle: dict[UpstreamConnection, float] = {}
        self._sweep: asyncio.TimerHandle | None = None

    def idle_one(self) -> UpstreamConnection | None:
        """The most recently used idle connection still open, if any."""
        while self.idle:
            connection, _ = self.idle.popitem()
            if connection.transport is not None and not connection.transport.is_closing():
                return connection
        return None

    async def connect(self, seconds: float | None) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        tls = self._tls() if self.https else None
        opening = loop.create_connection(
            lambda: UpstreamConnection(self.returned, self._told, self._max_head),
            self.host,
            self.port,
            ssl=tls,
            server_hostname=self.host if tls is not None else None,
        )
        try:
            _, protocol = await asyncio.wait_for(opening, seconds)
        except TimeoutError:
            raise aiohttp.ConnectionTimeoutError(
                f"Connection timeout to host {self.host}:{self.port}"
            ) from None
        except OSError as exc:  # its errno kept: the router's own lack of descriptors is told
            raise aiohttp.ClientOSError(
                exc.errno, f"Cannot connect to host {self.host}:{self.port}: {exc.strerror or exc}"
            ) from None
        return protocol

    def _told(self, connection: UpstreamConnection, dropped: Dropped) -> None:
        if self._told_pool is not None:
            self._told_pool(self.base, dropped)

    def returned(self, connection: UpstreamConnection, keep: bool) -> None:
        if not keep:
            self.idle.pop(connection, None)
            return
        loop = asyncio.get_running_loop()
        self.idle[connection] = loop.time()
        if self._sweep is None:
            self._sweep = loop.call_later(KEEPALIVE, self._swept)

    def _swept(self) -> None:
        """Closes the connections idle for ``KEEPALIVE``; runs again while some are idle."""
        loop = asyncio.get_running_loop()
        now, self._sweep = loop.time(), None
        for connection, since in list(self.idle.items()):
            if now - since < KEEPALIVE:
                self._sweep = loop.call_at(since + KEEPALIVE, self._swept)
                return
            del self.idle[connection]
            connection.abandon()

    def close(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for connection in list(self.idle):
            connection.abandon()
        self.idle.clear()


def _head_lines(headers: Mapping[str, str]) -> bytes:
    """``Name: value`` lines; a header whose name or value holds a line break is left out
    (it would end the head early: a request smuggled behind this one)."""
    lines = []
    for name, value in headers.items():
        line = f"{name}: {value}\r\n"
        if line.count("\r") == 1 and line.count("\n") == 1:
            lines.append(line.encode("utf-8", "surrogateescape"))
    return b"".join(lines)
