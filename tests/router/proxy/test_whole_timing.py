"""Every whole chat a sample too: an SGLang server is asked for a whole chat's ``meta_info``
where its client did not ask, its decode time read for the sample, and the ``meta_info``
taken out of the body the client gets, which is then the body the server writes unasked,
byte for byte."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import time
from typing import Any

import aiohttp
import pytest

from specroute.router.backends.backend import backend_name
from specroute.router.proxy.whole_timing import (
    PATH,
    Timing,
    asked_meta_info,
    meta_info_asked,
    read_whole,
)
from tests.conditions import until
from tests.emulator.test_emulator_api import CHAT, client
from tests.routers import running_router
from tests.wire import Backend, Client, Script, post, routed


def _sent(answer: bytes) -> bytes | None:
    return read_whole(answer, take_out=True).sent


def _timing(answer: bytes) -> Timing | None:
    return read_whole(answer, take_out=False).timing


RAW = b'{"model":"m","messages":[{"role":"user","content":"hi"}]} \n'
BODY = json.loads(RAW)


def test_the_server_is_asked_only_where_asking_changes_nothing_else() -> None:
    asked = meta_info_asked(PATH, RAW, BODY)
    assert (
        asked
        == b'{"model":"m","messages":[{"role":"user","content":"hi"}],"return_meta_info":true}'
    )
    assert meta_info_asked(PATH, RAW, BODY | {"return_meta_info": False}) is not None
    assert meta_info_asked(PATH, RAW, BODY | {"stream": False, "n": 1}) is not None
    for own in (
        {"stream": True},  # SGLang refuses it on a stream
        {"n": 2},  # one decode time a sample
        {"return_meta_info": True},  # the client's own: read, not taken out
        {"logprobs": True},  # copied into the meta_info too
        {"top_logprobs": 3},
        {"return_routed_experts": True},  # answered in the meta_info instead, once asked
        {"return_hidden_states": True},
    ):
        assert meta_info_asked(PATH, RAW, BODY | own) is None, own
    assert meta_info_asked("/v1/completions", RAW, BODY) is None  # SGLang's takes none
    assert meta_info_asked(PATH, b"[1]", BODY) is None  # not an object
    assert meta_info_asked(PATH, b"{ }", {}) is None  # no member to add one after
    assert meta_info_asked(PATH, RAW.replace(b"{", b"{\x00", 1), BODY) is None  # UTF-16
    own = {"return_meta_info": True}
    assert asked_meta_info(PATH, own) and asked_meta_info(PATH, own | {"n": 1})
    for more in ({"n": 2}, {"stream": True}):
        assert not asked_meta_info(PATH, own | more)  # several decode times; refused
    assert not asked_meta_info("/v1/completions", own)


def _answer(meta: list[dict[str, Any] | None], separators: tuple[str, str]) -> bytes:
    """An SGLang-shaped whole chat, a choice for each of ``meta`` (its meta_info, last)."""
    content = 'a "meta_info": {"x": "}"} and ,"meta_info":{ in text'  # escaped: not a key
    choices = []
    for i, info in enumerate(meta):
        choice: dict[str, Any] = {
            "index": i,
            "message": {"role": "assistant", "content": content, "reasoning_content": None},
            "logprobs": None,
            "finish_reason": "stop",
            "matched_stop": '}{\\"',
        }
        if info is not None:
            choice["meta_info"] = info
        choices.append(choice)
    body = {"id": "x", "object": "chat.completion", "choices": choices, "usage": USAGE}
    return json.dumps(body, separators=separators, ensure_ascii=False).encode()


USAGE = {"prompt_tokens": 3, "total_tokens": 12, "completion_tokens": 9}
META = {
    "id": "x",
    "finish_reason": {"type": "stop", "matched": '"}{'},
    "completion_tokens": 9,
    "e2e_latency": 0.5,
    "first_token_latency": 0.1,
    "decode_throughput": 20.0,
    "spec_accept_length": 2.25,
}


def test_each_meta_info_is_taken_out_byte_for_byte_and_its_decode_read() -> None:
    for separators in ((",", ":"), (", ", ": ")):
        one, bare = _answer([META], separators), _answer([None], separators)
        assert _sent(one) == bare
        assert _timing(one) == (0.05, 2.25)
        two = _answer([META, META], separators)
        assert _sent(two) == _answer([None, None], separators)
        assert _timing(two) is None  # whose is it: no sample
        assert _sent(bare) == bare and _timing(bare) is None
    one = _answer([META], (",", ":"))
    cut = one[: one.index(b"decode_throughput")]  # inside its meta_info
    assert _sent(cut) is None  # not the object it should be: not sent so
    named = _answer([META | {"weight_version": "meta_info", "n": "decode_throughput"}], (",", ":"))
    assert _sent(named) == _answer([None], (",", ":"))  # values, not keys
    assert _timing(named) == (0.05, 2.25)
    for wild in ("1e400", "1e-300", "-1", "0"):  # read, but no decode's
        assert _timing(one.replace(b":20.0", b":" + wild.encode())) is None, wild
    wild_accept = one.replace(b":2.25", b":1e300")
    assert _timing(wild_accept) == (0.05, None)
    broken = b'{"choices":[{"index":0,"meta_info":{"id":"' + b'\\"' * 20_000 + b"}"
    started = time.perf_counter()
    assert _sent(b'{"a":1,' + broken[1:]) is None  # not closed, not scanned again
    assert time.perf_counter() - started < 0.5  # once through: milliseconds
    plain = _answer([META | {"spec_accept_length": 0.0}], (",", ":"))
    assert _timing(plain) == (0.05, None)


async def test_the_emulator_s_body_less_its_meta_info_is_its_body_unasked(
    backends: tuple[str, str],
) -> None:
    """The project's SGLang server asked the same request twice, with and without
    ``return_meta_info``: the one less its ``meta_info`` is the other, byte for byte."""
    spec, _ = backends
    bodies = []
    async with aiohttp.ClientSession() as s:
        for asked in ({}, {"return_meta_info": True}):
            body = {"model": "m", "messages": CHAT, "max_tokens": 12, "rid": "same", "seed": 1}
            async with s.post(f"{spec}/v1/chat/completions", json=body | asked) as r:
                assert r.status == 200
                bodies.append(re.sub(rb'"created":\s*\d+', b'"created":0', await r.read()))
    unasked, asked_body = bodies
    assert b'"meta_info"' in asked_body and b'"meta_info"' not in unasked
    assert _sent(asked_body) == unasked
    timing = _timing(asked_body)
    assert timing is not None and 0 < timing.tpot < 1 and timing.accept_length is not None


async def test_the_openai_client_s_whole_chat_becomes_a_sample(
    backends: tuple[str, str],
) -> None:
    """The official client's plain whole chat: a sample each, with its server's decode time
    and, on the speculative server, its own accept length; the client gets no
    ``meta_info``, and one that asks for it gets it. (That the time reads as a stream's of
    the same load: ``test_online_live``, where the emulators keep their time.)"""
    spec, base = backends
    async with running_router(spec=[spec], base=[base], crossover=2.5) as (url, state):
        for backend in state.roster.backends:
            await until(lambda b=backend: b.gives_meta_info)  # its first poll: SGLang

        async def whole() -> dict[str, Any]:
            raw = await client(url).chat.completions.with_raw_response.create(
                model="m", messages=CHAT, max_tokens=32
            )
            return json.loads(raw.http_response.content)  # type: ignore[no-any-return]

        answers = await asyncio.gather(*(whole() for _ in range(4)))
        samples = state.online.samples.window(time.monotonic())
        own = await client(url).chat.completions.create(
            model="m", messages=CHAT, max_tokens=8, extra_body={"return_meta_info": True}
        )
        await client(url).chat.completions.create(model="m", messages=CHAT, max_tokens=1)
        async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
            metrics = await r.text()
    assert len(samples) == 4 and {s.pool for s in samples} == {"spec", "base"}  # past 2.5
    assert all("meta_info" not in a["choices"][0] for a in answers)
    tokens = [a["usage"]["completion_tokens"] for a in answers]
    assert all(t > 1 for t in tokens) and all(0 < s.tpot < 1 for s in samples)
    assert all(1 <= s.load <= 4.5 for s in samples)  # counted from each one's dispatch
    assert all(s.accept_length is not None for s in samples if s.pool == "spec")
    assert own.choices[0].model_extra and "meta_info" in own.choices[0].model_extra
    assert "specroute_online_unread_total{" not in metrics  # none (one token: none to read)


SGLANG = {"/metrics": b"sglang:num_running_reqs 0\nsglang:num_queue_reqs 0\n"}  # what it is
ANSWER = _answer([META], (",", ":"))


def _whole(body: bytes, cut: bool = False) -> Script:
    """SGLang's head and ``body``, or half of it and the connection closed."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    if cut:
        return [head % len(body), body[: len(body) // 2], None]
    return [head % len(body) + body]


@pytest.mark.parametrize("front", ["own", "aiohttp"])
async def test_the_client_gets_the_body_less_the_meta_info_and_the_sample_its_decode(
    front: str,
) -> None:
    backend = Backend(script=lambda _: _whole(ANSWER), pages=SGLANG)
    async with routed(backend, front) as (_, port, state):
        await until(lambda: all(b.gives_meta_info for b in state.roster.backends))
        answers = [await asyncio.to_thread(_answer_to, port, own) for own in (False, True)]
        samples = state.online.samples.window(time.monotonic())
    sent = [json.loads(body) for body in backend.bodies]
    assert sent[0]["return_meta_info"] is True and backend.bodies[0].endswith(
        b',"return_meta_info":true}'
    )
    assert backend.bodies[1] == _request(own=True)  # the client's own: as it came
    assert answers == [_sent(ANSWER), ANSWER]
    assert [s.tpot for s in samples] == [0.05, 0.05]  # 1 / decode_throughput, each
    assert [s.accept_length for s in samples] == [2.25, 2.25]  # its own


async def test_a_body_cut_before_it_was_whole_reached_no_client_and_is_retried() -> None:
    """Held until whole, a body the backend cut short has reached no client: another
    attempt serves it (as one that failed before its first byte)."""
    tries: list[bool] = []

    def script(_: str) -> Script:
        tries.append(not tries)
        return _whole(ANSWER, cut=tries[-1])

    backend = Backend(script=script, pages=SGLANG)
    async with routed(backend, "own") as (_, port, state):
        await until(lambda: all(b.gives_meta_info for b in state.roster.backends))
        answer = await asyncio.to_thread(_answer_to, port, False)
        reasons = [d["reason"] for d in state.decisions.recent]
    assert tries == [True, False] and answer == _sent(ANSWER)
    assert reasons[-1] == "retry"


async def test_bytes_after_a_body_already_whole_do_not_fail_it() -> None:
    """A backend that writes past its answer's end (the connection is then closed, never
    pooled): the answer was whole, and is the client's, not retried."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    whole = head % len(ANSWER) + ANSWER
    half = len(whole) - len(ANSWER) // 2  # its end, and more, in the read that ends it
    script: Script = [whole[:half], 0.05, whole[half:] + b"HTTP/1.1 500 junk\r\n\r\n"]
    backend = Backend(script=lambda _: script, pages=SGLANG)
    async with routed(backend, "own") as (_, port, state):
        await until(lambda: all(b.gives_meta_info for b in state.roster.backends))
        answer = await asyncio.to_thread(_answer_to, port, False)
        reasons = [d["reason"] for d in state.decisions.recent]
        samples = state.online.samples.window(time.monotonic())
    assert answer == _sent(ANSWER) and reasons == ["static"] and len(samples) == 1


async def test_an_answer_whose_meta_info_gives_no_decode_time_is_counted_not_sampled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Counted each time, logged once for its backend: a server that never gives it would
    otherwise say so on every request."""
    untimed = {k: v for k, v in META.items() if k != "decode_throughput"}
    backend = Backend(script=lambda _: _whole(_answer([untimed], (",", ":"))), pages=SGLANG)
    async with routed(backend, "own") as (url, port, state):
        await until(lambda: all(b.gives_meta_info for b in state.roster.backends))
        answers = [await asyncio.to_thread(_answer_to, port, False) for _ in range(2)]
        samples = state.online.samples.window(time.monotonic())
        async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
            metrics = await r.text()
    assert answers == [_answer([None], (",", ":"))] * 2 and not samples
    name = backend_name(state.roster.backends[0].url, "spec")
    unread = f'specroute_online_unread_total{{backend="{name}",reason="no_decode_time"}} 2.0'
    assert unread in metrics
    said = [r for r in caplog.records if "no_decode_time" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING"


async def test_a_meta_info_it_cannot_take_out_is_counted_once_and_relayed_as_it_came() -> None:
    """A backend that compresses what was asked ``identity``, or answers a ``meta_info``
    not of SGLang's shape: the client gets the body as it came, counted once."""
    nulled = _answer([None], (",", ":")).replace(b'"matched_stop"', b'"meta_info":null,"m"')
    packed = gzip.compress(ANSWER)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
    answers: list[Script] = [
        [head % len(packed) + b"Content-Encoding: gzip\r\n\r\n" + packed],
        _whole(nulled),
    ]
    backend = Backend(script=lambda _: answers.pop(0), pages=SGLANG)
    async with routed(backend, "own") as (url, port, state):
        await until(lambda: all(b.gives_meta_info for b in state.roster.backends))
        got = [await asyncio.to_thread(_answer_to, port, False) for _ in range(2)]
        async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
            metrics = await r.text()
    assert got == [packed, nulled]
    name = backend_name(state.roster.backends[0].url, "spec")
    kept = f'specroute_online_unread_total{{backend="{name}",reason="meta_info_kept"}} 2.0'
    assert kept in metrics and 'reason="no_decode_time"' not in metrics


def _answer_to(port: int, own: bool) -> bytes:
    with Client(port) as c:
        c.send(post(_request(own)))
        answer = c.answer()
        assert answer.status == 200 and int(answer.headers["content-length"]) == len(answer.body)
        return answer.body


def _request(own: bool) -> bytes:
    asked: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    return json.dumps(asked | ({"return_meta_info": True} if own else {})).encode()
