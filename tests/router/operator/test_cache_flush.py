"""``/flush_cache`` through the router: every server's radix cache dropped, or an answer
that says which server did not flush and why; the emulator's flush as SGLang's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import aiohttp
import openai
import pytest

from specroute.loadgen.spawn import free_port
from tests.emulators import running_emulator
from tests.router.operator.test_server_info import bearer, counted
from tests.router.proxy.test_router import LONG_STREAM
from tests.routers import running_router

CACHED = ("--time-scale", "0.1", "--radix-cache-tokens", "100000", "--enable-cache-report")
SYSTEM = "You answer in one line. " + "the queue and the batch " * 200
ADMIN_KEY = "sk-admin-fl0sh"
CLIENT_KEY = "sk-client-fl0sh"


@asynccontextmanager
async def deployment(**router: object) -> AsyncIterator[tuple[str, list[str]]]:
    """A router in front of a speculative and a plain server with radix caches."""
    async with AsyncExitStack() as stack:
        servers = [
            await stack.enter_async_context(running_emulator("--mode", mode, *CACHED))
            for mode in ("spec", "base")
        ]
        url, _ = await stack.enter_async_context(
            running_router(
                spec=servers[:1], base=servers[1:], given_params={"crossover": 8}, **router
            )
        )
        yield url, servers


async def _cached_tokens(client: openai.AsyncOpenAI) -> int:
    answer = await client.chat.completions.create(
        model="m",
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}],
        max_tokens=4,
    )
    assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
    return answer.usage.prompt_tokens_details.cached_tokens or 0


async def test_a_flush_through_the_router_empties_every_servers_cache() -> None:
    async with deployment() as (url, servers):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none")
        await _cached_tokens(client)
        assert await _cached_tokens(client) > 1000  # the system prompt, from the cache
        plain = openai.AsyncOpenAI(base_url=f"{servers[1]}/v1", api_key="none")
        await _cached_tokens(plain)  # the plain server's cache too, filled directly
        assert await _cached_tokens(plain) > 1000
        async with aiohttp.ClientSession() as s:
            r = await s.post(f"{url}/flush_cache")
            answer = await r.json()
        assert r.status == 200 and answer["flushed"] is True
        assert {(x["pool"], x["status"]) for x in answer["servers"]} == {
            ("spec", 200),
            ("base", 200),
        }
        assert await _cached_tokens(client) == 0  # prefilled whole again
        assert await _cached_tokens(plain) == 0


async def test_a_busy_server_refuses_unless_the_flush_may_wait_for_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with deployment() as (url, servers), aiohttp.ClientSession() as s:
        stream = await s.post(f"{url}/v1/chat/completions", json=LONG_STREAM)
        assert stream.headers["x-specroute-backend"].startswith("spec:")
        await stream.content.readline()  # decoding on the speculative server
        r = await s.get(f"{url}/flush_cache")
        answer = await r.json()
        assert r.status == 400, answer
        assert answer["flushed"] is False and answer["error"]["type"] == "invalid_request_error"
        assert f"spec:{servers[0].removeprefix('http://')}" in answer["error"]["message"]
        status = {x["pool"]: x["status"] for x in answer["servers"]}
        assert status == {"spec": 400, "base": 200}  # the idle one flushed all the same
        assert await counted(url, "specroute_upstream_errors_total", kind="flush") == 1
        busy = f"spec:{servers[0].removeprefix('http://')}: cache flush failed (400)"
        assert any(r.getMessage().startswith(busy) for r in caplog.records), caplog.text
        waited = asyncio.create_task(s.post(f"{url}/flush_cache", params={"timeout": "60"}))
        await asyncio.sleep(0.3)
        assert not waited.done()  # the server waits to fall idle
        stream.close()  # the client leaves: the server aborts it and is idle
        r = await asyncio.wait_for(waited, 30)
        assert r.status == 200, await r.text()


async def test_a_server_that_cannot_be_asked_is_a_502_and_bad_timeouts_a_400() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with AsyncExitStack() as stack:
        base = await stack.enter_async_context(running_emulator("--mode", "base", *CACHED))
        url, _ = await stack.enter_async_context(
            running_router(spec=[dead], base=[base], given_params={"crossover": 8})
        )
        async with aiohttp.ClientSession() as s:
            r = await s.post(f"{url}/flush_cache")
            answer = await r.json()
            assert r.status == 502 and answer["error"]["type"] == "upstream_error"
            assert "unreachable" in answer["error"]["message"]
            assert {x["pool"]: x["status"] for x in answer["servers"]} == {"spec": 0, "base": 200}
            for bad in ("-1", "soon", "nan", "inf"):
                r = await s.post(f"{url}/flush_cache", params={"timeout": bad})
                error = (await r.json())["error"]
                assert r.status == 400 and error["param"] == "timeout", bad
            direct = await s.post(f"{base}/flush_cache", params={"timeout": "-1"})
            assert direct.status == 400  # the emulator, as SGLang: a bad timeout is a 400


async def test_the_admin_key_where_one_is_configured_else_a_client_key() -> None:
    keyed = deployment(api_keys=[CLIENT_KEY], admin_key=ADMIN_KEY)
    async with keyed as (url, _), aiohttp.ClientSession() as s:
        assert (await s.post(f"{url}/flush_cache")).status == 401
        client = await s.post(f"{url}/flush_cache", headers=bearer(CLIENT_KEY))
        assert client.status == 403
        assert CLIENT_KEY not in await client.text()
        admin = await s.post(f"{url}/flush_cache", headers=bearer(ADMIN_KEY))
        assert admin.status == 200
    clients_only = deployment(api_keys=[CLIENT_KEY])
    async with clients_only as (url, _), aiohttp.ClientSession() as s:
        assert (await s.post(f"{url}/flush_cache")).status == 401
        client = await s.post(f"{url}/flush_cache", headers=bearer(CLIENT_KEY))
        assert client.status == 200
