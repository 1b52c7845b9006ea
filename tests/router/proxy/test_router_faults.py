"""Faults at either side of the router, each told apart: a slow backend is not a dead one, a
client that leaves is not a backend that failed, and the router's own limits are its own."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from specroute.loadgen.spawn import spawned
from tests.apps import serving
from tests.emulator.test_emulator_api import CHAT, client
from tests.emulators import FAST, running_emulator
from tests.router.proxy.test_router import LONG_STREAM, settled
from tests.router.test_router_ops import hanging_up_after, samples
from tests.routers import running_router


async def _metrics(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        return await r.text()


async def test_a_slow_non_streamed_answer_is_waited_for_not_cut_and_run_twice() -> None:
    """Its headers come only when generation ends: the idle timeout must not cut it."""
    async with (
        running_emulator("--mode", "spec", "--time-scale", "0.5") as spec,
        running_emulator("--mode", "base", *FAST) as base,
        running_router(spec=[spec], base=[base], crossover=8, idle_timeout=0.3) as (url, state),
    ):
        answer = await client(url).chat.completions.create(
            model="m", messages=CHAT, max_tokens=200, extra_body={"ignore_eos": True}
        )
        assert answer.usage is not None and answer.usage.completion_tokens == 200
        await settled(state)
        text = await _metrics(url)
    assert sum(samples(text, "specroute_upstream_errors_total").values()) == 0
    assert list(samples(text, "specroute_requests_total").values()) == [1]
    assert [d["reason"] for d in state.decisions.recent] == ["below_crossover"]


async def test_past_its_deadline_a_non_streamed_request_gets_504_and_is_not_retried() -> None:
    async with (
        running_emulator("--mode", "spec", "--time-scale", "0.5") as spec,
        running_emulator("--mode", "base", *FAST) as base,
        running_router(spec=[spec], base=[base], crossover=8, request_timeout=0.3) as (
            url,
            state,
        ),
    ):
        with pytest.raises(openai.APIStatusError) as raised:
            await client(url).chat.completions.create(
                model="m", messages=CHAT, max_tokens=200, extra_body={"ignore_eos": True}
            )
        assert raised.value.status_code == 504
        assert "not retried" in raised.value.message
        await settled(state)
        text = await _metrics(url)
    spec_name = state.roster.backends[0].name
    assert samples(text, "specroute_upstream_errors_total") == {
        (("backend", spec_name), ("kind", "timeout")): 1
    }
    assert samples(text, "specroute_requests_total") == {
        (("backend", spec_name), ("pool", "spec"), ("status", "timeout")): 1
    }
    assert [d["reason"] for d in state.decisions.recent] == ["below_crossover"]  # no retry


@asynccontextmanager
async def compressing_backend() -> AsyncIterator[tuple[str, list[str]]]:
    """An SGLang-shaped answer behind a gzip middleware (as an ingress would add); yields
    its URL and the ``Accept-Encoding`` of every request it got."""
    offered: list[str] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        offered.append(request.headers.get("Accept-Encoding", ""))
        body: dict[str, Any] = await request.json()
        answer = {
            "id": "c1",
            "object": "chat.completion",
            "created": 1,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "compressed " * 200},
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 400, "total_tokens": 403},
        }
        response = web.json_response(answer)
        response.enable_compression()  # only when the request accepts it
        return response

    async def health(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    async with serving(app) as url:
        yield url, offered


async def test_a_compressed_answer_keeps_its_encoding() -> None:
    async with (
        compressing_backend() as (spec, offered),
        running_emulator("--mode", "base", *FAST) as base,
        running_router(spec=[spec], base=[base], crossover=8) as (url, _),
        aiohttp.ClientSession() as s,
    ):
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        async with s.post(
            f"{url}/v1/chat/completions", json=body, headers={"Accept-Encoding": "gzip"}
        ) as r:
            assert r.headers["Content-Encoding"] == "gzip"
            assert (await r.json())["choices"][0]["message"]["content"].startswith("compressed")
        async with s.post(
            f"{url}/v1/chat/completions", json=body, skip_auto_headers=["Accept-Encoding"]
        ) as r:
            assert "Content-Encoding" not in r.headers  # a client that reads no gzip gets none
            assert (await r.json())["usage"]["completion_tokens"] == 400
        async with s.post(
            f"{url}/v1/chat/completions",
            json=body | {"stream": True},
            headers={"Accept-Encoding": "gzip"},
        ) as r:
            await r.read()
        answer = await client(url).chat.completions.create(model="m", messages=CHAT)
        assert answer.choices[0].message.content is not None
    # a stream is asked for uncompressed: the relay may have to end it with its own event
    assert offered[:3] == ["gzip", "identity", "identity"]


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "non-streamed"])
async def test_a_client_that_leaves_is_not_charged_to_the_backend(
    stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        running_emulator("--mode", "spec", "--time-scale", "0.5") as spec,
        running_emulator("--mode", "base", *FAST) as base,
        running_router(spec=[spec], base=[base], crossover=8, health_interval=0.1) as (
            url,
            state,
        ),
    ):
        for _ in range(3):
            async with aiohttp.ClientSession() as s:

                async def ask() -> None:
                    body = {**LONG_STREAM, "stream": stream}
                    async with s.post(f"{url}/v1/chat/completions", json=body) as r:
                        await r.read()

                with pytest.raises(TimeoutError):  # the client gives up mid-answer and goes
                    await asyncio.wait_for(ask(), 0.3)
            await asyncio.sleep(0.1)
        await settled(state)
        await asyncio.sleep(0.3)  # a health check or two
        text = await _metrics(url)
        assert all(b.healthy for b in state.roster.backends)
    spec_name = state.roster.backends[0].name
    assert samples(text, "specroute_upstream_errors_total") == {}
    assert samples(text, "specroute_requests_total") == {
        (("backend", spec_name), ("pool", "spec"), ("status", "cancelled")): 3
    }
    assert {d["reason"] for d in state.decisions.recent} == {"below_crossover"}  # never re-sent
    assert "Error handling request" not in caplog.text  # nothing unhandled in the router
    assert "closing transport" not in caplog.text


async def test_out_of_file_descriptors_the_router_blames_itself() -> None:
    """The router's open-files limit lowered under it while it runs: once streams hold every
    descriptor, a client already connected gets 503 with Retry-After from the router itself,
    charged to no backend."""
    async with (
        running_emulator("--mode", "base", "--time-scale", "0.5") as base,
        spawned(
            "serve", "--spec", base, "--base", base, "--policy", "always-base", stop=signal.SIGKILL
        ) as router,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as connected,
    ):
        assert "open files limit" in router.said()
        async with connected.get(f"{router.url}/health") as r:  # its socket stays open
            assert r.status == 200
        pid = router.process.pid
        room = len(os.listdir(f"/proc/{pid}/fd")) + 2 * 8
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (room, room))
        held: list[aiohttp.ClientResponse] = []
        for _ in range(12):  # until the router cannot even accept
            try:
                held.append(await s.post(f"{router.url}/v1/chat/completions", json=LONG_STREAM))
            except aiohttp.ClientError:
                break
        refused = []
        for _ in range(3):
            async with connected.post(f"{router.url}/v1/chat/completions", json=LONG_STREAM) as r:
                refused.append((r.status, r.headers.get("Retry-After"), await r.json()))
        for r in held:  # their descriptors come back to the router
            r.close()
        await asyncio.sleep(1.0)
        async with s.get(f"{router.url}/metrics") as r:
            text = await r.text()
    assert held and all(r.status == 200 for r in held)
    assert [(status, after) for status, after, _ in refused] == [(503, "1")] * 3
    assert all("file descriptors" in body["error"]["message"] for *_, body in refused)
    assert samples(text, "specroute_router_errors_total") == {(("kind", "out_of_fds"),): 3}
    assert samples(text, "specroute_upstream_errors_total") == {}


async def test_two_busy_backends_answer_503_with_retry_after() -> None:
    """Both pools answer 503 (SGLang's queue full): the client gets 503 and when to come
    back, not a 502 that reads as a failure."""
    busy = ("--fault", "status:503")
    async with (
        running_emulator("--mode", "spec", *FAST, *busy) as spec,
        running_emulator("--mode", "base", *FAST, *busy) as base,
        running_router(spec=[spec], base=[base], crossover=100) as (url, state),
        aiohttp.ClientSession() as s,
        s.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": CHAT}) as r,
    ):
        assert r.status == 503
        assert r.headers["Retry-After"] == "1"
        assert "busy" in (await r.json())["error"]["message"]
        assert [d["reason"] for d in state.decisions.recent] == ["below_crossover", "retry"]


async def test_a_non_streamed_body_cut_short_is_never_relayed_as_whole() -> None:
    """The backend promises 1,000 bytes of JSON and sends 100: the client's connection is
    cut, so that half a body cannot pass for a whole one."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).lower()
        length = head.partition(b"content-length:")[2].split(b"\r\n")[0]
        await reader.readexactly(int(length or 0))
        if head.startswith(b"get /health"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        else:
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1000\r\n\r\n" + b'{"id": "c1", "choices": [' + b" " * 75
            )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    async with (
        server,
        running_emulator("--mode", "base", *FAST) as base,
        running_router(
            spec=[f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"],
            base=[base],
            crossover=8,
        ) as (url, state),
        aiohttp.ClientSession() as s,
    ):
        body = {"model": "m", "messages": CHAT}
        with pytest.raises(aiohttp.ClientPayloadError):
            async with s.post(f"{url}/v1/chat/completions", json=body) as r:
                await r.read()
        await settled(state)
        text = await _metrics(url)
    (status,) = [labels for labels in samples(text, "specroute_requests_total")]
    assert dict(status)["status"] == "truncated"


async def test_an_unexpected_error_in_the_router_is_counted_as_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bug in the relay: the client gets a 500, the request is counted by its outcome,
    charged to the router and to no backend, and nothing stays in flight."""

    async def broken_relay(*args: Any) -> web.StreamResponse:
        raise RuntimeError("a bug")

    monkeypatch.setattr("specroute.router.proxy.attempt.relay", broken_relay)
    async with (
        running_emulator("--mode", "spec", *FAST) as spec,
        running_emulator("--mode", "base", *FAST) as base,
        running_router(spec=[spec], base=[base], crossover=8) as (url, state),
        aiohttp.ClientSession() as s,
    ):
        async with s.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": CHAT}) as r:
            assert r.status == 500
        await settled(state)
        text = await _metrics(url)
    spec_name = state.roster.backends[0].name
    assert samples(text, "specroute_requests_total") == {
        (("backend", spec_name), ("pool", "spec"), ("status", "internal_error")): 1
    }
    assert samples(text, "specroute_router_errors_total") == {(("kind", "internal_error"),): 1}
    assert samples(text, "specroute_upstream_errors_total") == {}


async def test_a_stream_without_event_boundaries_is_not_held_without_limit() -> None:
    """``text/event-stream`` that never sends a blank line: past a bound the relay stops
    waiting for the end of an event and passes the bytes on."""
    async with (
        hanging_up_after(*[b"x" * 65536] * 20) as spec,
        running_emulator("--mode", "base", *FAST) as base,
        running_router(spec=[spec], base=[base], crossover=8) as (url, state),
        aiohttp.ClientSession() as s,
        s.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": CHAT}) as r,
    ):
        body = await r.read()
        await settled(state)
    assert body.count(b"x") > 1 << 20  # relayed, not held back to the end
    assert b'"error"' in body  # and the hang-up still ends it with an error event


async def test_the_status_page_shows_no_credentials_of_a_backend_url() -> None:
    async with (
        running_router(
            spec=["http://user:s3cret@127.0.0.1:9"], base=["http://127.0.0.1:9"], crossover=4
        ) as (url, _),
        aiohttp.ClientSession() as s,
        s.get(f"{url}/router/status") as r,
    ):
        shown = await r.text()
    assert "s3cret" not in shown and "127.0.0.1:9" in shown


async def test_the_start_line_shows_no_credentials_of_a_backend_url() -> None:
    """What ``specroute serve`` prints as it starts, which a service's log keeps."""
    secret = ("--spec", "http://user:s3cret@127.0.0.1:9", "--base", "http://u:pw2@127.0.0.1:9")
    args = ("serve", *secret, "--policy-param", "crossover=4")
    async with spawned(*args, stop=signal.SIGKILL) as router:
        for _ in range(100):
            if "127.0.0.1:9" in (said := router.said()):
                break
            await asyncio.sleep(0.05)
    assert "spec http://127.0.0.1:9; base http://127.0.0.1:9" in said
    assert "s3cret" not in said and "pw2" not in said
