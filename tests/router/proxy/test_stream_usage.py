"""Every stream a sample: a streamed chat whose client did not ask for its usage is sent to
the server with ``include_usage`` (the client's other stream options kept), read for its
sample, and relayed to the client without the usage event, byte for byte otherwise; with
online calibration off, or where the client asked, the body goes as it came."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from specroute.router.proxy.stream_usage import Asked, accept_length, asked_for, without_added
from tests.conditions import until
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
        # the server's bool reads these as asked: the client's, not taken out
        ("observe", {"include_usage": 1}, {"include_usage": 1}, True),
        ("observe", {"include_usage": "true"}, {"include_usage": "true"}, True),
        ("observe", {"include_usage": False}, {"include_usage": True}, False),
        ("off", None, None, True),
    ],
)
async def test_the_server_is_asked_and_the_client_gets_the_stream_it_asked_for(
    online: str,
    options: dict[str, Any] | None,
    sent_options: dict[str, Any] | None,
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
    assert without_added(chunk, usage=True, details=False) == event("a") + DONE
    with_both = b'data: {"choices":[{"index":0}],"usage":{"completion_tokens":1}}\n\n'
    assert without_added(with_both + USAGE, True, False) == with_both  # a continuous usage stays
    assert without_added(chunk, usage=False, details=True) == chunk  # not asked: not taken
    body = {"stream": True}
    assert asked_for("/generate", b'{"stream":true}', body) is None
    assert asked_for("/v1/chat/completions", b'{"stream":true}', {"stream": False}) is None
    assert (
        asked_for("/v1/chat/completions", b'{"stream":true}', {**body, "stream_options": 3}) is None
    )
    sent = asked_for("/v1/completions", b'{"stream": true}\n', body)
    assert sent == Asked(b'{"stream": true,"stream_options":{"include_usage":true}}', True, False)


DETAILS = (
    b'data: {"id":"d","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
    b'"usage":null,"sglext":{"spec_tokens_details":{"spec_accept_rate":0.5,'
    b'"spec_accept_length":2.25,"spec_num_proposed_drafts":24,"spec_verify_ct":8}}}\n\n'
)


def test_the_speculation_details_are_asked_where_offered_and_taken_out_as_they_came() -> None:
    """A speculative SGLang server is asked for the request's own details unless the client
    asked for an ``sglext`` field itself; their event is taken out whole, or only the
    details where the server put more in it; the accept length is read from them."""
    body = {"stream": True, "stream_options": {"include_usage": True}}
    raw = json.dumps(body).encode()
    assert asked_for("/v1/chat/completions", raw, body) is None  # not offered
    sent = asked_for("/v1/chat/completions", raw, body, details=True)
    assert sent == Asked(raw[:-1] + b',"return_spec_tokens_details":true}', False, True)
    for own in ("return_spec_tokens_details", "return_routed_experts"):
        assert asked_for("/v1/chat/completions", raw, {**body, own: True}, True) is None
    chunk = event("a") + DETAILS + USAGE + DONE
    assert without_added(chunk, usage=False, details=True) == event("a") + USAGE + DONE
    assert without_added(chunk, usage=True, details=True) == event("a") + DONE
    assert accept_length(chunk) == 2.25 and accept_length(event("a") + USAGE) is None
    ids = DETAILS.replace(b'"sglext":{', b'"sglext":{"input_ids":[1,2],')
    kept = without_added(ids, usage=False, details=True)
    assert json.loads(kept.removeprefix(b"data: "))["sglext"] == {"input_ids": [1, 2]}
    assert kept.endswith(b"\n\n")


async def test_a_stream_s_sample_carries_its_own_accept_length_and_the_client_no_sglext(
    backends: tuple[str, str],
) -> None:
    """The official client's plain ``stream=True`` to a speculative SGLang server: its
    sample's accept length is the request's own (the client that asks for the details gets
    the same number the router read), and no client gets an event it did not ask for."""
    spec, base = backends
    async with running_router(spec=[spec], base=[base], crossover=64.0) as (url, state):
        backend = state.roster.backends[0]
        await until(lambda: backend.offers_spec_details)  # its first poll says it is SGLang

        async def one(tokens: int, details: bool = False) -> list[Any]:
            extra = {"return_spec_tokens_details": True} if details else {}
            stream = await client(url).chat.completions.create(
                model="m", messages=CHAT, max_tokens=tokens, stream=True, extra_body=extra
            )
            return [chunk async for chunk in stream]

        # lengths whose last verify step is cut short differently: their accept lengths differ
        plain = await asyncio.gather(*(one(20 + 3 * i) for i in range(6)))
        asked = await one(40, details=True)
        samples = state.online.samples.window(time.monotonic())
    for chunks in plain:
        assert all(c.choices and getattr(c, "sglext", None) is None for c in chunks)
    (last,) = [c for c in asked if not c.choices]
    own = last.sglext["spec_tokens_details"]["spec_accept_length"]
    assert len(samples) == 7 and all(s.pool == "spec" for s in samples)
    lengths = [s.accept_length for s in samples]
    assert all(length is not None and 1 <= length <= 4 for length in lengths)
    assert samples[-1].accept_length == own
    assert len(set(lengths)) > 1  # each its own, not the server's one gauge
