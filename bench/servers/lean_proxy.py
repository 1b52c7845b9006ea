"""The floor of a Python proxy without aiohttp's server: ``python -m
specroute.bench.servers.lean_proxy --port P --upstream URL...`` reads each request with
llhttp (``httptools``) on a bare asyncio protocol, sends it to the next upstream in turn
with the router's own client (``router.upstream_pool``) and writes the answer back as its
bytes come, deciding nothing. ``bare`` beside it is the same pass-through on aiohttp's
server and client: the two apart are what aiohttp's server side costs a request, the part
of a router's CPU that its own work does not account for.

It serves what the benchmark sends and nothing more: one request at a time on each
connection (no pipelining), no limits, no flow control; any GET (``/health``,
``/bare/worker``) is answered ``{"index": 0}``. A bench target, not a server to deploy."""

from __future__ import annotations

import argparse
import asyncio
import itertools
from collections.abc import Iterator
from typing import cast

import httptools
import orjson

from specroute.event_loop import new_event_loop
from specroute.router.http.exchange import framed
from specroute.router.upstream.pool import Limits, UpstreamPool

_LIMITS = Limits(connect=5.0, silence=None, total=None)
_BAD = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_GOT = orjson.dumps({"index": 0})
_GET = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(_GOT),
    _GOT,
)


class _Connection(asyncio.Protocol):
    """One client's connection: its requests parsed as they come, each relayed in a task."""

    def __init__(self, pool: UpstreamPool, turn: Iterator[str]) -> None:
        self._pool, self._turn = pool, turn
        self._parser = httptools.HttpRequestParser(self)
        self._url, self._body, self._type = b"", list[bytes](), b"application/json"
        self._transport: asyncio.Transport | None = None
        self._relaying: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            assert self._transport is not None
            self._transport.write(_BAD)
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._relaying is not None:
            self._relaying.cancel()

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self._type = value

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        assert self._transport is not None
        path, body, kind = self._url.decode(), b"".join(self._body), self._type.decode()
        self._url, self._body, self._type = b"", [], b"application/json"
        if self._parser.get_method() == b"GET":
            self._transport.write(_GET)
            return
        relayed = self._relay(self._transport, path, body, kind)
        self._relaying = asyncio.get_running_loop().create_task(relayed)

    async def _relay(self, out: asyncio.Transport, path: str, body: bytes, kind: str) -> None:
        upstream = next(self._turn)
        answer = await self._pool.send(upstream, path, body, {"Content-Type": kind}, _LIMITS)
        try:
            await answer.head()
            head = b"HTTP/1.1 %d OK\r\ncontent-type: %s\r\n" % (
                answer.status,
                answer.content_type.encode(),
            )
            first = await answer.chunk()
            if answer.content_length is not None:
                out.write(b"%scontent-length: %d\r\n\r\n%s" % (head, answer.content_length, first))
                while chunk := await answer.chunk():
                    out.write(chunk)
            else:
                out.write(b"%stransfer-encoding: chunked\r\n\r\n%s" % (head, framed(first)))
                while chunk := await answer.chunk():
                    out.write(framed(chunk))
                out.write(b"0\r\n\r\n")
        finally:
            answer.release()
            self._relaying = None


async def _serve(upstreams: list[str], host: str, port: int) -> None:
    pool, turn = UpstreamPool({}), itertools.cycle(upstreams)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Connection(pool, turn), host, port, backlog=4096)
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m specroute.bench.servers.lean_proxy")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", action="append", required=True, metavar="URL")
    args = p.parse_args()
    upstreams = [u.rstrip("/") for u in args.upstream]
    new_event_loop().run_until_complete(_serve(upstreams, args.host, args.port))


if __name__ == "__main__":
    main()
