"""The router's HTTP/1.1 held to the letter on raw sockets, both fronts side by side where
both serve the case: a backend's interim answer, or bytes past an answer's end, never reach
another client; a client is read no further than its bounds; a stream cut short ends whole;
Upgrade, CONNECT, 204 and 304, malformed chunked bodies, an oversized body, Host, and a parse
error behind valid pipelined requests are each answered as HTTP asks, at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import subprocess
import time
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import openai
import pytest

from specroute.router.proxy.stream_usage import asked_for
from tests.apps import listening
from tests.emulator.test_emulator_api import client
from tests.router.proxy.test_router import settled
from tests.router.test_router_ops import samples
from tests.routers import running_router
from tests.wire import Backend, Client, Script, chat, completion, event, post, routed, whole

FRONTS = pytest.mark.parametrize("front", ["own", "aiohttp"])


async def metric(router: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    async with aiohttp.ClientSession() as s, s.get(f"{router}/metrics") as r:
        return samples(await r.text(), name)


def dropped(found: dict[tuple[tuple[str, str], ...], float], reason: str) -> float:
    return sum(v for labels, v in found.items() if ("reason", reason) in labels)


# 1. An interim answer is read and dropped


@FRONTS
async def test_an_interim_answer_is_dropped_and_the_answer_reaches_its_own_client(
    front: str,
) -> None:
    """A backend sends 103 Early Hints (and 100 Continue), then its 200 300 ms later, while
    a second client's request waits: each client gets its own completion, and the 1xx reach
    none of them."""

    def script(marker: str) -> Script:
        if marker == "A":
            return [
                b"HTTP/1.1 100 Continue\r\n\r\n",
                b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n",
                0.3,
                whole(completion("cmpl-A")),
            ]
        return [whole(completion("cmpl-B"))]

    backend = Backend(script)
    async with routed(backend, front) as (router, _, state):
        api = client(router)
        first = asyncio.create_task(api.chat.completions.create(model="m", messages=_said("A")))
        await asyncio.sleep(0.1)  # A's 1xx came; its 200 has not
        second = await api.chat.completions.create(model="m", messages=_said("B"))
        assert (await first).id == "cmpl-A"
        assert second.id == "cmpl-B"
        await settled(state)
        found = await metric(router, "specroute_upstream_dropped_total")
    assert dropped(found, "interim") == 2


@FRONTS
async def test_a_101_is_a_broken_answer_served_by_the_other_pool(front: str) -> None:
    """A backend that switches protocols unasked: nothing of it reaches the client, which is
    served by the other pool."""
    switching = Backend(lambda m: [b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n"])
    good = Backend()
    async with (
        switching.serving() as spec,
        good.serving() as base,
        running_router(spec=[spec], base=[base], policy="always-spec", front=front) as (
            router,
            state,
        ),
    ):
        answer = await client(router).chat.completions.create(model="m", messages=_said("C"))
        assert answer.id == "C"
        await settled(state)
        found = await metric(router, "specroute_upstream_dropped_total")
    assert dropped(found, "switched_protocols") == 1
    assert good.bodies and switching.bodies


# 2. Bytes past an answer's end close its connection


@FRONTS
@pytest.mark.parametrize("late", [False, True], ids=["same-read", "later-read"])
async def test_bytes_past_an_answers_end_are_dropped_with_their_connection(
    front: str, late: bool
) -> None:
    """A backend writes another whole answer behind its first, in the same write or a
    moment later: the client gets the first as its length frames it, and the connection is
    closed, never pooled; the next request opens another and gets its own answer."""
    junk = whole(b'{"id":"cmpl-junk"}' + b" " * 300)

    def script(marker: str) -> Script:
        answer = whole(completion(marker))
        if marker != "A":
            return [answer]
        return [answer, 0.05, junk] if late else [answer + junk]

    backend = Backend(script)
    async with routed(backend, front) as (router, _, state):
        api = client(router)
        raw = await api.chat.completions.with_raw_response.create(model="m", messages=_said("A"))
        assert raw.http_response.content == completion("A")
        await asyncio.sleep(0.1)
        for marker in ("B", "C"):
            answer = await api.chat.completions.create(model="m", messages=_said(marker))
            assert answer.id == marker
        await settled(state)
        found = await metric(router, "specroute_upstream_dropped_total")
    assert backend.connections == 2  # A's was closed; B and C share the next
    assert dropped(found, "unasked" if late else "trailing_bytes") == 1


@FRONTS
async def test_a_head_past_its_limit_is_a_broken_answer(front: str) -> None:
    """A backend whose answer's head runs past ``max_upstream_head_bytes``: the client gets
    a 502 that says so, and the router read no more of it than its limit and one read."""
    huge = b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 3_000_000 + b"\r\nContent-Length: 2\r\n\r\n{}"
    backend = Backend(lambda marker: [huge])
    async with routed(backend, front, max_upstream_head_bytes=16_384) as (router, _, state):
        with pytest.raises(openai.APIStatusError) as raised:
            await client(router).chat.completions.create(model="m", messages=_said("H"))
        assert raised.value.status_code == 502
        assert "head is longer than 16384 bytes" in raised.value.message
        await settled(state)
        found = await metric(router, "specroute_upstream_dropped_total")
    assert dropped(found, "head_too_large") == 2  # one a pool: the request was retried once


# 3. A client is read no further than its bounds


@pytest.mark.parametrize(
    ("count", "size", "limit"),
    [(150, 200_000, "pipelined_bytes"), (300, 0, "pipelined_requests")],
    ids=["bytes", "requests"],
)
async def test_requests_sent_ahead_of_their_answers_are_read_only_to_the_bounds(
    count: int, size: int, limit: str
) -> None:
    """Behind a stream the client does not read yet, it sends many requests at once (30 MB,
    or 300 small ones): the router stops reading the connection at its bounds, and once the
    stream ends, answers every one of them, in order, as it reads them."""

    def script(marker: str) -> Script:
        if marker == "slow":
            events: list[bytes | float] = [event("slow"), 0.5, event("slow"), 0.5]
            events.append(b"data: [DONE]\n\n")
            framed: Script = [
                p if isinstance(p, float) else b"%x\r\n%s\r\n" % (len(p), p) for p in events
            ]
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            return [head + b"Transfer-Encoding: chunked\r\n\r\n", *framed, b"0\r\n\r\n"]
        return [whole(completion(marker))]

    backend = Backend(script)
    async with routed(backend, "own") as (router, port, state):
        wire = await asyncio.to_thread(Client, port)
        wire.sock.setblocking(False)
        requests = post(chat("slow", stream=True)) + b"".join(
            post(chat(f"r{i}", size=size)) for i in range(count)
        )
        written = 0
        loop = asyncio.get_running_loop()
        start = time.monotonic()
        while time.monotonic() - start < 1.0:  # the router reads meanwhile, what it will
            with contextlib.suppress(BlockingIOError):
                written += wire.sock.send(requests[written : written + (1 << 16)])
            await asyncio.sleep(0.001)
        # nothing else while it streams (sent with its usage asked for: ``stream_usage``)
        slow = chat("slow", stream=True)
        asked = asked_for("/v1/chat/completions", slow, json.loads(slow))
        assert asked is not None and backend.bodies == [asked.raw]
        if size:
            assert written < len(requests) / 2, written  # held back: not read by the router
        wire.sock.setblocking(True)
        rest = loop.run_in_executor(None, wire.sock.sendall, requests[written:])
        stream = await asyncio.to_thread(wire.answer)
        assert stream.body.count(b"data: ") == 3
        for i in range(count):
            answer = await asyncio.to_thread(wire.answer)
            assert answer.json()["id"] == f"r{i}"
        await rest
        wire.sock.close()
        await settled(state)
        found = await metric(router, "specroute_client_limits_total")
    assert len(backend.bodies) == count + 1
    assert found[(("limit", limit),)] >= 1


@FRONTS
async def test_a_client_that_reads_nothing_is_cut_off_and_its_request_aborted(front: str) -> None:
    """A stream far larger than the sockets' buffers, to a client that never reads: past
    ``client_write_timeout`` it is cut off, its request ends as cancelled, and the backend's
    connection is closed (its work aborted)."""
    sent = [0]
    aborted = asyncio.Event()

    async def firehose(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if head.startswith(b"GET"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            return
        length = int(head.lower().partition(b"content-length:")[2].split(b"\r\n")[0])
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        chunk = event("x" * 4000)
        try:
            while True:
                writer.write(chunk)
                await writer.drain()
                sent[0] += len(chunk)
        except ConnectionError:
            aborted.set()

    async with (
        listening(firehose) as url,
        running_router(
            spec=[url], base=[url], policy="always-spec", front=front, client_write_timeout=0.5
        ) as (router, state),
    ):
        port = urlsplit(router).port
        assert port is not None
        wire = await asyncio.to_thread(Client, port)
        wire.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        wire.send(post(chat("s", stream=True)))
        await asyncio.wait_for(aborted.wait(), 10)
        await settled(state)
        assert state.inflight() == 0
        found = await metric(router, "specroute_client_limits_total")
        requests = await metric(router, "specroute_requests_total")
        wire.sock.close()
    assert found[(("limit", "write_timeout"),)] == 1
    assert sum(v for k, v in requests.items() if ("status", "cancelled") in k) == 1
    assert sent[0] < 50_000_000


# 4. A stream that has a length, cut short, ends whole


@FRONTS
async def test_a_stream_with_a_length_cut_short_ends_with_an_error_event_and_the_next_answer(
    front: str,
) -> None:
    """An event stream announced with a Content-Length, cut short: it goes to the client
    chunked, so the error event follows the events whole and the answer ends; the connection
    then carries the next request."""

    def script(marker: str) -> Script:
        if marker == "cut":
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 5000\r\n"
            return [head + b"\r\n" + event("cut"), 0.05, None]
        return [whole(completion(marker))]

    backend = Backend(script)
    async with routed(backend, front) as (router, port, state):
        with Client(port) as wire:
            await asyncio.to_thread(wire.send, post(chat("cut", stream=True)))
            stream = await asyncio.to_thread(wire.answer)
            assert stream.headers.get("transfer-encoding") == "chunked"
            assert b"failed mid-stream" in stream.body and stream.body.endswith(b"[DONE]\n\n")
            await asyncio.to_thread(wire.send, post(chat("next")))
            after = await asyncio.to_thread(wire.answer)
            assert after.json()["id"] == "next"
        stream_api = await client(router).chat.completions.create(
            model="m", messages=_said("cut"), stream=True
        )
        with pytest.raises(openai.APIError, match="failed mid-stream"):
            async for _ in stream_api:
                pass
        await settled(state)


# 5. Upgrade is ignored; CONNECT is refused


UPGRADE = (
    "Connection: Upgrade, HTTP2-Settings",
    "Upgrade: h2c",
    "HTTP2-Settings: AAMAAABkAAQCAAAA",
)


@FRONTS
async def test_an_upgrade_is_ignored_and_the_requests_around_it_are_served(front: str) -> None:
    """A POST that asks to upgrade to h2c (as ``curl --http2`` sends one) between two plain
    ones, all in one write: each answered, in order, on HTTP/1.1. aiohttp's server takes
    what follows an upgrade as the new protocol's: the one after it is the own front's."""
    backend = Backend()
    async with routed(backend, front) as (_, port, state):
        upgrade = post(chat("up"), "/v1/chat/completions", *UPGRADE)
        with Client(port) as wire:
            sent = post(chat("before")) + upgrade + post(chat("after"))
            await asyncio.to_thread(
                wire.send, sent if front == "own" else sent[: -len(post(chat("after")))]
            )
            answers = [
                await asyncio.to_thread(wire.answer) for _ in range(3 if front == "own" else 2)
            ]
        assert [a.status for a in answers] == [200] * len(answers)
        assert [a.json()["id"] for a in answers] == ["before", "up", "after"][: len(answers)]
        await settled(state)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@FRONTS
async def test_curl_http2_gets_its_answer(front: str) -> None:
    backend = Backend()
    async with routed(backend, front) as (router, _, state):
        done = await asyncio.to_thread(
            subprocess.run,
            ["curl", "-sS", "--http2", f"{router}/v1/chat/completions", "-H",
             "Content-Type: application/json", "-d", chat("curl").decode()],
            capture_output=True,
            timeout=20,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["id"] == "curl"
        await settled(state)


@FRONTS
async def test_connect_is_refused_after_the_requests_before_it(front: str) -> None:
    """The router is no tunnel: a CONNECT is refused in its turn. The own front reads nothing
    after it (a client may send its tunnel's bytes at once) and ends the connection; aiohttp's
    server reads on, and would refuse those bytes as a request."""
    backend = Backend()
    async with routed(backend, front) as (_, port, state):
        with Client(port) as wire:
            tunnel = b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"
            await asyncio.to_thread(wire.send, post(chat("before")) + tunnel)
            first = await asyncio.to_thread(wire.answer)
            refused = await asyncio.to_thread(wire.answer)
            assert first.json()["id"] == "before"
            assert refused.status in (400, 404, 405), refused
            assert "error" in refused.json()
            if front == "own":
                await asyncio.to_thread(wire.send, b"\x16\x03\x01")
                assert await asyncio.to_thread(wire.closed)
        assert backend.bodies == [chat("before")]
        await settled(state)


# 6. 204 and 304 carry no body and no framing


@FRONTS
@pytest.mark.parametrize("status", [b"204 No Content", b"304 Not Modified"])
async def test_an_answer_without_a_body_is_relayed_without_framing(
    front: str, status: bytes
) -> None:
    def script(marker: str) -> Script:
        if marker == "empty":
            return [b"HTTP/1.1 %s\r\nContent-Type: application/json\r\n\r\n" % status]
        return [whole(completion(marker))]

    backend = Backend(script)
    async with routed(backend, front) as (_, port, state):
        with Client(port) as wire:
            await asyncio.to_thread(wire.send, post(chat("empty")))
            empty = await asyncio.to_thread(wire.answer)
            assert empty.status == int(status[:3]) and empty.body == b""
            assert "transfer-encoding" not in empty.headers
            await asyncio.to_thread(wire.send, post(chat("next")))
            after = await asyncio.to_thread(wire.answer)  # h11 reads it: nothing was left over
            assert after.json()["id"] == "next"
        await settled(state)


# 7. A malformed chunked body is 400 at once


MALFORMED_CHUNKED = {
    "size-then-space": b"5 \r\nhello\r\n0\r\n\r\n",
    "space-then-size": b" 5\r\nhello\r\n0\r\n\r\n",
    "garbage": b"zz\r\nhello\r\n0\r\n\r\n",
    "sign": b"+5\r\nhello\r\n0\r\n\r\n",
    "hex-prefix": b"0x5\r\nhello\r\n0\r\n\r\n",
    "overflow": b"fffffffffffffffffffff\r\nhello\r\n0\r\n\r\n",
    "no-crlf-after-data": b"5\r\nhelloXX0\r\n\r\n",
}


@FRONTS
@pytest.mark.parametrize("case", [*MALFORMED_CHUNKED, "xchunked"])
async def test_a_malformed_chunked_body_is_refused_at_once(front: str, case: str) -> None:
    backend = Backend()
    async with routed(backend, front) as (_, port, state):
        coding = "xchunked" if case == "xchunked" else "chunked"
        body = MALFORMED_CHUNKED.get(case, b"5\r\nhello\r\n0\r\n\r\n")
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
            f"Transfer-Encoding: {coding}\r\n\r\n"
        ).encode()
        with Client(port) as wire:
            start = time.monotonic()
            await asyncio.to_thread(wire.send, head + body)
            answer = await asyncio.to_thread(wire.answer)
            assert answer.status == 400, answer
            assert time.monotonic() - start < 5  # not the body timeout's 60 s
            if front == "own":  # a request whose head was taken: its error names its id
                error: dict[str, str] = answer.json()["error"]  # type: ignore[assignment]
                assert error["request_id"] == answer.headers["x-request-id"], answer
            assert await asyncio.to_thread(wire.closed)
        assert backend.bodies == []
        await settled(state)


# 8. A body past its limit is 413 and ends the connection


@FRONTS
async def test_a_body_past_its_limit_is_413_and_its_connection_ends(front: str) -> None:
    backend = Backend()
    async with routed(backend, front, max_body_bytes=1 << 20) as (_, port, state):
        with Client(port) as wire:
            await asyncio.to_thread(wire.send, post(chat("big", size=(1 << 20) + 1000)))
            answer = await asyncio.to_thread(wire.answer)
            assert answer.status == 413 and answer.headers.get("connection") == "close"
            error: dict[str, str] = answer.json()["error"]  # type: ignore[assignment]
            assert "larger than the limit" in error["message"]
            # named by the request's id, in its body as in its header, as any request's error
            assert error["request_id"] == answer.headers["x-request-id"], answer
            start = time.monotonic()
            await asyncio.to_thread(wire.send, post(chat("after")))
            assert await asyncio.to_thread(wire.closed)
            assert time.monotonic() - start < 5  # not the 75 s idle timeout
        assert backend.bodies == []
        await settled(state)


# 9 and 10. A head that cannot be taken is 400 at once, after the answers before it


async def refused_after_one(port: int, bad: bytes, together: bool) -> list[Any]:
    """A good request, then ``bad``: in one write (``together``), or once the first is
    answered. The answers, then whether the connection ended."""
    with Client(port) as wire:
        good = post(chat("first"))
        if together:
            await asyncio.to_thread(wire.send, good + bad)
            answers = [await asyncio.to_thread(wire.answer)]
        else:
            await asyncio.to_thread(wire.send, good)
            answers = [await asyncio.to_thread(wire.answer)]
            await asyncio.to_thread(wire.send, bad)
        with contextlib.suppress(EOFError):
            answers.append(await asyncio.to_thread(wire.answer))
        return [*answers, await asyncio.to_thread(wire.closed)]


def hostless(hosts: tuple[str, ...]) -> bytes:
    body = chat("h")
    lines = ["POST /v1/chat/completions HTTP/1.1", *hosts, "Content-Type: application/json"]
    return ("\r\n".join([*lines, f"Content-Length: {len(body)}"]) + "\r\n\r\n").encode() + body


BAD_HEADS = {
    "no-host": hostless(()),
    "two-hosts": hostless(("Host: a", "Host: b")),
    "garbage": b"GARBAGE\r\n\r\n",
    "bad-header": b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nBad Name: x\r\n\r\n",
}


@FRONTS
@pytest.mark.parametrize("bad", BAD_HEADS)
@pytest.mark.parametrize("together", [False, True], ids=["apart", "pipelined"])
async def test_a_bad_head_is_400_after_the_answers_before_it(
    front: str, bad: str, together: bool
) -> None:
    """The request before it answered, then 400, then the connection ends. aiohttp's server
    drops what it parsed in the read that holds the error (the first request is never
    answered), which the own front does not."""
    backend = Backend()
    async with routed(backend, front) as (_, port, state):
        *answers, closed = await refused_after_one(port, BAD_HEADS[bad], together)
        assert closed
        if front == "aiohttp" and together:
            assert [a.status for a in answers] == [400]
            return
        assert [a.status for a in answers] == [200, 400], answers
        assert answers[0].json()["id"] == "first"
        assert "error" in answers[1].json()
        assert backend.bodies == [chat("first")]
        await settled(state)


async def test_a_parse_error_behind_two_pipelined_requests_is_answered_after_both() -> None:
    backend = Backend()
    async with routed(backend, "own") as (_, port, state):
        with Client(port) as wire:
            sent = post(chat("one")) + post(chat("two")) + b"GARBAGE\r\n\r\n"
            await asyncio.to_thread(wire.send, sent)
            answers = [await asyncio.to_thread(wire.answer) for _ in range(3)]
            assert [a.status for a in answers] == [200, 200, 400]
            assert [a.json()["id"] for a in answers[:2]] == ["one", "two"]
            assert await asyncio.to_thread(wire.closed)
        assert backend.bodies == [chat("one"), chat("two")]
        await settled(state)


@FRONTS
async def test_an_unmet_expectation_is_an_openai_shaped_417(front: str) -> None:
    backend = Backend()
    async with routed(backend, front) as (_, port, state):
        with Client(port) as wire:
            await asyncio.to_thread(
                wire.send, post(chat("e"), "/v1/chat/completions", "Expect: foo")
            )
            answer = await asyncio.to_thread(wire.answer)
        assert answer.status == 417
        assert answer.json()["error"]["code"] == 417  # type: ignore[index]
        assert backend.bodies == []
        await settled(state)


def _said(marker: str) -> list[Any]:
    return [{"role": "user", "content": marker}]
