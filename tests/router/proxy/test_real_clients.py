"""What real clients found through the router: the openai client's ``models.retrieve()``,
a stream closed as soon as its ``[DONE]`` came, a 405's ``Allow``, a head too large."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import jsonschema  # type: ignore[import-untyped]
import openai
import pytest
from aiohttp import web

from specroute.router.operator.openapi import document
from specroute.router.state import RouterState
from tests.apps import serving
from tests.emulator.test_emulator_api import client
from tests.emulators import running_emulator
from tests.routers import running_router

FAST = ("--time-scale", "0.01")
NOWHERE = {"spec": ["http://127.0.0.1:9"], "base": ["http://127.0.0.1:9"], "crossover": 4}
MODEL = "moonshotai/Kimi-K2.5"  # the default hardware model's


@pytest.fixture
async def routed() -> AsyncIterator[tuple[str, RouterState]]:
    async with (
        running_emulator("--mode", "spec", *FAST) as spec,
        running_emulator("--mode", "base", *FAST) as base,
        running_router(spec=[spec], base=[base], crossover=4) as router,
    ):
        yield router


async def test_models_retrieve_works_through_the_router(routed: tuple[str, RouterState]) -> None:
    url, _ = routed
    card = await client(url).models.retrieve(MODEL)
    assert card.id == MODEL and card.object == "model"
    with pytest.raises(openai.NotFoundError) as caught:
        await client(url).models.retrieve("org/nothing")
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert "org/nothing" in error["message"]


def _samples(text: str, name: str) -> dict[str, float]:
    """A metric's samples, by their label text."""
    found = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) :].rsplit(" ", 1)
            found[labels] = float(value)
    return found


@asynccontextmanager
async def lingering() -> AsyncIterator[str]:
    """A backend whose stream ends a moment after its ``data: [DONE]``, as a server's does
    when the end of its chunked body is a write of its own (uvicorn's)."""

    async def stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n')
        await response.write(b"data: [DONE]\n\n")
        await asyncio.sleep(0.05)
        await response.write_eof()
        return response

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", stream)
    app.router.add_get("/health", health)
    async with serving(app) as url:
        yield url


async def test_a_stream_closed_right_after_done_is_answered_not_cancelled() -> None:
    """The client closes its connection the moment ``data: [DONE]`` arrives, before the
    backend's end of the body: the answer was whole, so it counts as answered."""
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    streams = 40

    async def one(s: aiohttp.ClientSession, url: str) -> None:
        r = await s.post(f"{url}/v1/chat/completions", json=body)
        async for line in r.content:
            if line.strip() == b"data: [DONE]":
                break
        r.close()  # at once: the connection goes with it

    async with (
        lingering() as spec,
        lingering() as base,
        running_router(spec=[spec], base=[base], crossover=4) as (url, state),
        aiohttp.ClientSession() as s,
    ):
        await asyncio.gather(*[one(s, url) for _ in range(streams)])
        for _ in range(100):
            if state.inflight() == 0:
                break
            await asyncio.sleep(0.02)
        async with s.get(f"{url}/metrics") as r:
            counted = _samples(await r.text(), "specroute_requests_total")
    by_status: dict[str, float] = {}
    for labels, value in counted.items():
        status = labels.split('status="')[1].split('"')[0]
        by_status[status] = by_status.get(status, 0) + value
    assert by_status == {"200": streams}, by_status


async def test_405_says_which_methods_are_allowed(routed: tuple[str, RouterState]) -> None:
    url, _ = routed
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{url}/v1/chat/completions") as r:
            assert r.status == 405
            assert r.headers["Allow"] == "POST"
            assert (await r.json())["error"]["code"] == 405
        async with s.delete(f"{url}/router/status") as r:
            assert r.status == 405
            assert set(r.headers["Allow"].replace(" ", "").split(",")) == {"GET", "HEAD"}


async def _exchange(url: str, request: bytes) -> bytes:
    """``request`` as raw bytes; whatever came back before the router closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", urlsplit(url).port)
    writer.write(request)
    with contextlib.suppress(ConnectionError):
        await writer.drain()
    data = b""
    with contextlib.suppress(ConnectionError):
        while chunk := await reader.read(1 << 16):
            data += chunk
    writer.close()
    return data


async def test_a_head_too_large_is_an_openai_error_that_quotes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    key = "sk-l0ng-h3ad-k3y"
    async with running_router(**NOWHERE, api_keys=[key]) as (url, _):
        said = await _exchange(
            url,
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\n"
            + f"Authorization: Bearer {key}".encode()
            + b"p" * 9000
            + b"\r\n\r\n",
        )
    head, _, body = said.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"431", said[:300]
    assert b"application/json" in head
    error = json.loads(body)["error"]
    assert error["code"] == 431 and "8190" in error["message"]
    assert key.encode() not in said and b"ppp" not in said
    logged = caplog.text + "".join(f"{r.getMessage()} {r.exc_text}" for r in caplog.records)
    assert "Error handling request" in logged  # it was logged, without the line
    assert key not in logged


def _schema(name: str) -> jsonschema.Draft202012Validator:
    """A validator of one of the description's schemas, its references resolved in it."""
    components = document()["components"]
    root = {"$ref": f"#/components/schemas/{name}", "components": components}
    return jsonschema.Draft202012Validator(root)


HI = [{"role": "user", "content": "hi"}]
# each body, the schema it is sent under, and whether SGLang 0.5.23 takes it
BODIES = [
    ("/v1/chat/completions", "ChatCompletionRequest", {"messages": []}, False),
    ("/generate", "GenerateRequest", {}, False),
    ("/generate", "GenerateRequest", {"sampling_params": {"max_new_tokens": 2}}, False),
    ("/v1/completions", "CompletionRequest", {"prompt": "hi", "max_tokens": 0}, False),
    ("/v1/chat/completions", "ChatCompletionRequest", {"messages": HI, "max_tokens": 2.5}, False),
    ("/v1/chat/completions", "ChatCompletionRequest", {"messages": HI, "max_tokens": 2.0}, True),
    ("/v1/completions", "CompletionRequest", {"prompt": "hi", "max_tokens": 2.0}, True),
    ("/v1/responses", "ResponsesRequest", {"input": "hi", "max_output_tokens": 1}, False),
    ("/v1/responses", "ResponsesRequest", {"input": "hi", "max_output_tokens": 4.0}, True),
    (
        "/generate",
        "GenerateRequest",
        {"text": "hi", "sampling_params": {"max_new_tokens": 2.0}},
        True,
    ),
]


async def test_the_description_takes_what_the_servers_take(
    routed: tuple[str, RouterState],
) -> None:
    """What the description allows, the emulated server takes, as SGLang does; what it
    refuses comes back as the server's own refusal, in the shape the description gives."""
    url, _ = routed
    refusal = _schema("BackendError")
    async with aiohttp.ClientSession() as s:
        for path, name, body, taken in BODIES:
            assert _schema(name).is_valid(body) == taken, (path, body)
            async with s.post(url + path, json=body) as r:
                answer = await r.json()
                assert r.status == (200 if taken else 400), (path, body, answer)
                assert "x-specroute-backend" in r.headers  # the server's answer, relayed
                if not taken:
                    refusal.validate(answer)


async def test_bodies_past_a_mebibyte_reach_the_server(routed: tuple[str, RouterState]) -> None:
    """SGLang reads a body of any size; the router's own limit (8 MiB) is the one a
    rehearsal meets."""
    url, state = routed
    body = {"messages": HI, "max_tokens": 2, "user": "u" * (2 << 20)}
    direct = state.roster.backends[0].url
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{direct}/v1/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
        async with s.post(f"{url}/v1/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
        body["user"] = "u" * (9 << 20)
        async with s.post(f"{url}/v1/chat/completions", json=body) as r:
            assert r.status == 413
            assert (await r.json())["error"]["code"] == 413


SGLANG_PYTHON = Path(__file__).resolve().parents[3] / ".venv-sglang" / "bin" / "python"
# what SGLang's own pydantic models say of the OpenAI bodies above (``{"messages": []}``
# passes its model and is refused by its chat handler: "Messages cannot be empty.")
MODELS = """
import json, sys
sys.path.insert(0, "tests/conformance")
from validate import load_sglang
protocol, _ = load_sglang()
models = {"ChatCompletionRequest": protocol.ChatCompletionRequest,
          "CompletionRequest": protocol.CompletionRequest}
for name, body in json.loads(sys.argv[1]):
    try:
        models[name].model_validate(body)
        print("taken")
    except ValueError:
        print("refused")
"""


@pytest.mark.skipif(not SGLANG_PYTHON.exists(), reason="run `make conformance-env` first")
def test_sglangs_own_models_take_what_the_description_takes() -> None:
    checked = [(name, body, taken) for _, name, body, taken in BODIES if "Completion" in name]
    checked = [c for c in checked if c[1] != {"messages": []}]
    given = json.dumps([[name, body] for name, body, _ in checked])
    done = subprocess.run(
        [SGLANG_PYTHON, "-c", MODELS, given],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert done.returncode == 0, done.stderr[-2000:]
    verdicts = done.stdout.split()
    assert verdicts == ["taken" if taken else "refused" for _, _, taken in checked]
