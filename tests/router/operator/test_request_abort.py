"""``POST /abort_request`` through the router: SGLang's abort by ``rid``, or of everything,
reaches the server that holds the request, and its client sees the request end."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from tests.router.operator.test_cache_flush import ADMIN_KEY, CLIENT_KEY, deployment
from tests.router.operator.test_server_info import bearer
from tests.router.proxy.test_router import LONG_STREAM


async def _last_event(stream: aiohttp.ClientResponse) -> dict[str, object]:
    """The last JSON event of an SSE stream, read to its end."""
    last: dict[str, object] = {}
    async for line in stream.content:
        data = line.decode().strip().removeprefix("data: ")
        if data.startswith("{"):
            last = json.loads(data)
    return last


async def test_an_abort_by_rid_ends_that_request_and_no_other() -> None:
    async with deployment() as (url, _), aiohttp.ClientSession() as s:
        native = {
            "text": "hi",
            "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True},
            "stream": True,
        }
        mine = await s.post(f"{url}/generate", json={**native, "rid": "mine"})
        other = await s.post(f"{url}/generate", json={**native, "rid": "other"})
        async with s.post(f"{url}/abort_request", json={"rid": "mine"}) as r:
            answer = await r.json()
            assert r.status == 200, answer
        assert answer["aborted"] is True and [x["status"] for x in answer["servers"]] == [200, 200]
        ended = await asyncio.wait_for(_last_event(mine), 10)
        assert ended["meta_info"]["finish_reason"]["type"] == "abort"  # type: ignore[index]
        await asyncio.sleep(0.2)
        assert not other.content.at_eof()  # the other runs on
        other.close()


async def test_abort_all_ends_every_request_on_every_server() -> None:
    async with deployment() as (url, servers), aiohttp.ClientSession() as s:
        streams = [
            await s.post(target, json={**LONG_STREAM, "max_tokens": 4000})
            for target in (f"{url}/v1/chat/completions", f"{servers[1]}/v1/chat/completions")
        ]  # one through the router, one sent to the plain server by another client
        async with s.post(f"{url}/abort_request", json={"abort_all": True}) as r:
            assert r.status == 200, await r.text()
        for stream in streams:
            ended = await asyncio.wait_for(_last_event(stream), 10)
            assert ended["choices"][0]["finish_reason"] == "abort"  # type: ignore[index]


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"[]", b"{}", b'{"rid": ""}', b'{"rid": 5}', b'{"abort_all": "yes"}'],
)
async def test_a_body_that_names_no_request_is_a_400(body: bytes) -> None:
    async with deployment() as (url, _), aiohttp.ClientSession() as s:
        r = await s.post(f"{url}/abort_request", data=body)
        error = (await r.json())["error"]
        assert r.status == 400 and error["type"] == "invalid_request_error", error


async def test_the_admin_key_where_one_is_configured() -> None:
    keyed = deployment(api_keys=[CLIENT_KEY], admin_key=ADMIN_KEY)
    async with keyed as (url, _), aiohttp.ClientSession() as s:
        body = {"abort_all": True}
        assert (await s.post(f"{url}/abort_request", json=body)).status == 401
        client = await s.post(f"{url}/abort_request", json=body, headers=bearer(CLIENT_KEY))
        assert client.status == 403
        admin = await s.post(f"{url}/abort_request", json=body, headers=bearer(ADMIN_KEY))
        assert admin.status == 200
