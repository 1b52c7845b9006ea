"""One measured window of ``specroute bench overhead``: ``level`` closed-loop clients against
one target, each on a kept-alive connection of its own, each sending its next request as
soon as the last one ends.

The clients start spread over the warm-up, so their phases do not march in step, and each
opens its connection just before its first request: the connections are opened during
the warm-up, never inside the window. ``snapshot`` is called as the window opens and as it
closes, for the CPU readings that must cover the same span. After the window the clients
send nothing new and their requests in flight may end (the latencies of every request that
started in the window are known); what is still running ``DRAIN_SECONDS`` later is cut.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from specroute.loadgen.connection import Connection, Reply

ENDPOINT = "/v1/chat/completions"
DRAIN_SECONDS = 30.0
_RETRY_SECONDS = 0.05  # after a connection failed to open


@dataclass(frozen=True)
class Address:
    host: str
    port: int
    request: bytes  # the whole request sent to it, head and body


@dataclass(frozen=True)
class Load:
    level: int
    stream: bool
    warmup: float  # seconds of load before the window
    seconds: float  # the window
    spread: float  # first requests spread over this many seconds of the warm-up


@dataclass(frozen=True)
class Sampled:
    t0: float
    t1: float
    replies: list[Reply]
    cut: int  # requests still running DRAIN_SECONDS after the window, cut off


def address(url: str, stream: bool, chunks: int) -> Address:
    """A chat completion of ``chunks`` tokens to ``url``, streamed (asking for the token
    counts at its end, which a router's online calibration learns from) or not."""
    where = urlsplit(url)
    host, port = where.hostname or "127.0.0.1", where.port or 80
    asked: dict[str, object] = {
        "model": "stub",
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": chunks,
        "stream": stream,
    }
    if stream:
        asked["stream_options"] = {"include_usage": True}
    body = json.dumps(asked).encode()
    head = (
        f"POST {ENDPOINT} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return Address(host, port, head.encode() + body)


async def run_window(
    addresses: Sequence[Address], load: Load, snapshot: Callable[[], None]
) -> Sampled:
    """Client ``i`` talks to ``addresses[i % len(addresses)]``."""
    replies: list[Reply] = []
    stopping = False

    async def client(i: int) -> None:
        address = addresses[i % len(addresses)]
        await asyncio.sleep(load.spread * i / load.level)
        connection: Connection | None = None
        try:
            while not stopping:
                if connection is None or connection.closed:
                    try:
                        connection = await Connection.open(address.host, address.port)
                    except OSError as exc:
                        replies.append(Reply(time.monotonic(), error=f"connect: {exc}"))
                        await asyncio.sleep(_RETRY_SECONDS)
                        continue
                reply = await connection.post(address.request, load.stream)
                if reply.error is None and reply.status != 200:
                    reply.error = f"HTTP {reply.status}"
                replies.append(reply)
        finally:
            if connection is not None:
                connection.close()

    clients = [asyncio.create_task(client(i)) for i in range(load.level)]
    await asyncio.sleep(load.warmup)
    snapshot()
    t0 = time.monotonic()
    await asyncio.sleep(load.seconds)
    t1 = time.monotonic()
    snapshot()
    stopping = True
    _, running = await asyncio.wait(clients, timeout=DRAIN_SECONDS)
    for task in running:
        task.cancel()
    for outcome in await asyncio.gather(*clients, return_exceptions=True):
        if isinstance(outcome, Exception):  # a client's own bug, not a failed request
            raise outcome
    return Sampled(t0, t1, replies, len(running))
