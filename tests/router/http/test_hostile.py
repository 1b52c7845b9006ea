"""Hostile clients: every endpoint fuzzed with what no honest client sends, clients that
send or read slowly, and keys that never show, wherever the router writes."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import os
import random
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specroute.router.app import create_app
from specroute.router.operator.openapi import document
from specroute.router.settings import RouterSettings
from specroute.router.state import RouterState
from tests.emulator.test_emulator_api import CHAT
from tests.emulators import running_emulator
from tests.router.proxy.test_router import settled
from tests.router.test_router_ops import keyed
from tests.routers import running_router

CLIENT, ADMIN, BACKEND = "cl1ent-k3y-f00", "adm1n-k3y-b4r", "b4ckend-k3y-b4z"
SMALL = ("--time-scale", "0.01", "--context-length", "64")  # no answer runs long
BODY_LIMIT = 512 * 1024  # the fuzzed router's max_body_bytes: the same code as 8 MiB, faster
EXAMPLES = int(os.environ.get("SPECROUTE_FUZZ_EXAMPLES", "1500"))  # ~17 s; more for a hunt
HEAD_LIMIT, HEADERS_LIMIT = 8190, 128  # the defaults of max_header_bytes and max_headers
NOWHERE: dict[str, Any] = {
    "spec": ["http://127.0.0.1:9"],
    "base": ["http://127.0.0.1:9"],
    "crossover": 4,
}


@asynccontextmanager
async def fronted(*flags: str, **settings: Any) -> AsyncIterator[tuple[str, RouterState]]:
    """A router in front of two small, fast emulators."""
    async with (
        running_emulator("--mode", "spec", *SMALL, *flags) as spec,
        running_emulator("--mode", "base", *SMALL, *flags) as base,
        running_router(spec=[spec], base=[base], crossover=4, **settings) as routed,
    ):
        yield routed


# A client that writes bytes, not requests


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def exchange(port: int, request: bytes, wait: float = 20.0) -> Answer | None:
    """Send ``request`` as it is and read until the router closes; None if it closed
    without a word. Blocking: the fuzzer runs in a thread beside the router's loop."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        with contextlib.suppress(ConnectionError):  # it may answer before reading it all
            sock.sendall(request)
        data = bytearray()
        with contextlib.suppress(ConnectionError):
            while chunk := sock.recv(1 << 16):
                data += chunk
    return parse(bytes(data))


def parse(data: bytes) -> Answer | None:
    if not data:
        return None
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    if headers.get("transfer-encoding") == "chunked":
        body = _dechunk(body)
    return Answer(int(status_line.split()[1]), headers, body)


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    while data:
        size, _, data = data.partition(b"\r\n")
        length = int(size.split(b";")[0] or b"0", 16)
        if length == 0:
            break
        out += data[:length]
        data = data[length + 2 :]
    return bytes(out)


def error_of(answer: Answer) -> dict[str, Any]:
    """The OpenAI-shaped error in an answer; fails the test if it is not one."""
    error = json.loads(answer.body)["error"]
    assert isinstance(error["message"], str) and isinstance(error["type"], str), answer
    assert error["code"] == answer.status or error["code"] == "model_not_found", answer
    return dict(error)


# What the fuzzer sends


# What aiohttp's parser does with a request: takes it, refuses it with a plain-text 400, or
# either (a body that does not decompress: found with the head, or after it, as it comes).
Parser = Literal["takes", "refuses", "either"]


def _short(data: bytes) -> bytes:
    return data if len(data) < 200 else data[:80] + b"...(%d bytes)" % len(data)


@dataclass(frozen=True)
class Hostile:
    method: bytes
    target: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    chunked: bool
    parser: Parser

    def __repr__(self) -> str:
        heads = [(k, _short(v)) for k, v in self.headers]
        return (
            f"Hostile({self.method!r}, {_short(self.target)!r}, {heads!r}, "
            f"{_short(self.body)!r}, chunked={self.chunked}, parser={self.parser!r})"
        )

    def wire(self) -> bytes:
        lines = [self.method + b" " + self.target + b" HTTP/1.1", b"Host: router"]
        lines += [name + b": " + value for name, value in self.headers]
        if self.chunked:
            lines.append(b"Transfer-Encoding: chunked")
            payload = b"%x\r\n%s\r\n" % (len(self.body), self.body) if self.body else b""
            payload += b"0\r\n\r\n"
        else:
            lines.append(b"Content-Length: %d" % len(self.body))
            payload = self.body
        lines.append(b"Connection: close")
        return b"\r\n".join(lines) + b"\r\n\r\n" + payload


PATHS = sorted(document()["paths"])
PROXIED = ["/v1/chat/completions", "/v1/completions", "/generate"]
ODD_PATHS = [
    "/",
    "/v1",
    "/v1/chat/completions/",
    "/V1/MODELS",
    "/router",
    "/router/profile/x",
    "/generate?stream=true",
    "/v1/models?x=%ff",
    "/%ff%fe",
    "/..%2f..%2fetc/passwd",
    "//health",
    "/health/",
    "/metrics?name[]=1",
    "/v1/completions#frag",
]
METHODS = [b"GET", b"PUT", b"DELETE", b"PATCH", b"HEAD", b"OPTIONS", b"TRACE"]
FIELDS = [
    "model",
    "messages",
    "prompt",
    "text",
    "input_ids",
    "stream",
    "max_tokens",
    "max_completion_tokens",
    "sampling_params",
    "rid",
    "stream_options",
    "ignore_eos",
    "schema",
    "crossover",
    "created",
]

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=16),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
ODD = st.sampled_from(
    [
        -1,
        0,
        1,
        2**63,
        -(2**63),
        "5",
        "",
        1.5,
        1e308,
        True,
        None,
        [],
        {},
        "\x00",
        "\ud800",
        [{"role": "user"}],
        {"max_new_tokens": "x"},
    ]
)


def _valid(path: str, tokens: int) -> dict[str, Any]:
    if path == "/router/profile":
        return {
            "schema": "specroute.profile/v1",
            "created": "2026-01-01T00:00:00+00:00",
            "crossover": {"value": tokens, "ci": [0, tokens + 1]},
        }
    if path == "/generate":
        return {"text": "hi", "sampling_params": {"max_new_tokens": tokens}}
    if path == "/v1/completions":
        return {"model": "m", "prompt": "hi", "max_tokens": tokens}
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens}


@st.composite
def bodies(draw: st.DrawFn, path: str) -> bytes:
    shape = draw(
        st.sampled_from(
            ["mutated"] * 8 + ["json", "deep", "near_limit", "digits", "literal", "bytes"]
        )
    )
    if shape == "mutated":  # the fields the router and the backend read, of any type
        body = _valid(path, draw(st.integers(0, 8)))
        body |= draw(st.dictionaries(st.sampled_from(FIELDS), JSON | ODD, max_size=3))
        for key in draw(st.sets(st.sampled_from(FIELDS), max_size=2)):
            body.pop(key, None)
        if draw(st.booleans()):
            body["stream"] = True
        return json.dumps(body).encode()
    if shape == "json":
        return json.dumps(draw(JSON)).encode()
    if shape == "deep":
        depth = draw(st.integers(1, 10_000))
        opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
        nested = opener * depth + (b"1" if opener != b"[" else b"") + closer * depth
        return b'{"messages":' + nested + b"}" if draw(st.booleans()) else nested
    if shape == "near_limit":
        size = draw(st.integers(BODY_LIMIT - 2048, BODY_LIMIT + 2048))
        start, end = b'{"max_tokens":1,"prompt":"', b'","messages":[{"role":"user","content":"x"}]}'
        return start + b"x" * (size - len(start) - len(end)) + end
    if shape == "digits":  # past Python's 4,300-digit limit for int()
        return b'{"max_tokens":' + b"9" * draw(st.integers(4000, 5000)) + b"}"
    if shape == "literal":
        return draw(
            st.sampled_from(
                [
                    b"",
                    b"null",
                    b"[]",
                    b'"text"',
                    b"1",
                    b"{",
                    b'{"a":1}trailing',
                    b"\xef\xbb\xbf{}",
                    b'{"max_tokens": NaN}',
                    b'{"max_tokens": Infinity}',
                    b'{"a": "\xff\xfe"}',
                    b"\x00" * 16,
                    '{"prompt": "hi"}'.encode("utf-16"),
                    b'{"a":1,"a":2}',
                ]
            )
        )
    return draw(st.binary(max_size=256))


AUTH = (
    [f"Bearer {CLIENT}"] * 12
    + [f"Bearer {ADMIN}"] * 4
    + [
        None,
        "Bearer wrong",
        "Basic dXNlcjpwYXNz",
        "Bearer",
        "Bearer ",
        f"bearer   {CLIENT}  ",
        f"Bearer {CLIENT} {ADMIN}",
        "Token x",
        f"Bearer {CLIENT}\xe9",
    ]
)
CONTENT_TYPES = ["application/json"] * 12 + [
    None,
    "application/json; charset=utf-8",
    "application/json; charset=utf-16",
    "application/json; charset=bogus",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=zz",
    "application/json;;; ;",
    "*/*",
    "",
    "APPLICATION/JSON",
]
NAME = st.from_regex(r"\AX-[A-Za-z0-9-]{1,12}\Z")
VALUE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40).map(str.encode)
ODD_VALUE = st.sampled_from([b"caf\xc3\xa9", b"\xff\xfe", b"\x80", b"\t tab"])  # kept by aiohttp


@st.composite
def hostile(draw: st.DrawFn) -> Hostile:
    path = draw(st.sampled_from(PROXIED) | st.sampled_from(PATHS) | st.sampled_from(ODD_PATHS))
    method = draw(st.sampled_from([b"POST"] * 14 + METHODS))
    body = draw(bodies(path.split("?")[0]))
    headers: list[tuple[bytes, bytes]] = []
    parsable, compressed = True, False

    def header(name: str, value: str | bytes | None) -> None:
        if value is not None:
            headers.append((name.encode(), value.encode() if isinstance(value, str) else value))

    header("Authorization", draw(st.sampled_from(AUTH)))
    header("Content-Type", draw(st.sampled_from(CONTENT_TYPES)))
    header("Accept-Encoding", draw(st.sampled_from([None, "gzip", "br", "identity", "*"])))
    encoding = draw(st.sampled_from([None] * 10 + ["gzip", "deflate", "identity", "x-nope", "br"]))
    header("Content-Encoding", encoding)
    if encoding == "gzip" and draw(st.booleans()):
        body, compressed = gzip.compress(body), True
    parsable &= encoding != "br"  # aiohttp's parser refuses what it cannot decode
    value = st.integers(0, 15).flatmap(lambda n: ODD_VALUE if n == 0 else VALUE)
    headers += draw(st.lists(st.tuples(NAME.map(str.encode), value), max_size=4))
    abuse = draw(st.sampled_from(["none"] * 12 + ["huge", "many", "nul", "long_path", "method"]))
    if abuse == "huge":  # around max_header_bytes, the key's header too
        name = draw(st.sampled_from(["X-Big", "Authorization"]))
        size = draw(st.integers(HEAD_LIMIT - 200, HEAD_LIMIT + 200))
        header(name, ("Bearer " + CLIENT + "k" * size)[:size] if name[0] == "A" else "v" * size)
        parsable &= size <= HEAD_LIMIT
    elif abuse == "many":  # around max_headers
        headers += [(b"X-N%d" % i, b"v") for i in range(draw(st.integers(100, 160)))]
    elif abuse == "nul":
        header(draw(st.sampled_from(["Authorization", "X-Nul"])), f"Bearer {CLIENT}\x00")
        parsable = False
    elif abuse == "long_path":
        path = "/v1/" + "a" * (draw(st.integers(HEAD_LIMIT - 100, HEAD_LIMIT + 100)) - 4)
        parsable &= len(path) <= HEAD_LIMIT
    elif abuse == "method":
        method = draw(st.sampled_from([b"FOO", b"get", b"P0ST"]))
        parsable = False
    parsable &= len(headers) + 3 <= HEADERS_LIMIT  # with Host, the length, Connection
    undecodable = encoding in ("gzip", "deflate") and body and not compressed
    parser: Parser = "either" if parsable and undecodable else "takes" if parsable else "refuses"
    return Hostile(method, path.encode(), tuple(headers), body, draw(st.booleans()), parser)


# Known bugs of the emulator, not the router's: its answer is relayed as it is. SGLang
# parses a body as UTF-8 JSON whatever charset Content-Type declares; the emulator decodes
# by the charset (emulator/errors.py, read_json) and answers 500 to one Python lacks.
EMULATOR_BUGS = ("unknown encoding",)


def judge(request: Hostile, answer: Answer | None) -> None:
    assert answer is not None, "closed without an answer"
    said = answer.body.decode(errors="replace")
    if answer.status in (400, 431) and ("head is longer" in said or "not be parsed" in said):
        assert request.parser != "takes", answer  # aiohttp's parser refused it
        error_of(answer)
        return
    if answer.status == 413 and len(request.body) > BODY_LIMIT:  # its size first, whatever
        if request.method != b"HEAD":  # else is wrong with it
            assert "larger than the limit" in error_of(answer)["message"], answer
        return
    assert request.parser != "refuses", answer
    if "x-specroute-backend" in answer.headers:  # the backend's own answer, relayed
        said = answer.body.decode(errors="replace")
        assert answer.status < 500 or any(bug in said for bug in EMULATOR_BUGS), answer
        return
    if answer.status >= 500:  # the router's: only a backend's failure, named
        assert answer.status in (502, 503, 504), answer
        assert any(pool in error_of(answer)["message"] for pool in ("spec:", "base:")), answer
    if answer.status >= 400 and request.method != b"HEAD":
        error_of(answer)


@pytest.mark.parametrize("front", ["own", "aiohttp"])
async def test_fuzzed_requests_never_get_a_500_nor_leak_a_request(
    caplog: pytest.LogCaptureFixture, front: str
) -> None:
    """Whichever serves the proxied paths: the router's own front, or aiohttp's server."""
    caplog.set_level(logging.DEBUG)
    async with fronted(
        api_keys=[CLIENT], admin_key=ADMIN, max_body_bytes=BODY_LIMIT, front=front
    ) as (url, state):
        port = urlsplit(url).port
        assert port is not None
        seen: dict[int, int] = {}

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(hostile())
        def fuzz(request: Hostile) -> None:
            answer = exchange(port, request.wire())
            judge(request, answer)
            assert answer is not None
            seen[answer.status] = seen.get(answer.status, 0) + 1

        await asyncio.to_thread(fuzz)
        await settled(state)
        assert state.inflight() == 0
        answer = await keyed(url, CLIENT).chat.completions.create(
            model="m", messages=CHAT, max_tokens=3
        )
        assert answer.choices[0].message.content
    print(f"answers by status: {dict(sorted(seen.items()))}")
    assert {200, 400, 401}.issubset(seen)  # the fuzzer got past the door too
    # the router's and its server's records; a client left over from another test may log
    # its own teardown here too, and that says nothing of the router
    broken = [
        r
        for r in caplog.records
        if r.levelno >= logging.ERROR and r.name.startswith(("specroute", "aiohttp"))
    ]
    assert not broken, [r.getMessage() for r in broken]
    assert CLIENT not in caplog.text and ADMIN not in caplog.text  # sent in bad heads too


@pytest.mark.parametrize("front", ["own", "aiohttp"])
@pytest.mark.parametrize("coding", [b"gzip", b"x-nope"])
async def test_a_compressed_body_past_the_limit_is_a_413(front: str, coding: bytes) -> None:
    """A body past the limit is refused for its size whatever its coding, on the own front
    too, where a compressed body is aiohttp's to decode (it used to be a 400 there: the
    refusal was written as a line aiohttp's parser could not read)."""
    plain = json.dumps({"model": "m", "prompt": random.randbytes(BODY_LIMIT).hex()}).encode()
    body = gzip.compress(plain) if coding == b"gzip" else plain  # past the limit either way
    heads = (
        (b"Authorization", f"Bearer {CLIENT}".encode()),
        (b"Content-Type", b"application/json"),
    )
    request = Hostile(
        b"POST", b"/v1/completions", (*heads, (b"Content-Encoding", coding)), body, False, "takes"
    )
    async with fronted(api_keys=[CLIENT], max_body_bytes=BODY_LIMIT, front=front) as (url, _):
        port = urlsplit(url).port
        assert port is not None
        answer = await asyncio.to_thread(exchange, port, request.wire())
    assert answer is not None and answer.status == 413, answer
    judge(request, answer)


# The description of the router's own endpoints


def test_the_description_names_every_route_and_what_the_router_reads() -> None:
    app = create_app(RouterSettings(**NOWHERE))
    routes = {
        (r.resource.canonical, r.method)
        for r in app.router.routes()
        if r.resource is not None and r.method != "HEAD"
    }
    doc = document()
    described = {(path, m.upper()) for path, ops in doc["paths"].items() for m in ops}
    assert described == routes
    schemas = doc["components"]["schemas"]
    for name in ("ChatCompletionRequest", "CompletionRequest", "GenerateRequest"):
        assert schemas[name]["additionalProperties"] is True  # the rest passes through
        assert {"stream", "rid"} <= set(schemas[name]["properties"])
    assert "max_completion_tokens" in schemas["ChatCompletionRequest"]["properties"]
    assert (
        "max_new_tokens"
        in schemas["GenerateRequest"]["properties"]["sampling_params"]["properties"]
    )
    assert doc["paths"]["/router/profile"]["post"]["security"] == [{"adminKey": []}]
    for path in ("/health", "/ready", "/health_generate", "/metrics", "/openapi.json"):
        assert doc["paths"][path]["get"]["security"] == []
    json.dumps(doc)  # plain JSON all through


async def test_the_description_is_served() -> None:
    async with (
        running_router(**NOWHERE) as (url, _),
        aiohttp.ClientSession() as s,
        s.get(f"{url}/openapi.json") as r,
    ):
        assert r.status == 200
        assert await r.json() == document()


async def test_the_description_needs_no_key() -> None:
    async with (
        running_router(**NOWHERE, api_keys=[CLIENT]) as (url, _),
        aiohttp.ClientSession() as s,
        s.get(f"{url}/openapi.json") as r,
    ):
        assert r.status == 200  # it reveals no state, like /health


# Clients that send slowly, or too much


async def _closed(reader: asyncio.StreamReader) -> bytes:
    """Whatever came before the router closed the connection."""
    data = b""
    with contextlib.suppress(ConnectionError):
        while chunk := await reader.read(1 << 16):
            data += chunk
    return data


@pytest.mark.parametrize("front", ["own", "aiohttp"])
async def test_slow_heads_are_cut_off_and_crowd_no_one_out(front: str) -> None:
    """Slowloris: 200 clients each sending a head a byte at a time. aiohttp's keep-alive
    timer runs from a connection's start, and bytes trickling in do not reset it: each is
    closed ``client_idle_timeout`` after it opened, and meanwhile others are served."""
    async with fronted(client_idle_timeout=1.0, front=front) as (url, state):
        port = urlsplit(url).port
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nX-Slow: " + b"z" * 1000

        async def slowloris() -> tuple[float, bytes]:
            # timed from before the connection opens: the server's timer starts once it is
            # accepted, which a task resumed late after its connect (200 at once, a busy
            # loop) would otherwise place after the server's start and read as closed early
            opened = time.monotonic()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)

            async def dribble() -> None:
                with contextlib.suppress(ConnectionError):
                    for byte in head:
                        writer.write(bytes([byte]))
                        await asyncio.sleep(0.05)

            dribbling = asyncio.create_task(dribble())
            said = await asyncio.wait_for(_closed(reader), 10)
            lasted = time.monotonic() - opened
            dribbling.cancel()
            writer.close()
            return lasted, said

        slow = [asyncio.create_task(slowloris()) for _ in range(200)]
        await asyncio.sleep(0.3)
        served = []
        async with aiohttp.ClientSession() as s:
            for _ in range(10):
                started = time.monotonic()
                async with s.post(f"{url}/v1/chat/completions", json=_valid("", 2)) as r:
                    assert r.status == 200
                    await r.read()
                served.append(time.monotonic() - started)
            idle = await asyncio.open_connection("127.0.0.1", port)  # served, then idle
            idle[1].write(b"GET /health HTTP/1.1\r\nHost: r\r\n\r\n")
            answered = time.monotonic()
            first = await idle[0].readuntil(b"}")
            assert first.startswith(b"HTTP/1.1 200")
            assert await asyncio.wait_for(_closed(idle[0]), 5) == b""
            idled = time.monotonic() - answered
            idle[1].close()
        results = await asyncio.gather(*slow)
        assert state.inflight() == 0
    lasted = sorted(t for t, _ in results)
    print(
        f"200 slow heads closed after {lasted[0]:.2f} to {lasted[-1]:.2f} s; meanwhile "
        f"requests took at most {max(served):.3f} s; an idle one closed after {idled:.2f} s"
    )
    assert all(said == b"" for _, said in results)  # closed without a word: no head came
    assert 0.9 < lasted[0] <= lasted[-1] < 2.5, (lasted[0], lasted[-1])
    assert max(served) < 0.5, served
    assert 0.9 < idled < 2.5


@pytest.mark.parametrize(
    "head",
    [
        b"X-Long: " + b"v" * 4096 + b"\r\n\r\n",
        b"".join(b"X-N%d: v\r\n" % i for i in range(40)) + b"\r\n",
        b"X-Endless: " + b"v" * (1 << 20),  # no end of line, ever: not kept past the limit
    ],
    ids=["a header too long", "too many headers", "a header without end"],
)
async def test_a_head_past_its_limits_is_refused_at_once(head: bytes) -> None:
    async with running_router(**NOWHERE, max_header_bytes=2048, max_headers=16) as (url, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", urlsplit(url).port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: r\r\n" + head)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        said = await asyncio.wait_for(_closed(reader), 5)
        writer.close()
    answer = parse(said)
    assert answer is not None and answer.status in (400, 431), said[:200]
    assert error_of(answer)["message"].startswith(
        ("A line of the request head", "The request could")
    )


async def test_a_slow_body_gets_408_and_never_reaches_a_backend() -> None:
    async with fronted(body_timeout=0.5) as (url, state):
        reader, writer = await asyncio.open_connection("127.0.0.1", urlsplit(url).port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
        )
        started = time.monotonic()

        async def dribble() -> None:
            with contextlib.suppress(ConnectionError):
                for _ in range(100):
                    writer.write(b" ")
                    await asyncio.sleep(0.05)

        dribbling = asyncio.create_task(dribble())
        answer = parse(await asyncio.wait_for(reader.readuntil(b"}}"), 5))
        waited = time.monotonic() - started
        dribbling.cancel()
        writer.close()
        assert state.inflight() == 0 and not state.decisions.recent  # no decision was even made
    assert answer is not None and answer.status == 408
    assert "0.5 s" in error_of(answer)["message"]
    assert 0.4 < waited < 1.5


@asynccontextmanager
async def firehose() -> AsyncIterator[tuple[str, list[int]]]:
    """A backend that answers every POST with an endless SSE stream, written as fast as
    its socket takes it; yields its URL and how many bytes it has written so far."""
    sent = [0]
    event = b'data: {"x": "' + b"y" * 1000 + b'"}\n\n'

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = head.lower().partition(b"content-length:")[2].split(b"\r\n")[0]
            await reader.readexactly(int(length or 0))
            if not head.startswith(b"POST"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            else:
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Connection: close\r\n\r\n"
                )
                for _ in range(1_000_000):  # a gigabyte, unless someone stops reading
                    writer.write(event)
                    sent[0] += len(event)
                    await writer.drain()
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the router hung up
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", sent


def _rss() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


async def test_a_slow_reader_holds_back_the_backend_not_the_routers_memory() -> None:
    """A client reading a fast stream at 50 KiB/s: the router writes to it only as fast as
    it reads (aiohttp waits for the socket to drain) and reads from the backend only as
    fast as it writes, so the backend is held back and nothing piles up in between."""
    async with (
        firehose() as (spec, sent),
        running_router(spec=[spec], base=[spec], policy="always-spec") as (url, state),
    ):
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", urlsplit(url).port))
        body = b'{"prompt": "hi", "stream": true}'
        await loop.sock_sendall(
            sock,
            b"POST /v1/completions HTTP/1.1\r\nHost: r\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
        )
        before, read, marks = _rss(), 0, list[tuple[int, int]]()
        started = time.monotonic()
        while (now := time.monotonic() - started) < 3.0:
            read += len(await loop.sock_recv(sock, 1024))
            if len(marks) < 2 and now >= (1.0, 2.9)[len(marks)]:
                marks.append((sent[0], read))
            await asyncio.sleep(0.02)
        grown = _rss() - before
        sock.close()
        await settled(state)
        assert state.inflight() == 0
    (sent_1, read_1), (sent_3, read_3) = marks
    print(
        f"backend sent {sent_1 / 2**20:.1f} MiB by 1 s, {sent_3 / 2**20:.1f} MiB by 2.9 s; "
        f"client read {read_3 / 2**10:.0f} KiB; memory grew {grown / 2**20:.1f} MiB"
    )
    assert sent_3 - sent_1 < (read_3 - read_1) + 4 * 2**20  # held to the reader's pace
    assert sent_3 - read_3 < 48 * 2**20  # the kernel's buffers, mostly (tcp_rmem grows)
    assert grown < 16 * 2**20


# Keys


@asynccontextmanager
async def answering_garbage() -> AsyncIterator[tuple[str, list[bytes]]]:
    """A backend that passes its health checks and answers every POST with what is not
    HTTP; yields its URL and the heads of the requests it got."""
    heads: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = head.lower().partition(b"content-length:")[2].split(b"\r\n")[0]
        await reader.readexactly(int(length or 0))
        heads.append(head)
        ok = head.startswith(b"GET")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n" if ok else b"HTTP/1.1 2x0 ?\r\n\r\n"
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", heads


async def test_no_key_shows_in_logs_metrics_or_status(caplog: pytest.LogCaptureFixture) -> None:
    """Client, admin, backend and wrong keys through every endpoint, refusals, backend
    failures whose messages the router builds, ejections and a profile swap: none of the
    keys is in any log record, metric, status page or answer."""
    caplog.set_level(logging.DEBUG)
    wrong = "wr0ng-k3y-qux"
    secrets = (CLIENT, ADMIN, BACKEND, wrong)
    keys = {
        "api_keys": [CLIENT],
        "admin_key": ADMIN,
        "backend_api_key": BACKEND,
        "eject_after_failures": 1,
        "eject_seconds": 0.2,
        "health_interval": 0.1,
        "idle_timeout": 0.5,
    }
    shown: list[str] = []

    async def call(
        s: aiohttp.ClientSession, method: str, url: str, key: str | None, **kwargs: Any
    ) -> int:
        headers = {} if key is None else {"Authorization": f"Bearer {key}"}
        async with s.request(method, url, headers=headers, **kwargs) as r:
            shown.append(str(r.headers) + await r.text())
            return r.status

    async with (
        fronted("--api-key", BACKEND, **keys) as (url, state),
        answering_garbage() as (spec, heads),
        answering_garbage() as (base, _),
        running_router(spec=[spec], base=[base], crossover=4, **keys) as (garbage_url, _),
        aiohttp.ClientSession() as s,
    ):
        faults = (
            f"{state.roster.backends[0].url}/emulator/faults",
            f"{state.roster.backends[1].url}/emulator/faults",
        )
        for key in (CLIENT, ADMIN, wrong, None):
            for path in (
                "/v1/models",
                "/health",
                "/ready",
                "/metrics",
                "/router/status",
                "/v1/loads",
                "/router/profile/live",
                "/router/online/samples",
                "/openapi.json",
                "/nowhere",
            ):
                await call(s, "GET", url + path, key)
            for path, body in (
                ("/v1/chat/completions", _valid("", 2)),
                ("/v1/completions", _valid("/v1/completions", 2)),
                ("/generate", _valid("/generate", 2)),
            ):
                for stream in (False, True):
                    await call(s, "POST", url + path, key, json={**body, "stream": stream})
            await call(s, "POST", f"{url}/router/profile", key, json=_valid("/router/profile", 3))
        assert await call(s, "POST", f"{url}/router/profile", ADMIN, data=b"{bad") == 400
        await call(s, "GET", f"{url}/health", f"{CLIENT}\xe9")  # valid UTF-8, a wrong key
        for fault, statuses in (
            ("status:503", {503}),
            ("refuse", {502, 503}),
            ("stall_first", {504}),
            ("cut_mid:2", {200}),
        ):
            for _ in range(100):  # readmitted after the last step's ejections
                if all(b.healthy for b in state.roster.backends):
                    break
                await asyncio.sleep(0.05)
            for at in faults:
                await call(s, "POST", at, BACKEND, json={"faults": [fault]})
            body = {**_valid("", 8), "stream": fault != "status:503"}
            assert await call(s, "POST", f"{url}/v1/chat/completions", CLIENT, json=body) in (
                statuses  # refused: 503 once a health check has ejected both first
            )
            for at in faults:
                await call(s, "DELETE", at, BACKEND)
        port = urlsplit(url).port
        assert port is not None
        for bad in (
            f"Bearer {CLIENT}\x00".encode(),
            f"Bearer {CLIENT}".encode() + b"k" * 9000,
            f"Bearer {CLIENT}".encode() + b"\xff",
        ):
            request = b"GET /router/status HTTP/1.1\r\nHost: r\r\nConnection: close\r\n" + (
                b"Authorization: %s\r\n\r\n" % bad
            )
            answer = await asyncio.to_thread(exchange, port, request)
            assert answer is not None and answer.status in (400, 431)
            assert CLIENT.encode() not in answer.body  # not even to its sender
        assert (
            await call(s, "POST", f"{garbage_url}/v1/chat/completions", CLIENT, json=_valid("", 2))
            == 502
        )
        assert any(f"Bearer {BACKEND}".encode() in head for head in heads)  # it was sent
        await settled(state)
        for at in (url, garbage_url):
            await call(s, "GET", f"{at}/router/status", ADMIN)
            await call(s, "GET", f"{at}/metrics", None)
        ejections = [r for r in caplog.records if "ejected" in r.getMessage()]
    assert ejections  # the failures above ejected backends, and said so
    logged = caplog.text + "".join(
        f"{r.getMessage()} {r.args} {r.exc_text}" for r in caplog.records
    )
    for secret in secrets:
        assert secret not in logged, secret
        assert not [text for text in shown if secret in text], secret
