"""Injecting the faults of ``faults.py``: one middleware decides per generation request
which faults act on it, and the handlers take their stream response from here, so that a
stall, a cut or a crash lands between two events as a real server's would."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import struct
import sys
import zlib
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any, NoReturn

from aiohttp import hdrs, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.typedefs import Middleware
from prometheus_client import Counter

from specroute.emulator.errors import error_body
from specroute.emulator.faults import (
    ADMIN_PREFIX,
    CRASH_EXIT_STATUS,
    GENERATION_PATHS,
    Fault,
    Kind,
)


class StreamCut(Exception):
    """A stream's connection was cut on purpose; the handler stops writing."""

    def __init__(self, response: web.StreamResponse) -> None:
        super().__init__("the stream was cut by a fault")
        self.response = response


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Plan:
    """The faults drawn for one request; each is counted where it acts."""

    def __init__(self, drawn: dict[Kind, Fault], counter: Counter) -> None:
        self.drawn = drawn
        self.counter = counter

    def take(self, kind: Kind, after: int | None = None) -> Fault | None:
        """The fault of this kind if it was drawn (and acts after ``after`` events)."""
        fault = self.drawn.get(kind)
        if fault is None or (after is not None and fault.after != after):
            return None
        self.counter.labels(kind=kind).inc()
        return fault


class FaultInjector:
    """The faults in force, and the one place that draws which of them act on a request."""

    def __init__(self, counter: Counter, faults: tuple[Fault, ...] = (), seed: int = 0) -> None:
        self.counter = counter
        self.seed = seed
        self._plans: dict[int, Plan] = {}  # by id(request), while its handler runs
        self.set(faults)

    def set(self, faults: tuple[Fault, ...], seed: int | None = None) -> None:
        """Replace the faults; their counts and the seeded draws start over."""
        self.faults = faults
        self.seed = self.seed if seed is None else seed
        self._rng = random.Random(self.seed)
        self._remaining = {fault.kind: fault.count for fault in faults}
        self._refresh()

    def _refresh(self) -> None:
        self._per_request = tuple(fault for fault in self.faults if fault.kind != "slow")
        # whether a request streams decides where stall_first acts, and if the rest act at all
        self._peek = any(f.streams_only or f.kind == "stall_first" for f in self.faults)
        self.slowdown = next((f.factor for f in self.faults if f.kind == "slow"), 1.0)

    def describe(self) -> dict[str, Any]:
        faults = [
            fault.describe() | ({"remaining": self._remaining[fault.kind]} if fault.count else {})
            for fault in self.faults
        ]
        return {"faults": faults, "seed": self.seed}

    def middleware(self) -> Middleware:
        @web.middleware
        async def inject(request: web.Request, handler: Handler) -> web.StreamResponse:
            if not self.faults:  # the normal path: one attribute read
                return await handler(request)
            return await self._serve(request, handler)

        return inject

    def draw(self, *, generation: bool, streaming: bool, gzip: bool) -> dict[Kind, Fault]:
        drawn: dict[Kind, Fault] = {}
        for fault in self._per_request:
            if fault.kind != "refuse" and not generation:
                continue
            if (fault.streams_only and not streaming) or (fault.kind == "compress" and not gzip):
                continue
            if fault.probability < 1.0 and self._rng.random() >= fault.probability:
                continue
            drawn[fault.kind] = fault
            left = self._remaining[fault.kind]
            if left is not None:
                self._remaining[fault.kind] = left - 1
        spent = [kind for kind, left in self._remaining.items() if left == 0]
        if spent:
            for kind in spent:
                del self._remaining[kind]
            self.faults = tuple(f for f in self.faults if f.kind not in spent)
            self._refresh()
        return drawn

    def event_stream(self, request: web.Request) -> web.StreamResponse:
        """The response a handler streams into, one SSE event a write, with SGLang's
        headers; the faults drawn for the request act on its events."""
        plan = self._plans.get(id(request))
        return web.StreamResponse(headers=SSE_HEADERS) if plan is None else _FaultyStream(plan)

    async def _serve(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith(ADMIN_PREFIX):  # or a refusal could never be lifted
            return await handler(request)
        generation = request.path in GENERATION_PATHS
        streaming = generation and self._peek and await _asks_to_stream(request)
        gzip = _accepts_gzip(request.headers.get(hdrs.ACCEPT_ENCODING, ""))
        plan = Plan(self.draw(generation=generation, streaming=streaming, gzip=gzip), self.counter)
        if plan.take("refuse"):
            _reset(request)
            return web.Response()  # never sent: the connection is gone
        if not generation:
            return await handler(request)
        if self.slowdown != 1.0:
            self.counter.labels(kind="slow").inc()
        if plan.take("crash", after=0):
            crash()
        if fault := plan.take("status"):
            message = f"The emulator injected this error (fault 'status', HTTP {fault.status})."
            body = error_body(message, fault.status, HTTPStatus(fault.status).name)
            return web.json_response(body, status=fault.status)
        if not plan.drawn:
            return await handler(request)
        if not streaming and (fault := plan.take("stall_first")):
            await _stall(fault.seconds)  # nothing for a while; then the request runs
        self._plans[id(request)] = plan
        try:
            response = await handler(request)
        except StreamCut as cut:
            return cut.response  # aiohttp finds its connection closed and lets it go
        finally:
            del self._plans[id(request)]
        if not response.prepared and plan.take("compress"):
            response.enable_compression(web.ContentCoding.gzip)
        return response


async def _asks_to_stream(request: web.Request) -> bool:
    """The body's ``stream`` flag; aiohttp keeps the bytes for the handler to read again."""
    try:
        body = await request.json()
    except (ValueError, web.HTTPException):
        return False
    return isinstance(body, dict) and body.get("stream") is True


def _accepts_gzip(accept_encoding: str) -> bool:
    for item in accept_encoding.split(","):
        coding, _, weight = item.partition(";")
        if coding.strip().lower() in ("gzip", "*"):
            name, _, value = weight.partition("=")
            try:
                return name.strip() != "q" or float(value) > 0
            except ValueError:
                return False
    return False


def _reset(request: web.Request) -> None:
    """Drop the connection with a reset (RST), answering nothing."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def crash() -> NoReturn:
    print("specroute emulate: exiting at once (fault 'crash')", file=sys.stderr, flush=True)
    os._exit(CRASH_EXIT_STATUS)


async def _stall(seconds: float | None) -> None:
    if seconds is None:
        await asyncio.Event().wait()  # until the client leaves and the handler is cancelled
    else:
        await asyncio.sleep(seconds)


SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class _FaultyStream(web.StreamResponse):
    def __init__(self, plan: Plan) -> None:
        super().__init__(headers=SSE_HEADERS)
        self._plan = plan
        self._events = 0
        self._request: web.BaseRequest | None = None
        self._gzip = None
        if plan.take("compress"):  # as a gzip middleware streams: each event flushed whole
            self._gzip = zlib.compressobj(wbits=31)
            self.headers[hdrs.CONTENT_ENCODING] = "gzip"

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        first = not self.prepared
        writer = await super().prepare(request)
        self._request = request
        if first and (fault := self._plan.take("stall_first")):
            await _stall(fault.seconds)  # the headers are out; then nothing
        return writer

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        index, plan = self._events, self._plan
        self._events += 1
        if fault := plan.take("stall_mid", after=index):
            await _stall(fault.seconds)
        if plan.take("crash", after=index):
            crash()
        if fault := plan.take("cut_mid", after=index):
            if fault.mid_event:
                event = bytes(data)
                await super().write(self._encoded(event[: len(event) // 2]))
            self._cut()
        await super().write(self._encoded(data))

    async def write_eof(self, data: bytes = b"") -> None:
        gzip, self._gzip = self._gzip, None
        if gzip is not None:
            data = gzip.compress(data) + gzip.flush()
        await super().write_eof(data)

    def _encoded(self, data: bytes | bytearray | memoryview) -> bytes | bytearray | memoryview:
        if self._gzip is None:
            return data
        return self._gzip.compress(data) + self._gzip.flush(zlib.Z_SYNC_FLUSH)

    def _cut(self) -> NoReturn:
        self._gzip = None
        transport = None if self._request is None else self._request.transport
        if transport is not None:
            transport.close()  # what was written goes out first
        raise StreamCut(self)
