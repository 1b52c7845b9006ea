"""The own front (``front = "own"``) on raw sockets: what it serves and what it leaves to
aiohttp's server on the same connection, in order; pipelining, ``Expect: 100-continue`` and
chunked bodies; its limits (size, body time, idle, a head that trickles); its stop."""

from __future__ import annotations

import asyncio
import gc
import gzip
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import pytest

from specroute.router.serve import quiet_collector
from specroute.router.state import RouterState
from tests.emulators import running_emulator
from tests.routers import running_router

FAST = ("--time-scale", "0.01")
CHAT = json.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
).encode()
STREAM = json.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
).encode()


@asynccontextmanager
async def fronted(**settings: Any) -> AsyncIterator[tuple[str, RouterState]]:
    async with (
        running_emulator("--mode", "spec", *FAST) as spec,
        running_emulator("--mode", "base", *FAST) as base,
        running_router(spec=[spec], base=[base], crossover=4, front="own", **settings) as router,
    ):
        yield router


def post(body: bytes, path: str = "/v1/chat/completions", *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: r", "Content-Type: application/json", *extra]
    return ("\r\n".join([*head, f"Content-Length: {len(body)}"]) + "\r\n\r\n").encode() + body


GET_MODELS = b"GET /v1/models HTTP/1.1\r\nHost: r\r\n\r\n"


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    @property
    def aiohttps(self) -> bool:
        """Answered by aiohttp's server (it names itself; the own front does not)."""
        return "aiohttp" in self.headers.get("server", "")


async def answer(reader: asyncio.StreamReader) -> Answer:
    """One answer off the connection: its head, then its body by its length or its chunks."""
    line = await asyncio.wait_for(reader.readline(), 10)
    assert line.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")), line
    status = int(line.split()[1])
    headers: dict[str, str] = {}
    while (field := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = field.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    if status == 100:
        return Answer(status, headers, b"")
    if "content-length" in headers:
        return Answer(status, headers, await reader.readexactly(int(headers["content-length"])))
    body = b""
    while size := int((await reader.readline()).strip(), 16):
        body += await reader.readexactly(size)
        await reader.readexactly(2)
    await reader.readexactly(2)
    return Answer(status, headers, body)


async def connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", urlsplit(url).port)


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> float:
    """How long until the router closed the connection (its last bytes read and dropped)."""
    start = time.monotonic()
    while await asyncio.wait_for(reader.read(1 << 16), seconds):
        pass
    return time.monotonic() - start


async def test_a_connection_is_the_fronts_until_it_asks_for_what_is_aiohttps() -> None:
    async with fronted() as (url, state):
        reader, writer = await connect(url)
        writer.write(post(CHAT))
        first = await answer(reader)
        assert first.status == 200 and not first.aiohttps, first.headers
        assert json.loads(first.body)["object"] == "chat.completion"
        assert first.headers["x-specroute-backend"].startswith("spec:")
        assert len(first.headers["x-request-id"]) == 32
        writer.write(GET_MODELS)  # as the openai client does on its pool
        models = await answer(reader)
        assert models.status == 200 and models.aiohttps
        assert json.loads(models.body)["object"] == "list"
        writer.write(post(CHAT))  # the same connection, now aiohttp's
        again = await answer(reader)
        assert again.status == 200 and again.aiohttps
        assert json.loads(again.body)["object"] == "chat.completion"
        writer.write(b"GET /router/status HTTP/1.1\r\nHost: r\r\n\r\n")
        assert json.loads((await answer(reader)).body)["front"] == "own"
        writer.close()
        assert state.inflight() == 0


async def test_a_request_leaves_nothing_of_the_routers_for_the_cyclic_collector() -> None:
    """Whole and streamed answers on one kept-alive connection: no object of the router's
    made for a request is left in a reference cycle. Such garbage waits for the cyclic
    collector, whose pauses (milliseconds, about every second under load) were the tail
    of the first chunks."""
    async with fronted() as (url, _):
        reader, writer = await connect(url)
        writer.write(post(CHAT))  # the connection's and the pool's own objects made first
        assert (await answer(reader)).status == 200
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(10):
                for body in (CHAT, STREAM):
                    writer.write(post(body))
                    assert (await answer(reader)).status == 200
            gc.collect()
            left = [o for o in gc.garbage if type(o).__module__.startswith("specroute.router")]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        writer.close()
    assert not left, Counter(type(o).__qualname__ for o in left)


async def test_streams_on_many_connections_wake_no_collector_once_it_is_quieted() -> None:
    """A hundred streams on eight connections at once, with the collector as ``serve``
    leaves it: none of them waits for a collection (at the default threshold several
    would, each walking every object in flight)."""
    started: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    thresholds = gc.get_threshold()
    async with fronted() as (url, _):
        quiet_collector()
        gc.callbacks.append(seen)
        try:

            async def streams() -> None:
                reader, writer = await connect(url)
                for _ in range(12):
                    writer.write(post(STREAM))
                    assert (await answer(reader)).status == 200
                writer.close()

            await asyncio.gather(*(streams() for _ in range(8)))
        finally:
            gc.callbacks.remove(seen)
            gc.unfreeze()
            gc.set_threshold(*thresholds)
    assert started == []


async def test_a_connection_that_starts_elsewhere_is_aiohttps_from_its_first_byte() -> None:
    async with fronted() as (url, _):
        reader, writer = await connect(url)
        writer.write(b"GET /health HTTP/1.1\r\nHost: r\r\n\r\n" + post(CHAT))
        health, completion = await answer(reader), await answer(reader)
        assert health.status == 200 and health.aiohttps
        assert completion.status == 200 and completion.aiohttps
        writer.close()


async def test_pipelined_requests_are_answered_in_the_order_they_came() -> None:
    async with fronted() as (url, state):
        reader, writer = await connect(url)
        writer.write(post(STREAM) + post(CHAT) + GET_MODELS + post(b"{nope"))
        stream, whole, models, bad = [await answer(reader) for _ in range(4)]
        assert stream.status == 200 and stream.headers["content-type"] == "text/event-stream"
        assert stream.headers["transfer-encoding"] == "chunked"
        assert stream.body.endswith(b"data: [DONE]\n\n") and not stream.aiohttps
        assert whole.status == 200 and json.loads(whole.body)["object"] == "chat.completion"
        assert models.status == 200 and models.aiohttps
        assert bad.status == 400 and "not valid JSON" in json.loads(bad.body)["error"]["message"]
        writer.close()
        assert state.inflight() == 0


async def test_a_body_sent_after_100_continue_in_chunks() -> None:
    async with fronted() as (url, _):
        reader, writer = await connect(url)
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
            "Expect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        writer.write(head.encode())
        assert (await answer(reader)).status == 100  # the key is good: the body may come
        for part in (CHAT[:10], CHAT[10:]):
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await asyncio.sleep(0.05)
        writer.write(b"0\r\n\r\n")
        done = await answer(reader)
        assert done.status == 200 and not done.aiohttps
        assert json.loads(done.body)["object"] == "chat.completion"
        writer.close()


async def test_a_compressed_body_is_read_by_aiohttp_as_before() -> None:
    async with fronted() as (url, _):
        reader, writer = await connect(url)
        writer.write(post(gzip.compress(CHAT), "/v1/chat/completions", "Content-Encoding: gzip"))
        done = await answer(reader)
        assert done.status == 200 and done.aiohttps
        writer.close()


async def test_a_key_is_asked_before_any_body_is_waited_for() -> None:
    async with fronted(api_keys=["k3y"]) as (url, _):
        reader, writer = await connect(url)
        writer.write(post(CHAT)[:-5])  # the body not whole: it is not waited for
        refused = await answer(reader)
        assert refused.status == 401 and refused.headers["connection"] == "close"
        assert json.loads(refused.body)["error"]["type"] == "authentication_error"
        assert await closed_within(reader, 3) < 3
        reader, writer = await connect(url)
        writer.write(post(CHAT, "/v1/chat/completions", "Authorization: Bearer k3y"))
        assert (await answer(reader)).status == 200
        writer.close()


@pytest.mark.parametrize("declared", [True, False])
async def test_a_body_past_the_limit_is_413_and_the_connection_ends(declared: bool) -> None:
    async with fronted(max_body_bytes=1024) as (url, state):
        reader, writer = await connect(url)
        body = b'{"pad": "' + b"x" * 2000 + b'"}'
        if declared:
            writer.write(post(body))
        else:  # chunked: found as it comes
            head = post(b"").split(b"Content-Length")[0] + b"Transfer-Encoding: chunked\r\n\r\n"
            writer.write(head + b"%x\r\n%s\r\n" % (len(body), body))
        refused = await answer(reader)
        assert refused.status == 413
        assert "larger than the limit" in json.loads(refused.body)["error"]["message"]
        assert await closed_within(reader, 3) < 3
        assert state.inflight() == 0


async def test_a_slow_body_is_408_and_a_silent_connection_is_closed() -> None:
    async with fronted(body_timeout=0.3, client_idle_timeout=0.6) as (url, _):
        reader, writer = await connect(url)
        writer.write(post(CHAT)[:-20])
        start = time.monotonic()
        late = await answer(reader)
        assert late.status == 408 and time.monotonic() - start < 3
        assert await closed_within(reader, 3) < 3
        reader, writer = await connect(url)  # says nothing at all
        assert 0.3 < await closed_within(reader, 5) < 4
        reader, writer = await connect(url)  # a head that trickles in is no reprieve
        start = time.monotonic()
        with pytest.raises(ConnectionError):
            await trickle(writer, [b"POST /v1/chat/completions HTTP/1.1\r\n", *[b"X: y\r\n"] * 40])
        assert time.monotonic() - start < 3


async def trickle(writer: asyncio.StreamWriter, lines: list[bytes]) -> None:
    """``lines`` a tenth of a second apart (4 s for 40): a connection closed first raises."""
    for line in lines:
        writer.write(line)
        await writer.drain()
        await asyncio.sleep(0.1)


async def test_the_router_stops_with_its_connections_open() -> None:
    async with fronted() as (url, _):
        idle_reader, idle_writer = await connect(url)
        idle_writer.write(post(CHAT))
        assert (await answer(idle_reader)).status == 200  # kept alive, then idle
        start = time.monotonic()
    assert time.monotonic() - start < 3
    assert await closed_within(idle_reader, 3) < 3


@pytest.mark.parametrize(
    "request_bytes",
    [
        post(CHAT, "/v1/chat/completions?trace=1"),  # a query string
        post(CHAT).replace(b"HTTP/1.1", b"HTTP/1.0", 1),
    ],
    ids=["query", "http1.0"],
)
async def test_what_the_front_does_not_serve_is_aiohttps(request_bytes: bytes) -> None:
    async with fronted() as (url, _):
        reader, writer = await connect(url)
        writer.write(request_bytes)
        done = await answer(reader)
        assert done.status == 200 and done.aiohttps
        writer.close()


async def test_a_head_that_does_not_parse_is_a_400_that_quotes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with fronted() as (url, _):
        reader, writer = await connect(url)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nBad Header sk-s3cret\r\n\r\n")
        refused = await answer(reader)
        assert refused.status == 400 and b"s3cret" not in refused.body
        assert json.loads(refused.body)["error"]["code"] == 400
        assert await closed_within(reader, 3) < 3
    assert "Error handling request" in caplog.text and "s3cret" not in caplog.text
