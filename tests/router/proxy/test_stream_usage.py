"""Every stream a sample: a streamed chat whose client did not ask for its usage is sent to
the server with ``include_usage`` (the client's other stream options kept), read for its
sample, and relayed to the client without the usage event, byte for byte otherwise; with
online calibration off, or where the client asked, the body goes as it came."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from specroute.router.proxy.stream_usage import asked_for, without_usage
from tests.emulator.test_emulator_api import CHAT, client
from tests.routers import running_router
from tests.wire import Backend, Client, chat, event, post, routed

USAGE = b'data: {"id":"u","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}\n\n'
DONE = b"data: [DONE]\n\n"


def _stream(marker: str) -> list[bytes | float | None]:
    events = event(marker) + event(marker + "!")
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    body = [events, USAGE + DONE]
    return [head, *(b"%x\r\n%s\r\n" % (len(p), p) for p in body), b"0\r\n\r\n"]


@pytest.mark.parametrize("front", ["own", "aiohttp"])
@pytest.mark.parametrize(
    ("online", "options", "sent_options", "relayed_usage"),
    [
        ("observe", None, {"include_usage": True}, False),
        (
            "observe",
            {"continuous_usage_stats": True},
            {"continuous_usage_stats": True, "include_usage": True},
            False,
        ),
        ("observe", {"include_usage": True}, {"include_usage": True}, True),
        ("off", None, None, True),
    ],
)
async def test_the_server_is_asked_and_the_client_gets_the_stream_it_asked_for(
    online: str,
    options: dict[str, bool] | None,
    sent_options: dict[str, bool] | None,
    relayed_usage: bool,
    front: str,
) -> None:
    backend = Backend(script=_stream)
    asked = json.loads(chat("hello", stream=True))
    if options is not None:
        asked["stream_options"] = options
    raw = json.dumps(asked).encode()
    async with routed(backend, front, online=online) as (_, port, state):
        answer = await asyncio.to_thread(lambda: _answer(port, raw))
        sample_count = len(state.online.samples.window(time.monotonic()))
    sent = json.loads(backend.bodies[0])
    assert sent.get("stream_options") == sent_options
    if sent_options is None or options == sent_options:
        assert backend.bodies[0] == raw  # as it came
    expected = event("hello") + event("hello!") + (USAGE if relayed_usage else b"") + DONE
    assert answer == expected
    assert sample_count == (0 if online == "off" else 1)  # the usage read all the same


def _answer(port: int, raw: bytes) -> bytes:
    with Client(port) as c:
        c.send(post(raw))
        return c.answer().body


async def test_the_openai_client_s_plain_stream_becomes_a_sample(
    backends: tuple[str, str],
) -> None:
    """The official client's ``stream=True`` with no stream options: a sample each, and
    no chunk the client did not ask for."""
    spec, base = backends
    async with running_router(spec=[spec], base=[base], crossover=2.5) as (url, state):

        async def one() -> list[object]:
            stream = await client(url).chat.completions.create(
                model="m", messages=CHAT, max_tokens=24, stream=True
            )
            return [chunk async for chunk in stream]

        answers = await asyncio.gather(*(one() for _ in range(4)))
        samples = state.online.samples.window(time.monotonic())
    assert len(samples) == 4 and all(0 < s.tpot < 1 for s in samples)
    for chunks in answers:
        assert all(c.usage is None and c.choices for c in chunks)  # type: ignore[attr-defined]


def test_only_the_usage_event_is_taken_out_and_only_what_can_take_usage_is_asked() -> None:
    chunk = event("a") + USAGE.replace(b"\n\n", b"\r\n\r\n") + DONE
    assert without_usage(chunk) == event("a") + DONE
    with_both = b'data: {"choices":[{"index":0}],"usage":{"completion_tokens":1}}\n\n'
    assert without_usage(with_both + USAGE) == with_both  # a continuous usage stays
    body = {"stream": True}
    assert asked_for("/generate", b'{"stream":true}', body) is None
    assert asked_for("/v1/chat/completions", b'{"stream":true}', {"stream": False}) is None
    assert (
        asked_for("/v1/chat/completions", b'{"stream":true}', {**body, "stream_options": 3}) is None
    )
    sent = asked_for("/v1/completions", b'{"stream": true}\n', body)
    assert sent == b'{"stream": true,"stream_options":{"include_usage":true}}'
