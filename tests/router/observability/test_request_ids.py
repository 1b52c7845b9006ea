"""Request ids through the router, both ways, and the access line each request ends with."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from specroute.logs import JsonFormatter
from tests.apps import serving
from tests.emulator.test_emulator_api import CHAT, client
from tests.emulators import running_emulator
from tests.routers import running_router

KEY = "sk-acc3ss-l0g-k3y"
USAGE = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}


@dataclass
class Seen:
    """What a recording backend was sent."""

    headers: list[dict[str, str]] = field(default_factory=list)  # names in lower case
    bodies: list[bytes] = field(default_factory=list)
    drop: bool = False  # close the connection instead of answering
    delay: float = 0.0  # seconds before each answer


@asynccontextmanager
async def recording() -> AsyncIterator[tuple[str, Seen]]:
    """A backend that keeps each request's headers and body, and answers with a usage."""
    seen = Seen()

    async def answer(request: web.Request) -> web.StreamResponse:
        seen.headers.append({k.lower(): v for k, v in request.headers.items()})
        seen.bodies.append(await request.read())
        if seen.drop and request.transport is not None:
            request.transport.close()
        await asyncio.sleep(seen.delay)
        if json.loads(seen.bodies[-1] or b"{}").get("stream"):
            return await stream(request)
        return web.json_response({"id": "x", "choices": [], "usage": USAGE})

    async def stream(request: web.Request) -> web.StreamResponse:
        """SGLang's stream with include_usage: its usage event, then [DONE] apart."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n')
        await response.write(b"data: " + json.dumps({"choices": [], "usage": USAGE}).encode())
        await response.write(b"\n\n")
        await asyncio.sleep(0.02)
        await response.write(b"data: [DONE]\n\n")
        return response

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    for path in ("/v1/chat/completions", "/v1/completions", "/generate"):
        app.router.add_post(path, answer)
    app.router.add_get("/health", health)
    async with serving(app) as url:
        yield url, seen


@asynccontextmanager
async def routed(**settings: Any) -> AsyncIterator[tuple[str, Seen]]:
    async with (
        recording() as (spec, seen),
        recording() as (base, _),
        running_router(spec=[spec], base=[base], crossover=4, **settings) as (url, _),
    ):
        yield url, seen


async def test_a_clients_id_goes_upstream_and_comes_back() -> None:
    async with routed() as (url, seen), aiohttp.ClientSession() as s:
        chat = {"messages": CHAT, "max_tokens": 2}
        async with s.post(
            f"{url}/v1/chat/completions", json=chat, headers={"X-Request-ID": "abc-1"}
        ) as r:
            assert r.status == 200
            assert r.headers["x-request-id"] == "abc-1"
        assert seen.headers[-1]["x-request-id"] == "abc-1"
        async with s.post(f"{url}/v1/chat/completions", json=chat) as r:
            made = r.headers["x-request-id"]
        assert len(made) == 32 and made != "abc-1"
        assert seen.headers[-1]["x-request-id"] == made
        # one that cannot be logged as it is: replaced, not refused
        async with s.post(
            f"{url}/v1/chat/completions", json=chat, headers={"x-request-id": "a b\tc"}
        ) as r:
            assert r.status == 200 and len(r.headers["x-request-id"]) == 32


async def test_the_openai_client_reads_the_id_of_its_answer() -> None:
    async with (
        running_emulator("--mode", "spec", "--time-scale", "0.01") as spec,
        running_emulator("--mode", "base", "--time-scale", "0.01") as base,
        running_router(spec=[spec], base=[base], crossover=4) as (url, _),
    ):
        raw = await client(url).chat.completions.with_raw_response.create(
            model="m", messages=CHAT, max_tokens=2, extra_headers={"x-request-id": "oa-9"}
        )
        assert raw.headers["x-request-id"] == "oa-9"
        assert raw.parse().choices[0].message.content


async def test_generate_gets_the_id_as_its_rid_unless_it_has_one() -> None:
    async with routed() as (url, seen), aiohttp.ClientSession() as s:
        sent = b'{ "text": "hi",\n "sampling_params": {"max_new_tokens": 2}, "extra": [1]}'
        headers = {"Content-Type": "application/json", "x-request-id": "gen-7"}
        async with s.post(f"{url}/generate", data=sent, headers=headers) as r:
            assert r.status == 200
        body = json.loads(seen.bodies[-1])
        assert body == {**json.loads(sent), "rid": "gen-7"}
        own = b'{"text": "hi", "rid": "mine"}'
        async with s.post(f"{url}/generate", data=own, headers=headers) as r:
            assert r.status == 200
        assert seen.bodies[-1] == own  # byte for byte
        async with s.post(f"{url}/generate", data=b"{}", headers=headers) as r:
            assert r.status == 200
        assert json.loads(seen.bodies[-1]) == {"rid": "gen-7"}
        chat = b'{"messages": []}'
        async with s.post(f"{url}/v1/chat/completions", data=chat, headers=headers) as r:
            assert r.status == 200
        assert seen.bodies[-1] == chat  # rid is /generate's field only


async def test_the_setting_names_the_headers_an_id_comes_in() -> None:
    names = ["x-correlation-id", "x-request-id"]
    async with routed(request_id_headers=names) as (url, seen), aiohttp.ClientSession() as s:
        chat = {"messages": CHAT}
        async with s.post(
            f"{url}/v1/chat/completions",
            json=chat,
            headers={"x-correlation-id": "c-9", "x-request-id": "r-1"},
        ) as r:
            assert r.headers["x-correlation-id"] == "c-9"
        assert seen.headers[-1]["x-request-id"] == "c-9"
        async with s.post(
            f"{url}/v1/chat/completions", json=chat, headers={"x-request-id": "r-2"}
        ) as r:
            assert r.headers["x-request-id"] == "r-2"


async def test_errors_and_log_lines_name_the_request(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with routed(eject_after_failures=1) as (url, seen), aiohttp.ClientSession() as s:
        headers = {"x-request-id": "bad-1", "Content-Type": "application/json"}
        async with s.post(f"{url}/v1/chat/completions", data=b"{", headers=headers) as r:
            assert r.status == 400 and r.headers["x-request-id"] == "bad-1"
            error = (await r.json())["error"]
        assert error["request_id"] == "bad-1" and error["code"] == 400
        async with s.get(f"{url}/nowhere", headers=headers) as r:
            assert (await r.json())["error"]["request_id"] == "bad-1"
        seen.drop = True  # the spec server fails: ejected, and the line says during what
        async with s.post(
            f"{url}/v1/chat/completions",
            json={"messages": CHAT},
            headers={"x-request-id": "ej-2"},
        ) as r:
            assert r.status == 200  # retried on the other pool
    ejected = [r for r in caplog.records if "ejected" in r.getMessage()]
    assert ejected and all("[request ej-2]" in r.getMessage() for r in ejected)
    assert all(getattr(r, "request_id", None) == "ej-2" for r in ejected)


def _lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.__dict__["fields"] for r in caplog.records if r.name == "specroute.router.access"]


async def test_each_request_ends_with_one_access_line_and_no_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with (
        routed(api_keys=[KEY]) as (url, _),
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {KEY}"}) as s,
    ):
        for rid in ("one", "two"):
            async with s.post(
                f"{url}/v1/chat/completions",
                json={"messages": CHAT, "max_tokens": 2, "user": "a body's text"},
                headers={"x-request-id": rid},
            ) as r:
                assert r.status == 200
        async with s.get(f"{url}/v1/models", headers={"Authorization": "Bearer wrong"}) as r:
            assert r.status == 401
    lines = _lines(caplog)
    assert [line["request_id"] for line in lines if line["path"] == "/v1/chat/completions"] == [
        "one",
        "two",
    ]
    one = next(line for line in lines if line["request_id"] == "one")
    assert one["status"] == 200 and one["outcome"] == "answered"
    assert one["pool"] == "spec" and one["backend"].startswith("spec:")
    assert one["policy"] == "crossover" and one["reason"] and one["load"] == 0
    assert one["attempts"] == 1
    assert 0 < one["ttfb_s"] <= one["duration_s"]
    assert one["prompt_tokens"] == 3 and one["completion_tokens"] == 5
    refused = next(line for line in lines if line["status"] == 401)
    assert refused["outcome"] is None and refused["pool"] is None
    record = next(r for r in caplog.records if r.name == "specroute.router.access")
    as_json = json.loads(JsonFormatter().format(record))
    assert as_json["request_id"] == "one" and as_json["status"] == 200
    assert as_json["logger"] == "specroute.router.access"
    logged = caplog.text + "".join(JsonFormatter().format(r) for r in caplog.records)
    assert KEY not in logged and "wrong" not in logged and "a body's text" not in logged


async def test_a_streams_tokens_come_from_its_usage_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The usage event and ``[DONE]`` come apart, as SGLang writes them."""
    caplog.set_level(logging.INFO)
    async with routed() as (url, _), aiohttp.ClientSession() as s:
        body = {"messages": CHAT, "stream": True}
        async with s.post(f"{url}/v1/chat/completions", json=body) as r:
            assert b"[DONE]" in await r.read()
            assert len(r.headers["x-request-id"]) == 32  # a stream's head names it too
    (line,) = [line for line in _lines(caplog) if line["path"] == "/v1/chat/completions"]
    assert line["prompt_tokens"] == 3 and line["completion_tokens"] == 5


def test_the_json_format_writes_one_object_a_line() -> None:
    """``log_format = json`` in a process of its own, as ``serve`` sets it up."""
    script = (
        "import logging\n"
        "from specroute import logs\n"
        "logs.configure()\n"
        "logs.configure(log_format='json')\n"  # serve's call, after the command line's
        "logging.getLogger('specroute.router').warning('Backend %s ejected.', 'b1')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    (line,) = done.stderr.splitlines()
    said = json.loads(line)
    assert said["message"] == "Backend b1 ejected." and said["level"] == "WARNING"
    assert said["logger"] == "specroute.router" and said["time"].endswith("Z")


async def test_one_id_on_two_generates_at_once_is_the_rid_of_the_first_only() -> None:
    """SGLang refuses a rid already in flight: the second keeps its body as it came."""
    async with routed() as (url, seen), aiohttp.ClientSession() as s:
        seen.delay = 0.2
        headers = {"Content-Type": "application/json", "x-request-id": "twice"}

        async def generate() -> int:
            async with s.post(f"{url}/generate", data=b'{"text": "hi"}', headers=headers) as r:
                return r.status

        assert list(await asyncio.gather(generate(), generate())) == [200, 200]
        rids = sorted(json.loads(body).get("rid", "") for body in seen.bodies)
        assert rids == ["", "twice"]
        seen.bodies.clear()
        assert await generate() == 200  # the first has ended: its id is free again
        assert json.loads(seen.bodies[-1])["rid"] == "twice"


@pytest.mark.parametrize(
    ("flags", "expected"), [([], True), (["--no-access-log"], False), (["--access-log"], True)]
)
def test_the_access_log_flag_reaches_the_settings(flags: list[str], expected: bool) -> None:
    from specroute.cli import parser
    from specroute.router.settings import RouterSettings
    from specroute.serve_command import given_settings

    backends = ["serve", "--spec", "http://127.0.0.1:1", "--base", "http://127.0.0.1:2"]
    given = given_settings(parser().parse_args([*backends, *flags]))
    assert RouterSettings(**given).observability.access_log is expected
