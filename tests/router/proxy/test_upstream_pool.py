"""The request path's own HTTP/1.1 client (``router/upstream/pool.py``) against scripted
backends on raw sockets: connections kept and reused, closed before the backend's
keep-alive runs out, answers of every framing relayed whole, broken ones told apart, a
slow reader holding the backend back, and no header line smuggled into a request."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

import aiohttp
import openai
import pytest

from specroute.router.upstream import answer as upstream_answer
from specroute.router.upstream import pool as upstream_pool
from specroute.router.upstream.pool import Limits, UpstreamPool
from tests.apps import listening
from tests.emulator.test_emulator_api import CHAT, client
from tests.emulators import FAST, running_emulator
from tests.router.proxy.test_router import settled
from tests.router.test_router_ops import samples
from tests.routers import running_router
from tests.wire import posted_request

_BODY = b'{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}'
_EVENT = b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
_LIMITS = Limits(connect=2.0, silence=None, total=5.0)

Answerer = Callable[[bytes], list[bytes]]  # a request's body -> what to write, in pieces


def _framed(body: bytes, content_type: bytes = b"application/json") -> list[bytes]:
    return [
        b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
        % (content_type, len(body), body)
    ]


@dataclass
class Scripted:
    """A backend on a raw socket that keeps its connections open between answers. Health
    checks and polls get an empty 200; each POST what ``answer`` says, written piece by piece. ``closing``:
    it closes the connection after each answer (while its head says keep-alive)."""

    answer: Answerer = lambda body: _framed(_BODY)
    closing: bool = False
    connections: int = 0  # that carried a POST
    open: int = 0
    heads: list[bytes] = field(default_factory=list)

    def serving(self) -> AbstractAsyncContextManager[str]:
        return listening(self._serve)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        posted = False
        self.open += 1
        try:
            while True:
                head, body = await posted_request(reader, writer)
                self.heads.append(head)
                self.connections += not posted
                posted = True
                for piece in self.answer(body):
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0)
                if self.closing:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the router closed it
        finally:
            self.open -= 1
            writer.close()


async def test_one_connection_carries_every_request_in_turn() -> None:
    """Twenty requests one after another, whole and streamed, through the router with the
    openai client: one connection to the backend carries them all."""

    def answer(body: bytes) -> list[bytes]:
        if b'"stream":true' not in body.replace(b" ", b""):
            return _framed(_BODY)
        chunked = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in (_EVENT, b"data: [DONE]\n\n"))
        return [
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n",
            chunked + b"0\r\n\r\n",
        ]

    backend = Scripted(answer)
    async with (
        backend.serving() as url,
        running_router(spec=[url], base=[url], policy="always-spec") as (router, state),
    ):
        api = client(router)
        for _ in range(10):
            whole = await api.chat.completions.create(model="m", messages=CHAT)
            assert whole.choices[0].message.content == "hello"
            stream = await api.chat.completions.create(model="m", messages=CHAT, stream=True)
            assert [c.choices[0].delta.content async for c in stream] == ["hi"]
        await settled(state)
        assert state.relaying.pool is not None and state.relaying.pool.idle() == 1
    assert backend.connections == 1 and len(backend.heads) == 20


async def test_an_idle_connection_is_closed_before_the_backends_keep_alive_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After an answer, the connection stays open for the next request, then the router
    closes it once idle for ``KEEPALIVE`` (SGLang's uvicorn would at 5 s), with no request
    to wake it."""
    monkeypatch.setattr(upstream_pool, "KEEPALIVE", 0.3)
    backend = Scripted()
    async with (
        backend.serving() as url,
        running_router(spec=[url], base=[url], policy="always-spec", health_interval=60) as (
            router,
            state,
        ),
    ):
        await client(router).chat.completions.create(model="m", messages=CHAT)
        await settled(state)
        assert state.relaying.pool is not None and state.relaying.pool.idle() == 1
        held = backend.open
        await asyncio.sleep(0.8)
        assert state.relaying.pool.idle() == 0
        assert backend.open == held - 1  # the backend saw it closed


async def test_a_connection_the_backend_closed_is_not_sent_on_again() -> None:
    """A backend that says keep-alive but closes each connection after its answer: every
    request gets a fresh connection, none fails."""
    backend = Scripted(closing=True)
    async with (
        backend.serving() as url,
        running_router(spec=[url], base=[url], policy="always-spec") as (router, state),
    ):
        api = client(router)
        for _ in range(8):
            await api.chat.completions.create(model="m", messages=CHAT)
            await asyncio.sleep(0.02)  # the close arrives before the next request
        await settled(state)
    assert len(backend.heads) == 8 and backend.connections >= 8


async def test_a_body_that_ends_with_its_connection_is_relayed_whole() -> None:
    """No length and no chunks: the body is what comes until the backend closes."""
    backend = Scripted(
        lambda body: [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n", _BODY],
        closing=True,
    )
    async with (
        backend.serving() as url,
        running_router(spec=[url], base=[url], policy="always-spec") as (router, _),
    ):
        answer = await client(router).chat.completions.create(model="m", messages=CHAT)
    assert answer.usage is not None and answer.usage.completion_tokens == 1


async def test_an_answer_that_is_not_http_is_retried_on_the_other_pool() -> None:
    """What is not an HTTP answer reached no client: the request is served by the other
    pool, and the malformed answer is counted as the backend's failure."""
    broken = Scripted(lambda body: [b"SPDY/9 what\r\n\r\n"], closing=True)
    async with (
        broken.serving() as spec,
        running_emulator("--mode", "base", *FAST) as base,
        running_router(spec=[spec], base=[base], policy="always-spec") as (router, state),
    ):
        answer = await client(router).chat.completions.create(model="m", messages=CHAT)
        assert answer.choices[0].message.content
        assert [d["reason"] for d in state.decisions.recent][-1] == "retry"
        async with aiohttp.ClientSession() as s, s.get(f"{router}/metrics") as r:
            text = await r.text()
    spec_name = state.roster.backends[0].name
    assert samples(text, "specroute_upstream_errors_total") == {
        (("backend", spec_name), ("kind", "midstream")): 1
    }


async def test_a_chunked_stream_cut_short_ends_with_an_error_event() -> None:
    """The backend sends one event of a chunked stream, then closes without its last chunk:
    the client gets the event, then an error event saying the answer is incomplete."""
    backend = Scripted(
        lambda body: [
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n",
            b"%x\r\n%s\r\n" % (len(_EVENT), _EVENT),
        ],
        closing=True,
    )
    async with (
        backend.serving() as url,
        running_router(spec=[url], base=[url], policy="always-spec") as (router, state),
    ):
        stream = await client(router).chat.completions.create(model="m", messages=CHAT, stream=True)
        got: list[str | None] = []

        async def read() -> None:
            async for chunk in stream:
                got.append(chunk.choices[0].delta.content)

        with pytest.raises(openai.APIError, match="failed mid-stream"):
            await read()
        await settled(state)
    assert got == ["hi"]


async def test_a_reader_that_stops_stops_the_socket_being_read() -> None:
    """An answer nobody reads: the pool stops reading its socket once a few hundred KiB
    wait, so the backend is held back instead of the router's memory filling."""
    sent = [0]

    async def firehose(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        try:
            while sent[0] < 64 * 2**20:
                writer.write(_EVENT * 64)
                sent[0] += len(_EVENT) * 64
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(firehose, "127.0.0.1", 0)
    pool = UpstreamPool({})
    async with server:
        port = server.sockets[0].getsockname()[1]
        answer = await pool.send(f"http://127.0.0.1:{port}", "/v1/completions", b"{}", {}, _LIMITS)
        await answer.head()
        await asyncio.sleep(1.0)
        held, at_pause = answer.received, sent[0]
        assert held < 2 * upstream_answer._PAUSE_AT
        assert at_pause < 16 * 2**20  # the kernel's buffers, then the backend waits
        read = len(await answer.chunk())  # reading again: the socket is read again
        await asyncio.sleep(0.3)
        assert read == held and answer.received > held
        answer.close()
    pool.close()


async def test_a_direct_reader_is_given_each_read_and_what_it_refuses_comes_in_order() -> None:
    """A stream's events a few milliseconds apart, read with a ``direct`` taker that
    refuses the second offer: every other offer is taken in the socket's callback and not
    returned, the refused bytes come back from ``chunk`` before any later ones, and the
    end of the answer still wakes the reader."""
    events = [_EVENT.replace(b"hi", b"e%d" % i) for i in range(6)]

    async def paced(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
        writer.write(b"Transfer-Encoding: chunked\r\n\r\n")
        for event in events:
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(0.02)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()  # until the pool closes the connection
        writer.close()

    seen: list[tuple[str, bytes]] = []
    offers = [0]

    def direct(data: bytes) -> bool:
        offers[0] += 1
        if offers[0] == 2:
            return False
        seen.append(("taken", data))
        return True

    pool = UpstreamPool({})
    async with listening(paced) as url:
        answer = await pool.send(url, "/v1/completions", b"{}", {}, _LIMITS)
        await answer.head()
        while chunk := await answer.chunk(direct):
            seen.append(("read", chunk))
        answer.release()
        assert answer.complete and pool.idle() == 1  # read to its end: the connection kept
        pool.close()
    assert b"".join(data for _, data in seen) == b"".join(events)
    hows = [how for how, _ in seen]
    refused = hows.index("taken") + 1  # the offer after the first taken
    assert hows[refused] == "read" and hows.count("taken") >= 3


async def test_a_client_that_reads_nothing_holds_the_backend_back_through_the_router() -> None:
    """A stream whose backend sends an event a write as fast as it can, to a client that
    reads nothing for a second: the router stops reading the backend once its client is
    behind (it does not buffer the stream), and the stream flows again once the client
    reads."""
    sent = [0]
    event = _EVENT.replace(b"hi", b"x" * 4000)

    async def firehose(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"POST"):  # health checks and polls
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            writer.close()
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        try:
            while sent[0] < 512 * 2**20:  # an event a write, as an engine sends them
                writer.write(event)
                sent[0] += len(event)
                await writer.drain()
                await asyncio.sleep(0)  # the router's turn: each read an event or two, whole
        except ConnectionError:
            pass
        finally:
            writer.close()

    async with (
        listening(firehose) as url,
        running_router(spec=[url], base=[url], policy="always-spec") as (router, _),
    ):
        host, port = router.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}'
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json"
            b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        await asyncio.sleep(1.0)
        held = sent[0]
        assert held < 64 * 2**20  # the sockets' buffers on both sides, then the backend waits
        await reader.readuntil(b"\r\n\r\n")
        read = 0
        while read < held + 8 * 2**20:  # past what was sent while the client read nothing
            data = await reader.read(2**20)
            assert data
            read += len(data)
        assert sent[0] > held
        writer.close()


async def test_no_header_line_is_smuggled_into_a_request() -> None:
    """A header value holding a line break is left out of the request: it cannot end the
    head early and start another request on the same connection."""
    backend = Scripted()
    pool = UpstreamPool({"Authorization": "Bearer k"})
    async with backend.serving() as url:
        smuggled = {"User-Agent": "x\r\nContent-Length: 0\r\n\r\nGET /admin HTTP/1.1", "X-Ok": "1"}
        answer = await pool.send(url, "/v1/completions", b"{}", smuggled, _LIMITS)
        await answer.head()
        assert await answer.read() == _BODY
        answer.release()
    pool.close()
    (head,) = backend.heads
    assert b"GET /admin" not in head and b"User-Agent" not in head
    assert b"X-Ok: 1\r\n" in head and b"Authorization: Bearer k\r\n" in head


async def test_a_whole_answer_past_its_deadline_fails_with_a_timeout() -> None:
    """A backend that sends its head and then nothing: the whole answer's deadline ends
    it, as a timeout (not a broken answer), and its connection is not kept."""
    backend = Scripted(lambda body: [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"])
    pool = UpstreamPool({})
    async with backend.serving() as url:
        answer = await pool.send(url, "/v1/completions", b"{}", {}, Limits(2.0, None, 0.3))
        await answer.head()
        with pytest.raises(TimeoutError):
            await answer.read()
        answer.release()
        assert pool.idle() == 0
    pool.close()


async def test_no_connection_opens_raises_a_connection_error() -> None:
    """Nothing listens: the error is aiohttp's connection error, which the router retries
    elsewhere (``Outcome.CONNECT``)."""
    pool = UpstreamPool({})
    with pytest.raises(aiohttp.ClientConnectionError, match="Cannot connect"):
        await pool.send("http://127.0.0.1:9", "/generate", b"{}", {}, _LIMITS)
    pool.close()
