"""A minimal SGLang-shaped server, for measuring what sits in front of it: ``python -m
specroute.bench.servers.stub_backend --port P``.

The emulator models an engine; this models nothing. It parses HTTP/1.1 on a raw asyncio
``Protocol``, answers from bytes encoded once at start, and paces a stream with the event
loop's timers (no task per request), so that it costs a small fraction of what a proxy in
front of it costs, and a proxy benchmark measures the proxy. A stream is ``chunks`` SSE
events ``gap_ms`` apart, the first at once (so the time to a first chunk is all transport
and proxy), the last followed by ``data: [DONE]`` (after an event of the token counts, as
SGLang sends it, when the request asks with ``stream_options.include_usage``); a whole
answer comes when the stream's last event would (a chat's with its ``meta_info`` and decode
time when asked ``return_meta_info``). ``/metrics`` has SGLang's gauges, so a
router's poller reads a load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from dataclasses import dataclass, field

from specroute.event_loop import run
from specroute.loadgen.connection import no_delay

_STREAMED = ("/v1/chat/completions", "/v1/completions", "/generate")
_MAX_HEAD = 64 * 1024


def _chunked(data: bytes) -> bytes:
    """One frame of a chunked body."""
    return b"%x\r\n%b\r\n" % (len(data), data)


def _head(status: str, content_type: str, length: int | None) -> bytes:
    size = "Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}"
    return f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n{size}\r\n\r\n".encode()


def _json(status: str, document: object) -> bytes:
    body = json.dumps(document, separators=(",", ":")).encode()
    return _head(status, "application/json", len(body)) + body


def _openai(kind: str, model: str, **fields: object) -> dict[str, object]:
    """An OpenAI-shaped object: the fields every one of the stub's answers begins with."""
    return {"id": "stub", "object": kind, "created": 0, "model": model, **fields}


def _chat_chunk(model: str, n: int, i: int) -> object:
    end = "length" if i == n - 1 else None
    delta = {"role": "assistant", "content": "tok"} if i == 0 else {"content": "tok"}
    choice = {"index": 0, "delta": delta, "finish_reason": end}
    return _openai("chat.completion.chunk", model, choices=[choice])


def _completion_chunk(model: str, n: int, i: int) -> object:
    end = "length" if i == n - 1 else None
    choice = {"index": 0, "text": "tok", "finish_reason": end}
    return _openai("text_completion", model, choices=[choice])


def _generate_chunk(model: str, n: int, i: int) -> object:
    """SGLang's /generate streams the text so far."""
    end = {"type": "length", "length": n} if i == n - 1 else None
    meta = {"id": "stub", "prompt_tokens": 8, "completion_tokens": i + 1, "finish_reason": end}
    return {"text": "tok" * (i + 1), "meta_info": meta}


def _usage(n: int) -> dict[str, int]:
    return {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}


def _sse(event: object) -> bytes:
    return _chunked(b"data: %b\n\n" % json.dumps(event).encode())


def _streams(model: str, n: int, counted: bool = False) -> dict[str, list[bytes]]:
    """Each streamed path's answer as chunked SSE frames, the head on the first; ``counted``:
    an OpenAI path's last event the token counts (``stream_options.include_usage``)."""
    events = {}
    chunks = (_chat_chunk, _completion_chunk, _generate_chunk)
    kinds = ("chat.completion.chunk", "text_completion", None)
    for path, event, kind in zip(_STREAMED, chunks, kinds, strict=True):
        frames = [_sse(event(model, n, i)) for i in range(n)]
        if counted and kind is not None:
            frames[-1] += _sse(_openai(kind, model, choices=[], usage=_usage(n)))
        frames[-1] += _chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n"
        frames[0] = _head("200 OK", "text/event-stream", None) + frames[0]
        events[path] = frames
    return events


def _wholes(model: str, n: int, gap: float, timed: bool = False) -> dict[str, bytes]:
    """Each streamed path's answer when it is not streamed; ``timed``: the chat's with its
    ``meta_info`` (``return_meta_info``), and its decode's tokens a second as SGLang's
    ``--enable-metrics`` gives them."""
    text = "tok" * n
    usage = _usage(n)
    message = {"role": "assistant", "content": text}
    chat: dict[str, object] = {"index": 0, "finish_reason": "length", "message": message}
    completion = {"index": 0, "text": text, "finish_reason": "length"}
    finish = {"type": "length", "length": n}
    meta = {"id": "stub", "prompt_tokens": 8, "completion_tokens": n, "finish_reason": finish}
    if timed:
        chat["meta_info"] = meta | {"decode_throughput": 1 / gap if gap > 0 else 1e6}
    return {
        "/v1/chat/completions": _json(
            "200 OK", _openai("chat.completion", model, choices=[chat], usage=usage)
        ),
        "/v1/completions": _json(
            "200 OK", _openai("text_completion", model, choices=[completion], usage=usage)
        ),
        "/generate": _json("200 OK", {"text": text, "meta_info": meta}),
    }


def _fixed(model: str) -> dict[str, bytes]:
    """The GET paths' answers."""
    # no model_path: sglang-router would fetch a tokenizer by that name from a model hub
    info = {"is_generation": True, "model_type": "stub"}
    server = {**info, "version": "stub", "max_total_num_tokens": 1 << 20}
    card = {"id": model, "object": "model", "owned_by": "sglang", "root": model}
    models = {"object": "list", "data": [card | {"max_model_len": 131072}]}
    empty = _head("200 OK", "text/plain", 0)
    return {
        "/health": empty,
        "/health_generate": empty,
        "/v1/models": _json("200 OK", models),
        "/model_info": _json("200 OK", info),
        "/get_model_info": _json("200 OK", info),
        "/server_info": _json("200 OK", server),
        "/get_server_info": _json("200 OK", server),
    }


@dataclass
class Answers:
    """Every byte the server sends, encoded once."""

    model: str
    chunks: int
    gap: float = 0.0  # seconds between a stream's events
    events: dict[str, list[bytes]] = field(default_factory=dict)  # path: chunked SSE frames
    counted: dict[str, list[bytes]] = field(default_factory=dict)  # the same, with usage
    whole: dict[str, bytes] = field(default_factory=dict)  # path: a whole response
    timed: dict[str, bytes] = field(default_factory=dict)  # the same, with its meta_info
    fixed: dict[str, bytes] = field(default_factory=dict)  # GET path: its response

    def __post_init__(self) -> None:
        self.events.update(_streams(self.model, self.chunks))
        self.counted.update(_streams(self.model, self.chunks, counted=True))
        self.whole = _wholes(self.model, self.chunks, self.gap)
        self.timed = _wholes(self.model, self.chunks, self.gap, timed=True)
        self.fixed = _fixed(self.model)

    def metrics(self, running: int, generated: int) -> bytes:
        label = f'{{model_name="{self.model}"}}'
        text = "".join(
            f"# TYPE sglang:{name} {kind}\nsglang:{name}{label} {value}\n"
            for name, kind, value in (
                ("num_running_reqs", "gauge", running),
                ("num_queue_reqs", "gauge", 0),
                ("num_used_tokens", "gauge", running * 8),
                ("token_usage", "gauge", 0.0),
                ("generation_tokens_total", "counter", generated),
            )
        ).encode()
        return _head("200 OK", "text/plain; version=0.0.4", len(text)) + text


_NOT_FOUND = _json("404 Not Found", {"object": "error", "message": "Not Found", "code": 404})
_BAD = _json("400 Bad Request", {"object": "error", "message": "bad request", "code": 400})


@dataclass
class Stub:
    answers: Answers
    gap: float  # seconds between a stream's events
    running: int = 0
    generated: int = 0


class _Connection(asyncio.Protocol):
    """One client connection: one request at a time, kept alive."""

    def __init__(self, stub: Stub) -> None:
        self.stub, self.buffer = stub, b""
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None  # a stream's or a whole answer's next
        self.close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = no_delay(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
            self.stub.running -= 1
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.timer is None:
            self._next_request()

    def _next_request(self) -> None:
        """Answer the request at the head of the buffer, if it is whole."""
        assert self.transport is not None
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > _MAX_HEAD:
                self._send(_BAD, close=True)
            return
        lines = self.buffer[:end].decode("latin-1").split("\r\n")
        method, target, *_ = [*lines[0].split(" "), "", ""]
        headers = dict(line.lower().split(":", 1) for line in lines[1:] if ":" in line)
        if "chunked" in headers.get("transfer-encoding", ""):  # no client here sends one
            self._send(_BAD, close=True)
            return
        length = int(headers.get("content-length", "0").strip() or 0)
        if len(self.buffer) < end + 4 + length:
            return  # the body is still coming
        body, self.buffer = self.buffer[end + 4 : end + 4 + length], self.buffer[end + 4 + length :]
        self.close_after = "close" in headers.get("connection", "")
        path = target.split("?", 1)[0]
        if method == "POST" and path in _STREAMED:
            self._generate(path, body)
        elif method == "GET" and path == "/metrics":
            self._send(self.stub.answers.metrics(self.stub.running, self.stub.generated))
        elif method == "GET":
            self._send(self.stub.answers.fixed.get(path, _NOT_FOUND))
        else:
            self._send(_NOT_FOUND)

    def _generate(self, path: str, body: bytes) -> None:
        try:
            asked = json.loads(body)
            stream = asked.get("stream") is True
            options = asked.get("stream_options")
            timed = asked.get("return_meta_info") is True
        except (ValueError, AttributeError):
            self._send(_BAD)
            return
        counted = isinstance(options, dict) and options.get("include_usage") is True
        stub, loop = self.stub, asyncio.get_running_loop()
        stub.running += 1
        if not stream:
            answer = (stub.answers.timed if timed else stub.answers.whole)[path]
            self.timer = loop.call_later(stub.gap * (stub.answers.chunks - 1), self._done, answer)
            return
        frames = (stub.answers.counted if counted else stub.answers.events)[path]

        def tick(i: int) -> None:
            if i == len(frames) - 1:
                self._done(frames[i])
            else:
                assert self.transport is not None
                self.transport.write(frames[i])
                self.timer = loop.call_later(stub.gap, tick, i + 1)

        tick(0)

    def _done(self, last: bytes) -> None:
        self.timer = None
        self.stub.running -= 1
        self.stub.generated += self.stub.answers.chunks
        self._send(last)

    def _send(self, data: bytes, close: bool = False) -> None:
        if self.transport is None:
            return
        self.transport.write(data)
        if close or self.close_after:
            self.transport.close()
        elif self.buffer:
            self._next_request()


async def listen(host: str, port: int, stub: Stub) -> asyncio.Server:
    """The stub on ``host:port`` (0: a free port), on the running loop."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: _Connection(stub), host, port, backlog=4096)


async def serve(host: str, port: int, stub: Stub) -> None:
    server = await listen(host, port, stub)
    print(f"stub backend on http://{host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m specroute.bench.servers.stub_backend", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--chunks", type=int, default=16, help="events per stream")
    p.add_argument("--gap-ms", type=float, default=20.0, help="between a stream's events")
    p.add_argument("--model", default="stub")
    args = p.parse_args()
    if args.chunks < 1 or args.gap_ms < 0:
        p.error("--chunks must be >= 1 and --gap-ms >= 0")
    gap = args.gap_ms / 1000
    stub = Stub(Answers(args.model, args.chunks, gap), gap)
    with contextlib.suppress(KeyboardInterrupt):
        run(serve(args.host, args.port, stub))


if __name__ == "__main__":
    main()
