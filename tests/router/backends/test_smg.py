"""A pool that is itself an SMG (SGLang's gateway, ``pip install smg``) in front of two
data-parallel servers: the router chooses the pool, SMG's ``cache_aware`` the server, and
the router reads the pool's load from SMG's ``/get_loads`` (docs/guides/smg.md)."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from specroute.loadgen.spawn import Spawned, free_port, spawned
from specroute.router.state import RouterState
from tests.emulators import running_emulator
from tests.router.proxy.test_router import LONG_STREAM, settled
from tests.routers import running_router

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("smg") is None,
    reason="smg, SGLang's gateway, is not installed (the dev extra installs it)",
)
SERVER = ("--time-scale", "0.1", "--radix-cache-tokens", "100000", "--enable-cache-report")
KEY = "sk-replicas-k3y"
SYSTEM = "You answer in one line. " + "the queue and the batch " * 300


def smg(workers: list[str], *flags: str) -> AbstractAsyncContextManager[Spawned]:
    """SMG in front of ``workers`` on loopback, reading their loads every second (its
    ``/get_loads`` is its monitor's last reading, every 10 s by default)."""
    return spawned(
        *("launch", "--worker-urls", *workers, *flags, "--host", "127.0.0.1"),
        *("--prometheus-port", str(free_port()), "--log-level", "warn"),
        *("--load-monitor-interval", "1"),
        module="smg",
        ready="/readiness",
    )


@pytest.fixture
async def pool() -> AsyncIterator[tuple[str, RouterState, list[str]]]:
    """The router: its speculative pool an SMG in front of two servers, its plain pool one
    server; the crossover is the pool's (two servers' worth). Yields the servers behind
    SMG too."""
    async with AsyncExitStack() as stack:
        workers = [
            await stack.enter_async_context(running_emulator("--mode", "spec", *SERVER))
            for _ in range(2)
        ]
        base = await stack.enter_async_context(running_emulator("--mode", "base", *SERVER))
        gateway = await stack.enter_async_context(
            smg(workers, "--policy", "cache_aware", "--health-check-interval-secs", "1")
        )
        params = {"crossover": 6, "topology": "partitioned"}
        router = running_router(
            spec=[gateway.url],
            base=[base],
            given_params=params,
            poll_interval=0.1,
            health_interval=0.2,
            eject_after_failures=1,
        )
        url, state = await stack.enter_async_context(router)
        yield url, state, workers


async def test_the_router_chooses_the_pool_smg_the_server_and_smg_tells_the_load(
    pool: tuple[str, RouterState, list[str]],
) -> None:
    url, state, workers = pool
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    model = (await client.models.list()).data[0].id  # SMG routes by the model's name
    cached = []
    for question in ("Define a batch.", "Define a queue."):
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": question},
        ]
        raw = await client.chat.completions.with_raw_response.create(
            model=model, messages=messages, max_tokens=4
        )
        assert raw.headers["x-specroute-backend"].startswith("spec:")
        usage = raw.parse().usage
        assert usage is not None and usage.prompt_tokens_details is not None
        cached.append(usage.prompt_tokens_details.cached_tokens or 0)
    assert cached[0] == 0 and cached[1] > 1000  # SMG sent both to the server that held it

    spec = next(b for b in state.roster.backends if b.pool == "spec")
    assert spec.loads_path == "/get_loads"  # SMG answers 404 to /v1/loads
    body = {**LONG_STREAM, "model": model, "max_tokens": 4000}  # streams held open
    async with aiohttp.ClientSession() as s:
        streams = [await s.post(f"{url}/v1/chat/completions", json=body) for _ in range(4)]
        try:
            assert all(r.status == 200 for r in streams)
            for _ in range(100):  # SMG reads its servers every second, the router SMG often
                seen = state.view().backends[spec.index]
                if (seen.running, seen.queued) == (4, 0):  # its servers read apart: settled
                    break
                await asyncio.sleep(0.05)
            assert (seen.running, seen.queued) == (4, 0)  # over both servers behind SMG
            assert seen.inflight == 4  # the router's own count, its default load source
            assert seen.max_running_requests == 2 * 48
        finally:
            for r in streams:
                r.close()
    await settled(state)

    # every server behind SMG refuses: SMG is not ready, and the router ejects the pool
    assert spec.health_path == "/readiness" and spec.healthy
    async with aiohttp.ClientSession() as s:
        for worker in workers:
            async with s.post(f"{worker}/emulator/faults", json={"faults": ["refuse"]}) as r:
                assert r.status == 200
    for _ in range(200):
        if not spec.healthy:
            break
        await asyncio.sleep(0.05)
    assert not spec.healthy
    raw = await client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "Hi."}], max_tokens=2
    )
    assert raw.headers["x-specroute-backend"].startswith("base:")


async def test_server_info_and_a_flush_reach_the_servers_behind_smg(
    pool: tuple[str, RouterState, list[str]],
) -> None:
    """SMG answers SGLang's older names (/get_server_info, /get_model_info), 404 to the
    newer, and fans a flush out to its servers."""
    url, _, workers = pool
    router = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    model = (await router.models.list()).data[0].id
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Define a batch."},
    ]

    async def cached(client: openai.AsyncOpenAI) -> int:
        answer = await client.chat.completions.create(model=model, messages=messages, max_tokens=2)
        assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
        return answer.usage.prompt_tokens_details.cached_tokens or 0

    await cached(router)
    assert await cached(router) > 1000  # on one of the servers behind SMG
    async with aiohttp.ClientSession() as s:
        for path in ("/server_info", "/model_info"):
            async with s.get(f"{url}{path}") as r:
                assert r.status == 200, await r.text()
                assert r.headers["x-specroute-backend"].startswith("spec:")  # the SMG
                assert (await r.json())["model_path"] == model
        async with s.post(f"{url}/flush_cache") as r:
            answer = await r.json()
            assert r.status == 200, answer
    for worker in workers:  # the one that held the prompt too: asked directly
        direct = openai.AsyncOpenAI(base_url=f"{worker}/v1", api_key="unused", max_retries=0)
        async with direct:  # closed before the next is made (test_overhead.py says why)
            assert await cached(direct) == 0


async def test_smg_in_front_of_specroute_replicas_balances_by_their_load() -> None:
    """SMG over two specroute replicas (``power_of_two``): its monitor reads each replica's
    ``/v1/loads``, so new requests go to the replica that other clients do not load, and
    it checks each at ``/ready``. Without the replicas' loads SMG would count only the
    requests it sent itself, none here, and pick at random. (Between two readings SMG adds
    each request it sends to its estimate of that replica's load: fewer requests than the
    busy replica runs keep the idle one below it, however fast they come.)"""
    async with AsyncExitStack() as stack:
        spec = await stack.enter_async_context(running_emulator("--mode", "spec"))
        base = await stack.enter_async_context(running_emulator("--mode", "base"))
        replicas = [
            await stack.enter_async_context(
                running_router(
                    spec=[spec], base=[base], given_params={"crossover": 8}, api_keys=[KEY]
                )
            )
            for _ in range(2)
        ]
        (busy, busy_state), (idle, idle_state) = replicas
        gateway = await stack.enter_async_context(
            smg(
                [busy, idle],
                *("--policy", "power_of_two"),
                *("--health-check-endpoint", "/ready"),  # a replica's /health: that it runs
                *("--api-key", KEY),  # its clients' key, and what it sends its workers
            )
        )
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {KEY}"}) as s:
            body = {**LONG_STREAM, "max_tokens": 4000}  # held open while SMG reads
            streams = [
                await s.post(f"{busy}/v1/chat/completions", json=body) for _ in range(16)
            ]  # the busy replica's own clients, which SMG does not see
            try:
                for _ in range(100):  # SMG's monitor reads every second
                    async with s.get(f"{gateway.url}/get_loads") as r:
                        told = {busy: 0, idle: 0}  # SMG lists each replica's backends apart
                        for e in (await r.json())["loads"]:
                            told[e["worker"]] += e["num_running_reqs"] + e["num_waiting_reqs"]
                    if told[busy] == 16:
                        break
                    await asyncio.sleep(0.1)
                assert told == {busy: 16, idle: 0}, told
                client = openai.AsyncOpenAI(
                    base_url=f"{gateway.url}/v1", api_key=KEY, max_retries=0
                )
                model = (await client.models.list()).data[0].id
                before = len(busy_state.decisions.recent), len(idle_state.decisions.recent)
                for _ in range(12):
                    await client.chat.completions.create(
                        model=model, messages=[{"role": "user", "content": "Hi."}], max_tokens=2
                    )
                after = len(busy_state.decisions.recent), len(idle_state.decisions.recent)
                assert (after[0] - before[0], after[1] - before[1]) == (0, 12)
            finally:
                for r in streams:
                    r.close()
            await settled(busy_state)
