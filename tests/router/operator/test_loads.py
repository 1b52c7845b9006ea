"""``GET /v1/loads`` (and SMG's ``/get_loads``) on the router: its load in SGLang's shape,
one entry a backend, so that what polls SGLang servers for load polls the router too."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import aiohttp
import orjson
import pytest

from specroute import prometheus
from specroute.server_metrics import parse_loads
from tests.emulators import running_emulator
from tests.processes import emulator_pair, specroute
from tests.router.operator.test_server_info import bearer, counted
from tests.router.proxy.test_router import LONG_STREAM, settled
from tests.routers import running_router

FAST = ("--time-scale", "0.1")
CLIENT_KEY = "sk-client-k3y"


@pytest.mark.parametrize("path", ["/v1/loads", "/get_loads"])
async def test_the_load_the_router_routes_by_one_entry_a_backend(path: str) -> None:
    async with AsyncExitStack() as stack:
        spec = await stack.enter_async_context(running_emulator("--mode", "spec", *FAST))
        base = await stack.enter_async_context(running_emulator("--mode", "base", *FAST))
        url, state = await stack.enter_async_context(
            running_router(
                spec=[spec], base=[base], given_params={"crossover": 8}, poll_interval=0.1
            )
        )
        async with aiohttp.ClientSession() as s:
            own = await (await s.get(f"{spec}/v1/loads")).json()
            own_base = await (await s.get(f"{base}/v1/loads")).json()
            chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}
            await s.post(f"{url}/v1/chat/completions", json=chat)  # an accept length to read
            for _ in range(100):
                if state.view().accept_length() is not None:
                    break
                await asyncio.sleep(0.05)
            streams = [
                await s.post(f"{url}/v1/chat/completions", json=LONG_STREAM) for _ in range(3)
            ]
            try:
                assert all(r.headers["x-specroute-backend"].startswith("spec:") for r in streams)
                for _ in range(100):  # until a poll found the streams' context in the cache
                    r = await s.get(f"{url}{path}")
                    assert r.status == 200, await r.text()
                    answer = await r.json()
                    if answer["loads"][0]["num_used_tokens"] > 0:
                        break
                    await asyncio.sleep(0.05)
            finally:
                for stream in streams:
                    stream.close()
            await settled(state)
            after = await (await s.get(f"{url}{path}")).json()

    assert answer["version"].startswith("specroute-") and answer["dp_rank_count"] == 2
    first, second = answer["loads"]
    assert (first["dp_rank"], first["worker"], first["pool"]) == (0, spec, "spec")
    assert (second["dp_rank"], second["worker"], second["pool"]) == (1, base, "base")
    assert first["num_running_reqs"] + first["num_waiting_reqs"] == 3  # the router's count
    assert second["num_running_reqs"] + second["num_waiting_reqs"] == 0
    # the servers' KV caches, as they report them: a gateway's overload protection reads these
    assert first["num_used_tokens"] > 0 == second["num_used_tokens"]
    for entry, server in ((first, own), (second, own_base)):
        assert entry["max_total_num_tokens"] == server["loads"][0]["max_total_num_tokens"] > 0
        assert entry["token_usage"] == entry["num_used_tokens"] / entry["max_total_num_tokens"]
    assert first["max_running_requests"] == own["loads"][0]["max_running_requests"]
    assert first["speculative"]["accept_length"] > 1 and "speculative" not in second
    assert answer["aggregate"] == {
        "total_running_reqs": first["num_running_reqs"],
        "total_waiting_reqs": first["num_waiting_reqs"],
        "total_reqs": 3,
        "router_waiting_reqs": 0,
    }
    read = parse_loads(answer)  # what a router in front of this one reads
    assert read is not None
    assert (read.running, read.queued) == (3 - first["num_waiting_reqs"], first["num_waiting_reqs"])
    assert read.max_running == first["max_running_requests"] + second["max_running_requests"]
    assert read.used_tokens == first["num_used_tokens"]
    assert read.max_tokens == first["max_total_num_tokens"] + second["max_total_num_tokens"]
    assert after["aggregate"]["total_reqs"] == 0  # every request counted down


async def test_what_sglang_takes_and_a_clear_400_for_what_it_does_not() -> None:
    async with AsyncExitStack() as stack:
        spec = await stack.enter_async_context(running_emulator("--mode", "spec", *FAST))
        base = await stack.enter_async_context(running_emulator("--mode", "base", *FAST))
        url, _ = await stack.enter_async_context(
            running_router(
                spec=[spec], base=[base], given_params={"crossover": 8}, api_keys=[CLIENT_KEY]
            )
        )
        key = bearer(CLIENT_KEY)
        async with aiohttp.ClientSession() as s:
            assert (await s.get(f"{url}/v1/loads")).status == 401  # as /router/status
            one = await (await s.get(f"{url}/v1/loads?dp_rank=1", headers=key)).json()
            assert [e["dp_rank"] for e in one["loads"]] == [1] and one["dp_rank_count"] == 1
            core = await s.get(f"{url}/v1/loads?include=core,queues", headers=key)
            assert all("speculative" not in e for e in (await core.json())["loads"])
            text = await s.get(f"{url}/v1/loads?format=prometheus&include=all", headers=key)
            assert text.status == 200 and text.content_type == "text/plain"
            found = prometheus.values(await text.text(), {"sglang_num_running_reqs"})
            assert found == {"sglang_num_running_reqs": [0.0, 0.0]}  # one sample a backend
            for query, param in (
                ("include=core,bogus", "include"),
                ("dp_rank=two", "dp_rank"),
                ("dp_rank=2", "dp_rank"),
                ("format=xml", "format"),
            ):
                r = await s.get(f"{url}/v1/loads?{query}", headers=key)
                error = (await r.json())["error"]
                assert (r.status, error["param"]) == (400, param), error
                assert error["type"] == "invalid_request_error" and error["message"]


async def test_a_router_in_front_of_a_router_reads_its_load() -> None:
    """Replicas in a tree: the outer router polls the inner one's ``/v1/loads`` as it
    would a server's, and with ``--concurrency-source backend`` routes by it: the inner
    router's own clients put its pool at the outer one's crossover."""
    async with AsyncExitStack() as stack:
        spec = await stack.enter_async_context(running_emulator("--mode", "spec", *FAST))
        base = await stack.enter_async_context(running_emulator("--mode", "base", *FAST))
        inner, inner_state = await stack.enter_async_context(
            running_router(spec=[spec], base=[base], given_params={"crossover": 8})
        )
        outer, state = await stack.enter_async_context(
            running_router(
                spec=[inner],
                base=[base],
                given_params={"crossover": 2},
                poll_interval=0.1,
                concurrency_source="backend",
            )
        )
        async with aiohttp.ClientSession() as s:
            streams = [
                await s.post(f"{inner}/v1/chat/completions", json=LONG_STREAM) for _ in range(2)
            ]  # the inner router's own clients: the outer one sees them only in the poll
            try:
                seen = None
                for _ in range(100):
                    seen = state.view().backends[0]
                    if seen.running is not None and seen.running + (seen.queued or 0) == 2:
                        break
                    await asyncio.sleep(0.05)
                assert seen is not None and seen.inflight == 0
                assert seen.load(state.settings.routing.concurrency_source) == 2
                inner_backend = state.roster.backends[0]
                assert inner_backend.loads_path == "/v1/loads"
                assert inner_backend.health_path == "/ready"  # its /health: only that it runs
                chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
                async with s.post(f"{outer}/v1/chat/completions", json=chat) as r:
                    assert r.status == 200  # at the crossover by the inner router's load
                    assert r.headers["x-specroute-backend"].startswith("base:")
            finally:
                for stream in streams:
                    stream.close()
            await settled(inner_state)
            polled = await (await s.get(f"{inner}/v1/loads")).read()
        # its /metrics, a router's, is not read as an engine's: no poll counted as failed
        assert await counted(outer, "specroute_background_errors_total", task="poll") == 0
    assert orjson.loads(polled)["aggregate"]["total_reqs"] == 0


async def test_every_worker_of_several_answers_the_whole_routers_load() -> None:
    """``--workers 2``: whichever worker a connection reaches, its ``/v1/loads`` counts
    every worker's requests."""
    async with (
        emulator_pair(*FAST) as (spec, base),
        specroute(
            *("serve", "--spec", spec, "--base", base, "--workers", "2"),
            *("--policy-param", "crossover=8"),
        ) as (url, _),
        aiohttp.ClientSession() as s,
    ):
        body = {**LONG_STREAM, "max_tokens": 4000}
        streams = []
        for _ in range(3):  # new connections: spread over the workers by the kernel
            stream = await s.post(f"{url}/v1/chat/completions", json=body)
            await stream.content.readline()  # dispatched, in flight
            streams.append(stream)
        seen: dict[int, int] = {}
        try:
            for _ in range(200):
                connector = aiohttp.TCPConnector(limit=1)  # one connection: one worker
                async with aiohttp.ClientSession(connector=connector) as one:
                    async with one.get(f"{url}/router/status") as r:
                        worker = (await r.json())["worker"]["index"]
                    async with one.get(f"{url}/v1/loads") as r:
                        seen[worker] = (await r.json())["aggregate"]["total_reqs"]
                if len(seen) == 2:
                    break
        finally:
            for stream in streams:
                stream.close()
    assert seen == {0: 3, 1: 3}
