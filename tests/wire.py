"""Both ends of the router's HTTP/1.1 on raw sockets, for tests that write bytes rather than
requests: a client that sends what it is given, split where it is told, and reads each
answer with h11 (a strict parser: an answer framed wrongly fails the test where it lands);
and a backend that answers each request with what its script says, byte for byte, and
records what it was sent.

The client blocks (the fuzzers run it in a thread beside the router's event loop: call it
through ``asyncio.to_thread`` from a test's coroutine); the backend runs in the loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import h11

from specroute.router.state import RouterState
from tests.apps import listening
from tests.routers import running_router


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes
    interim: tuple[int, ...] = ()  # the 1xx answers before it

    def json(self) -> dict[str, object]:
        said = json.loads(self.body)
        assert isinstance(said, dict), self
        return said


class Client:
    """One connection to ``port``. ``send`` writes bytes as they are; ``answer`` reads the
    next answer, as a client that sent one request reads it."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._h11 = h11.Connection(h11.CLIENT)
        self._ended = False

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.sock.close()

    def send(self, data: bytes, cuts: Sequence[int] = (), pause: float = 0.002) -> None:
        """``data`` written in pieces cut at ``cuts`` (offsets), ``pause`` seconds apart, so
        that they arrive in reads of their own."""
        start = 0
        for cut in [*sorted(set(cuts)), len(data)]:
            if start < cut <= len(data):
                with contextlib.suppress(ConnectionError):
                    self.sock.sendall(data[start:cut])
                start = cut
                if cut < len(data):
                    time.sleep(pause)

    def answer(self, method: str = "POST") -> Answer:
        """The next answer whole. Raises ``h11.RemoteProtocolError`` if it is not HTTP/1.1
        or is framed wrongly, ``EOFError`` if the connection ended before it."""
        conn = self._h11
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
        elif conn.our_state is not h11.IDLE:
            raise EOFError("the answer before this one ended the connection")
        conn.send(h11.Request(method=method, target="/", headers=[("Host", "r")]))
        conn.send(h11.EndOfMessage())
        interim: list[int] = []
        head: h11.Response | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = b""
                with contextlib.suppress(ConnectionError):
                    data = self.sock.recv(1 << 16)
                conn.receive_data(data)
                continue
            if isinstance(event, h11.InformationalResponse):
                interim.append(event.status_code)
            elif isinstance(event, h11.Response):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                headers = {k.decode().lower(): v.decode("latin-1") for k, v in head.headers}
                return Answer(head.status_code, headers, bytes(body), tuple(interim))
            elif isinstance(event, h11.ConnectionClosed):
                raise EOFError("the connection ended before its answer")

    def closed(self, within: float = 5.0) -> bool:
        """Whether the router ends the connection within ``within`` seconds, nothing more
        sent on it (what it sends before its end fails the test)."""
        self.sock.settimeout(within)
        try:
            extra = self.sock.recv(1 << 16)
        except TimeoutError:
            return False
        except ConnectionError:
            return True
        assert not extra, extra
        return True


def post(body: bytes, path: str = "/v1/chat/completions", *extra: str) -> bytes:
    """A POST as the openai client sends one, ``extra`` header lines added."""
    lines = [f"POST {path} HTTP/1.1", "Host: r", "Content-Type: application/json", *extra]
    return ("\r\n".join([*lines, f"Content-Length: {len(body)}"]) + "\r\n\r\n").encode() + body


def chat(marker: str, stream: bool = False, size: int = 0) -> bytes:
    """A chat request whose message is ``marker`` (the scripted backend echoes it), padded
    to ``size`` bytes or so."""
    content = marker + " " * max(0, size - len(marker))
    asked = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    if stream:
        asked["stream"] = True
    return json.dumps(asked).encode()


def completion(marker: str) -> bytes:
    """A whole chat completion whose id is ``marker``."""
    return json.dumps(
        {
            "id": marker,
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": marker},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    ).encode()


def event(marker: str) -> bytes:
    chunk = {
        "id": marker,
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": marker}, "finish_reason": None}],
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def whole(body: bytes, status: bytes = b"200 OK", extra: bytes = b"") -> bytes:
    """An answer with a length."""
    return b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        status,
        len(body),
        extra,
        body,
    )


# What a scripted backend writes for one request: bytes, pauses (seconds) between them, and
# None where it closes the connection.
Script = list[bytes | float | None]


@dataclass
class Backend:
    """A backend on a raw socket that answers each POST with ``script(marker)``, the marker
    being the request's first message (``chat``), and each GET (a health check, a poll) with
    an empty 200, or ``pages``' body for its path (``/metrics``: what it says it is). It keeps
    its connections open; ``bodies``: the POSTs' bodies in the order they came,
    ``connections``: how many connections carried a POST."""

    script: Callable[[str], Script] = lambda marker: [whole(completion(marker))]
    bodies: list[bytes] = field(default_factory=list)
    connections: int = 0
    pages: dict[str, bytes] = field(default_factory=dict)

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[str]:
        """Its URL until the block ends; then every connection is closed and its handler
        ended, none left to the event loop's close."""
        handlers: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            handlers[task] = writer
            try:
                await self._serve(reader, writer)
            finally:
                handlers.pop(task, None)

        async with listening(serve) as url:
            try:
                yield url
            finally:  # each connection closed: its handler reads its end and returns
                for writer in handlers.values():
                    writer.close()
                if handlers:
                    await asyncio.wait(list(handlers), timeout=5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        posted = False
        try:
            while True:
                _, body = await posted_request(reader, writer, self.pages)
                self.connections += not posted
                posted = True
                self.bodies.append(body)
                for piece in self.script(marker_of(body)):
                    if piece is None:
                        return
                    if isinstance(piece, float):
                        await asyncio.sleep(piece)
                    else:
                        writer.write(piece)
                        await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the router closed it
        finally:
            writer.close()


async def posted_request(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    pages: dict[str, bytes] | None = None,
) -> tuple[bytes, bytes]:
    """The next POST's head and body as the router sends them (with a length), each GET
    before it (a health check, a poll) answered with a 200: ``pages``' body for its path,
    else an empty one."""
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        length = head.lower().partition(b"content-length:")[2].split(b"\r\n")[0]
        body = await reader.readexactly(int(length or 0))
        if not head.startswith(b"GET"):
            return head, body
        page = (pages or {}).get(head.split(b" ")[1].decode(), b"")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(page), page))


def marker_of(body: bytes) -> str:
    try:
        return str(json.loads(body)["messages"][0]["content"]).strip()
    except (ValueError, LookupError, TypeError):
        return ""


@asynccontextmanager
async def routed(
    backend: Backend, front: str, **settings: Any
) -> AsyncIterator[tuple[str, int, RouterState]]:
    """A router whose every request goes to ``backend``."""
    async with (
        backend.serving() as url,
        running_router(spec=[url], base=[url], policy="always-spec", front=front, **settings) as (
            router,
            state,
        ),
    ):
        port = urlsplit(router).port
        assert port is not None
        yield router, port, state
